// evr::wait_handle: cancellable on_complete waits, on the simulated device. Exactly one outcome
// per wait, cancel() == true exactly when the callback saw operation_aborted, and memory safety
// whatever the order of completion, handle destruction and reactor destruction (run it under ASan
// and TSan: scripts/test.sh asan -R evr_tests, or evr_tests -tc="wait_handle*").
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "support/helpers.hpp"

using namespace std::chrono_literals;
using evr::test::quick_options;
using evr::test::wait_until;

namespace {

/// What one wait's callback saw.
struct outcome {
  std::atomic<int> calls{0};
  std::atomic<int> aborted{0};
  std::atomic<int> ok{0};
};

auto record_into(outcome& o) {
  return [&o](std::error_code ec) {
    if (ec == evr::errc::operation_aborted) ++o.aborted;
    if (!ec) ++o.ok;
    ++o.calls;
  };
}

}  // namespace

static_assert(std::is_nothrow_default_constructible_v<evr::wait_handle>);
static_assert(std::is_nothrow_move_constructible_v<evr::wait_handle>);
static_assert(std::is_nothrow_move_assignable_v<evr::wait_handle>);
static_assert(!std::is_copy_constructible_v<evr::wait_handle>);
static_assert(!std::is_copy_assignable_v<evr::wait_handle>);

TEST_CASE("wait_handle: empty handles cancel nothing") {
  evr::wait_handle h;
  CHECK_FALSE(h);
  CHECK_FALSE(h.cancel());
  evr::wait_handle moved(std::move(h));
  CHECK_FALSE(moved);
  CHECK_FALSE(moved.cancel());
}

TEST_CASE("wait_handle: cancel before completion aborts the wait exactly once") {
  for (evr::strategy s : evr::test::all_strategies) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
    outcome o, bystander;  // before the reactor: its destructor completes pending waits
    evr::reactor r(sim, quick_options(s));
    evr::stream st(sim, 0);
    REQUIRE(sim.launch_kernel(st.native()) == std::error_code{});  // holds the stream (manual)
    evr::wait_handle h, other;
    REQUIRE_FALSE(evr::on_complete(r, st, record_into(o), h));
    REQUIRE_FALSE(evr::on_complete(r, st, record_into(bystander), other));
    CHECK(h);
    CHECK(h.cancel());
    CHECK_FALSE(h.cancel());  // twice: nothing more
    REQUIRE(wait_until([&] { return o.calls.load() == 1; }));
    CHECK(o.aborted.load() == 1);
    CHECK(bystander.calls.load() == 0);  // only the cancelled wait was touched
    // The GPU work goes on; the bystander completes normally.
    sim.run_until_blocked();
    REQUIRE(wait_until([&] { return bystander.calls.load() == 1; }));
    CHECK(bystander.ok.load() == 1);
    CHECK_FALSE(other.cancel());  // after completion
    CHECK_FALSE(h.cancel());
    std::this_thread::sleep_for(5ms);
    CHECK(o.calls.load() == 1);
    CHECK(bystander.calls.load() == 1);
    CHECK(r.metrics().cancelled == 1);
  }
}

TEST_CASE("wait_handle: cancel after completion returns false and calls nothing again") {
  evr::sim::device sim;
  outcome o;  // before the reactor: its destructor completes pending waits
  evr::reactor r(sim, quick_options(evr::strategy::poll));
  evr::stream st(sim, 0);
  evr::wait_handle h;
  REQUIRE_FALSE(evr::on_complete(r, st, record_into(o), h));
  REQUIRE(wait_until([&] { return o.calls.load() == 1; }));
  CHECK(o.ok.load() == 1);
  CHECK(h);  // still refers to the (completed) wait
  CHECK_FALSE(h.cancel());
  std::this_thread::sleep_for(5ms);
  CHECK(o.calls.load() == 1);
  CHECK(r.metrics().cancelled == 0);
}

TEST_CASE("wait_handle: cancel from inside the callback itself returns false") {
  evr::sim::device sim;
  // Before the reactor: its destructor completes a pending wait into these.
  evr::wait_handle h;
  std::atomic<int> calls{0}, cancel_result{-1};
  evr::reactor r(sim, quick_options(evr::strategy::poll));
  evr::stream st(sim, 0);
  REQUIRE_FALSE(evr::on_complete(
      r, st,
      [&](std::error_code) {
        cancel_result = h.cancel() ? 1 : 0;
        ++calls;
      },
      h));
  REQUIRE(wait_until([&] { return calls.load() == 1; }));
  CHECK(cancel_result.load() == 0);
}

TEST_CASE("wait_handle: a refused wait leaves the handle empty") {
  evr::sim::device sim;
  evr::reactor r(sim, quick_options(evr::strategy::poll));
  evr::stream st(sim, 0);
  outcome first, refused;
  evr::wait_handle h;
  REQUIRE_FALSE(evr::on_complete(r, st, record_into(first), h));
  r.stop();
  CHECK(evr::on_complete(r, st, record_into(refused), h) == evr::errc::reactor_stopped);
  CHECK_FALSE(h);
  CHECK(first.calls.load() == 1);
  CHECK(refused.calls.load() == 0);
}

