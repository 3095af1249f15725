#include "example_device.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <utility>

#if defined(EVR_EXAMPLES_HAVE_KERNELS)
#include <cuda_runtime.h>

#include "kernels.hpp"
#endif

namespace examples {
namespace {

#if defined(EVR_EXAMPLES_HAVE_KERNELS)
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw evr::error(evr::make_cuda_error(static_cast<int>(e)), what);
}
cudaStream_t native(const evr::stream& s) { return static_cast<cudaStream_t>(s.native()); }
#endif

// The simulated device's "kernels" take about 1 ns per element, like the demo's.
std::chrono::nanoseconds sim_cost(std::size_t n) { return std::chrono::nanoseconds(n); }

}  // namespace

// --- choosing the device ----------------------------------------------------------------------

device::device(const std::string& want, int sim_devices) {
  if (want != "auto" && want != "cuda" && want != "sim")
    throw std::invalid_argument("--device takes auto, cuda or sim, not '" + want + "'");

  bool gpu = false;
#if defined(EVR_EXAMPLES_HAVE_KERNELS)
  if (want != "sim") gpu = evr::device::cuda_device_available();
#endif
  if (want == "cuda" && !gpu)
    throw std::runtime_error("--device cuda, but no usable GPU (or built without CUDA kernels)");

  if (gpu) {
    backend_ = &evr::device::cuda_backend();
    evr::throw_if(backend_->device_count(count_), "cudaGetDeviceCount");
    std::printf("device: GPU — %s\n", backend_->describe().c_str());
  } else {
    sim_ = std::make_unique<evr::sim::device>(evr::sim::options{.devices = sim_devices});
    backend_ = sim_.get();
    count_ = sim_devices;
    std::printf("device: SIMULATED (no GPU %s) — %s\n", want == "sim" ? "requested" : "found",
                sim_->describe().c_str());
  }
  std::fflush(stdout);
}

device::~device() = default;

// --- memory -----------------------------------------------------------------------------------

device_floats device::alloc_device(std::size_t n, int device_index) {
  device_floats out;
  out.size_ = n;
  out.gpu_ = on_gpu();
#if defined(EVR_EXAMPLES_HAVE_KERNELS)
  if (on_gpu()) {
    check(cudaSetDevice(device_index), "cudaSetDevice");
    check(cudaMalloc(&out.data_, n * sizeof(float)), "cudaMalloc");
    return out;
  }
#endif
  (void)device_index;
  out.data_ = new float[n]();
  return out;
}

host_floats device::alloc_host(std::size_t n) {
  host_floats out;
  out.size_ = n;
  out.gpu_ = on_gpu();
#if defined(EVR_EXAMPLES_HAVE_KERNELS)
  if (on_gpu()) {
    check(cudaMallocHost(&out.data_, n * sizeof(float)), "cudaMallocHost");
    std::memset(out.data_, 0, n * sizeof(float));
    return out;
  }
#endif
  out.data_ = new float[n]();
  return out;
}

device_floats::device_floats(device_floats&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      gpu_(other.gpu_) {}

device_floats& device_floats::operator=(device_floats&& other) noexcept {
  if (this != &other) {
    device_floats old(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    gpu_ = other.gpu_;
  }
  return *this;
}

device_floats::~device_floats() {
  if (data_ == nullptr) return;
#if defined(EVR_EXAMPLES_HAVE_KERNELS)
  if (gpu_) {
    cudaFree(data_);
    return;
  }
#endif
  delete[] data_;
}

host_floats::host_floats(host_floats&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      gpu_(other.gpu_) {}

host_floats& host_floats::operator=(host_floats&& other) noexcept {
  if (this != &other) {
    host_floats old(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    gpu_ = other.gpu_;
  }
  return *this;
}

host_floats::~host_floats() {
  if (data_ == nullptr) return;
#if defined(EVR_EXAMPLES_HAVE_KERNELS)
  if (gpu_) {
    cudaFreeHost(data_);
    return;
  }
#endif
  delete[] data_;
}

// --- work on a stream ---------------------------------------------------------------------------

void device::copy_to_device(const evr::stream& s, std::span<float> dst,
                            std::span<const float> src) {
  const std::size_t n = std::min(dst.size(), src.size());
#if defined(EVR_EXAMPLES_HAVE_KERNELS)
  if (on_gpu()) {
    check(cudaMemcpyAsync(dst.data(), src.data(), n * sizeof(float), cudaMemcpyHostToDevice,
                          native(s)),
          "cudaMemcpyAsync (to the device)");
    return;
  }
#endif
  // The simulated copy runs on the stream's worker thread, in order with the stream's other work.
  auto body = [d = dst.data(), from = src.data(), n] { std::memcpy(d, from, n * sizeof(float)); };
  evr::throw_if(sim_->launch_kernel(s.native(), sim_cost(n), body), "simulated copy to the device");
}

void device::copy_to_host(const evr::stream& s, std::span<float> dst, std::span<const float> src) {
  const std::size_t n = std::min(dst.size(), src.size());
#if defined(EVR_EXAMPLES_HAVE_KERNELS)
  if (on_gpu()) {
    check(cudaMemcpyAsync(dst.data(), src.data(), n * sizeof(float), cudaMemcpyDeviceToHost,
                          native(s)),
          "cudaMemcpyAsync (to the host)");
    return;
  }
#endif
  auto body = [d = dst.data(), from = src.data(), n] { std::memcpy(d, from, n * sizeof(float)); };
  evr::throw_if(sim_->launch_kernel(s.native(), sim_cost(n), body), "simulated copy to the host");
}

void device::affine(const evr::stream& s, std::span<float> data, float a, float b) {
#if defined(EVR_EXAMPLES_HAVE_KERNELS)
  if (on_gpu()) {
    check(cudaSetDevice(s.device()), "cudaSetDevice");  // a kernel launches on the current device
    check(
        static_cast<cudaError_t>(kernels::launch_affine(native(s), data.data(), data.size(), a, b)),
        "affine kernel");
    return;
  }
#endif
  auto body = [data, a, b] {
    for (float& x : data) x = a * x + b;
  };
  evr::throw_if(sim_->launch_kernel(s.native(), sim_cost(data.size()), body),
                "simulated affine kernel");
}

void device::busy(const evr::stream& s, std::chrono::milliseconds how_long) {
#if defined(EVR_EXAMPLES_HAVE_KERNELS)
  if (on_gpu()) {
    check(cudaSetDevice(s.device()), "cudaSetDevice");
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(how_long).count();
    check(static_cast<cudaError_t>(
              kernels::launch_busy(native(s), static_cast<unsigned long long>(ns))),
          "busy kernel");
    return;
  }
#endif
  evr::throw_if(sim_->launch_kernel(s.native(), how_long), "simulated busy kernel");
}

double ms_since_start() {
  static const auto start = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace examples
