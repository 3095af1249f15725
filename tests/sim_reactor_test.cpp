// Reactor properties that need the simulator's control: exact query counts, manual stepping,
// injected faults, huge numbers of pending waits, counted allocations, stress from many threads.
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
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include <evr/callbacks/sender.hpp>
#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "support/asio.hpp"
#include "support/helpers.hpp"
#include "support/instant_backend.hpp"
#include "support/test_receiver.hpp"

using namespace std::chrono_literals;
using evr::test::quick_options;
using evr::test::run_until;
using evr::test::wait_until;

// ------------------------------------------------------------------------------------------------
// Counting every heap allocation of the process (for the zero-allocation test).
#if defined(__GNUC__) && !defined(__clang__)
// GCC flags free() of memory from the replaced operator new after inlining; both sides are
// malloc/free here, so the pairing is right.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
namespace {
std::atomic<std::uint64_t> g_allocations{0};
}  // namespace

void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

TEST_CASE("poll: one query of the newest event retires every older wait of the stream") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
  auto opts = quick_options(evr::strategy::poll);
  opts.spin_window = 0ns;  // sweep rarely, so that the queries of one sweep can be counted
  opts.yield_window = 0ns;
  opts.max_sleep = 20ms;
  evr::reactor r(sim, opts);
  evr::stream st(sim, 0);
  constexpr int n = 1000;
  std::atomic<int> done{0};
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
  constexpr std::uint64_t one_bisection = 11;
  CHECK(queries <= sweeps * (2 + one_bisection));
  CHECK(queries < n / 4);
}

TEST_CASE("poll: a partly done stream is bisected, not walked") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
  auto opts = quick_options(evr::strategy::poll);
  opts.spin_window = 0ns;
  opts.yield_window = 0ns;
  opts.max_sleep = 20ms;
  evr::reactor r(sim, opts);
  evr::stream st(sim, 0);
  constexpr int n = 1024;
  std::atomic<int> done{0};
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
  CHECK(queries <= sweeps * 12);
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
    evr::reactor r(sim, opts);
    evr::stream other(sim, 0);
    evr::stream st(sim, 0);
    std::atomic<int> done{0};
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
  evr::reactor r(sim, opts);
  evr::stream st(sim, 0);
  constexpr int n = 200;
  std::atomic<int> done{0};
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
    evr::reactor r(sim, opts);
    evr::stream st(sim, 0);
    constexpr int n = 100;
    std::vector<std::atomic<int>> seen(n);
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
  evr::reactor r(*sim, opts);
  evr::stream st(*sim, 0);
  std::atomic<int> done{0};
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
    evr::reactor r(sim, opts);
    evr::stream a(sim, 0), b(sim, 0);
    std::vector<int> order;
    std::mutex m;
    std::atomic<int> done{0};
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

TEST_CASE("fence: while more streams are busy than max_fence_streams, waits record events") {
  for (evr::strategy s : {evr::strategy::fence, evr::strategy::adaptive}) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
    auto opts = quick_options(s);
    opts.max_fence_streams = 2;
    evr::reactor r(sim, opts);
    std::vector<std::unique_ptr<evr::stream>> streams;
    for (int i = 0; i < 4; ++i) streams.push_back(std::make_unique<evr::stream>(sim, 0));
    std::atomic<int> done{0};
    auto wait_on = [&](int i) {
      REQUIRE_FALSE(evr::on_complete(r, *streams[static_cast<std::size_t>(i)],
                                     [&](std::error_code ec) { done += ec ? 1000 : 1; }));
    };
    // Two waits on each of four streams: the first two streams take fences; the third and fourth
    // would make more streams busy than the limit: events; and so does every wait while four
    // streams are busy (the first two streams' second waits included).
    for (int i = 0; i < 4; ++i) wait_on(i);
    CHECK(sim.counters().fence_writes_enqueued == 2);
    CHECK(sim.counters().event_records == 2);
    for (int i = 0; i < 4; ++i) wait_on(i);
    CHECK(sim.counters().fence_writes_enqueued == 2);
    CHECK(sim.counters().event_records == 6);
    sim.run_until_blocked();
    REQUIRE(wait_until([&] { return done.load() == 8; }));
    // Once those are retired, one busy stream is within the limit: a fence again.
    wait_on(3);
    CHECK(sim.counters().fence_writes_enqueued == 3);
    sim.run_until_blocked();
    REQUIRE(wait_until([&] { return done.load() == 9; }));
    CHECK(wait_until([&] { return r.pools().stats().in_use == 0; }));
  }
}

