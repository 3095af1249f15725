// Faults and stalls on the simulated device, under every strategy: a sticky fault injected at a
// random operation while waits are pending on that device, a fault that only the probe can see
// (host_func: host functions never run after a fault), and a stalled stream next to busy ones.
// (The fixed-point fault of sim_reactor_test.cpp, "a sticky fault fails every wait of that
// device; other devices go on", is not repeated here.)
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "support/asio.hpp"
#include "support/helpers.hpp"

using namespace std::chrono_literals;
using evr::test::quick_options;
using evr::test::wait_until;

namespace {

using clock_type = std::chrono::steady_clock;

/// One wait's outcome: how often it completed, with what, and when.
struct outcome {
  std::atomic<int> calls{0};
  std::error_code ec;
  clock_type::time_point at{};
};

/// The callback of a wait that records into `o` (on the reactor thread).
auto record_into(outcome& o, std::atomic<int>& finished) {
  return [&o, &finished](std::error_code ec) {
    o.ec = ec;
    o.at = clock_type::now();
    o.calls.fetch_add(1, std::memory_order_release);
    finished.fetch_add(1, std::memory_order_release);
  };
}

/// Watches a simulated device for its sticky fault; remembers when it was first seen (later than
/// the fault by a scheduling delay at most: the reactor may see it first).
class fault_watch {
 public:
  fault_watch(evr::sim::device& sim, int device)
      : thread_([this, &sim, device] {
          while (!stop_.load()) {
            if (sim.fault(device)) {
              seen_at_ = clock_type::now();
              seen_.store(true, std::memory_order_release);
              return;
            }
            std::this_thread::yield();  // (a sleep would blur the time of the fault)
          }
        }) {}
  ~fault_watch() {
    stop_ = true;
    thread_.join();
  }
  bool seen() const { return seen_.load(std::memory_order_acquire); }
  clock_type::time_point seen_at() const { return seen_at_; }

 private:
  std::atomic<bool> stop_{false}, seen_{false};
  clock_type::time_point seen_at_{};
  std::thread thread_;
};

}  // namespace

