// Kernels of evr_gpu_tests (see gpu_kernels.hpp).
#include "support/gpu_kernels.hpp"

#include <cstdint>

#include <evr/device/signal.cuh>

namespace evr::test::gpu {
namespace {

__device__ std::uint64_t global_timer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// Spins until `*flag != 0`; with a `timed_out` word, gives up after `limit_ns` and sets it.
__global__ void gate_kernel(const volatile int* flag, std::uint64_t limit_ns,
                            volatile int* timed_out) {
  const std::uint64_t start = global_timer_ns();
  while (*flag == 0) {
    if (timed_out != nullptr && global_timer_ns() - start > limit_ns) {
      *timed_out = 1;
      __threadfence_system();
      return;
    }
#if __CUDA_ARCH__ >= 700
    __nanosleep(100);  // fewer PCIe reads while closed; opening is still seen within ~1 µs
#endif
  }
}

__global__ void fault_kernel() {
  // A trap: the kernel ends with cudaErrorLaunchFailure, which is sticky. (A store to an unmapped
  // address is not a reliable fault: on the H100 machine, with HMM, such a store to
  // 0xdead00000000 completed without any error.)
  __trap();
}

__global__ void busy_kernel(std::uint64_t nanoseconds) {
  const std::uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < nanoseconds) {
  }
}

__global__ void spin_then_signal_kernel(evr::signal_ref done, std::uint64_t nanoseconds,
                                        unsigned long long* sink) {
  const std::uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < nanoseconds) {
  }
  // Work the host could read after the wait: each thread writes one word.
  sink[blockIdx.x * blockDim.x + threadIdx.x] = start;
  evr::signal_from_last_block(done);
}

/// Adds one to `*count` (mapped host memory): work whose effect the host can read.
__global__ void count_kernel(volatile unsigned* count) { *count = *count + 1; }

__global__ void busy_then_count_kernel(std::uint64_t nanoseconds, volatile unsigned* count) {
  const std::uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < nanoseconds) {
  }
  *count = *count + 1;
  __threadfence_system();
}

__global__ void empty_kernel() {}

/// Makes the stream's device current for a launch; restores the caller's device.
class stream_device_scope {
 public:
  explicit stream_device_scope(cudaStream_t stream) {
    int device = 0;
    if ((status_ = cudaGetDevice(&previous_)) != cudaSuccess) return;
    if ((status_ = cudaStreamGetDevice(stream, &device)) != cudaSuccess) return;
    if (device != previous_) {
      if ((status_ = cudaSetDevice(device)) != cudaSuccess) return;
      restore_ = true;
    }
  }
  ~stream_device_scope() {
    if (restore_) cudaSetDevice(previous_);
  }
  cudaError_t status() const { return status_; }

 private:
  int previous_ = 0;
  bool restore_ = false;
  cudaError_t status_ = cudaSuccess;
};

cudaError_t finish_launch(cudaError_t scope_status) {
  if (scope_status != cudaSuccess) {
    (void)cudaGetLastError();
    return scope_status;
  }
  return cudaGetLastError();  // the launch's status (and clears it)
}

}  // namespace

cudaError_t launch_gate(cudaStream_t stream, const volatile int* flag) {
  stream_device_scope scope(stream);
  if (scope.status() == cudaSuccess) gate_kernel<<<1, 1, 0, stream>>>(flag, 0, nullptr);
  return finish_launch(scope.status());
}

cudaError_t launch_gate_with_limit(cudaStream_t stream, const volatile int* flag,
                                   unsigned milliseconds, volatile int* timed_out) {
  stream_device_scope scope(stream);
  if (scope.status() == cudaSuccess)
    gate_kernel<<<1, 1, 0, stream>>>(flag, std::uint64_t{milliseconds} * 1000000u, timed_out);
  return finish_launch(scope.status());
}

cudaError_t launch_fault(cudaStream_t stream) {
  stream_device_scope scope(stream);
  if (scope.status() == cudaSuccess) fault_kernel<<<1, 1, 0, stream>>>();
  return finish_launch(scope.status());
}

cudaError_t launch_busy(cudaStream_t stream, unsigned microseconds) {
  stream_device_scope scope(stream);
  if (scope.status() == cudaSuccess)
    busy_kernel<<<1, 1, 0, stream>>>(std::uint64_t{microseconds} * 1000u);
  return finish_launch(scope.status());
}

cudaError_t launch_signal_captured(cudaStream_t stream, evr::signal_ref done, unsigned microseconds,
                                   unsigned blocks) {
  constexpr unsigned threads = 64;
  constexpr unsigned max_blocks = 1024;
  // Scratch for the kernels' writes, on the device of the first launch (the tests use device
  // 0): one buffer for every launch, its contents do not matter.
  static unsigned long long* sink = [] {
    void* p = nullptr;
    return cudaMalloc(&p, max_blocks * threads * sizeof(unsigned long long)) == cudaSuccess
               ? static_cast<unsigned long long*>(p)
               : nullptr;
  }();
  if (sink == nullptr || blocks == 0 || blocks > max_blocks) return cudaErrorInvalidValue;
  spin_then_signal_kernel<<<blocks, threads, 0, stream>>>(done, std::uint64_t{microseconds} * 1000u,
                                                          sink);
  return cudaGetLastError();
}

cudaError_t launch_chain_captured(cudaStream_t stream, unsigned microseconds, unsigned kernels,
                                  volatile unsigned* count) {
  for (unsigned k = 0; k < kernels; ++k)
    busy_kernel<<<1, 1, 0, stream>>>(std::uint64_t{microseconds} * 1000u);
  count_kernel<<<1, 1, 0, stream>>>(count);
  return cudaGetLastError();
}

cudaError_t launch_signal(cudaStream_t stream, evr::signal_ref done, unsigned microseconds,
                          unsigned blocks) {
  stream_device_scope scope(stream);
  if (scope.status() != cudaSuccess) return finish_launch(scope.status());
  return launch_signal_captured(stream, done, microseconds, blocks);
}

cudaError_t launch_busy_then_count(cudaStream_t stream, unsigned microseconds,
                                   volatile unsigned* count) {
  stream_device_scope scope(stream);
  if (scope.status() == cudaSuccess)
    busy_then_count_kernel<<<1, 1, 0, stream>>>(std::uint64_t{microseconds} * 1000u, count);
  return finish_launch(scope.status());
}

cudaError_t launch_independent_dependent(cudaStream_t stream) {
  stream_device_scope scope(stream);
  if (scope.status() != cudaSuccess) return finish_launch(scope.status());
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(1);
  config.blockDim = dim3(1);
  config.stream = stream;
  config.attrs = &overlap;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, empty_kernel);
}

}  // namespace evr::test::gpu