TEST_CASE("host_func: one host function per wait; the reactor sleeps until one runs") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::threaded});
  auto opts = quick_options(evr::strategy::host_func);
  opts.fault_probe_interval = 1s;  // so that completions can only come from host functions
  evr::reactor r(sim, opts);
  evr::stream st(sim, 0);
  std::atomic<int> done{0};
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
  evr::reactor r(sim, opts);
  evr::stream st(sim, 0);
  std::atomic<int> done{0};
  sim.launch_kernel(st.native(), 100ms);
  for (int i = 0; i < 10; ++i) evr::on_complete(r, st, [&](std::error_code ec) { done += !ec; });
  std::this_thread::sleep_for(50ms);
  const auto mid = r.metrics();
  CHECK(mid.doorbells == 1);
  CHECK(done.load() == 0);
  std::this_thread::sleep_for(40ms);
  const auto later = r.metrics();
  CHECK(later.sweeps - mid.sweeps < 10);  // parked behind the doorbell, not polling
  REQUIRE(wait_until([&] { return done.load() == 10; }, 5s));
}

TEST_CASE("idle: with nothing pending the reactor thread is parked (no wake-ups)") {
  evr::sim::device sim;
  evr::reactor r(sim, quick_options(evr::strategy::adaptive));
  evr::stream st(sim, 0);
  std::atomic<int> done{0};
  evr::on_complete(r, st, [&](std::error_code) { ++done; });
  REQUIRE(wait_until([&] { return done.load() == 1; }));
  std::this_thread::sleep_for(20ms);
  const auto a = r.metrics();
  std::this_thread::sleep_for(200ms);
  const auto b = r.metrics();
  CHECK(b.sweeps == a.sweeps);
  CHECK(b.parks == a.parks);
  CHECK(b.wakeups == a.wakeups);
}

namespace {

/// Launches a kernel of `d` on `st` and waits for it through `r` (inline callback); returns when
/// the wait completed.
void run_one(evr::sim::device& sim, evr::reactor& r, evr::stream& st, std::chrono::nanoseconds d) {
  std::atomic<int> done{0};
  sim.launch_kernel(st.native(), d);
  REQUIRE_FALSE(evr::on_complete(r, st, [&](std::error_code ec) { done += ec ? 100 : 1; }));
  REQUIRE(wait_until([&] { return done.load() != 0; }, 10s));
  REQUIRE(done.load() == 1);
}

evr::reactor_options predictive_fence() {
  auto opts = quick_options(evr::strategy::fence);
  opts.idle = evr::idle_mode::predictive;
  opts.fault_probe_interval = 10s;  // no probe may wake the reactor in these tests
  return opts;
}

}  // namespace

