// Reactor properties that need the simulator's control: batching, idle parking, injected faults,
// huge numbers of pending waits, refusals, stress from many threads. What each marker strategy
// costs per look is in sim_markers_test.cpp, the predictive idle policy in sim_predictive_test.cpp,
// allocation counts and executors in sim_delivery_test.cpp.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "support/helpers.hpp"

using namespace std::chrono_literals;
using evr::test::quick_options;
using evr::test::run_until;
using evr::test::wait_until;

TEST_CASE("busy_time counts the passes that deliver, not the polling between them") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
  auto opts = quick_options(evr::strategy::poll);
  opts.idle = evr::idle_mode::spin;  // sweeps back to back: all polling until the GPU moves
  const auto started = std::chrono::steady_clock::now();
  std::atomic<int> done{0};  // before the reactor: its destructor completes pending waits
  evr::reactor r(sim, opts);
  evr::stream st(sim, 0);
  constexpr int n = 200;
  for (int i = 0; i < n; ++i)
    REQUIRE_FALSE(evr::on_complete(r, st, [&](std::error_code ec) { done += !ec; }));
  REQUIRE(wait_until([&] { return r.metrics().submitted == n; }));
  std::this_thread::sleep_for(30ms);  // thousands of sweeps that find nothing
  const auto polling = r.metrics();
  CHECK(polling.sweeps > 10);
  CHECK(polling.busy_time.count() == 0);  // nothing delivered yet: none of that time is busy
  sim.run_until_blocked();
  REQUIRE(wait_until([&] { return done.load() == n; }));
  // The pass counts its time after its delivery, i.e. after the last handler ran: wait for it.
  CHECK(wait_until([&] { return r.metrics().busy_time.count() > 0; }));
  const auto after = r.metrics();
  MESSAGE("busy " << after.busy_time.count() << " ns for " << n << " completions in "
                  << after.sweeps << " sweeps; reactor CPU " << r.cpu_time().count() << " ns");
  CHECK(after.busy_time.count() > 0);
  // Wall time of disjoint passes of one thread: never more than the thread's life. (Not
  // bounded by the delivery phase alone: a pass preempted before the GPU moved counts whole.)
  CHECK(after.busy_time < std::chrono::steady_clock::now() - started);
}

TEST_CASE("coalesce: under a trickle of completions the reactor delivers in batches") {
  for (auto coalesce : {0ms, 5ms}) {
    CAPTURE(coalesce.count());
    evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
    auto opts = quick_options(evr::strategy::poll);
    opts.coalesce = coalesce;
    constexpr int n = 100;
    // Before the reactor: its destructor completes pending waits into these.
    std::vector<std::atomic<int>> seen(n);
    evr::reactor r(sim, opts);
    evr::stream st(sim, 0);
    for (int i = 0; i < n; ++i)
      REQUIRE_FALSE(evr::on_complete(r, st, [&, i](std::error_code ec) {
        if (!ec) seen[i].fetch_add(1);
      }));
    REQUIRE(wait_until([&] { return r.metrics().submitted == n; }));
    std::this_thread::sleep_for(20ms);
    const auto before = r.metrics();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {  // the GPU passes one marker every ~100 us
      sim.step(st.native(), 1);
      std::this_thread::sleep_for(100us);
    }
    REQUIRE(wait_until([&] { return r.metrics().completed == n; }));
    const auto elapsed = std::chrono::steady_clock::now() - t0;
    const auto sweeps = r.metrics().sweeps - before.sweeps;
    MESSAGE(n << " completions over " << std::chrono::duration<double, std::milli>(elapsed).count()
              << " ms in " << sweeps << " sweeps");
    int wrong = 0;
    for (auto& c : seen) wrong += c.load() != 1;
    CHECK(wrong == 0);
    if (coalesce.count() > 0) {
      // At most one delivering pass per interval, each followed by a nap; a pass that finds
      // nothing new falls back to the idle policy (a few more sweeps). Without coalescing the
      // reactor sweeps about once per marker or more (the message of the row with 0 shows it).
      CHECK(sweeps <= static_cast<std::uint64_t>(3 * (elapsed / coalesce) + 20));
    }
  }
}

