// bench/studies/study_common.cuh — what the CUDA studies (marker_queues.cu, event_queries.cu,
// launch_after_done.cu) share: the work kernel, timed calls, the error check and the command line.
// Each study is one executable; this header is included by one translation unit of each.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

/// A driver function by name, as of the CUDA 12.0 ABI, fetched through the runtime so that the
/// study links no driver symbol; exits naming it when the driver lacks it.
inline void* driver_entry_point(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  check(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found), name);
  if (found != cudaDriverEntryPointSuccess || fn == nullptr) check(cudaErrorSymbolNotFound, name);
  return fn;
}

/// The studies' command line: [--work-us US] [--rounds N].
struct options {
  double work_us = 1000;
  int rounds = 20;
};

/// Parses argv; prints the usage of `program` and exits with 2 on a bad value.
inline options parse(int argc, char** argv, const char* program) {
  options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--work-us"))
      o.work_us = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--rounds"))
      o.rounds = std::atoi(argv[i + 1]);
  }
  if (o.work_us <= 0 || o.rounds < 1) {
    std::fprintf(stderr, "usage: %s [--work-us US > 0] [--rounds N >= 1]\n", program);
    std::exit(2);
  }
  return o;
}

}  // namespace study
