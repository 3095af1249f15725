#include "lanes.hpp"

#include <cstdio>
#include <utility>
#include <vector>

#include <asio/use_awaitable.hpp>

#include "busy_math.hpp"

const char* to_string(sync_kind s) noexcept {
  switch (s) {
    case sync_kind::spin: return "spin";
    case sync_kind::automatic: return "auto";
    case sync_kind::blocking_sync: return "blocking-sync";
  }
  return "?";
}

std::error_code lane::wait_blocking(sync_kind how) noexcept {
  const evr::stream& s = stream();
  // spin and automatic differ in the device's scheduling flag, set at start-up (main.cpp).
  if (how != sync_kind::blocking_sync) return s.backend()->synchronize_stream(s.native());
  std::error_code ec;
  try {
    if (!blocking_event_)
      blocking_event_ = evr::event(*s.backend(), evr::device::event_flags::blocking_sync);
  } catch (const std::exception&) {
    return std::make_error_code(std::errc::not_enough_memory);
  }
  blocking_event_.record(s, ec);
  if (ec) return ec;
  return s.backend()->synchronize_event(blocking_event_.native());
}

std::error_code lane::record_done_event(evr::device::native_event& out) noexcept {
  const evr::stream& s = stream();
  try {
    if (!done_event_) done_event_ = evr::event(*s.backend());
  } catch (const std::exception&) {
    return std::make_error_code(std::errc::not_enough_memory);
  }
  std::error_code ec;
  done_event_.record(s, ec);
  if (ec) return ec;
  out = done_event_.native();
  return {};
}

namespace {

class sim_lane final : public lane {
 public:
  sim_lane(evr::sim::device& dev, int device_index, const mlp::model& model, const sim_costs& costs,
           evr::device::backend& stream_backend)
      : dev_(dev), model_(model), costs_(costs), stream_(stream_backend, device_index) {}
  ~sim_lane() override {
    // The worker thread may still run a body that writes our buffers (work abandoned at
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
  void shrink(std::size_t n) override {
    if (x_.size() <= n) return;
    x_ = std::vector<float>();  // (not `= {}`: that keeps the capacity)
    y_ = std::vector<float>();
    out_ = std::vector<float>();
  }

  void enqueue(const job::spec& s) override {
    no_signal();
    auto body = [this, s] {
      if (s.kind == job::kind::saxpy) {
        for (std::size_t i = 0; i < s.n; ++i) out_[i] = s.a * x_[i] + y_[i];
      } else {
        sum_ = job::sum(x_.data(), s.n);
      }
    };
    launch(costs_.per_element * static_cast<long long>(s.n), std::move(body), "simulated kernel");
  }

  void enqueue_busy(const busy::spec& s) override {
    const evr::signal_ref* done = arm_signal();
    launch(
        std::chrono::microseconds(s.us),
        [this, seed = s.seed, signal = done != nullptr,
         ref = done != nullptr ? *done : evr::signal_ref{}] {
          busy_ = busy_math::reference(seed);
          if (signal) evr::sim::signal(ref);  // what evr::signal does on the GPU
        },
        "simulated busy kernel");
  }
  std::uint32_t busy_result() const noexcept override { return busy_; }

  void reserve_rows(std::size_t rows) override {
    const mlp::shape& d = model_.dims();
    if (mlp_in_.size() >= rows * static_cast<std::size_t>(d.in)) return;
    mlp_in_.resize(rows * static_cast<std::size_t>(d.in));
    mlp_out_.resize(rows * static_cast<std::size_t>(d.out));
  }
  float* mlp_input() noexcept override { return mlp_in_.data(); }
  void enqueue_mlp(std::size_t rows) override {
    no_signal();
    const mlp::shape& d = model_.dims();
    auto body = [this, rows, in = static_cast<std::size_t>(d.in),
                 out = static_cast<std::size_t>(d.out)] {
      for (std::size_t r = 0; r < rows; ++r)
        model_.forward(mlp_in_.data() + r * in, mlp_out_.data() + r * out);
    };
    launch(costs_.mlp_base + costs_.mlp_per_row * static_cast<long long>(rows), std::move(body),
           "simulated mlp kernel");
  }
  const float* mlp_output() const noexcept override { return mlp_out_.data(); }

 private:
  void launch(std::chrono::nanoseconds d, std::function<void()> body, const char* what) {
    evr::throw_if(dev_.launch_kernel(stream_.native(), d, std::move(body)), what);
  }

  evr::sim::device& dev_;
  const mlp::model& model_;
  sim_costs costs_;
  evr::stream stream_;
  std::vector<float> x_, y_, out_, mlp_in_, mlp_out_;
  double sum_ = 0;
  std::uint32_t busy_ = 0;
};

}  // namespace

std::unique_ptr<lane> make_sim_lane(evr::sim::device& device, int device_index,
                                    const mlp::model& model, const sim_costs& costs,
                                    evr::device::backend* stream_backend) {
  return std::make_unique<sim_lane>(device, device_index, model, costs,
                                    stream_backend != nullptr ? *stream_backend : device);
}

lane_pool::lane_pool(std::vector<lane*> lanes) : lanes_(std::move(lanes)), slots_(lanes_.size()) {}

lane_pool::lease lane_pool::try_acquire() noexcept {
  const std::uint32_t i = slots_.try_take();
  return i == index_pool::none ? lease() : lease(this, i);
}

asio::awaitable<lane_pool::lease> lane_pool::acquire() {
  if (lease l = try_acquire()) co_return l;
  co_return co_await acquire_waiting();
}

void lane_pool::lease::give_back() noexcept {
  if (lane_ == nullptr) return;
  if (busy_) {
    if (std::error_code ec = lane_->wait_blocking(sync_kind::spin))
      std::fprintf(stderr, "evr-async-server: draining a lane after a failure: %s\n",
                   ec.message().c_str());
  }
  pool_->slots_.give_back(index_);
  lane_ = nullptr;
  pool_ = nullptr;
}
