// bench/throughput_drains.cpp — `evr-bench throughput` at the GPU's pace: sustained submission
// and the burst drain, for each evr strategy and two poller baselines; and how deep a stream's
// queue of markers may get before the enqueue blocks (which sizes the burst's rounds).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <evr/evr.hpp>

#include "stats.hpp"
#include "throughput.hpp"

#if defined(__linux__)
#include <time.h>
#endif

namespace evr::bench {
namespace {

/// This thread's CPU time (ns; 0 where unsupported). File-local: idle_lanes.hpp's
/// evr::bench::thread_cpu_ns returns an int64 under the same mangled name, and the two were one
/// symbol to the linker (an ODR violation: a call not inlined could take the other definition).
double this_thread_cpu_ns() {
#if defined(__linux__)
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
#else
  return 0;
#endif
}

}  // namespace

void wait_counting(reactor& r, const evr::stream& s, std::atomic<std::uint64_t>& done) {
  evr::throw_if(
      on_complete(r, s, [&done](std::error_code) { done.fetch_add(1, std::memory_order_release); }),
      "on_complete");
}

namespace {

/// A mutex-guarded pool and a poller thread: the baselines' shared machinery.
class baseline_poller {
 public:
  enum class kind { every_event, head_per_stream };
  baseline_poller(device::backend& be, kind k, int streams) : be_(be), kind_(k), queues_(streams) {
    thread_ = std::thread([this] { loop(); });
  }
  ~baseline_poller() {
    stop_ = true;
    thread_.join();
    for (auto e : free_) be_.destroy_event(e);
  }
  static const char* name(kind k) {
    return k == kind::every_event ? "poller: every event every pass"
                                  : "poller: head per stream + 10 us sleep";
  }
  void submit(int stream_index, device::native_stream s) {
    device::native_event e = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!free_.empty()) {
        e = free_.back();
        free_.pop_back();
      }
    }
    if (e == nullptr) evr::throw_if(be_.create_event(0, device::event_flags::none, e), "create");
    evr::throw_if(be_.record_event(e, s), "record");
    std::lock_guard<std::mutex> lock(mutex_);
    if (kind_ == kind::every_event)
      all_.push_back(e);
    else
      queues_[stream_index].push_back(e);
  }
  std::uint64_t completed() const { return completed_.load(std::memory_order_acquire); }
  double cpu_ns() const { return cpu_ns_.load(std::memory_order_acquire); }

 private:
  void loop() {
    const double start = this_thread_cpu_ns();
    while (!stop_.load(std::memory_order_relaxed)) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (kind_ == kind::every_event) {
          look_at_every_event();
        } else {
          look_at_heads();
        }
      }
      cpu_ns_.store(this_thread_cpu_ns() - start, std::memory_order_release);
      if (kind_ == kind::head_per_stream)
        std::this_thread::sleep_for(std::chrono::microseconds(10));
    }
  }
  void look_at_every_event() {
    for (std::size_t i = 0; i < all_.size();) {
      if (!be_.query_event(all_[i])) {
        free_.push_back(all_[i]);
        all_[i] = all_.back();
        all_.pop_back();
        completed_.fetch_add(1, std::memory_order_release);
      } else {
        ++i;
      }
    }
  }
  void look_at_heads() {
    for (auto& q : queues_) {
      std::size_t n = 0;
      while (n < q.size() && !be_.query_event(q[n])) ++n;
      for (std::size_t i = 0; i < n; ++i) free_.push_back(q[i]);
      q.erase(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(n));
      completed_.fetch_add(n, std::memory_order_release);
    }
  }
  device::backend& be_;
  kind kind_;
  std::mutex mutex_;
  std::vector<device::native_event> free_, all_;
  std::vector<std::vector<device::native_event>> queues_;
  std::atomic<std::uint64_t> completed_{0};
  std::atomic<double> cpu_ns_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

