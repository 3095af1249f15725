#include "bench_device.hpp"

#include <chrono>
#include <stdexcept>
#include <thread>

#include <evr/device/sim.hpp>

#if defined(EVR_BENCH_HAVE_KERNELS)
#include <cuda_runtime.h>

#include "gate_kernels.hpp"
#endif

namespace evr::bench {
namespace {

class sim_bench_device final : public bench_device {
 public:
  device::backend& backend() override { return sim_; }
  std::string name() const override { return "sim"; }
  std::string describe() const override {
    return sim_.describe() + " (simulated: no timing claims)";
  }
  void close_gate() override {
    gate_.store(false, std::memory_order_release);
    ack_.store(false, std::memory_order_release);
  }
  void launch_gate(device::native_stream stream, bool ack) override {
    sim_.launch_kernel(stream, {}, [this, ack] {
      while (!gate_.load(std::memory_order_acquire)) {
      }
      if (ack) ack_.store(true, std::memory_order_release);
    });
  }
  void open_gate() override { gate_.store(true, std::memory_order_release); }
  bool acked() const override { return ack_.load(std::memory_order_acquire); }
  void launch_busy(device::native_stream stream, unsigned us) override {
    sim_.launch_kernel(stream, std::chrono::microseconds(us));
  }
  void launch_tiny(device::native_stream stream) override { sim_.launch_kernel(stream); }

 private:
  sim::device sim_{sim::options{.devices = 1, .mode = sim::run_mode::threaded}};
  std::atomic<bool> gate_{false};
  std::atomic<bool> ack_{false};
};

#if defined(EVR_BENCH_HAVE_KERNELS)
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

class cuda_bench_device final : public bench_device {
 public:
  cuda_bench_device() {
    check(cudaSetDevice(0), "cudaSetDevice");
    // One word per 64-byte line: the gate (host writes) and the ack (GPU writes).
    void* host = nullptr;
    void* dev = nullptr;
    check(cudaHostAlloc(&host, 256, cudaHostAllocMapped), "cudaHostAlloc");
    check(cudaHostGetDevicePointer(&dev, host, 0), "cudaHostGetDevicePointer");
    host_ = static_cast<volatile int*>(host);
    dev_ = static_cast<volatile int*>(dev);
  }
  ~cuda_bench_device() override {
    open_gate();
    cudaDeviceSynchronize();
    cudaFreeHost(const_cast<int*>(host_));
  }
  device::backend& backend() override { return device::cuda_backend(); }
  std::string name() const override { return "cuda"; }
  std::string describe() const override { return device::cuda_backend().describe(); }
  void close_gate() override {
    host_[0] = 0;
    host_[16] = 0;
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  void launch_gate(device::native_stream stream, bool ack) override {
    check(static_cast<cudaError_t>(launch_gate_kernel(static_cast<CUstream_st*>(stream), dev_,
                                                      ack ? dev_ + 16 : nullptr)),
          "gate kernel");
  }
  void open_gate() override {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    host_[0] = 1;
  }
  bool acked() const override { return host_[16] != 0; }
  void launch_busy(device::native_stream stream, unsigned us) override {
    check(static_cast<cudaError_t>(launch_busy_kernel(static_cast<CUstream_st*>(stream), us)),
          "busy kernel");
  }
  void launch_tiny(device::native_stream stream) override {
    check(static_cast<cudaError_t>(launch_tiny_kernel(static_cast<CUstream_st*>(stream))),
          "tiny kernel");
  }

 private:
  volatile int* host_ = nullptr;
  volatile int* dev_ = nullptr;
};
#endif

}  // namespace

std::unique_ptr<bench_device> make_bench_device(const std::string& which) {
  if (which == "sim") return std::make_unique<sim_bench_device>();
  if (which != "cuda" && which != "auto")
    throw std::runtime_error("--device takes cuda, sim or auto, not '" + which + "'");
#if defined(EVR_BENCH_HAVE_KERNELS)
  if (device::cuda_device_available()) return std::make_unique<cuda_bench_device>();
#endif
  if (which == "cuda")
    throw std::runtime_error(
        "--device cuda: no usable CUDA device, or evr-bench built without nvcc");
  return std::make_unique<sim_bench_device>();
}

}  // namespace evr::bench
