#include "bench_device.hpp"

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <thread>
#include <tuple>

#include <evr/sim/device.hpp>

#if defined(EVR_BENCH_HAVE_KERNELS)
#include <cuda_runtime.h>

#include "gate_kernels.hpp"
#endif

namespace evr::bench {
namespace {

class sim_bench_device final : public bench_device {
 public:
  sim_bench_device() { reserve_gates(1); }
  device::backend& backend() override { return sim_; }
  std::string name() const override { return "sim"; }
  std::string describe() const override {
    return sim_.describe() + " (simulated: no timing claims)";
  }
  void reserve_gates(std::size_t count) override {
    if (count <= gate_count_) return;
    gates_ = std::make_unique<std::atomic<int>[]>(count);
    acks_ = std::make_unique<std::atomic<int>[]>(count);
    for (std::size_t i = 0; i < count; ++i) {
      gates_[i].store(0, std::memory_order_relaxed);
      acks_[i].store(0, std::memory_order_relaxed);
    }
    gate_count_ = count;
  }
  void close_gate(std::size_t gate) override {
    gates_[gate].store(0, std::memory_order_release);
    acks_[gate].store(0, std::memory_order_release);
  }
  void launch_gate(device::native_stream stream, bool ack, std::size_t gate) override {
    std::atomic<int>* flag = &gates_[gate];
    std::atomic<int>* done = ack ? &acks_[gate] : nullptr;
    sim_.launch_kernel(stream, {}, [flag, done] {
      // The simulated kernel blocks (no spinning worker threads on a small CI machine).
      while (flag->load(std::memory_order_acquire) == 0) flag->wait(0, std::memory_order_acquire);
      if (done != nullptr) done->store(1, std::memory_order_release);
    });
  }
  void launch_gate_signalling(device::native_stream stream, std::size_t gate,
                              const signal_ref& done) override {
    std::atomic<int>* flag = &gates_[gate];
    sim_.launch_kernel(stream, {}, [flag, done] {
      while (flag->load(std::memory_order_acquire) == 0) flag->wait(0, std::memory_order_acquire);
      sim::signal(done);
    });
  }
  void launch_gate_graph_signalling(device::native_stream stream, std::size_t gate,
                                    const signal_ref& done) override {
    launch_gate_signalling(stream, gate, done);
  }
  void open_gate(std::size_t gate) override {
    gates_[gate].store(1, std::memory_order_release);
    gates_[gate].notify_all();
  }
  bool acked(std::size_t gate) const override {
    return acks_[gate].load(std::memory_order_acquire) != 0;
  }
  void launch_busy(device::native_stream stream, unsigned us) override {
    sim_.launch_kernel(stream, std::chrono::microseconds(us));
  }
  void launch_tiny(device::native_stream stream) override { sim_.launch_kernel(stream); }

