#include "gate_kernels.hpp"

#include <cuda_runtime.h>

#include <evr/device/signal.cuh>

namespace {
__global__ void gate_kernel(volatile int* gate, volatile int* ack) {
  while (*gate == 0) {
  }
  if (ack != nullptr) {
    __threadfence_system();
    *ack = 1;
  }
}

// The gate kernel of a device-signalled wait: it signals an evr slot as it ends (evr::signal
// makes the write system-visible and counts), instead of writing an ack.
__global__ void gate_signal_kernel(volatile int* gate, evr::signal_ref done) {
  while (*gate == 0) {
  }
  evr::signal(done);
}

__global__ void busy_kernel(unsigned long long ns) {
  unsigned long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

__global__ void tiny_kernel() {}
}  // namespace

int evr::bench::launch_gate_kernel(CUstream_st* stream, volatile int* gate, volatile int* ack) {
  gate_kernel<<<1, 1, 0, stream>>>(gate, ack);
  return static_cast<int>(cudaGetLastError());
}

int evr::bench::launch_gate_signal_kernel(CUstream_st* stream, volatile int* gate,
                                          const evr::signal_ref& done) {
  gate_signal_kernel<<<1, 1, 0, stream>>>(gate, done);
  return static_cast<int>(cudaGetLastError());
}

int evr::bench::launch_busy_kernel(CUstream_st* stream, unsigned microseconds) {
  busy_kernel<<<1, 1, 0, stream>>>(static_cast<unsigned long long>(microseconds) * 1000ull);
  return static_cast<int>(cudaGetLastError());
}

int evr::bench::launch_tiny_kernel(CUstream_st* stream) {
  tiny_kernel<<<1, 1, 0, stream>>>();
  return static_cast<int>(cudaGetLastError());
}
