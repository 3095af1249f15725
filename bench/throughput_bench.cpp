// evr-bench throughput — S streams x N tiny operations, waits submitted from T threads:
// completions per second and reactor CPU time per completion, for each evr strategy and for two
// poller baselines; the reactor's own cost per completion when every marker is already done (the
// ready drain); then memory per in-flight wait.
// evr-bench cpu — reactor CPU use while 1000 waits sit on a 100 ms kernel, and when idle.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <asio/bind_executor.hpp>
#include <asio/post.hpp>
#include <evr/evr.hpp>

#include "bench_device.hpp"
#include "cli.hpp"
#include "cpu_case.hpp"
#include "io_thread.hpp"
#include "methods.hpp"
#include "stats.hpp"
#include "subcommands.hpp"

#if defined(__linux__)
#include <time.h>
#endif
#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace evr::bench {
namespace {

/// An executor evr does not recognize as an io_context's (a plain forwarder to one): its
/// completions are posted one by one, as every completion was before batching. The ready drain's
/// "posted one each" rows measure that baseline in the same run.
struct forwarding_executor {
  asio::io_context::executor_type inner;
  asio::execution_context& query(asio::execution::context_t) const noexcept {
    return inner.context();
  }
  static constexpr asio::execution::blocking_t::never_t query(
      asio::execution::blocking_t) noexcept {
    return {};
  }
  template <typename F>
  void execute(F&& f) const {
    asio::post(inner, std::forward<F>(f));
  }
  friend bool operator==(const forwarding_executor& a, const forwarding_executor& b) noexcept {
    return a.inner == b.inner;
  }
  friend bool operator!=(const forwarding_executor& a, const forwarding_executor& b) noexcept {
    return !(a == b);
  }
};

struct tp_settings {
  std::string device = "auto";
  int streams = 64;
  int ops = 100000;
  int threads = 4;
  int inflight_streams = 128;  // per memory row (2048 gated streams in all blocked the H100 run)
  /// Per memory row. The five rows stay pending together behind closed gates: 100 000 in all, as
  /// many as one row had when it was alone. With 100 000 per row (500 000 queued records) the
  /// H100's driver blocked the enqueuing thread in the second row until the run timed out.
  int inflight_waits = 20000;
  double coalesce_us = 100;   ///< the burst drain's extra rows with reactor_options::coalesce
  int max_fence_streams = 0;  ///< reactor_options::max_fence_streams of the evr rows (0: backend's)
  std::string json;
};

double thread_cpu_ns() {
#if defined(__linux__)
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
#else
  return 0;
#endif
}

long rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  return 0;
}

/// Bytes of heap in use (malloc's view, headers included); -1 where mallinfo2 is missing. Unlike
/// RSS it counts freed-and-reused memory right and is not rounded to pages.
long long heap_in_use() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  const struct mallinfo2 mi = mallinfo2();
  return static_cast<long long>(mi.uordblks + mi.hblkhd);  // small chunks + mapped large ones
#else
  return -1;
#endif
}

struct tp_row {
  std::string name;
  double seconds = 0;
  double per_second = 0;
  double poller_cpu_ns_per_completion = 0;
  /// evr rows of the burst drain: the reactor's busy time (metrics().busy_time) per completion:
  /// its own work, without the polling between completions. -1: not measured (baselines).
  double busy_ns_per_completion = -1;
  /// evr rows of the burst drain: event queries (driver calls) per completion. -1: not measured.
  double queries_per_completion = -1;
};

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
    const double start = thread_cpu_ns();
    while (!stop_.load(std::memory_order_relaxed)) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (kind_ == kind::every_event) {
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
        } else {
          for (auto& q : queues_) {
            std::size_t n = 0;
            while (n < q.size() && !be_.query_event(q[n])) ++n;
            for (std::size_t i = 0; i < n; ++i) free_.push_back(q[i]);
            q.erase(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(n));
            completed_.fetch_add(n, std::memory_order_release);
          }
        }
      }
      cpu_ns_.store(thread_cpu_ns() - start, std::memory_order_release);
      if (kind_ == kind::head_per_stream)
        std::this_thread::sleep_for(std::chrono::microseconds(10));
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

/// One evr wait (plain callback on the reactor thread) whose completion bumps `done`.
void wait_counting(reactor& r, const evr::stream& s, std::atomic<std::uint64_t>& done) {
  evr::throw_if(
      on_complete(r, s, [&done](std::error_code) { done.fetch_add(1, std::memory_order_release); }),
      "on_complete");
}