TEST_CASE(
    "sim fault: a sticky fault at a random operation: every pending wait of that device fails "
    "promptly; the other device and the reactor go on") {
  const std::error_code illegal = evr::make_cuda_error(evr::cuda_value::illegal_address);
  const unsigned seed = std::random_device{}();
  MESSAGE("seed " << seed);
  std::mt19937 rng(seed);
  for (evr::strategy s : evr::test::all_strategies) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(evr::sim::options{.devices = 2, .mode = evr::sim::run_mode::threaded});
    // Before the reactor: its destructor completes pending waits into these.
    constexpr int on_a = 30, on_b = 10, on_c = 20;
    std::vector<outcome> wa(on_a), wb(on_b), wc(on_c);
    outcome loose;  // a wait on a user's event recorded on `a`
    std::atomic<int> finished{0};
    outcome later_c, later_a;  // waits after the fault
    std::atomic<int> later{0};
    evr::reactor r(sim, quick_options(s));  // fault probe every 2 ms
    evr::stream a(sim, 0), b(sim, 0), c(sim, 1);

    // Everything is enqueued while device 0's streams are stalled, then the fault is armed.
    sim.stall(a.native());
    sim.stall(b.native());
    sim.launch_kernel(b.native(), 2s);  // unrelated long work: no wait may be held up by it
    for (auto& o : wb) REQUIRE_FALSE(evr::on_complete(r, b, record_into(o, finished)));
    evr::event ev(sim);
    for (int i = 0; i < on_a; ++i) {
      sim.launch_kernel(a.native(), 100us);
      REQUIRE_FALSE(evr::on_complete(r, a, record_into(wa[i], finished)));
      if (i == on_a / 2) {
        ev.record(a);
        REQUIRE_FALSE(evr::on_complete(r, ev, record_into(loose, finished)));
      }
    }
    for (auto& o : wc) {
      sim.launch_kernel(c.native(), 50us);
      REQUIRE_FALSE(evr::on_complete(r, c, record_into(o, finished)));
    }
    // Device 0 runs about 62 operations before b's long kernel ends; fault at one of them.
    const auto k = std::uniform_int_distribution<std::uint64_t>(1, 55)(rng);
    CAPTURE(k);
    sim.inject_fault_after(0, k);
    fault_watch watch(sim, 0);
    const auto resumed = clock_type::now();
    sim.resume(a.native());
    sim.resume(b.native());

    const int total = on_a + on_b + on_c + 1;
    REQUIRE(wait_until([&] { return finished.load() == total; }, 10s));
    REQUIRE(wait_until([&] { return watch.seen(); }));
    CHECK(sim.fault(0) == illegal);

    // Device 0: exactly once each; on a stream, successes (work done before the fault) form a
    // prefix, and everything after is the fault; b (behind its long kernel) fails entirely.
    auto latest = clock_type::time_point{};
    int ok_a = 0;
    bool failed_seen = false, prefix = true;
    for (auto& o : wa) {
      CHECK(o.calls.load() == 1);
      CHECK((!o.ec || o.ec == illegal));
      if (o.ec)
        failed_seen = true;
      else {
        ++ok_a;
        prefix = prefix && !failed_seen;
      }
      latest = std::max(latest, o.at);
    }
    CHECK(prefix);
    for (auto& o : wb) {
      CHECK(o.calls.load() == 1);
      CHECK(o.ec == illegal);
      latest = std::max(latest, o.at);
    }
    CHECK(loose.calls.load() == 1);
    CHECK((!loose.ec || loose.ec == illegal));
    latest = std::max(latest, loose.at);
    // Promptly: a probe interval or two after the fault (the bound is generous for slow, shared
    // or sanitized machines), never after b's 2 s kernel.
    // (The watcher polls every 50 us, so the reactor may see the fault first: clamp at 0.)
    const auto latency =
        std::max(std::chrono::microseconds(0),
                 std::chrono::duration_cast<std::chrono::microseconds>(latest - watch.seen_at()));
    MESSAGE(std::string(evr::to_string(s))
            << ": fault at operation " << k << ", " << ok_a << " of " << on_a
            << " waits on the faulting stream done before it; the last wait of the device failed "
            << latency.count() << " us after the fault was seen");
    CHECK(latency < 300ms);
    CHECK(latest - resumed < 1s);  // b's kernel alone takes 2 s
    // Device 1: untouched.
    for (auto& o : wc) {
      CHECK(o.calls.load() == 1);
      CHECK_FALSE(o.ec);
    }
    if (s == evr::strategy::host_func) {
      // A wait succeeds only through its host function, so every success has one that ran. The
      // converse does not hold: a host function may run just before the fault while the reactor
      // sees the sticky fault first and fails the wait (a sticky fault fails every pending wait of
      // the device). None of b's ran (its kernel outlives the fault). (The sim counts a host
      // function just after it returns, possibly after its wait was delivered.)
      const auto succeeded = static_cast<std::uint64_t>(ok_a + on_c);
      CHECK(wait_until([&] { return sim.counters().host_funcs_run >= succeeded; }, 2s));
      std::this_thread::sleep_for(5ms);
      CHECK(sim.counters().host_funcs_run >= succeeded);
      CHECK(sim.counters().host_funcs_run <= static_cast<std::uint64_t>(on_a + on_c));
    }
    auto m = r.metrics();
    CHECK(m.device_faults == 1);
    CHECK(m.in_flight == 0);
    CHECK(m.completed + m.failed == static_cast<std::uint64_t>(total));

    // The reactor keeps serving: device 1 as before; device 0 fails at once (refused: the marker
    // cannot go onto a dead device, or accepted and failed).
    REQUIRE_FALSE(evr::on_complete(r, c, record_into(later_c, later)));
    if (std::error_code refused = evr::on_complete(r, a, record_into(later_a, later))) {
      CHECK(refused == illegal);
      later_a.calls = 1;
      later_a.ec = refused;
      ++later;
    }
    REQUIRE(wait_until([&] { return later.load() == 2; }));
    CHECK_FALSE(later_c.ec);
    CHECK(later_a.ec == illegal);
  }
}

TEST_CASE(
    "sim fault: host_func learns of a fault from the probe, although no host function runs after "
    "it") {
  const std::error_code fault = evr::make_cuda_error(evr::cuda_value::launch_failure);
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::threaded});
  auto opts = evr::test::quick_options(evr::strategy::host_func);
  opts.fault_probe_interval = 30ms;  // the only way to learn of the fault: the reactor sleeps
  // Before the reactor: its destructor completes pending waits into these.
  constexpr int n = 25;
  std::vector<outcome> w(n);
  std::atomic<int> finished{0};
  evr::reactor r(sim, opts);
  evr::stream st(sim, 0);
  sim.launch_kernel(st.native(), 5ms);
  sim.launch_faulting_kernel(st.native(), fault);
  for (auto& o : w) REQUIRE_FALSE(evr::on_complete(r, st, record_into(o, finished)));
  fault_watch watch(sim, 0);
  REQUIRE(wait_until([&] { return finished.load() == n; }, 10s));
  REQUIRE(wait_until([&] { return watch.seen(); }));
  const auto latency = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::max_element(w.begin(), w.end(),
                       [](const outcome& x, const outcome& y) { return x.at < y.at; })
          ->at -
      watch.seen_at());
  MESSAGE("host_func, probe every 30 ms: every wait failed " << latency.count()
                                                             << " ms after the fault");
  for (auto& o : w) {
    CHECK(o.calls.load() == 1);
    CHECK(o.ec == fault);  // a non-default sticky error is passed on as it is
  }
  CHECK(latency < 30ms + 250ms);  // within a probe interval (plus a generous scheduling margin)
  const auto c = sim.counters();
  CHECK(c.host_funcs_launched == static_cast<std::uint64_t>(n));
  CHECK(c.host_funcs_run == 0);
  CHECK(r.metrics().device_faults == 1);
}