TEST_CASE("idle: with nothing pending the reactor thread is parked (no wake-ups)") {
  evr::sim::device sim;
  std::atomic<int> done{0};  // before the reactor: its destructor completes pending waits
  evr::reactor r(sim, quick_options(evr::strategy::adaptive));
  evr::stream st(sim, 0);
  evr::on_complete(r, st, [&](std::error_code) { ++done; });
  REQUIRE(wait_until([&] { return done.load() == 1; }));
  // The pass that delivered the wait (its callback set `done`) parks the thread right after its
  // delivery: from here on no sweep, and at most that park itself if `a` is read before it (the
  // test read `a` 20 ms later instead, which a loaded machine can outlast). A doorbell (adaptive
  // arms one for a wait older than doorbell_after, 2 ms here, which a loaded machine reaches)
  // may ring after its wait was found: one wake-up and one park each, and no sweep (nothing is
  // pending).
  const auto a = r.metrics();
  std::this_thread::sleep_for(200ms);  // what a thread that is not parked would do meanwhile
  const auto b = r.metrics();
  CAPTURE(b.doorbells);
  CHECK(b.sweeps == a.sweeps);
  CHECK(b.parks - a.parks <= 1 + b.doorbells);
  CHECK(b.wakeups - a.wakeups <= b.doorbells);
}

TEST_CASE("a sticky fault fails every wait of that device; other devices go on") {
  for (evr::strategy s : evr::test::all_strategies) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(evr::sim::options{.devices = 2, .mode = evr::sim::run_mode::threaded});
    // Before the reactor: its destructor completes pending waits into these.
    std::atomic<int> failed{0}, ok_other{0}, wrong{0};
    const std::error_code illegal = evr::make_cuda_error(evr::cuda_value::illegal_address);
    std::atomic<int> after_ok{0};
    std::error_code after_fail;
    std::atomic<bool> after_fail_done{false};
    evr::reactor r(sim, quick_options(s));
    evr::stream a(sim, 0), b(sim, 0), c(sim, 1);
    auto expect_fault = [&](std::error_code ec) { ec == illegal ? ++failed : ++wrong; };
    // Stream b (device 0) is busy for long: its waits are pending when the fault hits.
    sim.launch_kernel(b.native(), 300ms);
    for (int i = 0; i < 20; ++i) REQUIRE_FALSE(evr::on_complete(r, b, expect_fault));
    // Stream a faults after 2 ms; its waits come after the faulting kernel.
    sim.launch_kernel(a.native(), 2ms);
    sim.launch_faulting_kernel(a.native());
    for (int i = 0; i < 20; ++i) {
      if (std::error_code refused = evr::on_complete(r, a, expect_fault)) expect_fault(refused);
    }
    for (int i = 0; i < 20; ++i) {
      sim.launch_kernel(c.native(), 50us);
      evr::on_complete(r, c, [&](std::error_code ec) { ec ? ++wrong : ++ok_other; });
    }
    // Within a sweep (or a probe) of the fault, not after b's 300 ms kernel.
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE(wait_until([&] { return failed + wrong + ok_other == 60; }, 10s));
    CHECK(std::chrono::steady_clock::now() - t0 < 250ms);
    CHECK(failed.load() == 40);
    CHECK(ok_other.load() == 20);
    CHECK(wrong.load() == 0);
    CHECK(r.metrics().device_faults == 1);
    // The reactor keeps serving: a new wait on device 1 completes, one on device 0 fails.
    evr::on_complete(r, c, [&](std::error_code ec) { after_ok += !ec; });
    std::error_code refused = evr::on_complete(r, a, [&](std::error_code ec) {
      after_fail = ec;
      after_fail_done = true;
    });
    REQUIRE(wait_until([&] { return after_ok.load() == 1; }));
    if (refused) {
      CHECK(refused == illegal);  // the marker could not be enqueued on the dead device
    } else {
      REQUIRE(wait_until([&] { return after_fail_done.load(); }));
      CHECK(after_fail == illegal);
    }
  }
}