/// The command line of `throughput` (cpu == false) or `cpu`; returns -1 to run, else the exit
/// code.
int parse(int argc, char** argv, bool cpu, tp_settings& s) {
  CLI::App app{cpu ? "reactor CPU while waits sit on a 100 ms kernel, and when idle"
                   : "completions per second and reactor CPU per completion, sustained and in a "
                     "burst; bytes per in-flight wait",
               cpu ? "evr-bench cpu" : "evr-bench throughput"};
  add_device_option(app, s.device);
  add_json_option(app, s.json);
  if (cpu) {
    s.ops = 1000;
    app.add_option("--waits", s.ops, "waits on the long kernel")
        ->check(CLI::Range(1, 10000000))
        ->capture_default_str();
  } else {
    app.add_option("--streams", s.streams, "streams")
        ->check(CLI::Range(1, 4096))
        ->capture_default_str();
    app.add_option("--ops", s.ops, "waits per run")
        ->check(CLI::Range(1, 100000000))
        ->capture_default_str();
    app.add_option("--threads", s.threads, "submitting threads")
        ->check(CLI::Range(1, 256))
        ->capture_default_str();
    app.add_option("--inflight-streams", s.inflight_streams, "streams of the bytes-per-wait run")
        ->check(CLI::Range(1, 4096))
        ->capture_default_str();
    app.add_option("--inflight-waits", s.inflight_waits, "waits of the bytes-per-wait run")
        ->check(CLI::Range(1, 100000000))
        ->capture_default_str();
    app.add_option("--coalesce-us", s.coalesce_us,
                   "burst drain: also fence, poll and adaptive with reactor_options::coalesce of "
                   "this many us (0: no such rows)")
        ->check(CLI::Range(0.0, 100000.0))
        ->capture_default_str();
    app.add_option("--max-fence-streams", s.max_fence_streams,
                   "reactor_options::max_fence_streams of the evr rows: busy streams per device "
                   "up to which waits get fence markers, events beyond (0: the backend's number "
                   "of hardware queues; the simulated device has no limit)")
        ->check(CLI::Range(0, 4096))
        ->capture_default_str();
  }
  return parse_cli(app, argc, argv);
}

}  // namespace

