// How each marker strategy is looked at, on the simulator: driver queries per look (poll, fence
// words, runs of event markers), fence overflow to events, host functions and the adaptive
// doorbell. The reactor loop itself (batching, parking, faults, shutdown, refusals, stress) is in
// sim_reactor_test.cpp.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
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
    // A is found before the ring by the reactor's own look: with every stream's doorbell armed,
    // the reactor naps until a fault probe is due, and with a probe only every second the ring
    // itself found A (the stream moved at the ring, and a doorbell left set was cleared by that).
    opts.fault_probe_interval = 5ms;
    // The ladder naps at once: its spin and yield phases sweep as often as a sweep is fast (a
    // few hundred times), which would make the bound below one on the speed of a sweep.
    if (mode == evr::idle_mode::ladder) opts.spin_window = opts.yield_window = 0ns;
    // Before the reactor: its destructor completes pending waits into these.
    std::atomic<int> a_done{0};
    std::atomic<std::uint64_t> rung_at_a{0};  // host functions run when A completed
    std::atomic<std::int64_t> sweeps_at_b{-1};
    evr::reactor r(sim, opts);
    evr::stream st(sim, 0);
    sim.launch_kernel(st.native(), 20ms);
    evr::on_complete(r, st, [&](std::error_code ec) {
      rung_at_a = sim.counters().host_funcs_run;
      a_done = ec ? -1 : 1;
    });
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
    // What this case is about: A was found before its doorbell rang.
    CHECK(rung_at_a.load() == rung_before);
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