TEST_CASE("shutdown with 100k pending waits: each completes exactly once") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
  auto opts = quick_options(evr::strategy::poll);
  opts.shutdown_drain = 10ms;
  constexpr int n = evr::test::sanitized() ? 20000 : 100000;
  std::vector<std::atomic<std::uint8_t>> calls(n);
  std::atomic<int> aborted{0}, completed{0};
  {
    evr::reactor r(sim, opts);
    std::vector<evr::stream> ss;
    for (int i = 0; i < 8; ++i) ss.emplace_back(sim, 0);
    for (int i = 0; i < n; ++i) {
      REQUIRE_FALSE(evr::on_complete(r, ss[i % 8], [&, i](std::error_code ec) {
        calls[i].fetch_add(1);
        (ec == evr::errc::operation_aborted ? aborted : completed)++;
      }));
    }
    sim.step(ss[0].native(), 1000);  // some complete normally
    REQUIRE(wait_until([&] { return completed.load() == 1000; }));
  }  // ~reactor: stop, drain 10 ms, abort the rest
  CHECK(completed.load() == 1000);
  CHECK(aborted.load() == n - 1000);
  int wrong = 0;
  for (auto& c : calls) wrong += c.load() != 1;
  CHECK(wrong == 0);
}

TEST_CASE("options that cannot work are refused, naming the option") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
  auto refused = [&](auto change) -> std::string {
    evr::reactor_options o;
    change(o);
    try {
      evr::reactor r(sim, o);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "accepted";
  };
  CHECK(refused([](auto& o) { o.coalesce = -1ns; }).find("coalesce") != std::string::npos);
  CHECK(refused([](auto& o) { o.final_sleep = -1us; }).find("final_sleep") != std::string::npos);
  CHECK(refused([](auto& o) { o.spin_fraction = 2.0; }).find("spin_fraction") != std::string::npos);
  CHECK(refused([](auto& o) { o.poll_budget = -0.1; }).find("poll_budget") != std::string::npos);
  CHECK(refused([](auto& o) { o.poll_budget = std::nan(""); }).find("poll_budget") !=
        std::string::npos);
  const std::string pass_budget = refused([](auto& o) { o.host_pass_deliver_after = -1us; });
  CHECK(pass_budget.find("host_pass_deliver_after") != std::string::npos);
  CHECK(refused([](auto& o) { o.host_pass_deliver_after = 0ns; }) == "accepted");
  CHECK(refused([](auto& o) { o.poll_budget = 0.0; }) == "accepted");
  CHECK(refused([](auto& o) { o.coalesce = 100us; }) == "accepted");
}

TEST_CASE("refusals name the problem and never lose other waits") {
  evr::sim::device sim, other;
  std::atomic<int> ok{0};  // before the reactor: its destructor completes pending waits
  evr::reactor r(sim, quick_options(evr::strategy::poll));
  evr::stream mine(sim, 0), theirs(other, 0);
  auto noop = [](std::error_code) {};
  CHECK(evr::on_complete(r, theirs, noop) == evr::errc::backend_mismatch);
  CHECK(evr::on_complete(r, evr::stream{}, noop) == evr::errc::empty_handle);
  CHECK(evr::on_complete(r, evr::wait_target::of_stream(sim, reinterpret_cast<void*>(2)), noop) ==
        evr::errc::per_thread_default_stream);
  evr::event never(sim);
  CHECK(evr::on_complete(r, never, noop) == evr::errc::event_never_recorded);
  // A host function may not call evr.
  std::atomic<int> in_host{-1};
  struct ctx {
    evr::reactor* r;
    evr::stream* s;
    std::atomic<int>* result;
  } c{&r, &mine, &in_host};
  REQUIRE_FALSE(sim.launch_host_func(
      mine.native(),
      [](void* p) {
        auto* cx = static_cast<ctx*>(p);
        cx->result->store(evr::on_complete(*cx->r, *cx->s, [](std::error_code) {}) ==
                                  evr::errc::called_from_host_func
                              ? 1
                              : 0);
      },
      &c));
  REQUIRE(wait_until([&] { return sim.query_stream(mine.native()) == std::error_code{}; }));
  CHECK(in_host.load() == 1);
  evr::on_complete(r, mine, [&](std::error_code ec) { ok += !ec; });
  CHECK(wait_until([&] { return ok.load() == 1; }));
  CHECK(r.metrics().rejected >= 5);
}

