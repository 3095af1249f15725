// bench/studies/launch_after_done.cu — what a stream's next launch costs the thread that makes
// it, by how the end of the stream's last work was seen: by a driver query (an event or the
// stream), or not at all (a memory read, as with a signal slot or a fence word).
//
//   CUDA_DEVICE_MAX_CONNECTIONS=8  evr-launch-after-done [--rounds 20] [--work-us 1000]
//   CUDA_DEVICE_MAX_CONNECTIONS=32 evr-launch-after-done
//
// Why: the example server's profile put each launch about 1.6 us dearer under evr than under
// the hand-written poll loop, also with the kernel signalling, where no query is made. If the
// driver does the bookkeeping of ended work on the first call that meets it, a wait whose look
// is a memory read leaves that work to the next launch instead of removing it.
//
// For N = 1, 16 and 128 streams, each round launches on every stream a one-thread kernel of
// --work-us that writes the round's number into a word of mapped host memory as it ends, and
// records an event behind it; the host then reads the words until every stream's has the round
// (no driver call) and lets 20 us more pass for the events' own completion. The next round
// launches again, each stream in one of three ways (rotating with the round), timing single calls
// (ns, p50 and p90 over the rounds):
//   after event query   cudaEventQuery of the stream's event (it finds the work done), then the
//                       launch
//   after stream query  cudaStreamQuery of the stream, then the launch
//   nothing seen        the launch alone: the driver has not been asked since the last launch
// The queries' own times are rows too. Each table runs twice: on an idle device, and with a
// kernel of four times --work-us running on another stream throughout (a busy device, as a
// server's).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "study_common.cuh"

namespace {

using study::busy_kernel;
using study::check;
using clock_type = std::chrono::steady_clock;

/// Spins for `ns` of the GPU's global timer, then writes `value` to `word` (mapped host memory),
/// visible to the host before the kernel ends.
__global__ void work_then_write(unsigned long long ns, volatile unsigned* word, unsigned value) {
  study::spin_for(ns);
  *word = value;
  __threadfence_system();
}

struct samples {
  std::vector<double> ns;
  template <typename F>
  cudaError_t time(F&& call) {
    const clock_type::time_point a = clock_type::now();
    const cudaError_t e = call();
    ns.push_back(std::chrono::duration<double, std::nano>(clock_type::now() - a).count());
    return e;
  }
  double quantile(double q) {
    if (ns.empty()) return 0;
    std::sort(ns.begin(), ns.end());
    return ns[std::min(ns.size() - 1,
                       static_cast<std::size_t>(q * static_cast<double>(ns.size())))];
  }
};

enum class seen { by_event_query, by_stream_query, nothing };

struct table {
  samples launch[3], event_query, stream_query;
  int queries_not_done = 0;
};

/// Spins without a driver call until every word holds `value`, then 20 us more.
void wait_words(const volatile unsigned* words, int n, unsigned value) {
  for (int i = 0; i < n; ++i)
    while (words[i] != value) std::atomic_thread_fence(std::memory_order_acquire);
  const clock_type::time_point until = clock_type::now() + std::chrono::microseconds(20);
  while (clock_type::now() < until) {
  }
}

void run(int n, int rounds, double work_us, bool busy_device) {
  std::vector<cudaStream_t> streams(n);
  std::vector<cudaEvent_t> events(n);
  for (int i = 0; i < n; ++i) {
    check(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking), "stream");
    check(cudaEventCreateWithFlags(&events[i], cudaEventDisableTiming), "event");
  }
  cudaStream_t background = nullptr;
  check(cudaStreamCreateWithFlags(&background, cudaStreamNonBlocking), "stream");
  unsigned* host_words = nullptr;
  check(cudaHostAlloc(reinterpret_cast<void**>(&host_words), n * sizeof(unsigned),
                      cudaHostAllocMapped),
        "cudaHostAlloc");
  std::fill(host_words, host_words + n, 0u);
  unsigned* device_words = nullptr;
  check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_words), host_words, 0),
        "cudaHostGetDevicePointer");
  const auto work_ns = static_cast<unsigned long long>(work_us * 1000);
  table t;
  const int warm_up = 2;
  for (int r = 1; r <= rounds + warm_up; ++r) {
    const bool keep = r > warm_up;
    if (busy_device) busy_kernel<<<1, 1, 0, background>>>(4 * work_ns);
    for (int i = 0; i < n; ++i) {
      const auto how = static_cast<seen>((i + r) % 3);
      if (r > 1 && how == seen::by_event_query) {
        const cudaError_t e = t.event_query.time([&] { return cudaEventQuery(events[i]); });
        t.queries_not_done += e != cudaSuccess;
      } else if (r > 1 && how == seen::by_stream_query) {
        const cudaError_t e = t.stream_query.time([&] { return cudaStreamQuery(streams[i]); });
        t.queries_not_done += e != cudaSuccess;
      }
      t.launch[static_cast<int>(how)].time([&] {
        work_then_write<<<1, 1, 0, streams[i]>>>(work_ns, device_words + i,
                                                 static_cast<unsigned>(r));
        return cudaGetLastError();
      });
      check(cudaEventRecord(events[i], streams[i]), "record");
    }
    check(cudaGetLastError(), "launch");
    wait_words(host_words, n, static_cast<unsigned>(r));
    if (busy_device) check(cudaStreamSynchronize(background), "synchronize");
    if (!keep) t = table{};
  }
  check(cudaDeviceSynchronize(), "synchronize");
  const auto row = [&](const char* what, samples& s) {
    std::printf("%8d %-6s %-22s %9.0f %9.0f %8zu\n", n, busy_device ? "busy" : "idle", what,
                s.quantile(0.5), s.quantile(0.9), s.ns.size());
  };
  row("launch, nothing seen", t.launch[static_cast<int>(seen::nothing)]);
  row("launch, after event q.", t.launch[static_cast<int>(seen::by_event_query)]);
  row("launch, after stream q.", t.launch[static_cast<int>(seen::by_stream_query)]);
  row("event query (done)", t.event_query);
  row("stream query (done)", t.stream_query);
  if (t.queries_not_done > 0)
    std::printf("%8d %-6s %d queries found the work not done (the rows above mean less)\n", n,
                busy_device ? "busy" : "idle", t.queries_not_done);
  std::fflush(stdout);
  cudaFreeHost(host_words);
  cudaStreamDestroy(background);
  for (int i = 0; i < n; ++i) {
    cudaEventDestroy(events[i]);
    cudaStreamDestroy(streams[i]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  study::options opt = study::parse(argc, argv, "evr-launch-after-done");
  check(cudaSetDevice(0), "cudaSetDevice");
  const char* conn = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  std::printf("launch-after-done: work %.0f us, %d rounds, CUDA_DEVICE_MAX_CONNECTIONS=%s\n",
              opt.work_us, opt.rounds, conn ? conn : "unset (8)");
  std::printf("%8s %-6s %-22s %9s %9s %8s\n", "streams", "device", "call", "p50 ns", "p90 ns",
              "calls");
  for (bool busy : {false, true})
    for (int n : {1, 16, 128}) run(n, opt.rounds, opt.work_us, busy);
  return 0;
}
