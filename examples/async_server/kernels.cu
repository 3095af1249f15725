#include "kernels.hpp"

#include <cuda_runtime.h>

#include <cstdio>

#include "busy_math.hpp"

#include <evr/device/signal.cuh>

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

// One block of busy_math::threads threads: each computes its value, one warp reduction sums
// them, and thread 0 spins on the GPU's nanosecond clock until `ns` have passed since the kernel
// began, then writes the answer (into mapped host memory: no copy follows). Everything but the
// spin is a few microseconds of work.
__global__ void busy_kernel(unsigned long long ns, std::uint32_t seed, std::uint32_t* result,
                            evr::signal_ref done, bool signal_done) {
  unsigned long long start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  std::uint32_t v = busy_math::thread_value(seed, threadIdx.x);
  for (unsigned offset = busy_math::threads / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (threadIdx.x != 0) return;
  for (;;) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start >= ns) break;
    __nanosleep(1000);  // leaves the SM's issue slots to kernels beside it
  }
  // `result` is mapped host memory: the store goes over the bus, and the fence makes it visible
  // to the host before anything the stream does after this kernel (the completion marker).
  *static_cast<volatile std::uint32_t*>(result) = v;
  __threadfence_system();
  // A device-signalled wait: the kernel itself tells evr it is done (its fence orders the answer
  // before the count), so nothing follows it on the stream.
  if (signal_done) evr::signal(done);
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

int server_kernels::busy_concurrency(int device, char* detail, std::size_t detail_size) {
  int sms = 0, blocks = 0, major = 0;
  // The occupancy query is about the current device.
  if (cudaSetDevice(device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, busy_kernel, busy_math::threads, 0) !=
          cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  // Concurrent kernels per device (the CUDA programming guide's table): 128 from 7.0 on, 32 before.
  const int max_kernels = major >= 7 ? 128 : 32;
  const long long resident = static_cast<long long>(sms) * blocks;
  const int n = static_cast<int>(resident < max_kernels ? resident : max_kernels);
  if (detail != nullptr && detail_size > 0)
    std::snprintf(detail, detail_size,
                  "%d SMs x %d resident /busy blocks, at most %d kernels at once", sms, blocks,
                  max_kernels);
  return n;
}

int server_kernels::launch_busy(CUstream_st* stream, std::uint32_t us, std::uint32_t seed,
                                std::uint32_t* result, const evr::signal_ref* done) {
  busy_kernel<<<1, busy_math::threads, 0, stream>>>(
      static_cast<unsigned long long>(us) * 1000ull, seed, result,
      done != nullptr ? *done : evr::signal_ref{}, done != nullptr);
  return static_cast<int>(cudaGetLastError());
}

int server_kernels::set_busy_node_args(CUgraphExec_st* exec, CUgraphNode_st* node, std::uint32_t us,
                                       std::uint32_t seed, std::uint32_t* result) {
  // busy_kernel's parameters in order and of its exact types: the driver copies each by size.
  unsigned long long ns = static_cast<unsigned long long>(us) * 1000ull;
  evr::signal_ref none{};
  bool signal_done = false;
  void* args[] = {&ns, &seed, &result, &none, &signal_done};
  cudaKernelNodeParams p{};
  p.func = reinterpret_cast<void*>(&busy_kernel);
  p.gridDim = dim3(1);
  p.blockDim = dim3(busy_math::threads);
  p.kernelParams = args;
  return static_cast<int>(cudaGraphExecKernelNodeSetParams(exec, node, &p));
}