TEST_CASE("predictive: the reactor never sleeps past a submission that could finish first") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::threaded});
  evr::reactor r(sim, predictive_fence());
  evr::stream a(sim, 0), b(sim, 0);
  // Teach stream a that its waits take ~200 ms, then start one more: the reactor sleeps until
  // shortly before its predicted end.
  for (int i = 0; i < 3; ++i) run_one(sim, r, a, 200ms);
  std::atomic<int> a_done{0};
  sim.launch_kernel(a.native(), 200ms);
  REQUIRE_FALSE(evr::on_complete(r, a, [&](std::error_code) { ++a_done; }));
  std::this_thread::sleep_for(20ms);

  // More waits behind a's pending work cannot finish before it: they must not wake the reactor.
  const auto before = r.metrics();
  for (int i = 0; i < 10; ++i)
    REQUIRE_FALSE(evr::on_complete(r, a, [&](std::error_code) { ++a_done; }));
  std::this_thread::sleep_for(5ms);
  CHECK(r.metrics().wakeups == before.wakeups);

  // A wait on an idle stream could be done at once: it wakes the reactor and is found within one
  // look, not ~160 ms later when the reactor would have woken for a's prediction.
  std::atomic<bool> b_done{false};
  const auto t0 = std::chrono::steady_clock::now();
  std::atomic<std::int64_t> latency_ns{0};
  REQUIRE_FALSE(evr::on_complete(r, b, [&](std::error_code) {
    latency_ns = (std::chrono::steady_clock::now() - t0).count();
    b_done = true;
  }));
  REQUIRE(wait_until([&] { return b_done.load(); }, 5s));
  CHECK(a_done.load() == 0);
  CHECK(r.metrics().wakeups > before.wakeups);
  CHECK(std::chrono::nanoseconds(latency_ns.load()) < 100ms);
  REQUIRE(wait_until([&] { return a_done.load() == 11; }, 5s));
}

TEST_CASE("predictive: a missed prediction falls back, and the new length is learned") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::threaded});
  evr::reactor r(sim, predictive_fence());
  evr::stream st(sim, 0);
  // (A loaded CI machine may run a simulated kernel late now and then: that is a miss too, so
  // the counts are compared, not fixed.)
  for (int i = 0; i < 4; ++i) run_one(sim, r, st, 5ms);
  const auto before = r.metrics().prediction_misses;
  run_one(sim, r, st, 60ms);  // far longer than anything seen: missed, still found
  CHECK(r.metrics().prediction_misses >= before + 1);
  for (int i = 0; i < 2; ++i) run_one(sim, r, st, 60ms);  // three in a row: the new regime
  const auto learned = r.metrics().prediction_misses;
  CHECK(learned <= before + 3);
  for (int i = 0; i < 4; ++i) run_one(sim, r, st, 60ms);
  // The new length is predicted: not every one of them is missed (without learning, each would
  // be; a sanitized build on a loaded machine may still run one late).
  CHECK(r.metrics().prediction_misses < learned + 4);
}

TEST_CASE("predictive: the reactor sleeps through predictable work instead of spinning") {
  std::uint64_t sweeps[2] = {};
  for (evr::idle_mode mode : {evr::idle_mode::spin, evr::idle_mode::predictive}) {
    CAPTURE(std::string(evr::to_string(mode)));
    evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::threaded});
    auto opts = predictive_fence();
    opts.idle = mode;
    // Spin only through work that is steady to 2 %: a loaded CI machine runs simulated kernels
    // with jitter of milliseconds, through which the default (25 %) would rightly spin.
    opts.spin_fraction = 0.02;
    evr::reactor r(sim, opts);
    evr::stream st(sim, 0);
    for (int i = 0; i < 4; ++i) run_one(sim, r, st, 20ms);  // learning
    const auto a = r.metrics();
    for (int i = 0; i < 10; ++i) run_one(sim, r, st, 20ms);
    const auto b = r.metrics();
    sweeps[mode == evr::idle_mode::spin ? 0 : 1] = b.sweeps - a.sweeps;
    if (mode == evr::idle_mode::predictive) CHECK(b.parks - a.parks >= 10);
  }
  CAPTURE(sweeps[0]);
  CAPTURE(sweeps[1]);
  // Spinning sweeps continuously for 200 ms; the prediction only around each completion.
  CHECK(sweeps[1] * 10 < sweeps[0]);
}