constexpr baseline_poller::kind baseline_kinds[] = {baseline_poller::kind::every_event,
                                                    baseline_poller::kind::head_per_stream};
constexpr strategy all_strategies[] = {strategy::fence, strategy::poll, strategy::adaptive,
                                       strategy::host_func};

/// Submits cfg.ops (tiny kernel + wait) from cfg.threads threads; `wait` enqueues one wait.
/// Returns the seconds until `done()` counted them all.
double drive(const tp_run& run, const std::function<void(int)>& wait,
             const std::function<std::uint64_t()>& done) {
  const tp_settings& cfg = run.cfg;
  const auto t0 = bench_clock::now();
  std::vector<std::thread> ts;
  for (int t = 0; t < cfg.threads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = t; i < cfg.ops; i += cfg.threads) {
        const int s = i % cfg.streams;
        run.dev.launch_tiny(run.streams[s].native());
        wait(s);
      }
    });
  }
  for (auto& t : ts) t.join();
  while (done() < static_cast<std::uint64_t>(cfg.ops)) std::this_thread::yield();
  return std::chrono::duration<double>(bench_clock::now() - t0).count();
}

tp_row sustained_row(std::string name, double seconds, double cpu_ns, int ops) {
  tp_row row;
  row.name = std::move(name);
  row.seconds = seconds;
  row.per_second = ops / row.seconds;
  row.poller_cpu_ns_per_completion = cpu_ns / ops;
  std::fprintf(stderr, "  %-40s %10.0f completions/s  %8.1f ns CPU each\n", row.name.c_str(),
               row.per_second, row.poller_cpu_ns_per_completion);
  return row;
}

