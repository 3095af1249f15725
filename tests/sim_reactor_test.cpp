// Reactor properties that need the simulator's control: exact query counts per strategy,
// batching, idle parking, injected faults, huge numbers of pending waits, refusals, stress from
// many threads. The predictive idle policy is in sim_predictive_test.cpp, allocation counts and
// executors in sim_delivery_test.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "support/asio.hpp"
#include "support/helpers.hpp"
#include "support/instant_backend.hpp"

using namespace std::chrono_literals;
using evr::test::quick_options;
using evr::test::run_until;
using evr::test::wait_until;

TEST_CASE("poll: one query of the newest event retires every older wait of the stream") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
  auto opts = quick_options(evr::strategy::poll);
  opts.spin_window = 0ns;  // sweep rarely, so that the queries of one sweep can be counted
  opts.yield_window = 0ns;
  opts.max_sleep = 20ms;
  std::atomic<int> done{0};  // before the reactor: its destructor completes pending waits
  evr::reactor r(sim, opts);
  evr::stream st(sim, 0);
  constexpr int n = 1000;
  for (int i = 0; i < n; ++i)
    REQUIRE_FALSE(evr::on_complete(r, st, [&](std::error_code ec) { done += !ec; }));
  REQUIRE(wait_until([&] { return r.metrics().submitted == n; }));
  std::this_thread::sleep_for(50ms);  // the reactor settles into its longest sleep
  const auto before = r.metrics();
  CHECK(sim.run_until_blocked() == static_cast<std::size_t>(n));  // the GPU passes every marker
  REQUIRE(wait_until([&] { return done.load() == n; }));
  const auto after = r.metrics();
  const auto queries = after.event_queries - before.event_queries;
  const auto sweeps = after.sweeps - before.sweeps;
  MESSAGE("retired " << n << " waits with " << queries << " event queries in " << sweeps
                     << " sweeps");
  // One query (oldest: pending) per idle sweep, two (oldest, newest: done) for the sweep that
  // retires everything. The simulator releases its lock between markers, so sweeps may land
  // while the GPU is half way through them (on a fast many-core host several do: the reactor
  // sweeps again at once after progress); each such sweep bisects once (log2(1000) < 11
  // queries). Walking the stream would cost one query per wait: 1000.
  // The snapshot `before` may land inside a sweep (counted when it starts): that sweep's queries
  // fall after it, so it counts as one more.
  constexpr std::uint64_t one_bisection = 11;
  CHECK(queries <= (sweeps + 1) * (2 + one_bisection));
  CHECK(queries < n / 4);
}

TEST_CASE("poll: a partly done stream is bisected, not walked") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
  auto opts = quick_options(evr::strategy::poll);
  opts.spin_window = 0ns;
  opts.yield_window = 0ns;
  opts.max_sleep = 20ms;
  std::atomic<int> done{0};  // before the reactor: its destructor completes pending waits
  evr::reactor r(sim, opts);
  evr::stream st(sim, 0);
  constexpr int n = 1024;
  for (int i = 0; i < n; ++i)
    REQUIRE_FALSE(evr::on_complete(r, st, [&](std::error_code) { ++done; }));
  REQUIRE(wait_until([&] { return r.metrics().submitted == n; }));
  std::this_thread::sleep_for(50ms);
  const auto before = r.metrics();
  sim.step(st.native(), 700);
  REQUIRE(wait_until([&] { return done.load() == 700; }));
  const auto after = r.metrics();
  const auto queries = after.event_queries - before.event_queries;
  const auto sweeps = after.sweeps - before.sweeps;
  MESSAGE("700 of 1024 retired with " << queries << " queries in " << sweeps << " sweeps");
  // log2(1024) = 10 queries per bisection, plus the oldest and newest: at most 12 per sweep, and
  // a sweep may land while the simulator is half way through the 700 markers (it releases its
  // lock between them). Walking would cost a query per retired wait: 700.
  CHECK(queries <= (sweeps + 1) * 12);  // + 1: a sweep under way when `before` was taken
  CHECK(queries < 700 / 4);
  sim.run_until_blocked();
  REQUIRE(wait_until([&] { return done.load() == n; }));
}