TEST_CASE("predictive: poll_budget spreads the looks at irregular work, and loses nothing") {
  std::uint64_t sweeps[2] = {};
  for (double budget : {0.0, 1e-4}) {
    CAPTURE(budget);
    evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::threaded});
    auto opts = predictive_fence();
    opts.poll_budget = budget;
    evr::reactor r(sim, opts);
    evr::stream st(sim, 0);
    auto bimodal = [](int i) { return i % 2 ? 1ms : 8ms; };       // irregular: polled, not spun
    for (int i = 0; i < 6; ++i) run_one(sim, r, st, bimodal(i));  // learning
    const auto a = r.metrics();
    for (int i = 0; i < 8; ++i) run_one(sim, r, st, bimodal(i));  // each completes exactly once
    const auto b = r.metrics();
    sweeps[budget == 0.0 ? 0 : 1] = b.sweeps - a.sweeps;
  }
  CAPTURE(sweeps[0]);
  CAPTURE(sweeps[1]);
  // No budget: a look every poll_period (50 us) through windows of milliseconds, hundreds of
  // sweeps. A budget of 0.01 % of a core: one look per (look cost / 1e-4), a few per wait.
  CHECK(sweeps[1] * 4 < sweeps[0]);
}

TEST_CASE("predictive: another stream's windows do not make the reactor query a stream early") {
  // Stream a's long wait is before its window; stream b's short waits make the reactor sweep
  // (spinning through their windows). With event markers each look at a stream is a driver
  // query: sweeps skip a until its window (else every sweep queried it: about 2 per sweep).
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::threaded});
  auto opts = quick_options(evr::strategy::poll);
  opts.idle = evr::idle_mode::predictive;
  opts.fault_probe_interval = 10s;
  evr::reactor r(sim, opts);
  evr::stream a(sim, 0), b(sim, 0);
  // a learns 40 ms (8 samples: a younger model is not trusted to skip looks)
  for (int i = 0; i < 8; ++i) run_one(sim, r, a, 40ms);
  std::atomic<int> a_done{0};
  sim.launch_kernel(a.native(), 40ms);
  REQUIRE_FALSE(evr::on_complete(r, a, [&](std::error_code ec) { a_done += ec ? 100 : 1; }));
  const auto m0 = r.metrics();
  for (int i = 0; i < 6; ++i) run_one(sim, r, b, 2ms);  // 12+ ms, far from a's window
  const auto m1 = r.metrics();
  REQUIRE(wait_until([&] { return a_done.load() != 0; }, 10s));
  CHECK(a_done.load() == 1);  // skipped, still found (at its window), exactly once
  REQUIRE(m1.sweeps > m0.sweeps);
  const double queries_per_sweep = static_cast<double>(m1.event_queries - m0.event_queries) /
                                   static_cast<double>(m1.sweeps - m0.sweeps);
  CAPTURE(queries_per_sweep);
  CHECK(queries_per_sweep < 1.4);  // b alone (less while b has nothing pending)
}

TEST_CASE("predictive: irregular work in its window is looked at on the poll tick only") {
  // Stream a's irregular work is in its window (polled, not spun) for 300 ms; meanwhile stream b
  // completes one quick wait after another, and each completion makes the reactor sweep again.
  // Those sweeps skip a: it is looked at on the poll tick (every poll_period, 1 ms here). Before,
  // every sweep queried a too, and with 64 such streams that was most of the reactor's CPU.
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::threaded});
  auto opts = quick_options(evr::strategy::poll);  // every look is a counted event query
  opts.idle = evr::idle_mode::predictive;
  // The helpers' 2 ms fault_probe_interval stays: poll has no fault probe, and a wait older than
  // the interval must still be skipped between ticks.
  opts.poll_period = 1ms;
  evr::reactor r(sim, opts);
  evr::stream a(sim, 0), b(sim, 0);
  for (auto d : {5ms, 300ms, 5ms}) run_one(sim, r, a, d);  // spread 295 ms: irregular
  std::atomic<int> a_done{0};
  sim.launch_kernel(a.native(), 300ms);
  REQUIRE_FALSE(evr::on_complete(r, a, [&](std::error_code ec) { a_done += ec ? 100 : 1; }));
  constexpr int n = 200;
  const auto m0 = r.metrics();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) run_one(sim, r, b, 0us);
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  const auto m1 = r.metrics();
  const std::uint64_t queries = m1.event_queries - m0.event_queries;
  const std::uint64_t sweeps = m1.sweeps - m0.sweeps;
  CAPTURE(queries);
  CAPTURE(sweeps);
  const double elapsed_ms = std::chrono::duration<double, std::milli>(elapsed).count();
  CAPTURE(elapsed_ms);
  // Each of b's waits costs a sweep that queries b and finds it done, and a sweep after that
  // progress in which b has nothing pending. Had every sweep queried a, the queries would be at
  // least sweeps + n; with a looked at once per 1 ms tick, a's queries number about
  // elapsed / 1 ms, below n while b's round trips take under 1 ms each.
  if (elapsed < n * 1ms) CHECK(queries < sweeps + n);
  REQUIRE(wait_until([&] { return a_done.load() != 0; }, 10s));
  CHECK(a_done.load() == 1);  // found, exactly once
}