TEST_CASE("wait_handle: destroying or moving over the handle never cancels") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
  outcome a, b, c;  // before the reactor: its destructor completes pending waits
  evr::reactor r(sim, quick_options(evr::strategy::poll));
  evr::stream st(sim, 0);
  REQUIRE(sim.launch_kernel(st.native()) == std::error_code{});
  {
    evr::wait_handle h;
    REQUIRE_FALSE(evr::on_complete(r, st, record_into(a), h));
  }  // destroyed first
  evr::wait_handle h2, h3;
  REQUIRE_FALSE(evr::on_complete(r, st, record_into(b), h2));
  REQUIRE_FALSE(evr::on_complete(r, st, record_into(c), h3));
  h2 = std::move(h3);  // b forgotten, not cancelled; h2 now holds c
  CHECK_FALSE(h3);
  std::this_thread::sleep_for(5ms);
  CHECK(a.calls.load() + b.calls.load() + c.calls.load() == 0);
  sim.run_until_blocked();
  REQUIRE(wait_until([&] { return a.calls + b.calls + c.calls == 3; }));
  CHECK(a.ok.load() == 1);
  CHECK(b.ok.load() == 1);
  CHECK(c.ok.load() == 1);
  CHECK_FALSE(h2.cancel());
}

TEST_CASE("wait_handle: the handle outlives the reactor") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
  evr::stream st(sim, 0);
  REQUIRE(sim.launch_kernel(st.native()) == std::error_code{});
  outcome pending, done;
  evr::wait_handle hp, hd;
  {
    auto opts = quick_options(evr::strategy::poll);
    opts.shutdown_drain = 1ms;
    evr::reactor r(sim, opts);
    evr::stream quick(sim, 0);
    REQUIRE_FALSE(evr::on_complete(r, quick, record_into(done), hd));
    sim.step(quick.native());  // its marker
    REQUIRE(wait_until([&] { return done.calls.load() == 1; }));
    REQUIRE_FALSE(evr::on_complete(r, st, record_into(pending), hp));
  }  // the destructor aborts the pending wait
  CHECK(pending.calls.load() == 1);
  CHECK(pending.aborted.load() == 1);
  CHECK(done.ok.load() == 1);
  CHECK_FALSE(hp.cancel());  // the reactor is gone: false, nothing touched
  CHECK_FALSE(hd.cancel());
  CHECK(hp);
  sim.run_until_blocked();
}

TEST_CASE("wait_handle: cancel racing completion from many threads, exactly one outcome each") {
  constexpr int threads = 4;
  const int waits = evr::test::sanitized() ? 2000 : 8000;
  for (evr::strategy s : evr::test::all_strategies) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim;
    // Before the reactor: its destructor completes pending waits into these.
    std::vector<outcome> outcomes(static_cast<std::size_t>(waits));
    auto reactor = std::make_unique<evr::reactor>(sim, quick_options(s));
    evr::reactor& r = *reactor;
    std::vector<evr::stream> streams;
    for (int i = 0; i < 8; ++i) streams.emplace_back(sim, 0);
    std::vector<evr::wait_handle> handles(static_cast<std::size_t>(waits));
    std::vector<std::atomic<int>> wins(static_cast<std::size_t>(waits));
    std::atomic<int> submitted{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> cancellers;
    // Each wait is cancelled by two threads (i and i+1 mod threads), both racing the completion
    // and each other; the handles are read only after their wait was submitted (`submitted`).
    for (int t = 0; t < threads; ++t) {
      cancellers.emplace_back([&, t] {
        while (!go.load()) std::this_thread::yield();
        for (int i = 0; i < waits; ++i) {
          if (i % threads != t && (i + 1) % threads != t) continue;
          while (submitted.load(std::memory_order_acquire) <= i) std::this_thread::yield();
          if (handles[static_cast<std::size_t>(i)].cancel())
            wins[static_cast<std::size_t>(i)].fetch_add(1);
        }
      });
    }
    go = true;
    for (int i = 0; i < waits; ++i) {
      evr::stream& st = streams[static_cast<std::size_t>(i % 8)];
      if (i % 3 == 0)
        REQUIRE(sim.launch_kernel(st.native(), std::chrono::microseconds(i % 7)) ==
                std::error_code{});
      REQUIRE_FALSE(evr::on_complete(r, st, record_into(outcomes[static_cast<std::size_t>(i)]),
                                     handles[static_cast<std::size_t>(i)]));
      submitted.store(i + 1, std::memory_order_release);
    }
    for (auto& t : cancellers) t.join();
    REQUIRE(wait_until([&] {
      for (auto& o : outcomes)
        if (o.calls.load() == 0) return false;
      return true;
    }));
    std::this_thread::sleep_for(2ms);
    int cancelled = 0;
    for (int i = 0; i < waits; ++i) {
      const auto k = static_cast<std::size_t>(i);
      CAPTURE(i);
      REQUIRE(outcomes[k].calls.load() == 1);
      REQUIRE(wins[k].load() <= 1);
      REQUIRE((wins[k].load() == 1) == (outcomes[k].aborted.load() == 1));
      REQUIRE(outcomes[k].ok.load() + outcomes[k].aborted.load() == 1);
      cancelled += wins[k].load();
    }
    CHECK(r.metrics().cancelled == static_cast<std::uint64_t>(cancelled));
    MESSAGE(std::string(evr::to_string(s))
            << ": " << cancelled << " of " << waits << " waits cancelled, the rest completed");
    // Half the handles die before the reactor, the other half cancel again after it is gone.
    handles.resize(handles.size() / 2);
    reactor.reset();
    int late = 0;
    for (auto& h : handles) late += h.cancel() ? 1 : 0;
    CHECK(late == 0);
  }
}
