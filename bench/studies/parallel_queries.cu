// bench/studies/parallel_queries.cu — whether looks at ended events made by several threads at
// once overlap, or wait for one another inside the driver.
//
//   CUDA_DEVICE_MAX_CONNECTIONS=8  evr-parallel-queries [--rounds 30] [--work-us 1000]
//   CUDA_DEVICE_MAX_CONNECTIONS=32 evr-parallel-queries
//
// Why: the first query of an event whose work has ended is the dear look (1.4-3 us, the driver's
// 8 queues or 32; docs/architecture.md, "Markers and hardware queues"). Streams whose work ends
// together are found one query after another: 16 in lockstep over 20-25 us on one thread. If the
// driver lets two threads make such queries at once, a second thread could find them in half the
// time; if it makes them wait for each other, a second thread adds CPU and nothing else, and a
// server's io threads that query at the same moment slow each other down.
//
// For N = 16, 64 and 128 streams and T = 1, 2 and 4 querying threads, each round launches on
// every stream a one-thread kernel of --work-us that writes a word of mapped host memory as it
// ends, records an event behind it, waits for the words without a driver call (and 100 us more),
// then releases the T threads at once; thread t queries events t, t + T, ... once each. Printed
// per N and T, over the rounds (p50, p90):
//   query ns     one query's time (all threads' calls)
//   wall us      from the release to the last thread's last query
//   overlap      the threads' summed query time over the wall: 1.0 when no two queries overlap
//                (or T = 1), T when all do
// A query that finds the work not done is counted and reported (the rows then mean less). Each
// table runs on an idle device, and with a one-thread kernel on another stream throughout (busy).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "study_common.cuh"

namespace {

using study::check;
using study::streams_with_words;
using study::wait_words;
using clock_type = std::chrono::steady_clock;

/// T threads that query their share of the events each time the main thread releases a round.
/// Contract: release() and wait_done() alternate on the main thread; a round's figures are read
/// only between wait_done() and the next release() (acquire on `finished_` orders them).
class query_crew {
 public:
  query_crew(const std::vector<cudaEvent_t>& events, int threads)
      : events_(events), round_ns_(threads, 0.0), ends_(threads), calls_(threads) {
    for (int t = 0; t < threads; ++t) threads_.emplace_back([this, t] { work(t); });
  }
  ~query_crew() {
    stop_.store(true, std::memory_order_release);
    for (std::thread& th : threads_) th.join();
  }
  query_crew(const query_crew&) = delete;
  query_crew& operator=(const query_crew&) = delete;

  void release(int round) {
    released_at_ = clock_type::now();
    round_.store(round, std::memory_order_release);
  }
  /// Spins until every thread finished `round`; returns its wall time, us.
  double wait_done(int round) {
    const int want = round * static_cast<int>(threads_.size());
    while (finished_.load(std::memory_order_acquire) < want) {
    }
    clock_type::time_point last = released_at_;
    for (const clock_type::time_point& e : ends_) last = std::max(last, e);
    return std::chrono::duration<double, std::micro>(last - released_at_).count();
  }
  /// The threads' summed query time of the last round, us.
  double summed_query_us() const {
    double ns = 0;
    for (double v : round_ns_) ns += v;
    return ns / 1000.0;
  }
  study::call_times& calls(int t) { return calls_[t]; }
  int threads() const { return static_cast<int>(threads_.size()); }
  int not_done() const { return not_done_.load(std::memory_order_relaxed); }
  void forget() {  // the warm-up rounds' samples
    for (study::call_times& c : calls_) c.ns.clear();
    not_done_.store(0, std::memory_order_relaxed);
  }

 private:
  void work(int t) {
    check(cudaSetDevice(0), "cudaSetDevice (query thread)");
    int done_rounds = 0;
    for (;;) {
      int r = round_.load(std::memory_order_acquire);
      while (r == done_rounds) {
        if (stop_.load(std::memory_order_acquire)) return;
        r = round_.load(std::memory_order_acquire);
      }
      double ns = 0;
      const int stride = threads();
      for (std::size_t i = static_cast<std::size_t>(t); i < events_.size(); i += stride) {
        const auto start = clock_type::now();
        const cudaError_t e = cudaEventQuery(events_[i]);
        const double took =
            std::chrono::duration<double, std::nano>(clock_type::now() - start).count();
        if (e == cudaErrorNotReady)
          not_done_.fetch_add(1, std::memory_order_relaxed);
        else
          check(e, "cudaEventQuery");
        calls_[t].ns.push_back(took);
        ns += took;
      }
      round_ns_[t] = ns;
      ends_[t] = clock_type::now();
      done_rounds = r;
      finished_.fetch_add(1, std::memory_order_release);
    }
  }

  const std::vector<cudaEvent_t>& events_;
  std::vector<double> round_ns_;
  std::vector<clock_type::time_point> ends_;
  std::vector<study::call_times> calls_;  // one per thread: written by it, read between rounds
  std::vector<std::thread> threads_;
  clock_type::time_point released_at_;
  std::atomic<int> round_{0}, finished_{0}, not_done_{0};
  std::atomic<bool> stop_{false};
};

void run(int n, int threads, int rounds, double work_us, bool busy_device) {
  streams_with_words lanes(n, busy_device);
  const auto work_ns = static_cast<unsigned long long>(work_us * 1000);
  study::call_times wall, overlap;
  query_crew crew(lanes.events, threads);
  const int warm_up = 2;
  for (int r = 1; r <= rounds + warm_up; ++r) {
    for (int i = 0; i < n; ++i) lanes.launch(i, work_ns, static_cast<unsigned>(r));
    wait_words(lanes.words.host, n, static_cast<unsigned>(r));
    crew.release(r);
    const double wall_us = crew.wait_done(r);
    if (r <= warm_up) {
      crew.forget();
      continue;
    }
    wall.ns.push_back(wall_us);
    overlap.ns.push_back(wall_us > 0 ? crew.summed_query_us() / wall_us : 0);
  }
  study::call_times all;
  for (int t = 0; t < threads; ++t)
    all.ns.insert(all.ns.end(), crew.calls(t).ns.begin(), crew.calls(t).ns.end());
  std::printf("%8d %-6s %8d %9.0f %9.0f %9.1f %9.1f %8.2f %8.2f", n, busy_device ? "busy" : "idle",
              threads, all.quantile(0.5), all.quantile(0.9), wall.quantile(0.5), wall.quantile(0.9),
              overlap.quantile(0.5), overlap.quantile(0.9));
  if (crew.not_done() > 0) std::printf("  (%d queries found the work not done)", crew.not_done());
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  study::options opt = study::parse(argc, argv, "evr-parallel-queries");
  check(cudaSetDevice(0), "cudaSetDevice");
  const char* conn = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  std::printf(
      "parallel-queries: work %.0f us, %d rounds, CUDA_DEVICE_MAX_CONNECTIONS=%s, %u cpus\n",
      opt.work_us, opt.rounds, conn ? conn : "unset (8)", std::thread::hardware_concurrency());
  std::printf("%8s %-6s %8s %9s %9s %9s %9s %8s %8s\n", "streams", "device", "threads", "query p50",
              "p90 ns", "wall p50", "p90 us", "overlap", "p90");
  for (bool busy : {false, true})
    for (int n : {16, 64, 128})
      for (int threads : {1, 2, 4}) run(n, threads, opt.rounds, opt.work_us, busy);
  return 0;
}