TEST_CASE("predictive: poll_looks_per_second spaces the poll tick when many streams are on it") {
  // Eight streams of irregular work, each in its window for 300 ms. Unlimited, the tick comes
  // every poll_period (50 us): eight queries each time. At 4000 looks per second the eight
  // streams are looked at every 2 ms.
  std::uint64_t queries[2] = {};
  for (std::size_t limit : {std::size_t{0}, std::size_t{4000}}) {
    CAPTURE(limit);
    evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::threaded});
    auto opts = quick_options(evr::strategy::poll);  // every look is a counted event query
    opts.idle = evr::idle_mode::predictive;
    opts.fault_probe_interval = 10s;
    opts.poll_looks_per_second = limit;
    evr::reactor r(sim, opts);
    std::vector<evr::stream> streams;
    for (int i = 0; i < 8; ++i) streams.emplace_back(sim, 0);
    std::atomic<int> done{0};
    auto round = [&](std::chrono::nanoseconds d) {  // one wait of length d on every stream
      const int target = done.load() + 8;
      for (auto& st : streams) {
        sim.launch_kernel(st.native(), d);
        REQUIRE_FALSE(evr::on_complete(r, st, [&](std::error_code ec) { done += ec ? 100 : 1; }));
      }
      return target;
    };
    for (auto d : {5ms, 300ms, 5ms}) {  // spread 295 ms: irregular
      const int target = round(d);
      REQUIRE(wait_until([&] { return done.load() == target; }, 10s));
    }
    const int target = round(300ms);
    std::this_thread::sleep_for(50ms);
    const auto m0 = r.metrics();
    std::this_thread::sleep_for(150ms);
    const auto m1 = r.metrics();
    queries[limit == 0 ? 0 : 1] = m1.event_queries - m0.event_queries;
    REQUIRE(wait_until([&] { return done.load() == target; }, 10s));  // each exactly once
  }
  CAPTURE(queries[0]);
  CAPTURE(queries[1]);
  CHECK(queries[1] > 0);
  CHECK(queries[1] * 4 < queries[0]);
}

