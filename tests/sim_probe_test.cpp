// wait_target::probed(): a caller that polls through a window of its own (Python's event loop)
// gets the fence word of its wait, or its signal slot's word, and the reactor leaves the wait to
// it until the window closes.
// On the simulated device: which markers give a probe, that the word says what the wait will say,
// and that the reactor still completes every probed wait exactly once, in order, and at once
// when it is cancelled or the reactor shuts down, however far away the caller's window ends.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "support/helpers.hpp"

using namespace std::chrono_literals;
using evr::test::quick_options;
using evr::test::wait_until;

namespace {

/// The outcomes of a few waits, in the order their callbacks ran.
struct outcomes {
  std::atomic<int> calls{0};
  std::atomic<int> ok{0};
  std::atomic<int> aborted{0};
  std::vector<int> order;  // written by the reactor thread only (one callback at a time)

  auto record(int id) {
    return [this, id](std::error_code ec) {
      order.push_back(id);
      if (!ec) ++ok;
      if (ec == evr::errc::operation_aborted) ++aborted;
      ++calls;
    };
  }
};

}  // namespace

TEST_CASE("probed: a fence marker's word goes to the caller, and the reactor still completes") {
  for (const evr::strategy s : {evr::strategy::fence, evr::strategy::adaptive}) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
    outcomes o;  // before the reactor: its destructor completes pending waits
    evr::reactor r(sim, quick_options(s));
    evr::stream st(sim, 0);
    REQUIRE(sim.launch_kernel(st.native()) == std::error_code{});  // held until the GPU runs
    const auto until = std::chrono::steady_clock::now() + 20ms;
    constexpr int n = 3;
    evr::wait_probe probes[n];
    for (int i = 0; i < n; ++i) {
      const evr::wait_target t = evr::wait_target(st).probed(probes[i], until);
      REQUIRE_FALSE(evr::on_complete(r, t, o.record(i)));
    }
    for (int i = 0; i < n; ++i) {
      CAPTURE(i);
      REQUIRE(probes[i]);
      CHECK_FALSE(probes[i].reached());                         // the kernel before it still runs
      if (i > 0) CHECK(probes[i].value > probes[i - 1].value);  // one word, a value per wait
    }
    CHECK(probes[0].word == probes[n - 1].word);
    sim.run_until_blocked();
    for (int i = 0; i < n; ++i) CHECK(probes[i].reached());
    REQUIRE(wait_until([&] { return o.calls.load() == n; }));
    CHECK(o.ok.load() == n);
    CHECK(o.order == std::vector<int>{0, 1, 2});
    CHECK(r.metrics().completed == n);
  }
}

TEST_CASE("probed: a signalled wait's probe is its slot's word, and the reactor still completes") {
  // Library work ending in evr's signal (signal_slot::enqueue_signal): the caller polls the
  // slot's word itself; the reactor leaves the waits to it until the window closes, then
  // completes each exactly once, in order, after its own signal.
  for (const evr::strategy s : {evr::strategy::fence, evr::strategy::adaptive}) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
    outcomes o;
    evr::reactor r(sim, quick_options(s));
    evr::stream st(sim, 0);
    evr::signal_slot slot = r.pools().signals(0).acquire();
    const auto until = std::chrono::steady_clock::now() + 20ms;
    constexpr int n = 3;
    evr::wait_probe probes[n];
    for (int i = 0; i < n; ++i) {
      REQUIRE(sim.launch_kernel(st.native()) == std::error_code{});
      slot.enqueue_signal(st.native());
      const evr::wait_target t = evr::wait_target(st, slot.arm()).probed(probes[i], until);
      REQUIRE_FALSE(evr::on_complete(r, t, o.record(i)));
    }
    const std::uint64_t c0 = sim.counters().fence_writes_enqueued;
    for (int i = 0; i < n; ++i) {
      CAPTURE(i);
      REQUIRE(probes[i]);
      CHECK(probes[i].value == static_cast<std::uint64_t>(i + 1));  // the ticket's count
      CHECK_FALSE(probes[i].reached());
    }
    CHECK(probes[0].word == probes[n - 1].word);
    // Work and signal of the first wait only: its probe says done, the others' do not.
    CHECK(sim.step(st.native(), 2) == 2);
    CHECK(probes[0].reached());
    CHECK_FALSE(probes[1].reached());
    sim.run_until_blocked();
    for (int i = 0; i < n; ++i) CHECK(probes[i].reached());
    REQUIRE(wait_until([&] { return o.calls.load() == n; }));
    CHECK(o.ok.load() == n);
    CHECK(o.order == std::vector<int>{0, 1, 2});
    CHECK(sim.counters().fence_writes_enqueued == c0);  // nothing of evr's on the stream
  }
}

TEST_CASE("probed: without a fence word the probe stays empty and the wait is as usual") {
  for (const evr::strategy s : {evr::strategy::poll, evr::strategy::host_func}) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
    outcomes o;
    evr::reactor r(sim, quick_options(s));
    evr::stream st(sim, 0);
    int not_a_word = 0;
    evr::wait_probe probe{reinterpret_cast<const std::uint64_t*>(&not_a_word), 7};  // cleared
    // A window that closes in an hour: were the wait left to the caller, it would not end.
    const auto far = std::chrono::steady_clock::now() + 1h;
    REQUIRE_FALSE(evr::on_complete(r, evr::wait_target(st).probed(probe, far), o.record(0)));
    CHECK_FALSE(probe);
    CHECK_FALSE(probe.reached());
    sim.run_until_blocked();
    REQUIRE(wait_until([&] { return o.calls.load() == 1; }));
    CHECK(o.ok.load() == 1);
  }
  // A wait on an event has no word of evr's either, under a strategy with fence words.
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
  outcomes o;
  evr::reactor r(sim, quick_options(evr::strategy::fence));
  evr::stream st(sim, 0);
  evr::event ev(sim);
  ev.record(st);
  evr::wait_probe probe;
  const auto far = std::chrono::steady_clock::now() + 1h;
  REQUIRE_FALSE(evr::on_complete(r, evr::wait_target(ev).probed(probe, far), o.record(0)));
  CHECK_FALSE(probe);
  sim.run_until_blocked();
  REQUIRE(wait_until([&] { return o.calls.load() == 1; }));
  CHECK(o.ok.load() == 1);
}

TEST_CASE("probed: a cancel or a shutdown ends the wait at once, exactly once") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
  outcomes o;
  auto r = std::make_unique<evr::reactor>(sim, quick_options(evr::strategy::fence));
  evr::stream st(sim, 0);
  REQUIRE(sim.launch_kernel(st.native()) == std::error_code{});  // the GPU never gets past it
  const auto far = std::chrono::steady_clock::now() + 1h;
  evr::wait_probe cancelled_probe, pending_probe;
  evr::wait_handle h;
  REQUIRE_FALSE(
      evr::on_complete(*r, evr::wait_target(st).probed(cancelled_probe, far), o.record(0), h));
  REQUIRE_FALSE(evr::on_complete(*r, evr::wait_target(st).probed(pending_probe, far), o.record(1)));
  REQUIRE(cancelled_probe);
  REQUIRE(pending_probe);
  CHECK(h.cancel());  // not held back by the caller's window, an hour away
  REQUIRE(wait_until([&] { return o.calls.load() == 1; }));
  CHECK(o.aborted.load() == 1);
  CHECK_FALSE(pending_probe.reached());
  r.reset();  // shutdown: the other wait is aborted, once, although its window is open
  CHECK(o.calls.load() == 2);
  CHECK(o.aborted.load() == 2);
  CHECK(o.order == std::vector<int>{0, 1});
}
