// bench/studies/study_common.cuh — what the CUDA studies (marker_queues.cu, event_queries.cu,
// launch_after_done.cu, parallel_queries.cu) share: the work kernels, words the GPU writes into
// host memory, timed calls, the error check and the command line.
// Each study is one executable; this header is included by one translation unit of each.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace study {

/// Spins the calling thread for `ns` of the GPU's global timer.
__device__ inline void spin_for(unsigned long long ns) {
  unsigned long long start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (;;) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start >= ns) break;
  }
}

/// One thread that spins for `ns` of the GPU's global timer: work of a known length.
__global__ void busy_kernel(unsigned long long ns) { spin_for(ns); }

/// Single calls timed on the host, ns, and their quantiles.
struct call_times {
  std::vector<double> ns;
  /// Times `call`; returns what it returned.
  template <typename F>
  auto time(F&& call) {
    const auto start = std::chrono::steady_clock::now();
    auto result = call();
    ns.push_back(
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count());
    return result;
  }
  double quantile(double q) {
    if (ns.empty()) return 0;
    std::sort(ns.begin(), ns.end());
    return ns[std::min(ns.size() - 1,
                       static_cast<std::size_t>(q * static_cast<double>(ns.size())))];
  }
};

/// Exits with the CUDA error's text, naming `what`, unless `e` is cudaSuccess.
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

/// Spins until the host writes a non-zero value to `stop` (mapped host memory): a busy device
/// for as long as the host wants, without a driver call to end it.
__global__ void spin_until(volatile const unsigned* stop) {
  while (*stop == 0) {
  }
}

/// Spins for `ns` of the GPU's global timer, then writes `value` to `word` (mapped host memory),
/// visible to the host before the kernel ends.
__global__ void work_then_write(unsigned long long ns, volatile unsigned* word, unsigned value) {
  spin_for(ns);
  *word = value;
  __threadfence_system();
}

/// Mapped host memory: the host's pointer and the device's.
struct mapped_words {
  unsigned* host = nullptr;
  unsigned* device = nullptr;
  explicit mapped_words(int n) {
    check(cudaHostAlloc(reinterpret_cast<void**>(&host), n * sizeof(unsigned), cudaHostAllocMapped),
          "cudaHostAlloc");
    std::fill(host, host + n, 0u);
    check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device), host, 0),
          "cudaHostGetDevicePointer");
  }
  ~mapped_words() { cudaFreeHost(host); }
  mapped_words(const mapped_words&) = delete;
  mapped_words& operator=(const mapped_words&) = delete;
};

/// Spins without a driver call until every word holds `value`, then 100 us more (for the work's
/// events, which land after the kernel's own write).
inline void wait_words(const volatile unsigned* words, int n, unsigned value) {
  for (int i = 0; i < n; ++i)
    while (words[i] != value) std::atomic_thread_fence(std::memory_order_acquire);
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(100);
  while (std::chrono::steady_clock::now() < until) {
  }
}

/// N streams, an event and a word of mapped host memory for each (work_then_write writes the
/// word), and a background stream that keeps the device busy (spin_until) when asked to. The
/// destructor ends the background kernel, waits for the device and destroys them.
struct streams_with_words {
  std::vector<cudaStream_t> streams;
  std::vector<cudaEvent_t> events;
  mapped_words words, stop{1};
  cudaStream_t background = nullptr;

  streams_with_words(int n, bool busy_device) : streams(n), events(n), words(n) {
    for (int i = 0; i < n; ++i) {
      check(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking), "stream");
      check(cudaEventCreateWithFlags(&events[i], cudaEventDisableTiming), "event");
    }
    check(cudaStreamCreateWithFlags(&background, cudaStreamNonBlocking), "stream");
    if (busy_device) spin_until<<<1, 1, 0, background>>>(stop.device);
  }
  ~streams_with_words() {
    *static_cast<volatile unsigned*>(stop.host) = 1;
    check(cudaDeviceSynchronize(), "synchronize");
    cudaStreamDestroy(background);
    for (std::size_t i = 0; i < streams.size(); ++i) {
      cudaEventDestroy(events[i]);
      cudaStreamDestroy(streams[i]);
    }
  }
  streams_with_words(const streams_with_words&) = delete;
  streams_with_words& operator=(const streams_with_words&) = delete;

  /// On stream i: work of `work_ns` that writes `round` to word i as it ends, event i behind it.
  void launch(int i, unsigned long long work_ns, unsigned round) {
    work_then_write<<<1, 1, 0, streams[i]>>>(work_ns, words.device + i, round);
    check(cudaGetLastError(), "launch");
    check(cudaEventRecord(events[i], streams[i]), "record");
  }
};

/// A driver function by name, as of the CUDA 12.0 ABI, fetched through the runtime so that the
/// study links no driver symbol; exits naming it when the driver lacks it.
inline void* driver_entry_point(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  check(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found), name);
  if (found != cudaDriverEntryPointSuccess || fn == nullptr) check(cudaErrorSymbolNotFound, name);
  return fn;
}

/// The studies' command line: [--work-us US] [--rounds N] [--chain K] [--markers A,B].
struct options {
  double work_us = 1000;
  int rounds = 20;
  int chain = 1;  ///< marker_queues: the work as K kernels in a row on its stream
  std::vector<std::string> markers;  ///< marker_queues: the markers to measure (empty: all)
};

/// "a,b,c" as {"a", "b", "c"}; an empty item is kept (and refused by the study that reads it).
inline std::vector<std::string> split_commas(const char* text) {
  std::vector<std::string> items(1);
  for (const char* c = text; *c != 0; ++c) {
    if (*c == ',')
      items.emplace_back();
    else
      items.back() += *c;
  }
  return items;
}

/// Parses argv; prints the usage of `program` and exits with 2 on an unknown argument or a bad
/// value.
inline options parse(int argc, char** argv, const char* program) {
  options o;
  bool ok = argc % 2 == 1;  // every option takes one value
  for (int i = 1; ok && i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--work-us"))
      o.work_us = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--rounds"))
      o.rounds = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--chain"))
      o.chain = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--markers"))
      o.markers = split_commas(argv[i + 1]);
    else
      ok = false;
  }
  if (!ok || o.work_us <= 0 || o.rounds < 1 || o.chain < 1) {
    std::fprintf(stderr,
                 "usage: %s [--work-us US > 0] [--rounds N >= 1] [--chain K >= 1] "
                 "[--markers A,B,...]\n",
                 program);
    std::exit(2);
  }
  return o;
}

}  // namespace study