TEST_CASE("the reactor may be destroyed from one of its own inline handlers") {
  evr::sim::device sim;
  auto* r = new evr::reactor(sim, quick_options(evr::strategy::poll));
  evr::stream st(sim, 0);
  std::atomic<int> calls{0};
  std::atomic<bool> destroyed{false};
  std::atomic<bool> submitted{false};
  for (int i = 0; i < 5; ++i) evr::on_complete(*r, st, [&](std::error_code) { ++calls; });
  evr::on_complete(*r, st, [&, r](std::error_code) {
    ++calls;
    // The caller's contract: nobody else is still inside a call on the reactor being destroyed
    // (here: the test thread's on_complete, which touches the reactor after its push).
    while (!submitted.load()) std::this_thread::yield();
    delete r;  // from the reactor thread
    destroyed = true;
  });
  submitted = true;
  REQUIRE(wait_until([&] { return destroyed.load(); }));
  CHECK(calls.load() == 6);
  // The thread finishes the shutdown by itself; its last act on the device is destroying the
  // pooled events. Wait for that before `sim` goes away.
  REQUIRE(wait_until([&] {
    auto c = sim.counters();
    return c.events_destroyed == c.events_created;
  }));
  std::this_thread::sleep_for(20ms);
}

TEST_CASE("stress: 16 threads x 64 streams, none lost or duplicated") {
  evr::sim::device sim(evr::sim::options{.devices = 2, .mode = evr::sim::run_mode::threaded});
  constexpr int threads = 16, streams = 64;
  constexpr int total = evr::test::sanitized() ? 16000 : 100000;
  constexpr int per_thread = total / threads;
  for (evr::strategy s : {evr::strategy::poll, evr::strategy::adaptive}) {
    CAPTURE(std::string(evr::to_string(s)));
    // Before the reactor: its destructor completes pending waits into these.
    std::vector<std::atomic<std::uint8_t>> seen(total);
    std::atomic<int> errors{0};
    evr::reactor r(sim, quick_options(s));
    std::vector<evr::stream> ss;
    for (int i = 0; i < streams; ++i) ss.emplace_back(sim, i % 2);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        std::mt19937 rng(t);
        for (int i = 0; i < per_thread; ++i) {
          const int id = t * per_thread + i;
          evr::stream& st = ss[rng() % streams];
          if (rng() % 8 == 0) sim.launch_kernel(st.native(), 2us);
          if (evr::on_complete(r, st, [&, id](std::error_code ec) {
                if (ec) ++errors;
                seen[id].fetch_add(1, std::memory_order_relaxed);
              })) {
            ++errors;
          }
        }
      });
    }
    for (auto& t : pool) t.join();
    REQUIRE(wait_until([&] { return r.metrics().completed + r.metrics().failed == total; }, 60s));
    int wrong = 0;
    for (auto& c : seen) wrong += c.load() != 1;
    CHECK(wrong == 0);
    CHECK(errors.load() == 0);
    auto m = r.metrics();
    CHECK(m.submitted == total);
    CHECK(m.in_flight == 0);
    if (s == evr::strategy::poll) {
      CHECK(wait_until([&] { return r.pools().stats().in_use == 0; }));
    }
  }
}