int throughput_main(int argc, char** argv) {
  tp_settings cfg;
  if (int rc = parse(argc, argv, false, cfg); rc >= 0) return rc;
  auto dev = make_bench_device(cfg.device);
  device::backend& be = dev->backend();
  std::fprintf(stderr, "throughput on %s: %d streams x %d ops from %d threads\n",
               dev->describe().c_str(), cfg.streams, cfg.ops, cfg.threads);
  std::vector<evr::stream> streams;
  for (int i = 0; i < cfg.streams; ++i) streams.emplace_back(be, 0);
  std::vector<tp_row> rows;

  // Submits cfg.ops (tiny kernel + wait) from cfg.threads threads; `wait` enqueues one wait.
  auto drive = [&](const std::function<void(int)>& wait,
                   const std::function<std::uint64_t()>& done) {
    const auto t0 = bench_clock::now();
    std::vector<std::thread> ts;
    for (int t = 0; t < cfg.threads; ++t) {
      ts.emplace_back([&, t] {
        for (int i = t; i < cfg.ops; i += cfg.threads) {
          const int s = i % cfg.streams;
          dev->launch_tiny(streams[s].native());
          wait(s);
        }
      });
    }
    for (auto& t : ts) t.join();
    while (done() < static_cast<std::uint64_t>(cfg.ops)) std::this_thread::yield();
    return std::chrono::duration<double>(bench_clock::now() - t0).count();
  };

  // The evr rows' options: the strategy, and the fence-stream limit asked for.
  auto evr_options = [&](strategy strat) {
    reactor_options opts;
    opts.strategy = strat;
    opts.max_fence_streams = static_cast<std::size_t>(cfg.max_fence_streams);
    return opts;
  };
  for (strategy strat :
       {strategy::fence, strategy::poll, strategy::adaptive, strategy::host_func}) {
    reactor r(be, evr_options(strat));
    std::atomic<std::uint64_t> done{0};
    const auto cpu0 = r.cpu_time();
    tp_row row;
    row.name = std::string("evr ") + to_string(strat);
    row.seconds = drive([&](int s) { wait_counting(r, streams[s], done); },
                        [&] { return done.load(std::memory_order_acquire); });
    row.per_second = cfg.ops / row.seconds;
    row.poller_cpu_ns_per_completion = static_cast<double>((r.cpu_time() - cpu0).count()) / cfg.ops;
    std::fprintf(stderr, "  %-40s %10.0f completions/s  %8.1f ns CPU each\n", row.name.c_str(),
                 row.per_second, row.poller_cpu_ns_per_completion);
    rows.push_back(row);
  }
  for (auto k : {baseline_poller::kind::every_event, baseline_poller::kind::head_per_stream}) {
    baseline_poller poller(be, k, cfg.streams);
    tp_row row;
    row.name = k == baseline_poller::kind::every_event ? "poller: every event every pass"
                                                       : "poller: head per stream + 10 us sleep";
    row.seconds = drive([&](int s) { poller.submit(s, streams[s].native()); },
                        [&] { return poller.completed(); });
    row.per_second = cfg.ops / row.seconds;
    row.poller_cpu_ns_per_completion = poller.cpu_ns() / cfg.ops;
    std::fprintf(stderr, "  %-40s %10.0f completions/s  %8.1f ns CPU each\n", row.name.c_str(),
                 row.per_second, row.poller_cpu_ns_per_completion);
    rows.push_back(row);
  }

  // How deep a stream's queue of markers behind an unfinished kernel may get before the enqueue
  // itself blocks (the submitting thread then waits inside the driver until the stream moves).
  auto queue_depth = [&](bool fences) {
    evr::stream s(be, 0);
    device::fence_block fb;
    evr::throw_if(be.allocate_fence_block(0, 1, fb), "allocate fence");
    std::vector<device::native_event> evs;
    dev->close_gate();
    dev->launch_gate(s.native(), false);
    std::atomic<int> count{0};
    std::atomic<bool> stop{false};
    std::thread w([&] {
      for (int i = 1; i <= 8192 && !stop.load(); ++i) {
        if (fences) {
          evr::throw_if(
              be.write_fence(s.native(), fb.device_word(0), static_cast<std::uint64_t>(i)),
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
    dev->open_gate();
    w.join();
    evr::throw_if(be.synchronize_stream(s.native()), "synchronize");
    for (auto e : evs) be.destroy_event(e);
    be.free_fence_block(fb);
    return depth;
  };
  const int fence_depth = queue_depth(true);
  const int record_depth = queue_depth(false);
  std::fprintf(stderr,
               "  markers queued behind an unfinished kernel before the enqueue blocks: %d fence "
               "writes, %d event records (8192: no limit found)\n",
               fence_depth, record_depth);
  // The limit seen on the H100 (about 1000 fence writes) is not per stream: 128 per stream on
  // 64 streams blocked too. Keep a round's total under half of it.
  const int depth = std::min(fence_depth, record_depth);
  const int per_stream_round = std::max(1, std::min(128, depth / 2 / cfg.streams));

  // Burst drain: every wait submitted behind closed gates, then the gates open at once. The
  // reactor's CPU from the opening to the last completion, per completion, is its cost of
  // retiring and delivering (no idle spinning between sparse completions is counted).
  std::vector<tp_row> drain_rows;
  auto drain = [&](const std::string& name, const std::function<void(int)>& wait,
                   const std::function<std::uint64_t()>& accepted,
                   const std::function<std::uint64_t()>& done,
                   const std::function<double()>& cpu_ns,
                   const std::function<reactor_metrics()>& metrics) {  // evr rows only
    // Rounds of at most half the measured queue depth per stream (and 128): a stream's queue
    // holds only so many markers behind a kernel that does not finish.
    const int per_round = std::min(cfg.ops, cfg.streams * per_stream_round);
    double seconds = 0, cpu = 0, busy = 0, asked = 0;
    std::atomic<bool> blocked{false};
    std::uint64_t base_accepted = accepted(), base_done = done();
    for (int round_start = 0; round_start < cfg.ops; round_start += per_round) {
      const int n = std::min(per_round, cfg.ops - round_start);
      dev->close_gate();
      for (auto& st : streams) dev->launch_gate(st.native(), false);
      std::atomic<bool> submitted{false};
      std::thread watchdog([&] {
        // A stream's queue may be too short for all the markers: never leave the gate shut.
        for (int i = 0; i < 200 && !submitted.load(); ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        if (!submitted.load()) {
          std::fprintf(
              stderr, "  %s: enqueue blocked behind the closed gates; opening them (row invalid)\n",
              name.c_str());
          blocked = true;
          dev->open_gate();
        }
      });
      std::vector<std::thread> ts;
      for (int t = 0; t < cfg.threads; ++t)
        ts.emplace_back([&, t] {
          for (int i = t; i < n; i += cfg.threads) wait(i % cfg.streams);
        });
      for (auto& t : ts) t.join();
      submitted = true;
      watchdog.join();
      base_accepted += static_cast<std::uint64_t>(n);
      base_done += static_cast<std::uint64_t>(n);
      while (accepted() < base_accepted) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      const double c0 = cpu_ns();
      const reactor_metrics m0 = metrics ? metrics() : reactor_metrics{};
      const auto t0 = bench_clock::now();
      dev->open_gate();
      while (done() < base_done) std::this_thread::yield();
      seconds += std::chrono::duration<double>(bench_clock::now() - t0).count();
      cpu += cpu_ns() - c0;
      if (metrics) {
        const reactor_metrics m1 = metrics();
        busy += static_cast<double>((m1.busy_time - m0.busy_time).count());
        asked += static_cast<double>(m1.event_queries - m0.event_queries);
      }
      for (auto& st : streams) evr::throw_if(be.synchronize_stream(st.native()), "synchronize");
      if (blocked) break;  // the row is invalid: do not wait out every round
    }
    tp_row row;
    row.name = name;
    row.seconds = seconds;
    row.per_second = cfg.ops / row.seconds;
    row.poller_cpu_ns_per_completion = cpu / cfg.ops;
    if (metrics) {
      row.busy_ns_per_completion = busy / cfg.ops;
      row.queries_per_completion = asked / cfg.ops;
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
    drain_rows.push_back(row);
  };
  auto drain_evr = [&](const std::string& name, const reactor_options& opts) {
    reactor r(be, opts);
    std::atomic<std::uint64_t> done{0};
    drain(
        name, [&](int s) { wait_counting(r, streams[s], done); },
        [&] { return r.metrics().submitted; }, [&] { return done.load(std::memory_order_acquire); },
        [&] { return static_cast<double>(r.cpu_time().count()); }, [&] { return r.metrics(); });
  };
  for (strategy strat :
       {strategy::fence, strategy::poll, strategy::adaptive, strategy::host_func}) {
    drain_evr(std::string("evr ") + to_string(strat), evr_options(strat));
  }
  for (auto k : {baseline_poller::kind::every_event, baseline_poller::kind::head_per_stream}) {
    baseline_poller poller(be, k, cfg.streams);
    std::atomic<std::uint64_t> submitted{0};
    drain(
        k == baseline_poller::kind::every_event ? "poller: every event every pass"
                                                : "poller: head per stream + 10 us sleep",
        [&](int s) {
          poller.submit(s, streams[s].native());
          submitted.fetch_add(1);
        },
        [&] { return submitted.load(); }, [&] { return poller.completed(); },
        [&] { return poller.cpu_ns(); }, nullptr);
  }
  // Batching under load: the same drain with reactor_options::coalesce (rows after the baselines).
  const std::size_t first_coalesced = drain_rows.size();
  if (cfg.coalesce_us > 0) {
    char suffix[64];
    std::snprintf(suffix, sizeof suffix, ", coalesce %.0f us", cfg.coalesce_us);
    for (strategy strat : {strategy::fence, strategy::poll, strategy::adaptive}) {
      reactor_options opts = evr_options(strat);
      opts.coalesce = std::chrono::nanoseconds(static_cast<std::int64_t>(cfg.coalesce_us * 1e3));
      drain_evr(std::string("evr ") + to_string(strat) + suffix, opts);
    }
  }

  // Ready drain: the reactor's own cost per completion, with the GPU out of the way. In the burst
  // drain the GPU completes a round's markers one every ~1 us, and the reactor, keeping up, is
  // awake for the whole drain: its CPU per completion is the GPU's pace, not its own work. Here
  // the reactor is held (an inline handler blocks its thread), the waits are submitted on idle
  // streams and the GPU finishes every marker, then the reactor is released: its CPU from the
  // release to the last completion is taking the submissions, one sweep that retires each
  // stream's run of done markers (one fence read, or two event queries), delivery, and the
  // markers' return to their pools. Rounds of 1024 waits on 64 streams (event markers) or 480 on
  // 8 (fence markers: a device takes at most max_pending_fences, 512), after a warm-up round.
  struct ready_row {
    std::string name;
    int streams = 0, waits = 0;
    double cpu_ns_per_completion = 0, queries_per_completion = 0, completions_per_second = 0;
  };
  std::vector<ready_row> ready_rows;
  struct reactor_hold {  // what the holding handler blocks on (no CPU while it does)
    std::mutex m;
    std::condition_variable cv;
    bool held = false, released = false;
  };
  // How the ready drain's completions are delivered: inline on the reactor thread; posted to an
  // io_context (one post per batch); or posted through an executor evr does not recognize (a
  // plain forwarder to the same io_context: one post per completion, as before batching).
  enum class ready_delivery { inline_on_reactor, posted, posted_one_each };
  auto ready_drain = [&](const std::string& name, const reactor_options& opts, int nstreams,
                         int per_stream, int rounds, ready_delivery how) {
    const bool posted = how != ready_delivery::inline_on_reactor;
    reactor r(be, opts);
    std::vector<evr::stream> ss;
    for (int i = 0; i < nstreams; ++i) ss.emplace_back(be, 0);
    evr::stream holder(be, 0);
    std::unique_ptr<io_thread> io;
    std::unique_ptr<gpu_waiter> waiter;
    if (posted) {
      io = std::make_unique<io_thread>();
      waiter = std::make_unique<gpu_waiter>(io->io().get_executor(), r);
    }
    std::atomic<std::uint64_t> done{0};  // posted: counted by the io_context's thread
    struct {
      alignas(64) std::uint64_t count = 0;  // inline: the reactor thread's alone
      alignas(64) std::atomic<std::uint64_t> reached{0};
    } reactor_side;
    double cpu = 0, queries = 0, seconds = 0;
    const int n = nstreams * per_stream;
    // Round 0 warms the pools and tables (its figures are not counted): a steady state.
    for (int round = 0; round <= rounds; ++round) {
      auto hold = std::make_shared<reactor_hold>();
      evr::throw_if(on_complete(r, holder,
                                [hold](std::error_code) {
                                  std::unique_lock<std::mutex> l(hold->m);
                                  hold->held = true;
                                  hold->cv.notify_all();
                                  hold->cv.wait(l, [&] { return hold->released; });
                                }),
                    "on_complete");
      {
        std::unique_lock<std::mutex> l(hold->m);
        hold->cv.wait(l, [&] { return hold->held; });
      }
      const std::uint64_t target =
          (posted ? done.load() : reactor_side.count) + static_cast<std::uint64_t>(n);
      for (int i = 0; i < per_stream; ++i) {
        for (int k = 0; k < nstreams; ++k) {
          if (posted) {
            auto count = [&done](std::error_code) { done.fetch_add(1, std::memory_order_release); };
            if (how == ready_delivery::posted_one_each) {
              waiter->async_wait(
                  ss[static_cast<std::size_t>(k)],
                  asio::bind_executor(forwarding_executor{io->io().get_executor()}, count));
            } else {
              waiter->async_wait(ss[static_cast<std::size_t>(k)], count);
            }
          } else {
            // Counted on the reactor's own cache line; the waiting thread reads another one,
            // written once per round (a shared counter bounced between the two cores on every
            // completion, and the row measured that instead of the reactor).
            evr::throw_if(on_complete(r, ss[static_cast<std::size_t>(k)],
                                      [&reactor_side, target](std::error_code) {
                                        if (++reactor_side.count == target)
                                          reactor_side.reached.store(target,
                                                                     std::memory_order_release);
                                      }),
                          "on_complete");
          }
        }
      }
      for (auto& st : ss) evr::throw_if(be.synchronize_stream(st.native()), "synchronize");
      const double c0 = static_cast<double>(r.cpu_time().count());
      const reactor_metrics m0 = r.metrics();
      const auto t0 = bench_clock::now();
      {
        std::lock_guard<std::mutex> l(hold->m);
        hold->released = true;
      }
      hold->cv.notify_all();
      if (posted) {
        while (done.load(std::memory_order_acquire) < target) std::this_thread::yield();
      } else {
        while (reactor_side.reached.load(std::memory_order_acquire) < target)
          std::this_thread::yield();
      }
      if (round == 0) continue;
      seconds += std::chrono::duration<double>(bench_clock::now() - t0).count();
      cpu += static_cast<double>(r.cpu_time().count()) - c0;
      queries += static_cast<double>(r.metrics().event_queries - m0.event_queries);
    }
    const double total = static_cast<double>(n) * rounds;
    ready_row row{name, nstreams, n, cpu / total, queries / total, total / seconds};
    std::fprintf(stderr,
                 "  ready %-44s %10.0f completions/s  %8.1f ns reactor CPU each, %.3f queries "
                 "each\n",
                 name.c_str(), row.completions_per_second, row.cpu_ns_per_completion,
                 row.queries_per_completion);
    ready_rows.push_back(row);
  };
  {
    // Rounds of 16 waits per stream (1024 on 64 streams) for events; 480 fences on 8 streams.
    const int per_stream = 16;
    const int rounds = std::max(1, cfg.ops / 4 / (cfg.streams * per_stream));
    const int fence_streams = std::min(cfg.streams, 8);
    const int fence_per_stream = 480 / fence_streams;
    const int fence_rounds = std::max(1, cfg.ops / 4 / (fence_streams * fence_per_stream));
    reactor_options fence_opts = evr_options(strategy::fence);
    if (fence_opts.max_fence_streams == 0 || fence_opts.max_fence_streams > 8)
      fence_opts.max_fence_streams = 8;
    using rd = ready_delivery;
    ready_drain("evr fence (fence words), inline", fence_opts, fence_streams, fence_per_stream,
                fence_rounds, rd::inline_on_reactor);
    ready_drain("evr fence (fence words), posted", fence_opts, fence_streams, fence_per_stream,
                fence_rounds, rd::posted);
    ready_drain("evr fence (fence words), posted one each", fence_opts, fence_streams,
                fence_per_stream, fence_rounds, rd::posted_one_each);
    ready_drain("evr poll (events), inline", evr_options(strategy::poll), cfg.streams, per_stream,
                rounds, rd::inline_on_reactor);
    ready_drain("evr poll (events), posted", evr_options(strategy::poll), cfg.streams, per_stream,
                rounds, rd::posted);
    ready_drain("evr poll (events), posted one each", evr_options(strategy::poll), cfg.streams,
                per_stream, rounds, rd::posted_one_each);
    ready_drain("evr adaptive, inline", evr_options(strategy::adaptive), cfg.streams, per_stream,
                rounds, rd::inline_on_reactor);
  }

  // Memory per in-flight wait: many waits pending behind closed gates, with the poll strategy
  // (an event per wait). Rows, each on streams of its own and all pending together until the end
  // (freed memory would be reused by the next row and hide its cost): the device's own share
  // measured alone (an event created and recorded per wait, no evr), evr's plain callbacks,
  // gpu_waiter posting to an io_context (a one-pointer handler each; two executor types), and
  // the device alone again. What evr adds is the difference to the device alone.
  struct memory_row {
    std::string name;
    double rss_bytes = 0, heap_bytes = -1;  // per in-flight wait; heap -1: no mallinfo2
  };
  std::vector<memory_row> memory_rows;
  {
    const int n = cfg.inflight_waits;
    // Every row's streams and reactors exist before the first gate kernel is launched: on the
    // H100, creating them while other streams' gate kernels were held closed blocked the run
    // (the first version of these rows never finished there).
    auto make_streams = [&] {
      std::vector<evr::stream> ss;
      for (int i = 0; i < cfg.inflight_streams; ++i) ss.emplace_back(be, 0);
      return ss;
    };
    // Measures RSS and heap around `submit(i)` for i in [0, n), once `settled()` (everything
    // submitted taken in).
    auto measure = [&](const std::string& name, auto&& submit, auto&& settled) {
      const long before = rss_kib();
      const long long heap_before = heap_in_use();
      for (int i = 0; i < n; ++i) submit(i);
      while (!settled()) std::this_thread::yield();
      const long after = rss_kib();
      const long long heap_after = heap_in_use();
      memory_row row{name, static_cast<double>(after - before) * 1024.0 / n, -1};
      if (heap_before >= 0 && heap_after >= 0)
        row.heap_bytes = static_cast<double>(heap_after - heap_before) / n;
      std::fprintf(stderr, "  memory %-40s RSS %6.0f B, heap %6.0f B per in-flight wait\n",
                   name.c_str(), row.rss_bytes, row.heap_bytes);
      memory_rows.push_back(row);
    };
    reactor_options opts;
    opts.strategy = strategy::poll;
    const auto total = static_cast<std::uint64_t>(n);

    // The device's own share, measured first and last (a device's tables that grow by doubling
    // charge their growth to whichever row crosses the boundary: the two bracket it).
    std::vector<std::vector<evr::stream>> raw_streams;
    raw_streams.push_back(make_streams());
    raw_streams.push_back(make_streams());
    std::vector<std::vector<evr::device::native_event>> raw_events(
        2, std::vector<evr::device::native_event>(static_cast<std::size_t>(n)));
    std::vector<evr::stream> cb_streams = make_streams();
    reactor cb_reactor(be, opts);
    // gpu_waiter, a one-pointer handler, posting to an io_context whose handlers run on this
    // thread (io.run() once the gates open): the operations' memory goes back to this thread's
    // recycling cache, as in a server's steady state. With the io_context's own executor type,
    // and with the default any_io_executor.
    struct one_pointer_handler {
      std::uint64_t* done;
      void operator()(evr::asio_error_code) const { ++*done; }
    };
    asio::io_context io;
    std::uint64_t waiter_done = 0;
    std::vector<evr::stream> io_waiter_streams = make_streams();
    std::vector<evr::stream> any_waiter_streams = make_streams();
    reactor io_waiter_reactor(be, opts);
    reactor any_waiter_reactor(be, opts);
    basic_gpu_waiter<asio::io_context::executor_type> io_waiter(io.get_executor(),
                                                                io_waiter_reactor);
    gpu_waiter any_waiter(io.get_executor(), any_waiter_reactor);

    dev->close_gate();
    for (auto* ss :
         {&raw_streams[0], &raw_streams[1], &cb_streams, &io_waiter_streams, &any_waiter_streams}) {
      for (auto& st : *ss) dev->launch_gate(st.native(), false);
    }

    auto measure_device_alone = [&](const std::string& name, std::size_t k) {
      auto& ss = raw_streams[k];
      auto& evs = raw_events[k];
      measure(
          name + " (event created + recorded)",
          [&](int i) {
            auto& e = evs[static_cast<std::size_t>(i)];
            evr::throw_if(be.create_event(0, evr::device::event_flags::none, e), "create_event");
            evr::throw_if(be.record_event(e, ss[static_cast<std::size_t>(i) % ss.size()].native()),
                          "record_event");
          },
          [] { return true; });
    };
    measure_device_alone("device alone, before", 0);

    std::atomic<std::uint64_t> cb_done{0};
    auto cb = [&cb_done](std::error_code) { cb_done.fetch_add(1); };
    measure(
        "evr on_complete",
        [&](int i) {
          evr::throw_if(
              on_complete(cb_reactor, cb_streams[static_cast<std::size_t>(i) % cb_streams.size()],
                          cb),
              "on_complete");
        },
        [&] { return cb_reactor.metrics().submitted >= total; });

    auto measure_waiter = [&](const std::string& name, auto& waiter, reactor& r,
                              std::vector<evr::stream>& ss) {
      measure(
          name,
          [&](int i) {
            waiter.async_wait(ss[static_cast<std::size_t>(i) % ss.size()],
                              one_pointer_handler{&waiter_done});
          },
          [&] { return r.metrics().submitted >= total; });
    };
    measure_waiter("evr gpu_waiter (io_context executor)", io_waiter, io_waiter_reactor,
                   io_waiter_streams);
    measure_waiter("evr gpu_waiter (any_io_executor)", any_waiter, any_waiter_reactor,
                   any_waiter_streams);

    measure_device_alone("device alone, after", 1);

    dev->open_gate();
    for (auto& ss : raw_streams) {
      for (auto& st : ss) evr::throw_if(be.synchronize_stream(st.native()), "synchronize");
    }
    for (auto& evs : raw_events) {
      for (auto e : evs) be.destroy_event(e);
    }
    while (cb_done.load() < total) std::this_thread::yield();
    while (waiter_done < 2 * total) {
      io.restart();
      io.run_for(std::chrono::milliseconds(10));
    }
  }
  std::printf("\nthroughput: %d streams x %d ops, %d submitting threads (%s)\n", cfg.streams,
              cfg.ops, cfg.threads, dev->describe().c_str());
  std::printf("%-42s %14s %22s\n", "method", "completions/s", "poller CPU ns/completion");
  for (auto& r : rows)
    std::printf("%-42s %14.0f %22.1f\n", r.name.c_str(), r.per_second,
                r.poller_cpu_ns_per_completion);
  std::printf(
      "\nmarkers queued behind an unfinished kernel before the enqueue blocks: %d fence writes, "
      "%d event records (8192: no limit found)\n",
      fence_depth, record_depth);
  std::printf(
      "burst drain: %d waits on %d streams submitted behind closed gates (rounds of %d per "
      "stream), then released at once\n",
      cfg.ops, cfg.streams, per_stream_round);
  std::printf("%-42s %14s %22s %22s %14s\n", "method", "completions/s", "poller CPU ns/completion",
              "reactor busy ns/compl.", "queries/compl.");
  for (auto& r : drain_rows) {
    std::printf("%-42s %14.0f %22.1f", r.name.c_str(), r.per_second,
                r.poller_cpu_ns_per_completion);
    if (r.busy_ns_per_completion >= 0)
      std::printf(" %22.1f %14.3f\n", r.busy_ns_per_completion, r.queries_per_completion);
    else
      std::printf(" %22s %14s\n", "-", "-");
  }
  // The hot-path goal's figure (docs/architecture.md, "Where a wait's bytes and time go"): the
  // reactor's CPU from the gates' opening to the last completion, per completion.
  // The four evr rows without coalesce (the first ones), one figure each.
  const std::size_t evr_rows = std::min<std::size_t>(4, drain_rows.size());
  auto print_evr_rows = [&](const char* what, double tp_row::*field) {
    std::printf("%s (burst drain):", what);
    for (std::size_t i = 0; i < evr_rows; ++i)
      std::printf("%s %s %.1f", i ? "," : "", drain_rows[i].name.c_str(), drain_rows[i].*field);
    std::printf("\n");
  };
  print_evr_rows("reactor CPU ns per completion", &tp_row::poller_cpu_ns_per_completion);
  // The same passes' own work, without the polling between completions (metrics().busy_time).
  print_evr_rows("reactor busy ns per completion", &tp_row::busy_ns_per_completion);
  if (first_coalesced < drain_rows.size()) {
    std::printf("with coalesce, reactor CPU / busy ns per completion and completions/s:");
    for (std::size_t i = first_coalesced; i < drain_rows.size(); ++i)
      std::printf("%s %s %.1f / %.1f, %.0f/s", i > first_coalesced ? ";" : "",
                  drain_rows[i].name.c_str(), drain_rows[i].poller_cpu_ns_per_completion,
                  drain_rows[i].busy_ns_per_completion, drain_rows[i].per_second);
    std::printf("\n");
  }
  std::printf(
      "\nready drain: every marker done before the held reactor is released; reactor CPU from the "
      "release to the last completion\n");
  std::printf("%-44s %8s %8s %14s %22s %14s\n", "method", "streams", "waits", "completions/s",
              "reactor CPU ns/compl.", "queries/compl.");
  for (auto& r : ready_rows)
    std::printf("%-44s %8d %8d %14.0f %22.1f %14.3f\n", r.name.c_str(), r.streams, r.waits,
                r.completions_per_second, r.cpu_ns_per_completion, r.queries_per_completion);
  std::printf("reactor CPU ns per completion (ready drain):");
  for (std::size_t i = 0; i < ready_rows.size(); ++i)
    std::printf("%s %s %.1f", i ? "," : "", ready_rows[i].name.c_str(),
                ready_rows[i].cpu_ns_per_completion);
  std::printf("\n");
  std::printf("\nmemory per in-flight wait (poll: an event each; %d waits on %d streams)\n",
              cfg.inflight_waits, cfg.inflight_streams);
  std::printf("%-44s %14s %14s\n", "", "RSS delta B", "heap in use B");
  for (auto& m : memory_rows)
    std::printf("%-44s %14.0f %14.0f\n", m.name.c_str(), m.rss_bytes, m.heap_bytes);
  if (memory_rows.size() >= 3) {
    // evr's own: each evr row minus the device alone (the mean of the first and last rows).
    const double device_rss = (memory_rows.front().rss_bytes + memory_rows.back().rss_bytes) / 2;
    const double device_heap = (memory_rows.front().heap_bytes + memory_rows.back().heap_bytes) / 2;
    for (std::size_t i = 1; i + 1 < memory_rows.size(); ++i) {
      std::printf("%s: evr's own (minus the device alone): RSS %.0f B, heap %.0f B per wait\n",
                  memory_rows[i].name.c_str(), memory_rows[i].rss_bytes - device_rss,
                  memory_rows[i].heap_bytes - device_heap);
    }
  }

  if (!cfg.json.empty()) {
    std::FILE* f = std::fopen(cfg.json.c_str(), "w");
    if (f == nullptr) throw std::runtime_error("cannot write " + cfg.json);
    json_writer j(f);
    j.raw("{\"subcommand\":\"throughput\",\"device\":" + json_writer::quote(dev->describe()) +
          ",\"backend\":" + json_writer::quote(dev->name()) +
          ",\"streams\":" + std::to_string(cfg.streams) + ",\"ops\":" + std::to_string(cfg.ops) +
          ",\"threads\":" + std::to_string(cfg.threads) +
          ",\"max_fence_streams\":" + std::to_string(cfg.max_fence_streams) + ",\"rows\":[");
    for (std::size_t i = 0; i < rows.size(); ++i) {
      j.raw(std::string(i ? "," : "") + "{\"name\":" + json_writer::quote(rows[i].name) +
            ",\"seconds\":" + json_writer::number(rows[i].seconds) +
            ",\"completions_per_second\":" + json_writer::number(rows[i].per_second) +
            ",\"poller_cpu_ns_per_completion\":" +
            json_writer::number(rows[i].poller_cpu_ns_per_completion) + "}");
    }
    j.raw("],\"drain_rows\":[");
    for (std::size_t i = 0; i < drain_rows.size(); ++i) {
      j.raw(std::string(i ? "," : "") + "{\"name\":" + json_writer::quote(drain_rows[i].name) +
            ",\"seconds\":" + json_writer::number(drain_rows[i].seconds) +
            ",\"completions_per_second\":" + json_writer::number(drain_rows[i].per_second) +
            ",\"poller_cpu_ns_per_completion\":" +
            json_writer::number(drain_rows[i].poller_cpu_ns_per_completion) +
            ",\"reactor_busy_ns_per_completion\":" +
            json_writer::number(drain_rows[i].busy_ns_per_completion) +
            ",\"event_queries_per_completion\":" +
            json_writer::number(drain_rows[i].queries_per_completion) + "}");
    }
    j.raw("],\"ready_rows\":[");
    for (std::size_t i = 0; i < ready_rows.size(); ++i) {
      j.raw(std::string(i ? "," : "") + "{\"name\":" + json_writer::quote(ready_rows[i].name) +
            ",\"streams\":" + std::to_string(ready_rows[i].streams) + ",\"waits_per_round\":" +
            std::to_string(ready_rows[i].waits) + ",\"completions_per_second\":" +
            json_writer::number(ready_rows[i].completions_per_second) +
            ",\"reactor_cpu_ns_per_completion\":" +
            json_writer::number(ready_rows[i].cpu_ns_per_completion) +
            ",\"event_queries_per_completion\":" +
            json_writer::number(ready_rows[i].queries_per_completion) + "}");
    }
    j.raw("],\"fence_queue_depth\":" + std::to_string(fence_depth) +
          ",\"record_queue_depth\":" + std::to_string(record_depth) +
          ",\"bytes_per_inflight_wait\":" + json_writer::number(memory_rows[1].rss_bytes) +
          ",\"heap_bytes_per_inflight_wait\":" + json_writer::number(memory_rows[1].heap_bytes) +
          ",\"memory_rows\":[");
    for (std::size_t i = 0; i < memory_rows.size(); ++i) {
      j.raw(std::string(i ? "," : "") + "{\"name\":" + json_writer::quote(memory_rows[i].name) +
            ",\"rss_bytes_per_inflight_wait\":" + json_writer::number(memory_rows[i].rss_bytes) +
            ",\"heap_bytes_per_inflight_wait\":" + json_writer::number(memory_rows[i].heap_bytes) +
            "}");
    }
    j.raw("],");
    auto json_evr_rows = [&](const char* key, double tp_row::*field) {
      j.raw(json_writer::quote(key) + ":{");
      for (std::size_t i = 0; i < evr_rows; ++i)
        j.raw(std::string(i ? "," : "") + json_writer::quote(drain_rows[i].name) + ":" +
              json_writer::number(drain_rows[i].*field));
      j.raw("}");
    };
    json_evr_rows("reactor_cpu_ns_per_completion_burst", &tp_row::poller_cpu_ns_per_completion);
    j.raw(",");
    json_evr_rows("reactor_busy_ns_per_completion_burst", &tp_row::busy_ns_per_completion);
    j.raw("}\n");
    std::fclose(f);
  }
  return 0;
}

int cpu_main(int argc, char** argv) {
  tp_settings cfg;
  if (int rc = parse(argc, argv, true, cfg); rc >= 0) return rc;
  const int waits = cfg.ops;
  auto dev = make_bench_device(cfg.device);
  std::fprintf(stderr, "cpu on %s: %d waits on a 100 ms kernel, then 1 s idle\n",
               dev->describe().c_str(), waits);
  const std::vector<cpu_case_row> rows = measure_cpu_case(*dev, evr_methods(), waits, 100000);
  std::printf("\ncpu: reactor thread CPU while %d waits sit on a 100 ms kernel, and idle (%s)\n",
              waits, dev->describe().c_str());
  std::printf("%-44s %18s %14s %18s\n", "method", "busy % of a core", "idle % core",
              "idle wake-ups/s");
  for (auto& r : rows)
    std::printf("%-44s %18.2f %14.3f %18.0f\n", r.name.c_str(), r.busy_percent, r.idle_percent,
                r.idle_wakeups_per_s);
  if (!cfg.json.empty()) {
    std::FILE* f = std::fopen(cfg.json.c_str(), "w");
    if (f == nullptr) throw std::runtime_error("cannot write " + cfg.json);
    json_writer j(f);
    j.raw("{\"subcommand\":\"cpu\",\"device\":" + json_writer::quote(dev->describe()) +
          ",\"backend\":" + json_writer::quote(dev->name()) +
          ",\"waits\":" + std::to_string(waits) + ",\"rows\":" + cpu_case_json(rows) + "}\n");
    std::fclose(f);
  }
  return 0;
}

}  // namespace evr::bench

int evr_bench_throughput(int argc, char** argv) { return evr::bench::throughput_main(argc, argv); }

int evr_bench_cpu(int argc, char** argv) { return evr::bench::cpu_main(argc, argv); }
