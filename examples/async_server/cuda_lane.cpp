// The lane on a CUDA device (lanes.hpp, make_cuda_lane): its stream, pinned and device buffers,
// cuBLAS handle, and the CUDA graphs /mlp and /busy run as (cuda_lane_options). Built only with
// the server's kernels (EVR_ASYNC_SERVER_HAVE_KERNELS).
#include "lanes.hpp"

#if defined(EVR_ASYNC_SERVER_HAVE_KERNELS)
#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdio>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw evr::error(evr::make_cuda_error(e), what);
}

/// Makes `device` the calling thread's current device, if it is not already: kernels and cuBLAS
/// calls must be issued with their stream's device current, and any io or pool thread may serve a
/// lane of any device. (cudaGetDevice reads the thread's state: no driver round trip.)
void make_current(int device) {
  int current = -1;
  check(cudaGetDevice(&current), "cudaGetDevice");
  if (current != device) check(cudaSetDevice(device), "cudaSetDevice");
}

/// make_current(device) for a constructor's member initializers; returns device.
int made_current(int device) {
  make_current(device);
  return device;
}

/// What `enqueue` queues on `stream`, captured into a graph (thread-local mode: other threads'
/// CUDA calls go on). nullptr on failure (`enqueue` threw, or CUDA refused the capture), with the
/// stream out of capture and the error cleared. The caller owns the graph.
template <class Enqueue>
cudaGraph_t capture_graph(cudaStream_t stream, Enqueue&& enqueue) noexcept {
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  bool ok = true;
  try {
    enqueue();
  } catch (const std::exception&) {
    ok = false;
  }
  cudaGraph_t graph = nullptr;
  ok = cudaStreamEndCapture(stream, &graph) == cudaSuccess && ok;
  if (!ok) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    return nullptr;
  }
  return graph;
}

/// Says on stderr, once per `told`, that capturing `route` failed (the lanes where it fails then
/// launch its work call by call: cuda_self_test.sh fails a test on this line).
void say_capture_failed(std::atomic<bool>& told, const char* route, int device) {
  if (!told.exchange(true))
    std::fprintf(stderr,
                 "evr-async-server: capturing %s as a CUDA graph failed on device %d; the lanes "
                 "where it fails launch its work call by call\n",
                 route, device);
}

/// `graph` made launchable; nullptr on failure, with the error cleared.
cudaGraphExec_t instantiate(cudaGraph_t graph) noexcept {
  cudaGraphExec_t exec = nullptr;
  if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return exec;
}