TEST_CASE("a sticky fault fails every wait of that device; other devices go on") {
  for (evr::strategy s : evr::test::all_strategies) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(evr::sim::options{.devices = 2, .mode = evr::sim::run_mode::threaded});
    evr::reactor r(sim, quick_options(s));
    evr::stream a(sim, 0), b(sim, 0), c(sim, 1);
    std::atomic<int> failed{0}, ok_other{0}, wrong{0};
    const std::error_code illegal = evr::make_cuda_error(evr::cuda_value::illegal_address);
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
    std::atomic<int> after_ok{0};
    std::error_code after_fail;
    std::atomic<bool> after_fail_done{false};
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
  std::atomic<int> ok{0};
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

namespace {

// Waits one after another through `waiter`; returns the heap allocations made by the last
// `measured` of them.
template <typename Waiter>
std::uint64_t allocations_per_waits(asio::io_context& io, Waiter& waiter, evr::stream& st,
                                    int measured) {
  constexpr int warmup = 3000;
  int done = 0;
  std::uint64_t at_start = 0;
  std::function<void(std::error_code)> next;  // allocated once, before measuring
  next = [&](std::error_code ec) {
    REQUIRE_FALSE(ec);
    ++done;
    if (done == warmup) at_start = g_allocations.load();
    if (done < warmup + measured) waiter.async_wait(st, std::ref(next));
  };
  asio::post(io, [&] { waiter.async_wait(st, std::ref(next)); });
  REQUIRE(run_until(
      io, [&] { return done == warmup + measured; }, 60s));
  return g_allocations.load() - at_start;
}

}  // namespace

TEST_CASE("zero heap allocations per wait in steady state (Asio front end, posted delivery)") {
  evr::test::instant_backend device;
  constexpr int measured = 20000;
  for (evr::strategy s : {evr::strategy::poll, evr::strategy::fence}) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::reactor r(device, quick_options(s));
    evr::stream st = evr::stream::wrap(device, reinterpret_cast<void*>(0x1000));
    asio::io_context io;
    {
      evr::basic_gpu_waiter<asio::io_context::executor_type> waiter(io.get_executor(), r);
      const std::uint64_t n = allocations_per_waits(io, waiter, st, measured);
      MESSAGE(std::string(evr::to_string(s))
              << ", io_context executor: " << n << " heap allocations in " << measured << " waits");
      CHECK(n == 0);
    }
    {
      // The type-erased executor most code holds (evr::gpu_waiter's): evr posts to the
      // io_context inside it.
      evr::gpu_waiter waiter(io.get_executor(), r);
      const std::uint64_t n = allocations_per_waits(io, waiter, st, measured);
      MESSAGE(std::string(evr::to_string(s))
              << ", any_io_executor: " << n << " heap allocations in " << measured << " waits");
      CHECK(n == 0);
    }
    // (A handler bound to a strand is not free of allocations: when the strand is idle, Asio
    // posts an invoker of its own, allocated from the posting thread's recycling cache, the
    // reactor's, and freed into the io_context thread's: about one per three waits here. Posting
    // through the context's thread instead would recycle it but lose the strand's order when
    // several threads run the context: see docs/architecture.md.)
  }
}

namespace {

// The sender's operation state, built in place again for every wait; its receiver says when it
// has completed (the operation state may be destroyed from then on).
template <class Env>
struct alloc_receiver {
  using receiver_concept = evr::exec::receiver_t;
  std::atomic<int>* done;
  Env env{};
  void set_value() && noexcept { done->fetch_add(1, std::memory_order_release); }
  void set_error(std::error_code) && noexcept { std::abort(); }
  void set_stopped() && noexcept { std::abort(); }
  Env get_env() const noexcept { return env; }
};

template <class Env>
std::uint64_t sender_allocations(evr::reactor& r, evr::stream& st, Env env, int measured) {
  using op_type = evr::exec::connect_result_t<evr::gpu_sender, alloc_receiver<Env>>;
  constexpr int warmup = 3000;
  evr::test::op_slot<op_type> slot;
  std::atomic<int> done{0};
  std::uint64_t at_start = 0;
  for (int i = 0; i < warmup + measured; ++i) {
    if (i == warmup) at_start = g_allocations.load();
    slot.construct([&] {
      return evr::exec::connect(evr::async_wait(r, st), alloc_receiver<Env>{&done, env});
    });
    evr::exec::start(slot.get());
    while (done.load(std::memory_order_acquire) != i + 1) std::this_thread::yield();
  }
  const std::uint64_t n = g_allocations.load() - at_start;
  slot.reset();
  return n;
}

}  // namespace

