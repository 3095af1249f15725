#include "lanes.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <asio/use_awaitable.hpp>

#if defined(EVR_ASYNC_SERVER_HAVE_KERNELS)
#include <cuda_runtime.h>

#include "kernels.hpp"
#endif

namespace {

class sim_lane final : public lane {
 public:
  explicit sim_lane(evr::sim::device& dev) : dev_(dev), stream_(dev, 0) {}
  ~sim_lane() override {
    // The worker thread may still run a body that writes our buffers (a request abandoned at
    // shutdown): wait for it before they go.
    std::error_code ec;
    stream_.synchronize(ec);
  }

  const evr::stream& stream() const noexcept override { return stream_; }
  void reserve(std::size_t n) override {
    if (x_.size() >= n) return;
    x_.resize(n);
    y_.resize(n);
    out_.resize(n);
  }
  float* x() noexcept override { return x_.data(); }
  float* y() noexcept override { return y_.data(); }
  const float* out() const noexcept override { return out_.data(); }
  double sum() const noexcept override { return sum_; }

  void enqueue(const job::spec& s) override {
    auto body = [this, s] {
      if (s.kind == job::kind::saxpy) {
        for (std::size_t i = 0; i < s.n; ++i) out_[i] = s.a * x_[i] + y_[i];
      } else {
        sum_ = job::sum(x_.data(), s.n);
      }
    };
    evr::throw_if(dev_.launch_kernel(stream_.native(), std::chrono::nanoseconds(s.n), body),
                  "simulated kernel launch");
  }

 private:
  evr::sim::device& dev_;
  evr::stream stream_;
  std::vector<float> x_, y_, out_;
  double sum_ = 0;
};

}  // namespace

std::unique_ptr<lane> make_sim_lane(evr::sim::device& device) {
  return std::make_unique<sim_lane>(device);
}

#if defined(EVR_ASYNC_SERVER_HAVE_KERNELS)
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw evr::error(evr::make_cuda_error(e), what);
}

class cuda_lane final : public lane {
 public:
  cuda_lane() : stream_(evr::device::cuda_backend(), 0) {
    check(cudaMalloc(&d_sum_, sizeof(double)), "cudaMalloc");
    check(cudaMallocHost(&h_sum_, sizeof(double)), "cudaMallocHost");
  }
  ~cuda_lane() override {
    cudaStreamSynchronize(native());
    free_buffers();
    cudaFree(d_sum_);
    cudaFreeHost(h_sum_);
  }

  const evr::stream& stream() const noexcept override { return stream_; }

  void reserve(std::size_t n) override {
    if (n <= capacity_) return;
    // Grows to a power of two so a mix of sizes settles after a few requests. cudaFree and
    // cudaMallocHost synchronize the device: acceptable at warm-up, the reason not to shrink.
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

  void enqueue(const job::spec& s) override {
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

 private:
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

  evr::stream stream_;
  std::size_t capacity_ = 0;
  float* d_x_ = nullptr;
  float* d_y_ = nullptr;
  float* h_x_ = nullptr;
  float* h_y_ = nullptr;
  float* h_out_ = nullptr;
  double* d_sum_ = nullptr;
  double* h_sum_ = nullptr;
};

}  // namespace

std::unique_ptr<lane> make_cuda_lane() { return std::make_unique<cuda_lane>(); }
#endif

lane_pool::lane_pool(const asio::any_io_executor& ex, std::vector<std::unique_ptr<lane>> lanes)
    : lanes_(std::move(lanes)), free_(ex, lanes_.size()) {
  for (auto& l : lanes_) release(l.get());
}

asio::awaitable<lane_pool::lease> lane_pool::acquire() {
  // Fast path without a suspension when a lane is free (try_receive runs the handler inline).
  lane* got = nullptr;
  free_.try_receive([&got](std::error_code, lane* l) { got = l; });
  if (got == nullptr) got = co_await free_.async_receive(asio::use_awaitable);
  co_return lease(this, got);
}

void lane_pool::release(lane* l) noexcept {
  if (!free_.try_send(std::error_code{}, l))
    std::fprintf(stderr, "evr-async-server: internal error: lane pool over capacity\n");
}

void lane_pool::lease::give_back() noexcept {
  if (lane_ == nullptr) return;
  if (busy_) {
    if (std::error_code ec = lane_->synchronize())
      std::fprintf(stderr, "evr-async-server: draining a lane after a failure: %s\n",
                   ec.message().c_str());
  }
  pool_->release(lane_);
  lane_ = nullptr;
  pool_ = nullptr;
}
