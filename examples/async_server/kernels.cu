#include "kernels.hpp"

#include <cuda_runtime.h>

namespace {

constexpr unsigned threads_per_block = 256;

unsigned blocks_for(std::size_t n) {
  // Grid-stride loops: at most 1024 blocks, enough to fill an H100 and no launch for idle blocks.
  const std::size_t blocks = (n + threads_per_block - 1) / threads_per_block;
  return static_cast<unsigned>(blocks < 1024 ? (blocks == 0 ? 1 : blocks) : 1024);
}

__global__ void saxpy_kernel(float a, const float* x, float* y, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    y[i] = a * x[i] + y[i];
}

// Each thread sums a grid-stride slice in double, the block reduces in shared memory, and one
// atomicAdd per block lands in *sum. The inputs are whole numbers, so the result is exact in any
// order and the CPU check can demand equality.
__global__ void sum_kernel(const float* x, double* sum, std::size_t n) {
  __shared__ double partial[threads_per_block];
  double acc = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    acc += x[i];
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(sum, partial[0]);
}

}  // namespace

int server_kernels::launch_saxpy(CUstream_st* stream, float a, const float* x, float* y,
                                 std::size_t n) {
  saxpy_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(a, x, y, n);
  return static_cast<int>(cudaGetLastError());
}

int server_kernels::launch_sum(CUstream_st* stream, const float* x, double* sum, std::size_t n) {
  sum_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(x, sum, n);
  return static_cast<int>(cudaGetLastError());
}
