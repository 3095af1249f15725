#include "kernels.hpp"

#include <cuda_runtime.h>

namespace {

__global__ void affine_kernel(float* data, std::size_t n, float a, float b) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    data[i] = a * data[i] + b;
}

// One thread watches the GPU's nanosecond clock until `ns` have passed: "work that takes a while".
__global__ void busy_kernel(unsigned long long ns) {
  unsigned long long start = 0;
  unsigned long long now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(10000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

}  // namespace

int examples::kernels::launch_affine(CUstream_st* stream, float* data, std::size_t n, float a,
                                     float b) {
  const unsigned threads = 256;
  const std::size_t wanted = (n + threads - 1) / threads;
  const unsigned blocks = static_cast<unsigned>(wanted < 1024 ? (wanted > 0 ? wanted : 1) : 1024);
  affine_kernel<<<blocks, threads, 0, stream>>>(data, n, a, b);
  return static_cast<int>(cudaGetLastError());
}

int examples::kernels::launch_busy(CUstream_st* stream, unsigned long long ns) {
  busy_kernel<<<1, 1, 0, stream>>>(ns);
  return static_cast<int>(cudaGetLastError());
}