TEST_CASE("fence: a run of event markers is queried as poll queries a stream, not walked") {
  // More busy streams than max_fence_streams: every new wait records an event, and the sweep
  // meets a long run of events in front of the fence word.
  for (evr::strategy s : {evr::strategy::fence, evr::strategy::adaptive}) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
    auto opts = quick_options(s);
    opts.max_fence_streams = 1;
    opts.spin_window = 0ns;
    opts.yield_window = 0ns;
    opts.max_sleep = 20ms;
    opts.idle = evr::idle_mode::ladder;  // sweeps paced by the sleeps, not by predictions
    opts.fault_probe_interval = 10s;     // no stream query retires anything here
    // adaptive: no doorbell. Its host function would sit behind the markers, never run by this
    // manual device, and the reactor would sleep on it until the probe (a slow machine, TSan,
    // reached doorbell_after while the waits were submitted).
    opts.doorbell_after = std::chrono::hours(1);
    std::atomic<int> done{0};  // before the reactor: its destructor completes pending waits
    evr::reactor r(sim, opts);
    evr::stream other(sim, 0);
    evr::stream st(sim, 0);
    REQUIRE_FALSE(evr::on_complete(r, other, [&](std::error_code ec) { done += !ec; }));
    constexpr int n = 1000;
    for (int i = 0; i < n; ++i)
      REQUIRE_FALSE(evr::on_complete(r, st, [&](std::error_code ec) { done += !ec; }));
    REQUIRE(sim.counters().fence_writes_enqueued == 1);  // the other stream's
    REQUIRE(sim.counters().event_records == static_cast<std::uint64_t>(n));
    REQUIRE(wait_until([&] { return r.metrics().submitted == n + 1; }));
    std::this_thread::sleep_for(50ms);
    const auto before = r.metrics();
    sim.step(st.native(), 700);
    REQUIRE(wait_until([&] { return done.load() == 700; }));
    sim.run_until_blocked();
    REQUIRE(wait_until([&] { return done.load() == n + 1; }));
    const auto after = r.metrics();
    const auto queries = after.event_queries - before.event_queries;
    const auto sweeps = after.sweeps - before.sweeps;
    MESSAGE("retired " << n << " event markers with " << queries << " queries in " << sweeps
                       << " sweeps");
    // Per sweep at most the oldest, the newest of the run and a bisection (log2(1000) < 11),
    // over the few sweeps the burst takes; one query per wait (a walk) would be 1000.
    CHECK(queries < n / 4);
  }
}

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

TEST_CASE("fence: the sweep makes no event query and no driver call but the slow probe") {
  auto sim = std::make_unique<evr::sim::device>(
      evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::threaded});
  auto opts = quick_options(evr::strategy::fence);
  opts.fault_probe_interval = 1s;
  std::atomic<int> done{0};  // before the reactor: its destructor completes pending waits
  evr::reactor r(*sim, opts);
  evr::stream st(*sim, 0);
  for (int i = 0; i < 100; ++i) {
    sim->launch_kernel(st.native(), 10us);
    evr::on_complete(r, st, [&](std::error_code ec) { done += !ec; });
  }
  REQUIRE(wait_until([&] { return done.load() == 100; }));
  auto m = r.metrics();
  CHECK(m.event_queries == 0);
  CHECK(m.stream_queries <= 1);
  CHECK(sim->counters().fence_writes_landed >= 100);
}

TEST_CASE("fence: beyond max_pending_fences, waits record events instead, in order") {
  for (evr::strategy s : {evr::strategy::fence, evr::strategy::adaptive}) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
    auto opts = quick_options(s);
    opts.max_pending_fences = 4;
    // adaptive: no doorbell. Its host function is an operation of the stream: armed while the
    // waits are submitted (on a loaded machine that takes longer than doorbell_after), it sits
    // between a's markers and sim.step(a, 5) below runs it instead of a fifth marker, so only
    // four waits complete and the fifth never does on this manual device (seen under load).
    opts.doorbell_after = std::chrono::hours(1);
    // Before the reactor: its destructor completes pending waits into these.
    std::vector<int> order;
    std::mutex m;
    std::atomic<int> done{0};
    evr::reactor r(sim, opts);
    evr::stream a(sim, 0), b(sim, 0);
    constexpr int n = 40;
    for (int i = 0; i < n; ++i) {
      REQUIRE_FALSE(evr::on_complete(r, i % 2 ? b : a, [&, i](std::error_code ec) {
        std::lock_guard<std::mutex> lock(m);
        if (!ec) order.push_back(i);
        ++done;
      }));
    }
    // Only max_pending_fences fence writes were enqueued; the rest recorded pooled events.
    CHECK(sim.counters().fence_writes_enqueued == 4);
    CHECK(sim.counters().event_records == n - 4);
    sim.step(a.native(), 5);  // part of a: fences and events mixed
    REQUIRE(wait_until([&] { return done.load() == 5; }));
    sim.run_until_blocked();
    REQUIRE(wait_until([&] { return done.load() == n; }));
    std::vector<int> on_a, on_b;
    for (int i : order) (i % 2 ? on_b : on_a).push_back(i);
    CHECK(std::is_sorted(on_a.begin(), on_a.end()));
    CHECK(std::is_sorted(on_b.begin(), on_b.end()));
    CHECK(order.size() == static_cast<std::size_t>(n));
    // Every marker event came back once the GPU was past it.
    CHECK(wait_until([&] { return r.pools().stats().in_use == 0; }));
  }
}