TEST_CASE(
    "sim stall: a stalled stream holds only its own waits; resume() completes them in order") {
  for (evr::strategy s : evr::test::all_strategies) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(evr::sim::options{.devices = 2, .mode = evr::sim::run_mode::threaded});
    // Before the reactor: its destructor completes pending waits into these.
    std::atomic<int> held_done{0}, others_done{0}, errors{0};
    std::mutex order_mutex;
    std::vector<int> held_order;
    evr::reactor r(sim, quick_options(s));
    evr::stream held(sim, 0), busy0(sim, 0), busy1(sim, 1);

    sim.launch_kernel(held.native(), 50us);
    sim.stall(held.native());
    constexpr int held_waits = 10, busy_waits = 100;
    for (int i = 0; i < held_waits; ++i) {
      REQUIRE_FALSE(evr::on_complete(r, held, [&, i](std::error_code ec) {
        if (ec) ++errors;
        std::lock_guard lock(order_mutex);
        held_order.push_back(i);
        ++held_done;
      }));
    }
    evr::event held_event(sim), busy_event(sim);
    held_event.record(held);
    REQUIRE_FALSE(evr::on_complete(r, held_event, [&](std::error_code ec) {
      if (ec) ++errors;
      ++held_done;
    }));
    // Waits on the other streams, submitted after the held ones, complete meanwhile.
    for (int i = 0; i < busy_waits; ++i) {
      evr::stream& st = i % 2 ? busy1 : busy0;
      sim.launch_kernel(st.native(), 20us);
      REQUIRE_FALSE(evr::on_complete(r, st, [&](std::error_code ec) {
        if (ec) ++errors;
        ++others_done;
      }));
    }
    busy_event.record(busy0);
    REQUIRE_FALSE(evr::on_complete(r, busy_event, [&](std::error_code ec) {
      if (ec) ++errors;
      ++others_done;
    }));
    REQUIRE(wait_until([&] { return others_done.load() == busy_waits + 1; }, 10s));
    std::this_thread::sleep_for(30ms);  // many sweeps and probes (and, adaptive, a doorbell)
    CHECK(held_done.load() == 0);
    CHECK(r.metrics().in_flight == static_cast<std::uint64_t>(held_waits + 1));

    sim.resume(held.native());
    REQUIRE(wait_until([&] { return held_done.load() == held_waits + 1; }, 10s));
    CHECK(errors.load() == 0);
    std::vector<int> expected(held_waits);
    for (int i = 0; i < held_waits; ++i) expected[i] = i;
    {
      std::lock_guard lock(order_mutex);
      CHECK(held_order == expected);
    }
    CHECK(r.metrics().in_flight == 0);
    CHECK(r.metrics().failed == 0);
  }
}

TEST_CASE(
    "sim stall: a stalled stream at stop(): its waits are aborted exactly once, the others "
    "completed") {
  for (evr::strategy s : evr::test::all_strategies) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::threaded});
    auto opts = quick_options(s);
    opts.shutdown_drain = 20ms;
    evr::stream held(sim, 0), free_stream(sim, 0);
    constexpr int n = 50;
    std::vector<outcome> held_w(n), free_w(n);
    std::atomic<int> finished{0};
    std::uint64_t out_after_stop = 0;
    {
      evr::reactor r(sim, opts);
      sim.stall(held.native());
      for (int i = 0; i < n; ++i) {
        REQUIRE_FALSE(evr::on_complete(r, held, record_into(held_w[i], finished)));
        REQUIRE_FALSE(evr::on_complete(r, free_stream, record_into(free_w[i], finished)));
      }
      REQUIRE(wait_until([&] { return finished.load() == n; }));
      r.stop();  // returns once every wait has completed
      CHECK(finished.load() == 2 * n);
      out_after_stop = r.pools().stats().in_use;
      CHECK(r.metrics().cancelled == static_cast<std::uint64_t>(n));
    }
    for (int i = 0; i < n; ++i) {
      CHECK(held_w[i].calls.load() == 1);
      CHECK(held_w[i].ec == evr::errc::operation_aborted);
      CHECK(free_w[i].calls.load() == 1);
      CHECK_FALSE(free_w[i].ec);
    }
    // poll: the held markers were never returned to the pool (the GPU is not past them); they
    // were destroyed with the reactor instead.
    CHECK(out_after_stop == (s == evr::strategy::poll ? static_cast<std::uint64_t>(n) : 0));
    const auto c = sim.counters();
    CHECK(c.events_created == c.events_destroyed);
    sim.resume(held.native());
    sim.wait_idle();
  }
}