TEST_CASE("sender: zero heap allocations per wait beyond the operation state") {
  // The operation state (the reactor's operation, the receiver, the stop callback) lives where
  // connect's result is put: here a slot reused for every wait. Nothing else is allocated per
  // wait, with or without a stop callback (the std::stop_source's shared state is made once).
  evr::test::instant_backend device;
  constexpr int measured = 20000;
  for (evr::strategy s : {evr::strategy::poll, evr::strategy::fence}) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::reactor r(device, quick_options(s));
    evr::stream st = evr::stream::wrap(device, reinterpret_cast<void*>(0x1000));
    const std::uint64_t plain = sender_allocations(r, st, evr::exec::empty_env{}, measured);
    std::stop_source source;
    const std::uint64_t stoppable =
        sender_allocations(r, st, evr::test::stop_env{source.get_token()}, measured);
    MESSAGE(std::string(evr::to_string(s))
            << ": " << plain << " heap allocations in " << measured << " waits (no stop token), "
            << stoppable << " (std::stop_token)");
    CHECK(plain == 0);
    CHECK(stoppable == 0);
  }
}

TEST_CASE("gpu_waiter: handlers on another context run there, the waiter's context never run") {
  // A handler is posted to its own executor; it does not depend on the waiter's context.
  evr::test::instant_backend device;
  evr::reactor r(device, quick_options(evr::strategy::poll));
  evr::stream st = evr::stream::wrap(device, reinterpret_cast<void*>(0x1000));
  asio::io_context never_run, runs;
  asio::thread_pool pool(1);
  evr::basic_gpu_waiter<asio::io_context::executor_type> waiter(never_run.get_executor(), r);
  std::atomic<int> ran{0};
  auto strand = asio::make_strand(runs);
  waiter.async_wait(st, asio::bind_executor(runs, [&](evr::asio_error_code ec) { ran += !ec; }));
  waiter.async_wait(st, asio::bind_executor(strand, [&](evr::asio_error_code ec) {
                      ran += !ec && strand.running_in_this_thread();
                    }));
  waiter.async_wait(st, asio::bind_executor(pool, [&](evr::asio_error_code ec) { ran += !ec; }));
  REQUIRE(run_until(
      runs, [&] { return ran.load() == 3; }, 20s));
  pool.join();
  CHECK(ran.load() == 3);
}

TEST_CASE("gpu_waiter: handlers bound to one strand run in stream order, four threads running") {
  evr::test::instant_backend device;
  evr::reactor r(device, quick_options(evr::strategy::poll));
  evr::stream st = evr::stream::wrap(device, reinterpret_cast<void*>(0x1000));
  asio::io_context io;
  auto strand = asio::make_strand(io);
  evr::gpu_waiter waiter(io.get_executor(), r);
  constexpr int n = 4000;
  std::vector<int> order;  // appended on the strand only
  order.reserve(n);
  std::atomic<int> done{0};
  asio::post(strand, [&] {
    for (int i = 0; i < n; ++i) {
      waiter.async_wait(st, asio::bind_executor(strand, [&, i](evr::asio_error_code ec) {
                          if (!ec) order.push_back(i);
                          ++done;
                        }));
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&] { io.run_for(60s); });
  REQUIRE(wait_until([&] { return done.load() == n; }, 60s));
  io.stop();
  for (auto& t : threads) t.join();
  REQUIRE(order.size() == static_cast<std::size_t>(n));
  CHECK(std::is_sorted(order.begin(), order.end()));
}

TEST_CASE("stress: 16 threads x 64 streams, none lost or duplicated") {
  evr::sim::device sim(evr::sim::options{.devices = 2, .mode = evr::sim::run_mode::threaded});
  constexpr int threads = 16, streams = 64;
  constexpr int total = evr::test::sanitized() ? 16000 : 100000;
  constexpr int per_thread = total / threads;
  for (evr::strategy s : {evr::strategy::poll, evr::strategy::adaptive}) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::reactor r(sim, quick_options(s));
    std::vector<evr::stream> ss;
    for (int i = 0; i < streams; ++i) ss.emplace_back(sim, i % 2);
    std::vector<std::atomic<std::uint8_t>> seen(total);
    std::atomic<int> errors{0};
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
