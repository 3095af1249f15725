// The predictive idle policy on the simulator: the reactor sleeps through predictable work, is
// woken by a submission that could finish first, falls back when a prediction misses, and looks
// at irregular work on the poll tick only (reactor/src/idle_governor.hpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "support/asio.hpp"
#include "support/forwarding_backend.hpp"
#include "support/helpers.hpp"
#include "support/instant_backend.hpp"
#include "support/predictive.hpp"

using namespace std::chrono_literals;
using evr::test::holds_in_one_of_three;
using evr::test::predictive_fence;
using evr::test::quick_options;
using evr::test::run_one;
using evr::test::run_until;
using evr::test::wait_until;

TEST_CASE("predictive: the reactor never sleeps past a submission that could finish first") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::threaded});
  // Before the reactor: its destructor completes pending waits into these.
  std::atomic<int> a_done{0};
  std::atomic<bool> b_done{false};
  std::atomic<int> a_done_at_b{-1};
  std::atomic<std::int64_t> latency_ns{0};
  evr::reactor r(sim, predictive_fence());
  evr::stream a(sim, 0), b(sim, 0);
  // Teach stream a that its waits take ~200 ms, then start one more: the reactor sleeps until
  // shortly before its predicted end.
  for (int i = 0; i < 3; ++i) run_one(sim, r, a, 200ms);
  sim.launch_kernel(a.native(), 200ms);
  REQUIRE_FALSE(evr::on_complete(r, a, [&](std::error_code) { ++a_done; }));
  std::this_thread::sleep_for(20ms);

  // More waits behind a's pending work cannot finish before it: they must not wake the reactor.
  // (A submission that wakes the reactor counts the wake-up itself, before on_complete returns:
  // nothing to wait for before the check.)
  const auto before = r.metrics();
  for (int i = 0; i < 10; ++i)
    REQUIRE_FALSE(evr::on_complete(r, a, [&](std::error_code) { ++a_done; }));
  CHECK(r.metrics().wakeups == before.wakeups);

  // A wait on an idle stream could be done at once: its submission wakes the reactor (counted
  // before on_complete returns), which finds it then, not ~160 ms later when it would have woken
  // for a's prediction: b is delivered before a. Both are read on the reactor thread, in b's
  // callback: the test thread may be scheduled late on a loaded machine (it once saw b done only
  // after a's 200 ms kernel had ended, though b took under 100 ms). The time b took is reported;
  // it is the machine's scheduling as much as evr's.
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE_FALSE(evr::on_complete(r, b, [&, t0](std::error_code) {
    latency_ns = (std::chrono::steady_clock::now() - t0).count();
    a_done_at_b = a_done.load();
    b_done = true;
  }));
  CHECK(r.metrics().wakeups > before.wakeups);
  REQUIRE(wait_until([&] { return b_done.load(); }, 5s));
  MESSAGE("b delivered " << latency_ns.load() / 1000 << " us after its submission");
  CHECK(a_done_at_b.load() == 0);
  REQUIRE(wait_until([&] { return a_done.load() == 11; }, 5s));
}