int queue_depth(const tp_run& run, bool fences) {
  device::backend& be = run.be;
  evr::stream s(be, 0);
  device::fence_block fb;
  evr::throw_if(be.allocate_fence_block(0, 1, fb), "allocate fence");
  std::vector<device::native_event> evs;
  run.dev.close_gate();
  run.dev.launch_gate(s.native(), false);
  std::atomic<int> count{0};
  std::atomic<bool> stop{false};
  std::thread w([&] {
    for (int i = 1; i <= 8192 && !stop.load(); ++i) {
      if (fences) {
        evr::throw_if(be.write_fence(s.native(), fb.device_word(0), static_cast<std::uint64_t>(i)),
                      "fence");
      } else {
        device::native_event e = nullptr;
        evr::throw_if(be.create_event(0, device::event_flags::none, e), "create");
        evs.push_back(e);
        evr::throw_if(be.record_event(e, s.native()), "record");
      }
      count.store(i);
    }
  });
  int last = -1;
  for (int i = 0; i < 100 && count.load() != last; ++i) {  // until it stops growing
    last = count.load();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const int depth = count.load();
  stop = true;
  run.dev.open_gate();
  w.join();
  evr::throw_if(be.synchronize_stream(s.native()), "synchronize");
  for (auto e : evs) be.destroy_event(e);
  be.free_fence_block(fb);
  return depth;
}

/// The burst drain of one method: every wait submitted behind closed gates, then the gates open
/// at once. The reactor's CPU from the opening to the last completion, per completion, is its
/// cost of retiring and delivering (no idle spinning between sparse completions is counted).
class burst_runner {
 public:
  burst_runner(const tp_run& run, int per_stream_round) : run_(run) {
    // Rounds of at most half the measured queue depth per stream (and 128): a stream's queue
    // holds only so many markers behind a kernel that does not finish.
    per_round_ = std::min(run.cfg.ops, run.cfg.streams * per_stream_round);
  }
  struct method {
    std::function<void(int)> wait;
    std::function<std::uint64_t()> accepted, done;
    std::function<double()> cpu_ns;
    std::function<reactor_metrics()> metrics;  // evr rows only
  };
  tp_row drain(const std::string& name, const method& m);

 private:
  struct totals {
    double seconds = 0, cpu = 0, busy = 0, asked = 0;
  };
  /// One round of `n` waits; false when the submission blocked behind the closed gates.
  bool round(const std::string& name, const method& m, int n, std::uint64_t& accepted,
             std::uint64_t& done, totals& t);
  const tp_run& run_;
  int per_round_ = 0;
};

bool burst_runner::round(const std::string& name, const method& m, int n, std::uint64_t& accepted,
                         std::uint64_t& done, totals& t) {
  const tp_settings& cfg = run_.cfg;
  std::atomic<bool> blocked{false};
  run_.dev.close_gate();
  for (auto& st : run_.streams) run_.dev.launch_gate(st.native(), false);
  std::atomic<bool> submitted{false};
  std::thread watchdog([&] {
    // A stream's queue may be too short for all the markers: never leave the gate shut.
    for (int i = 0; i < 200 && !submitted.load(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!submitted.load()) {
      std::fprintf(stderr,
                   "  %s: enqueue blocked behind the closed gates; opening them (row invalid)\n",
                   name.c_str());
      blocked = true;
      run_.dev.open_gate();
    }
  });
  std::vector<std::thread> ts;
  for (int t = 0; t < cfg.threads; ++t)
    ts.emplace_back([&, t] {
      for (int i = t; i < n; i += cfg.threads) m.wait(i % cfg.streams);
    });
  for (auto& th : ts) th.join();
  submitted = true;
  watchdog.join();
  accepted += static_cast<std::uint64_t>(n);
  done += static_cast<std::uint64_t>(n);
  while (m.accepted() < accepted) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const double c0 = m.cpu_ns();
  const reactor_metrics m0 = m.metrics ? m.metrics() : reactor_metrics{};
  const auto t0 = bench_clock::now();
  run_.dev.open_gate();
  while (m.done() < done) std::this_thread::yield();
  t.seconds += std::chrono::duration<double>(bench_clock::now() - t0).count();
  t.cpu += m.cpu_ns() - c0;
  if (m.metrics) {
    const reactor_metrics m1 = m.metrics();
    t.busy += static_cast<double>((m1.busy_time - m0.busy_time).count());
    t.asked += static_cast<double>(m1.event_queries - m0.event_queries);
  }
  for (auto& st : run_.streams)
    evr::throw_if(run_.be.synchronize_stream(st.native()), "synchronize");
  return !blocked;
}

tp_row burst_runner::drain(const std::string& name, const method& m) {
  const int ops = run_.cfg.ops;
  totals t;
  bool blocked = false;
  std::uint64_t accepted = m.accepted(), done = m.done();
  for (int round_start = 0; round_start < ops && !blocked; round_start += per_round_)
    blocked = !round(name, m, std::min(per_round_, ops - round_start), accepted, done, t);
  tp_row row;
  row.name = name;
  row.seconds = t.seconds;
  row.per_second = ops / row.seconds;
  row.poller_cpu_ns_per_completion = t.cpu / ops;
  if (m.metrics) {
    row.busy_ns_per_completion = t.busy / ops;
    row.queries_per_completion = t.asked / ops;
  }
  if (blocked) {
    // The submitting threads could not enqueue the waits while the gates were shut (for the
    // "every event every pass" poller: its pass holds the lock for O(in flight) queries).
    row.name += " [invalid: submission blocked]";
    row.per_second = 0;
    row.poller_cpu_ns_per_completion = 0;
  }
  std::fprintf(stderr, "  drain %-34s %10.0f completions/s  %8.1f ns CPU each, %.1f ns busy\n",
               name.c_str(), row.per_second, row.poller_cpu_ns_per_completion,
               row.busy_ns_per_completion);
  return row;
}

tp_row drain_evr(const tp_run& run, burst_runner& runner, const std::string& name,
                 const reactor_options& opts) {
  reactor r(run.be, opts);
  std::atomic<std::uint64_t> done{0};
  return runner.drain(
      name,
      {[&](int s) { wait_counting(r, run.streams[s], done); },
       [&] { return r.metrics().submitted; }, [&] { return done.load(std::memory_order_acquire); },
       [&] { return static_cast<double>(r.cpu_time().count()); }, [&] { return r.metrics(); }});
}

tp_row drain_baseline(const tp_run& run, burst_runner& runner, baseline_poller::kind k) {
  baseline_poller poller(run.be, k, run.cfg.streams);
  std::atomic<std::uint64_t> submitted{0};
  return runner.drain(baseline_poller::name(k),
                      {[&](int s) {
                         poller.submit(s, run.streams[s].native());
                         submitted.fetch_add(1);
                       },
                       [&] { return submitted.load(); }, [&] { return poller.completed(); },
                       [&] { return poller.cpu_ns(); }, nullptr});
}

}  // namespace

std::vector<tp_row> measure_sustained(const tp_run& run) {
  std::vector<tp_row> rows;
  const int ops = run.cfg.ops;
  for (strategy strat : all_strategies) {
    reactor r(run.be, run.evr_options(strat));
    std::atomic<std::uint64_t> done{0};
    const auto cpu0 = r.cpu_time();
    const double seconds = drive(
        run, [&](int s) { wait_counting(r, run.streams[s], done); },
        [&] { return done.load(std::memory_order_acquire); });
    rows.push_back(sustained_row(std::string("evr ") + to_string(strat), seconds,
                                 static_cast<double>((r.cpu_time() - cpu0).count()), ops));
  }
  for (auto k : baseline_kinds) {
    baseline_poller poller(run.be, k, run.cfg.streams);
    const double seconds = drive(
        run, [&](int s) { poller.submit(s, run.streams[s].native()); },
        [&] { return poller.completed(); });
    rows.push_back(sustained_row(baseline_poller::name(k), seconds, poller.cpu_ns(), ops));
  }
  return rows;
}

queue_depths measure_queue_depths(const tp_run& run) {
  queue_depths d;
  d.fence = queue_depth(run, true);
  d.record = queue_depth(run, false);
  std::fprintf(stderr,
               "  markers queued behind an unfinished kernel before the enqueue blocks: %d fence "
               "writes, %d event records (8192: no limit found)\n",
               d.fence, d.record);
  return d;
}

burst_drain measure_burst_drain(const tp_run& run, const queue_depths& depths) {
  burst_drain out;
  // The limit seen on the H100 (about 1000 fence writes) is not per stream: 128 per stream on
  // 64 streams blocked too. Keep a round's total under half of it.
  const int depth = std::min(depths.fence, depths.record);
  out.per_stream_round = std::max(1, std::min(128, depth / 2 / run.cfg.streams));
  burst_runner runner(run, out.per_stream_round);
  for (strategy strat : all_strategies)
    out.rows.push_back(
        drain_evr(run, runner, std::string("evr ") + to_string(strat), run.evr_options(strat)));
  for (auto k : baseline_kinds) out.rows.push_back(drain_baseline(run, runner, k));
  // Batching under load: the same drain with reactor_options::coalesce (rows after the baselines).
  out.first_coalesced = out.rows.size();
  if (run.cfg.coalesce_us > 0) {
    char suffix[64];
    std::snprintf(suffix, sizeof suffix, ", coalesce %.0f us", run.cfg.coalesce_us);
    for (strategy strat : {strategy::fence, strategy::poll, strategy::adaptive}) {
      reactor_options opts = run.evr_options(strat);
      opts.coalesce =
          std::chrono::nanoseconds(static_cast<std::int64_t>(run.cfg.coalesce_us * 1e3));
      out.rows.push_back(
          drain_evr(run, runner, std::string("evr ") + to_string(strat) + suffix, opts));
    }
  }
  return out;
}

}  // namespace evr::bench
