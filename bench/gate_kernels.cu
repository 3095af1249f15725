#include "gate_kernels.hpp"

#include <cuda_runtime.h>

namespace {
__global__ void gate_kernel(volatile int* gate, volatile int* ack) {
  while (*gate == 0) {
  }
  if (ack != nullptr) {
    __threadfence_system();
    *ack = 1;
  }
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

int evr::bench::launch_busy_kernel(CUstream_st* stream, unsigned microseconds) {
  busy_kernel<<<1, 1, 0, stream>>>(static_cast<unsigned long long>(microseconds) * 1000ull);
  return static_cast<int>(cudaGetLastError());
}

int evr::bench::launch_tiny_kernel(CUstream_st* stream) {
  tiny_kernel<<<1, 1, 0, stream>>>();
  return static_cast<int>(cudaGetLastError());
}
