// tests/support/governor_alone.hpp — what the idle governor's unit tests share
// (idle_governor_test.cpp, idle_governor_tick_test.cpp, idle_governor_host_tick_test.cpp): a
// governor with no reactor and no thread, a stream with one wait of its own, and one whose wait a
// host covers, which the tests plan and look at by hand.
#pragma once

#include <chrono>
#include <cstdint>
#include <system_error>

#include <doctest/doctest.h>

#include <evr/reactor/detail/poll_host.hpp>
#include <evr/reactor/detail/wait_op.hpp>
#include <evr/sim/device.hpp>

#include "counters.hpp"
#include "delivery_batch.hpp"
#include "idle_governor.hpp"
#include "marker_budget.hpp"
#include "stream_state.hpp"
#include "support/helpers.hpp"
#include "wait_registry.hpp"

namespace evr::test {

/// A wait's completion for waits the tests never complete.
inline void never_completes(evr::detail::wait_op*, std::error_code) noexcept {}

/// An idle governor with what it needs and nothing else: no reactor, no thread; the test drives
/// its plans and asks what a sweep would look at.
struct governor_alone {
  governor_alone(evr::strategy how, evr::idle_mode mode) : options(options_for(how, mode)) {}
  static evr::reactor_options options_for(evr::strategy how, evr::idle_mode mode) {
    evr::reactor_options o = evr::test::quick_options(how);
    o.idle = mode;
    return o;
  }
  evr::sim::device sim;
  const evr::reactor_options options;
  const evr::detail::strategy_traits traits = evr::detail::strategy_traits::of(options.strategy);
  evr::detail::reactor_counters counters;
  evr::detail::delivery_batch batch{counters};
  evr::detail::marker_budget markers{sim, options};
  evr::detail::wait_registry registry{traits, batch, markers, counters};
  evr::detail::idle_governor idle{options, traits, sim, registry, counters};
};

/// A stream with one wait of its own (no host), submitted at `now`, accepted by `g`'s registry
/// and new to its governor. The wait's flags may be set until the governor first plans it.
struct lone_wait {
  lone_wait(governor_alone& g, std::chrono::steady_clock::time_point now) {
    op.stream_ = &st;
    op.seq_ = 1;
    op.device_ = 0;
    op.submitted_at_ = now;
    REQUIRE(g.registry.accept(&op, now).activated);
    g.idle.new_wait(st, op, now, /*activated=*/true);
  }
  evr::detail::stream_state st;
  evr::detail::wait_op op{&never_completes};
};

/// A host that has promised to look a second from now, and does nothing else.
struct promising_host final : evr::detail::poll_host {
  promising_host() : poll_host(role::polls) {}
  void look_by(std::int64_t) noexcept override {}
  void wake_until(std::int64_t) noexcept override {}
};

/// A stream with one wait, submitted at `now`, whose host polls and has promised to look a second
/// from now.
struct hosted_stream {
  /// `other`: the wait is that host's instead of the stream's own.
  explicit hosted_stream(std::chrono::steady_clock::time_point now,
                         evr::detail::poll_host* other = nullptr) {
    host.looks_at_ns.store((now + std::chrono::seconds(1)).time_since_epoch().count());
    op.host_ = other != nullptr ? other : &host;
    op.submitted_at_ = now;
    st.entries.insert({1, nullptr, &op});
  }
  promising_host host;
  evr::detail::wait_op op{&never_completes};
  evr::detail::stream_state st;
};

}  // namespace evr::test
