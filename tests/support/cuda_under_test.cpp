// dut() for evr_gpu_tests: the CUDA backend with real kernels (gpu_kernels.cu).
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include <evr/device/backend.hpp>
#include <evr/device/error.hpp>

#include "support/device_under_test.hpp"
#include "support/gpu_kernels.hpp"

namespace evr::test {
namespace {

void throw_on(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    throw evr::error(make_cuda_error(static_cast<int>(status)), what);
  }
}

/// Gate flags: ints in mapped pinned host memory, one per 64-byte line, handed out from slabs
/// that live as long as the process. A flag is never reused and never freed, so a gate kernel
/// still queued when its gate object is destroyed (its stream blocked behind something else, or
/// the device faulted) can never read freed memory: it finds the flag open whenever it runs.
class flag_slabs {
 public:
  struct flag {
    volatile int* host;
    const volatile int* device;
  };

  flag take() {
    std::lock_guard lock(mutex_);
    if (next_ == per_slab) {
      void* host = nullptr;
      throw_on(cudaHostAlloc(&host, slab_bytes, cudaHostAllocMapped | cudaHostAllocPortable),
               "gate: cudaHostAlloc(mapped | portable)");
      void* dev = nullptr;
      throw_on(cudaHostGetDevicePointer(&dev, host, 0), "gate: cudaHostGetDevicePointer");
      host_ = static_cast<char*>(host);
      device_ = static_cast<char*>(dev);
      for (std::size_t i = 0; i < slab_bytes; ++i) host_[i] = 0;
      next_ = 0;
    }
    const std::size_t offset = next_++ * line;
    return {reinterpret_cast<volatile int*>(host_ + offset),
            reinterpret_cast<const volatile int*>(device_ + offset)};
  }

 private:
  static constexpr std::size_t line = 64;
  static constexpr std::size_t slab_bytes = 64 * 1024;
  static constexpr std::size_t per_slab = slab_bytes / line;
  std::mutex mutex_;
  char* host_ = nullptr;
  char* device_ = nullptr;
  std::size_t next_ = per_slab;
};

flag_slabs& gate_flags() {
  static auto* const slabs = new flag_slabs;  // never destroyed (see flag_slabs)
  return *slabs;
}

class cuda_gate final : public gate {
 public:
  cuda_gate() : flag_(gate_flags().take()) {}
  ~cuda_gate() override { open(); }
  void launch(device::native_stream stream) override {
    throw_on(gpu::launch_gate(static_cast<cudaStream_t>(stream), flag_.device),
             "gate: launch of the gate kernel");
  }
  void open() override {
    // The host store is seen by the spinning kernel over PCIe/C2C within about a microsecond;
    // volatile is enough here (the kernel only waits for the value to change).
    *flag_.host = 1;
  }

 private:
  flag_slabs::flag flag_;
};

class cuda_under_test final : public device_under_test {
 public:
  device::backend& backend() override { return device::cuda_backend(); }
  const char* name() const override { return "cuda"; }
  std::unique_ptr<gate> make_gate() override { return std::make_unique<cuda_gate>(); }
  void launch_fault(device::native_stream stream) override {
    throw_on(gpu::launch_fault(static_cast<cudaStream_t>(stream)), "launch of the faulting kernel");
  }
  void launch_busy(device::native_stream stream, unsigned microseconds) override {
    throw_on(gpu::launch_busy(static_cast<cudaStream_t>(stream), microseconds),
             "launch of the busy kernel");
  }
  void launch_signal(device::native_stream stream, const signal_ref& done, unsigned microseconds,
                     unsigned blocks) override {
    throw_on(gpu::launch_signal(static_cast<cudaStream_t>(stream), done, microseconds, blocks),
             "launch of the signalling kernel");
  }
};

}  // namespace

device_under_test& dut() {
  static cuda_under_test instance;
  return instance;
}

std::string skip_reason() {
  if (device::cuda_device_available()) return {};
  int count = 0;
  const std::error_code ec = device::cuda_backend().device_count(count);
  std::string why = "no usable CUDA device: ";
  why += ec ? ec.message() : "cudaGetDeviceCount found none";
  why += " — the GPU tests need one";
  return why;
}

}  // namespace evr::test