 private:
  sim::device sim_{sim::options{.devices = 1, .mode = sim::run_mode::threaded}};
  std::unique_ptr<std::atomic<int>[]> gates_, acks_;
  std::size_t gate_count_ = 0;
};

#if defined(EVR_BENCH_HAVE_KERNELS)
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

class cuda_bench_device final : public bench_device {
 public:
  cuda_bench_device() {
    check(cudaSetDevice(0), "cudaSetDevice");
    reserve_gates(1);
  }
  ~cuda_bench_device() override {
    for (std::size_t g = 0; g < gate_count_; ++g) open_gate(g);
    cudaDeviceSynchronize();
    drop_graphs();
    if (capture_stream_ != nullptr) cudaStreamDestroy(capture_stream_);
    cudaFreeHost(const_cast<int*>(host_));
  }
  device::backend& backend() override { return device::cuda_backend(); }
  std::string name() const override { return "cuda"; }
  std::string describe() const override { return device::cuda_backend().describe(); }
  // Mapped host memory, one int per 64-byte line: line 2g holds gate g (the host writes it),
  // line 2g + 1 its ack (the GPU writes it).
  void reserve_gates(std::size_t count) override {
    if (count <= gate_count_) return;
    if (host_ != nullptr) {
      check(cudaDeviceSynchronize(), "cudaDeviceSynchronize before regrowing the gates");
      check(cudaFreeHost(const_cast<int*>(host_)), "cudaFreeHost");
      drop_graphs();  // they name the old gates
    }
    void* host = nullptr;
    void* dev = nullptr;
    const std::size_t bytes = 2 * count * line_ints * sizeof(int);
    check(cudaHostAlloc(&host, bytes, cudaHostAllocMapped), "cudaHostAlloc");
    check(cudaHostGetDevicePointer(&dev, host, 0), "cudaHostGetDevicePointer");
    std::memset(host, 0, bytes);
    host_ = static_cast<volatile int*>(host);
    dev_ = static_cast<volatile int*>(dev);
    gate_count_ = count;
  }
  void close_gate(std::size_t gate) override {
    host_[gate_index(gate)] = 0;
    host_[ack_index(gate)] = 0;
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  void launch_gate(device::native_stream stream, bool ack, std::size_t gate) override {
    check(static_cast<cudaError_t>(launch_gate_kernel(static_cast<CUstream_st*>(stream),
                                                      dev_ + gate_index(gate),
                                                      ack ? dev_ + ack_index(gate) : nullptr)),
          "gate kernel");
  }
  void launch_gate_signalling(device::native_stream stream, std::size_t gate,
                              const signal_ref& done) override {
    check(static_cast<cudaError_t>(launch_gate_signal_kernel(static_cast<CUstream_st*>(stream),
                                                             dev_ + gate_index(gate), done)),
          "gate kernel (signalling)");
  }
  void launch_gate_graph_signalling(device::native_stream stream, std::size_t gate,
                                    const signal_ref& done) override {
    const graph_key key{stream, gate, done.counter, done.blocks, done.word};
    auto found = graphs_.find(key);
    if (found == graphs_.end())  // cached only once made: a failed capture leaves nothing
      found = graphs_.emplace(key, capture_gate_then_signal(gate, done)).first;
    check(cudaGraphLaunch(found->second, static_cast<cudaStream_t>(stream)), "cudaGraphLaunch");
  }
  void open_gate(std::size_t gate) override {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    host_[gate_index(gate)] = 1;
  }
  bool acked(std::size_t gate) const override { return host_[ack_index(gate)] != 0; }
  void launch_busy(device::native_stream stream, unsigned us) override {
    check(static_cast<cudaError_t>(launch_busy_kernel(static_cast<CUstream_st*>(stream), us)),
          "busy kernel");
  }
  void launch_tiny(device::native_stream stream) override {
    check(static_cast<cudaError_t>(launch_tiny_kernel(static_cast<CUstream_st*>(stream))),
          "tiny kernel");
  }

 private:
  static constexpr std::size_t line_ints = 64 / sizeof(int);
  static std::size_t gate_index(std::size_t gate) { return 2 * gate * line_ints; }
  static std::size_t ack_index(std::size_t gate) { return (2 * gate + 1) * line_ints; }
  /// Captured on a stream of the bench's own, not the lane's: the reactor may look at a lane's
  /// stream at any moment, which a capture in progress does not allow.
  cudaGraphExec_t capture_gate_then_signal(std::size_t gate, const signal_ref& done) {
    if (capture_stream_ == nullptr)
      check(cudaStreamCreateWithFlags(&capture_stream_, cudaStreamNonBlocking), "capture stream");
    check(cudaStreamBeginCapture(capture_stream_, cudaStreamCaptureModeThreadLocal), "capture");
    const int launched = launch_gate_kernel(capture_stream_, dev_ + gate_index(gate), nullptr);
    const std::error_code signalled =
        launched == 0 ? backend().enqueue_signal(0, capture_stream_, done) : std::error_code{};
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(capture_stream_, &graph);
    if (launched != 0 || signalled || ended != cudaSuccess) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      (void)cudaGetLastError();
      check(static_cast<cudaError_t>(launched), "gate kernel (captured)");  // the first cause
      if (signalled) throw std::runtime_error("enqueue_signal (captured): " + signalled.message());
      check(ended, "end capture");
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    check(made, "cudaGraphInstantiate");
    return exec;
  }
  void drop_graphs() {
    for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
    graphs_.clear();
  }
  volatile int* host_ = nullptr;
  volatile int* dev_ = nullptr;
  std::size_t gate_count_ = 0;
  cudaStream_t capture_stream_ = nullptr;
  /// A graph per lane's stream, gate and slot (all three of its addresses: a slot of a later row
  /// may reuse one of them): what a graph names is fixed when it is made.
  using graph_key =
      std::tuple<device::native_stream, std::size_t, const void*, const void*, const void*>;
  std::map<graph_key, cudaGraphExec_t> graphs_;
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