TEST_CASE("fence: once a device has more streams with waits than max_fence_streams, events") {
  // The driver gives each stream its hardware queue when the stream is made, so with more
  // streams than queues two may share one whichever are busy: fence writes only while the device
  // has no more streams with waits than the limit, busy or not.
  for (evr::strategy s : {evr::strategy::fence, evr::strategy::adaptive}) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
    auto opts = quick_options(s);
    opts.max_fence_streams = 2;
    std::atomic<int> done{0};  // before the reactor: its destructor completes pending waits
    evr::reactor r(sim, opts);
    std::vector<std::unique_ptr<evr::stream>> streams;
    for (int i = 0; i < 4; ++i) streams.push_back(std::make_unique<evr::stream>(sim, 0));
    auto wait_on = [&](int i) {
      REQUIRE_FALSE(evr::on_complete(r, *streams[static_cast<std::size_t>(i)],
                                     [&](std::error_code ec) { done += ec ? 1000 : 1; }));
    };
    // Two streams: fences, busy or idle.
    wait_on(0);
    wait_on(1);
    CHECK(sim.counters().fence_writes_enqueued == 2);
    sim.run_until_blocked();
    REQUIRE(wait_until([&] { return done.load() == 2; }));
    wait_on(0);
    CHECK(sim.counters().fence_writes_enqueued == 3);
    // A third and a fourth stream: from now on every wait of the device records an event, also
    // on the first two streams, also once everything is done.
    wait_on(2);
    wait_on(3);
    wait_on(1);
    CHECK(sim.counters().fence_writes_enqueued == 3);
    CHECK(sim.counters().event_records == 3);
    sim.run_until_blocked();
    REQUIRE(wait_until([&] { return done.load() == 6; }));
    wait_on(0);
    CHECK(sim.counters().fence_writes_enqueued == 3);
    CHECK(sim.counters().event_records == 4);
    sim.run_until_blocked();
    REQUIRE(wait_until([&] { return done.load() == 7; }));
    CHECK(wait_until([&] { return r.pools().stats().in_use == 0; }));
  }
}

TEST_CASE("host_func: one host function per wait; the reactor sleeps until one runs") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::threaded});
  auto opts = quick_options(evr::strategy::host_func);
  opts.fault_probe_interval = 1s;  // so that completions can only come from host functions
  std::atomic<int> done{0};        // before the reactor: its destructor completes pending waits
  evr::reactor r(sim, opts);
  evr::stream st(sim, 0);
  for (int i = 0; i < 50; ++i) {
    sim.launch_kernel(st.native(), 100us);
    evr::on_complete(r, st, [&](std::error_code ec) { done += !ec; });
  }
  REQUIRE(wait_until([&] { return done.load() == 50; }, 5s));
  CHECK(wait_until([&] { return sim.counters().host_funcs_run >= 50; }));
  CHECK(r.metrics().event_queries == 0);
  CHECK(r.metrics().sweeps < 5000);  // woken by host functions, not spinning
}