TEST_CASE("predictive: a missed prediction falls back, and the new length is learned") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::threaded});
  evr::reactor r(sim, predictive_fence());
  evr::stream st(sim, 0);
  // (A loaded CI machine may run a simulated kernel late now and then: that is a miss too, so
  // the counts are compared, not fixed.)
  std::chrono::nanoseconds longest{0};  // the longest round trip: launch to completion seen
  for (int i = 0; i < 4; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run_one(sim, r, st, 5ms);
    longest = std::max<std::chrono::nanoseconds>(longest, std::chrono::steady_clock::now() - t0);
  }
  const auto before = r.metrics().prediction_misses;
  // Far longer than anything seen: missed, still found. A miss is a wait that outlives
  // start + high + max(margin, spread / 2), high being the longest of the 4 samples (each at
  // most its round trip, measured above) and the timer margin at most half the sleep: at most
  // 1.5 x high. Twice the longest round trip outlives it whatever the scheduling (a fixed length
  // could fit in a window widened by a learning wait found late on a loaded machine).
  const auto longer = std::max<std::chrono::nanoseconds>(60ms, 2 * longest);
  CAPTURE(longer.count());
  run_one(sim, r, st, longer);
  CHECK(r.metrics().prediction_misses >= before + 1);
  for (int i = 0; i < 2; ++i) run_one(sim, r, st, longer);  // three in a row: the new regime
  const auto learned = r.metrics().prediction_misses;
  CHECK(learned <= before + 3);
  for (int i = 0; i < 4; ++i) run_one(sim, r, st, longer);
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
  // No budget: a look every poll_period (50 us) through windows of milliseconds, hundreds of
  // sweeps. A budget of 0.01 % of a core: one look per (look cost / 1e-4), a few per wait.
  CHECK(holds_in_one_of_three([] {
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
    MESSAGE("sweeps over 8 waits: " << sweeps[0] << " without a budget, " << sweeps[1]
                                    << " with 0.01 % of a core");
    return sweeps[1] * 4 < sweeps[0];
  }));
}

namespace {

/// The simulated device, logging when each stream's markers are queried: an event query asks
/// about the stream the event was last recorded on (poll: every look at a stream is one).
class query_log final : public evr::test::forwarding_backend {
 public:
  using clock = std::chrono::steady_clock;
  explicit query_log(evr::device::backend& inner) : forwarding_backend(inner) {}

  std::error_code record_event(evr::device::native_event e,
                               evr::device::native_stream s) noexcept override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      recorded_on_[e] = s;
    }
    return inner_.record_event(e, s);
  }
  std::error_code query_event(evr::device::native_event e) noexcept override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto it = recorded_on_.find(e);
      if (it != recorded_on_.end()) queries_.push_back({it->second, clock::now()});
    }
    return inner_.query_event(e);
  }
  /// When the markers of stream `s` were queried, in [from, to).
  std::vector<clock::time_point> queries_of(evr::device::native_stream s, clock::time_point from,
                                            clock::time_point to) const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<clock::time_point> out;
    for (const auto& q : queries_)
      if (q.stream == s && q.at >= from && q.at < to) out.push_back(q.at);
    return out;
  }

 private:
  struct query {
    evr::device::native_stream stream;
    clock::time_point at;
  };
  mutable std::mutex mutex_;
  std::map<evr::device::native_event, evr::device::native_stream> recorded_on_;
  std::vector<query> queries_;
};

}  // namespace

