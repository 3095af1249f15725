#include "saxpy.hpp"

#include <cuda_runtime.h>

namespace {
__global__ void saxpy_kernel(float a, const float* x, float* y, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] = a * x[i] + y[i];
}
}  // namespace

int saxpy_streams::launch_saxpy(CUstream_st* stream, float a, const float* x, float* y,
                                std::size_t n) {
  const unsigned threads = 256;
  const unsigned blocks = static_cast<unsigned>(
      (n + threads - 1) / threads < 1024 ? (n + threads - 1) / threads : 1024);
  saxpy_kernel<<<blocks, threads, 0, stream>>>(a, x, y, n);
  return static_cast<int>(cudaGetLastError());
}