TEST_CASE("adaptive: an old wait arms one doorbell, and the reactor sleeps until it rings") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::threaded});
  auto opts = quick_options(evr::strategy::adaptive);
  opts.doorbell_after = 2ms;
  opts.fault_probe_interval = 500ms;
  // Before the reactor: its destructor completes pending waits into these.
  std::atomic<int> done{0};
  // Read on the reactor thread as the last wait completes (the test thread may be scheduled late
  // on a loaded machine: it used to sample at 50 and 90 ms into the 100 ms kernel).
  std::atomic<std::int64_t> sweeps_at_done{-1}, doorbells_at_done{-1};
  evr::reactor r(sim, opts);
  evr::stream st(sim, 0);
  sim.launch_kernel(st.native(), 100ms);
  for (int i = 0; i < 10; ++i) {
    evr::on_complete(r, st, [&](std::error_code ec) {
      if (ec) return;
      // Inline on the reactor thread, one at a time. Counted after the samples: the test thread
      // reads them once it sees 10 (it used to see 10 before the last handler had stored them,
      // and read -1 under TSan).
      if (done.load() == 9) {
        const auto m = r.metrics();
        sweeps_at_done = static_cast<std::int64_t>(m.sweeps);
        doorbells_at_done = static_cast<std::int64_t>(m.doorbells);
      }
      ++done;
    });
  }
  // Armed once the oldest wait is doorbell_after old; one for the stream.
  REQUIRE(wait_until([&] { return r.metrics().doorbells >= 1; }, 5s));
  const auto armed = r.metrics();
  REQUIRE(wait_until([&] { return done.load() == 10; }, 5s));
  CHECK(doorbells_at_done.load() == 1);
  // From the doorbell's arming to the completion (most of the 100 ms): parked behind the
  // doorbell, not polling. (Read late, `armed` may follow the completion: nothing to check.)
  CAPTURE(sweeps_at_done.load() - static_cast<std::int64_t>(armed.sweeps));
  CHECK(sweeps_at_done.load() - static_cast<std::int64_t>(armed.sweeps) < 10);
}

TEST_CASE("a doorbell that rings after its wait was found is spent: the reactor sleeps again") {
  // The stream: K1, wait A, K2, [doorbell], K3, wait B. The doorbell is armed for A (older than
  // doorbell_after) and sits behind K2; A is found when K1 ends, and the doorbell rings when K2
  // ends, with B pending behind K3. A rung doorbell is a wake-up to be taken once: it used to
  // stay set until a look found the stream moved, so every nap of the reactor returned at once
  // for as long as B pended (a core spinning), and with a host covering the stream the reactor
  // never looked and never released the pass lock: the stream's waits hung (issue 43: evr-bench
  // idle, ladder, 16 streams in lockstep, posted).
  for (evr::idle_mode mode : {evr::idle_mode::ladder, evr::idle_mode::predictive}) {
    CAPTURE(std::string(evr::to_string(mode)));
    evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::threaded});
    auto opts = quick_options(evr::strategy::adaptive);
    opts.idle = mode;
    opts.doorbell_after = 1ms;
    opts.fault_probe_interval = 1s;
    // Before the reactor: its destructor completes pending waits into these.
    std::atomic<int> a_done{0};
    std::atomic<std::int64_t> sweeps_at_b{-1};
    evr::reactor r(sim, opts);
    evr::stream st(sim, 0);
    sim.launch_kernel(st.native(), 20ms);
    evr::on_complete(r, st, [&](std::error_code ec) { a_done = ec ? -1 : 1; });
    sim.launch_kernel(st.native(), 60ms);
    REQUIRE(wait_until([&] { return r.metrics().doorbells >= 1 || a_done != 0; }, 10s));
    if (a_done != 0) continue;  // a loaded machine: A was found before its doorbell was armed
    const std::uint64_t rung_before = sim.counters().host_funcs_run;
    sim.launch_kernel(st.native(), 300ms);
    evr::on_complete(r, st, [&](std::error_code ec) {
      if (!ec) sweeps_at_b = static_cast<std::int64_t>(r.metrics().sweeps);
    });
    REQUIRE(wait_until([&] { return a_done.load() != 0; }, 10s));
    CHECK(a_done.load() == 1);
    // The doorbell rang (K2 ended) while B pends behind K3.
    REQUIRE(wait_until([&] { return sim.counters().host_funcs_run > rung_before; }, 10s));
    const std::int64_t sweeps_at_ring = static_cast<std::int64_t>(r.metrics().sweeps);
    REQUIRE(wait_until([&] { return sweeps_at_b.load() >= 0; }, 10s));
    // From the ring to B's completion (most of K3's 300 ms): a few naps, a doorbell for B. A
    // reactor that cannot sleep sweeps hundreds of thousands of times meanwhile.
    CAPTURE(sweeps_at_b.load() - sweeps_at_ring);
    CHECK(sweeps_at_b.load() - sweeps_at_ring < 1000);
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