TEST_CASE("predictive: another stream's windows do not make the reactor query a stream early") {
  // Stream a's long wait is before its window; stream b's short waits make the reactor sweep
  // (spinning through their windows). With event markers each look at a stream is a driver
  // query: sweeps skip a until its window (else every sweep queried it too: about 2 queries per
  // sweep). What the design gives, whatever the scheduling: the pass that takes a's wait in
  // looks at a once (the wait is planned after that pass's sweep); from then on the plan skips a
  // until no earlier than half-way from its submission to its window's opening (the timer margin
  // the reactor looks early by is at most half the sleep: sleep_overshoot::margin), and the
  // window opens low - spread/4 - prespin after the submission (low, spread: of a's samples, each
  // at least the kernel's length less the gap between its launch and its submission, which is
  // measured). So before that point a is queried at most three times, however late b's waits
  // run: once by that pass, and by its scouts (idle_policy.hpp, next_scout: an eighth and half
  // way to the window; the second may fall just before the point); b's sweeps would be dozens.
  // What the bound assumes: a's model is its 8 steady samples. A reactor starved for
  // milliseconds (two test runs at once on two cores) sees some completions late and learns
  // another model (once 2 early queries, once 2058, in about 60 such runs). Hence up to three
  // attempts.
  // (Before, the test compared all queries per sweep with 1.4 over b's waits: on a loaded
  // machine b's waits reached a's window, where a is rightly looked at, and it failed: 1.65.)
  CHECK(holds_in_one_of_three([] {
    using clock = std::chrono::steady_clock;
    evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::threaded});
    query_log dev(sim);
    auto opts = quick_options(evr::strategy::poll);
    opts.idle = evr::idle_mode::predictive;
    opts.fault_probe_interval = 10s;
    // Before the reactor: its destructor completes pending waits into these.
    std::atomic<int> done{0}, a_done{0};
    evr::reactor r(dev, opts);
    evr::stream a(dev, 0), b(dev, 0);
    constexpr auto length = 100ms;
    // a learns its length (8 samples: a younger model is not trusted to skip looks). Each sample
    // is at least `length` less the launch-to-submission gap, and at most the round trip.
    clock::duration gap{0}, round_trip{0};
    for (int i = 0; i < 8; ++i) {
      done = 0;
      const auto launched = clock::now();
      sim.launch_kernel(a.native(), length);
      REQUIRE_FALSE(evr::on_complete(r, a, [&](std::error_code ec) { done += ec ? 100 : 1; }));
      gap = std::max(gap, clock::now() - launched);
      REQUIRE(wait_until([&] { return done.load() != 0; }, 10s));
      round_trip = std::max(round_trip, clock::now() - launched);
      REQUIRE(done.load() == 1);
    }
    const auto a_submitted = clock::now();  // before: the wait's own submission time is later
    sim.launch_kernel(a.native(), length);
    REQUIRE_FALSE(evr::on_complete(r, a, [&](std::error_code ec) { a_done += ec ? 100 : 1; }));
    const auto low = length - gap;                                       // at most the model's low
    const auto spread = std::max(round_trip - low, clock::duration{0});  // at least its spread
    const auto opens = low - spread / 4 - opts.prespin;  // at most the window's offset
    const auto no_look_before = a_submitted + opens / 2;
    for (int i = 0; i < 6; ++i) run_one(sim, r, b, 2ms);  // 12+ ms, far from a's window
    REQUIRE(wait_until([&] { return a_done.load() != 0; }, 10s));
    REQUIRE(a_done.load() == 1);  // skipped, still found (at its window), exactly once
    const auto early = dev.queries_of(a.native(), a_submitted, no_look_before);
    const auto b_meanwhile = dev.queries_of(b.native(), a_submitted, no_look_before);
    const double unlooked_ms = std::chrono::duration<double, std::milli>(opens / 2).count();
    MESSAGE("a queried " << early.size() << " times and b " << b_meanwhile.size()
                         << " times in the first " << unlooked_ms << " ms of a's wait");
    // b's sweeps ran meanwhile (it was queried; else the check would show nothing), and none of
    // them queried a but the one that took its wait in (and a's scouts, which are its own).
    return !b_meanwhile.empty() && early.size() <= 3;
  }));
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
  std::atomic<int> a_done{0};  // before the reactor: its destructor completes pending waits
  evr::reactor r(sim, opts);
  evr::stream a(sim, 0), b(sim, 0);
  for (auto d : {5ms, 300ms, 5ms}) run_one(sim, r, a, d);  // spread 295 ms: irregular
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
  CHECK(holds_in_one_of_three([] {
    std::uint64_t queries[2] = {};
    for (std::size_t limit : {std::size_t{0}, std::size_t{4000}}) {
      CAPTURE(limit);
      evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::threaded});
      auto opts = quick_options(evr::strategy::poll);  // every look is a counted event query
      opts.idle = evr::idle_mode::predictive;
      opts.fault_probe_interval = 10s;
      opts.poll_looks_per_second = limit;
      std::atomic<int> done{0};  // before the reactor: its destructor completes pending waits
      evr::reactor r(sim, opts);
      std::vector<evr::stream> streams;
      for (int i = 0; i < 8; ++i) streams.emplace_back(sim, 0);
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
    MESSAGE("queries in 150 ms: " << queries[0] << " unlimited, " << queries[1]
                                  << " at 4000 looks per second");
    return queries[1] > 0 && queries[1] * 4 < queries[0];
  }));
}