/// The only root of `graph` (a capture from one stream is a chain), or nullptr.
cudaGraphNode_t only_root(cudaGraph_t graph) noexcept {
  std::size_t count = 0;
  cudaGraphNode_t root = nullptr;
  if (cudaGraphGetRootNodes(graph, nullptr, &count) != cudaSuccess || count != 1 ||
      cudaGraphGetRootNodes(graph, &root, &count) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return root;
}

class cuda_lane final : public lane {
 public:
  cuda_lane(const cuda_mlp_weights& weights, cuda_lane_options options)
      : weights_(weights),
        mlp_graphs_on_(options.mlp_graphs),
        busy_graph_on_(options.busy_graph),
        device_(made_current(weights.device())),
        stream_(evr::device::cuda_backend(), device_) {
    check(cudaMalloc(&d_sum_, sizeof(double)), "cudaMalloc");
    check(cudaMallocHost(&h_sum_, sizeof(double)), "cudaMallocHost");
    // /busy's answer: pinned host memory mapped into the device's address space, written by the
    // kernel itself (no copy behind it: one CUDA call per request instead of two).
    check(
        cudaHostAlloc(&h_busy_, sizeof(std::uint32_t), cudaHostAllocMapped | cudaHostAllocPortable),
        "cudaHostAlloc");
    check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d_busy_), h_busy_, 0),
          "cudaHostGetDevicePointer");
    cublas_ = server_kernels::mlp_create_handle(native());
  }
  ~cuda_lane() override {
    if (cudaSetDevice(device_) != cudaSuccess) cudaGetLastError();  // cuBLAS wants its device
    cudaStreamSynchronize(native());
    drop_mlp_graphs();
    drop_busy_graph();
    server_kernels::mlp_destroy_handle(cublas_);
    free_buffers();
    free_mlp_buffers();
    cudaFree(d_sum_);
    cudaFreeHost(h_sum_);
    cudaFreeHost(h_busy_);  // (d_busy_ is its device-side address)
  }

  const evr::stream& stream() const noexcept override { return stream_; }

  void reserve(std::size_t n) override {
    if (n <= capacity_) return;
    make_current(device_);
    // Grows to a power of two so a mix of sizes settles after a few requests. cudaFree and
    // cudaMallocHost synchronize the device: acceptable at warm-up; buffers shrink only after an
    // unusually large request, on a large-request thread (shrink()).
    std::size_t cap = std::max<std::size_t>(capacity_, 1 << 16);
    while (cap < n) cap *= 2;
    free_buffers();
    const std::size_t bytes = cap * sizeof(float);
    check(cudaMalloc(&d_x_, bytes), "cudaMalloc");
    check(cudaMalloc(&d_y_, bytes), "cudaMalloc");
    check(cudaMallocHost(&h_x_, bytes), "cudaMallocHost");  // pinned: copies are truly async
    check(cudaMallocHost(&h_y_, bytes), "cudaMallocHost");
    check(cudaMallocHost(&h_out_, bytes), "cudaMallocHost");
    capacity_ = cap;
  }
  float* x() noexcept override { return h_x_; }
  float* y() noexcept override { return h_y_; }
  const float* out() const noexcept override { return h_out_; }
  double sum() const noexcept override { return *h_sum_; }
  void shrink(std::size_t n) override {
    if (capacity_ <= n) return;
    make_current(device_);
    free_buffers();  // the next reserve() allocates at the size it needs
  }

  void enqueue(const job::spec& s) override {
    no_signal();
    make_current(device_);
    const cudaStream_t st = native();
    const std::size_t bytes = s.n * sizeof(float);
    check(cudaMemcpyAsync(d_x_, h_x_, bytes, cudaMemcpyHostToDevice, st), "copy x in");
    if (s.kind == job::kind::saxpy) {
      check(cudaMemcpyAsync(d_y_, h_y_, bytes, cudaMemcpyHostToDevice, st), "copy y in");
      check(static_cast<cudaError_t>(server_kernels::launch_saxpy(st, s.a, d_x_, d_y_, s.n)),
            "saxpy kernel");
      check(cudaMemcpyAsync(h_out_, d_y_, bytes, cudaMemcpyDeviceToHost, st), "copy y out");
    } else {
      check(cudaMemsetAsync(d_sum_, 0, sizeof(double), st), "zero the sum");
      check(static_cast<cudaError_t>(server_kernels::launch_sum(st, d_x_, d_sum_, s.n)),
            "sum kernel");
      check(cudaMemcpyAsync(h_sum_, d_sum_, sizeof(double), cudaMemcpyDeviceToHost, st),
            "copy the sum out");
    }
  }

  void enqueue_busy(const busy::spec& s) override {
    make_current(device_);
    const cudaStream_t st = native();
    if (busy_graph_ready()) {
      no_signal();
      check(static_cast<cudaError_t>(
                server_kernels::set_busy_node_args(busy_exec_, busy_node_, s.us, s.seed, d_busy_)),
            "set the busy graph's arguments");
      check(cudaGraphLaunch(busy_exec_, st), "launch the busy graph");
      if (has_signal_slot()) (void)arm_signal();  // after the launch, as for /mlp's graphs
      return;
    }
    // The kernel writes its answer straight into mapped host memory (then a system-scope fence):
    // one launch and nothing else per request. The work is done -- in every mode, by evr's
    // marker or the blocking synchronize behind the kernel -- only after that write is visible.
    check(static_cast<cudaError_t>(
              server_kernels::launch_busy(st, s.us, s.seed, d_busy_, arm_signal())),
          "busy kernel");
  }
  std::uint32_t busy_result() const noexcept override {
    return *static_cast<volatile const std::uint32_t*>(h_busy_);
  }

  void reserve_rows(std::size_t rows) override {
    if (rows <= rows_) return;
    make_current(device_);
    std::size_t cap = std::max<std::size_t>(rows_, 8);
    while (cap < rows) cap *= 2;
    free_mlp_buffers();
    const mlp::shape& d = weights_.dims();
    const std::size_t in = cap * static_cast<std::size_t>(d.in) * sizeof(float);
    const std::size_t act = cap * static_cast<std::size_t>(d.widest()) * sizeof(float);
    const std::size_t out = cap * static_cast<std::size_t>(d.out) * sizeof(float);
    check(cudaMalloc(&d_mlp_in_, in), "cudaMalloc (mlp input)");
    check(cudaMalloc(&d_mlp_a_, act), "cudaMalloc (mlp activations)");
    check(cudaMalloc(&d_mlp_b_, act), "cudaMalloc (mlp activations)");
    check(cudaMallocHost(&h_mlp_in_, in), "cudaMallocHost (mlp input)");
    check(cudaMallocHost(&h_mlp_out_, out), "cudaMallocHost (mlp output)");
    rows_ = cap;
  }
  float* mlp_input() noexcept override { return h_mlp_in_; }
  void enqueue_mlp(std::size_t rows) override {
    make_current(device_);
    if (cudaGraphExec_t graph = mlp_graph(rows)) {
      no_signal();
      check(cudaGraphLaunch(graph, native()), "launch the mlp graph");
      // Armed after the launch is queued, so a launch that failed leaves no signal owed.
      if (has_signal_slot()) (void)arm_signal();
      return;
    }
    no_signal();
    enqueue_mlp_steps(rows);
  }
  const float* mlp_output() const noexcept override { return h_mlp_out_; }

  void use_signal(evr::signal_slot slot) noexcept override {
    drop_mlp_graphs();  // captured without the signal (warm-up): captured again with it
    drop_busy_graph();
    lane::use_signal(std::move(slot));
  }

 private:
  static constexpr std::size_t max_mlp_graphs = 16;  // buckets 1 .. 2^15 rows

  /// The graph of the bucket `rows` falls in, captured now if it is new; nullptr: run eagerly
  /// (graphs off, or a capture failed once: then never again on this lane).
  cudaGraphExec_t mlp_graph(std::size_t rows) {
    if (!mlp_graphs_on_) return nullptr;
    const std::size_t bucket = std::min(std::bit_ceil(rows), rows_);  // the buffers hold rows_ rows
    for (const auto& [b, exec] : mlp_graphs_)
      if (b == bucket) return exec;
    if (mlp_graphs_.size() >= max_mlp_graphs) return nullptr;
    cudaGraphExec_t exec = capture_mlp(bucket);
    if (exec == nullptr) {
      mlp_graphs_on_ = false;
      static std::atomic<bool> told{false};  // once per process, not once per lane
      say_capture_failed(told, "/mlp", device_);
      return nullptr;
    }
    mlp_graphs_.emplace_back(bucket, exec);
    return exec;
  }

  /// The forward pass of `rows` rows, and the lane's signal when it has a slot, captured and
  /// instantiated; nullptr on failure.
  cudaGraphExec_t capture_mlp(std::size_t rows) noexcept {
    const cudaStream_t st = native();
    cudaGraph_t graph = capture_graph(st, [&] {
      enqueue_mlp_steps(rows);
      if (has_signal_slot()) enqueue_slot_signal(st);
    });
    if (graph == nullptr) return nullptr;
    cudaGraphExec_t exec = instantiate(graph);
    cudaGraphDestroy(graph);
    return exec;
  }

  /// /busy's graph is captured (now, on first use); false: launch eagerly (busy graphs off, or
  /// the capture failed once: then never again on this lane).
  bool busy_graph_ready() {
    if (busy_exec_ != nullptr) return true;
    if (!busy_graph_on_) return false;
    if (!capture_busy()) {
      busy_graph_on_ = false;
      static std::atomic<bool> told{false};  // once per process, not once per lane
      say_capture_failed(told, "/busy", device_);
    }
    return busy_exec_ != nullptr;
  }

  /// The /busy kernel (not signalling itself), and the lane's signal when it has a slot, captured
  /// and instantiated; busy_node_ is the kernel's node, whose arguments each request sets. False
  /// on failure, with nothing kept.
  bool capture_busy() noexcept {
    const cudaStream_t st = native();
    busy_graph_ = capture_graph(st, [&] {
      check(static_cast<cudaError_t>(server_kernels::launch_busy(st, 1, 1, d_busy_)),
            "busy kernel");
      if (has_signal_slot()) enqueue_slot_signal(st);
    });
    if (busy_graph_ != nullptr) busy_node_ = only_root(busy_graph_);  // the kernel
    if (busy_node_ != nullptr) busy_exec_ = instantiate(busy_graph_);
    if (busy_exec_ == nullptr) drop_busy_graph();
    return busy_exec_ != nullptr;
  }

  /// Only while nothing is queued. The graph itself is kept while its exec lives: busy_node_ is
  /// one of its nodes.
  void drop_busy_graph() noexcept {
    if (busy_exec_ != nullptr) cudaGraphExecDestroy(busy_exec_);
    if (busy_graph_ != nullptr) cudaGraphDestroy(busy_graph_);
    busy_exec_ = nullptr;
    busy_graph_ = nullptr;
    busy_node_ = nullptr;
  }

  /// Only while nothing is queued: the graphs name the buffers and the slot.
  void drop_mlp_graphs() noexcept {
    for (const auto& [b, exec] : mlp_graphs_) cudaGraphExecDestroy(exec);
    mlp_graphs_.clear();
  }

  /// Copy in, the layers (cuBLAS), copy out, on the lane's stream.
  void enqueue_mlp_steps(std::size_t rows) {
    const cudaStream_t st = native();
    const mlp::shape& d = weights_.dims();
    check(
        cudaMemcpyAsync(d_mlp_in_, h_mlp_in_, rows * static_cast<std::size_t>(d.in) * sizeof(float),
                        cudaMemcpyHostToDevice, st),
        "copy the mlp input in");
    const std::vector<server_kernels::mlp_layer>& layers = weights_.layers();
    const float* result =
        server_kernels::mlp_enqueue_forward(cublas_, layers.data(), static_cast<int>(layers.size()),
                                            d_mlp_in_, d_mlp_a_, d_mlp_b_, static_cast<int>(rows));
    check(
        cudaMemcpyAsync(h_mlp_out_, result, rows * static_cast<std::size_t>(d.out) * sizeof(float),
                        cudaMemcpyDeviceToHost, st),
        "copy the mlp output out");
  }

  cudaStream_t native() const noexcept { return static_cast<cudaStream_t>(stream_.native()); }
  void free_buffers() noexcept {
    cudaFree(d_x_);
    cudaFree(d_y_);
    cudaFreeHost(h_x_);
    cudaFreeHost(h_y_);
    cudaFreeHost(h_out_);
    d_x_ = d_y_ = h_x_ = h_y_ = h_out_ = nullptr;
    capacity_ = 0;
  }
  void free_mlp_buffers() noexcept {
    drop_mlp_graphs();
    cudaFree(d_mlp_in_);
    cudaFree(d_mlp_a_);
    cudaFree(d_mlp_b_);
    cudaFreeHost(h_mlp_in_);
    cudaFreeHost(h_mlp_out_);
    d_mlp_in_ = d_mlp_a_ = d_mlp_b_ = h_mlp_in_ = h_mlp_out_ = nullptr;
    rows_ = 0;
  }

  const cuda_mlp_weights& weights_;
  bool mlp_graphs_on_;
  std::vector<std::pair<std::size_t, cudaGraphExec_t>> mlp_graphs_;  // (bucket, graph), few
  bool busy_graph_on_;
  cudaGraph_t busy_graph_ = nullptr;
  cudaGraphNode_t busy_node_ = nullptr;  // the /busy kernel's node in busy_graph_
  cudaGraphExec_t busy_exec_ = nullptr;
  int device_;
  evr::stream stream_;
  void* cublas_ = nullptr;
  std::size_t capacity_ = 0;
  float* d_x_ = nullptr;
  float* d_y_ = nullptr;
  float* h_x_ = nullptr;
  float* h_y_ = nullptr;
  float* h_out_ = nullptr;
  double* d_sum_ = nullptr;
  double* h_sum_ = nullptr;
  std::uint32_t* d_busy_ = nullptr;  // h_busy_ as the device sees it (mapped)
  std::uint32_t* h_busy_ = nullptr;
  std::size_t rows_ = 0;
  float* d_mlp_in_ = nullptr;
  float* d_mlp_a_ = nullptr;
  float* d_mlp_b_ = nullptr;
  float* h_mlp_in_ = nullptr;
  float* h_mlp_out_ = nullptr;
};

}  // namespace

cuda_mlp_weights::cuda_mlp_weights(const mlp::model& model, int device)
    : shape_(model.dims()), device_(device) {
  make_current(device_);
  try {
    for (int l = 0; l < shape_.layers(); ++l)
      layers_.push_back(server_kernels::mlp_upload_layer(
          model.u(l, 0), model.v(l, 0), model.u(l, 1), model.v(l, 1), model.bias(l),
          shape_.layer_in(l), shape_.layer_out(l)));
  } catch (...) {
    for (auto& layer : layers_) server_kernels::mlp_free_layer(layer);
    throw;
  }
}

cuda_mlp_weights::~cuda_mlp_weights() {
  if (cudaSetDevice(device_) != cudaSuccess) cudaGetLastError();
  for (auto& layer : layers_) server_kernels::mlp_free_layer(layer);
}

std::unique_ptr<lane> make_cuda_lane(const cuda_mlp_weights& weights, cuda_lane_options options) {
  return std::make_unique<cuda_lane>(weights, options);
}
#endif
