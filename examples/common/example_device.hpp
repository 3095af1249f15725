// What the examples share — none of it is part of evr: picking the GPU or evr's simulated device,
// memory on either, and the three kinds of work the examples put on a stream.
//
//   examples::device gpu("auto");            // the GPU if there is one, else the simulated device
//   evr::reactor reactor(gpu.backend());     // evr works the same on both
//   evr::stream stream(gpu.backend(), 0);
//   gpu.copy_to_device(stream, dev, host);   // queued on the stream, returns at once
//   gpu.affine(stream, dev, 2.0f, 1.0f);     // dev[i] = 2 * dev[i] + 1
//   gpu.copy_to_host(stream, host, dev);
//   ... then wait for the stream through evr ...
//
// On the GPU each call enqueues real CUDA work (cudaMemcpyAsync, a kernel). On the simulated
// device it enqueues an operation that the stream's worker thread runs in order, as a GPU would.
// Either way the work is *queued*, not done, when the call returns: finding out when it is done,
// without blocking a thread, is evr's job. Every call throws evr::error on failure.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

namespace examples {

class device;

/// n floats in the memory of one device (cudaMalloc on the GPU; heap memory on the simulated
/// device). Move-only; freed by the destructor, which on the GPU waits for the device (cudaFree
/// synchronizes): free it only once no queued work uses it.
class device_floats {
 public:
  device_floats() = default;
  device_floats(device_floats&& other) noexcept;
  device_floats& operator=(device_floats&& other) noexcept;
  ~device_floats();
  float* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  operator std::span<float>() const noexcept { return {data_, size_}; }  // NOLINT: a buffer view
  operator std::span<const float>() const noexcept { return {data_, size_}; }  // NOLINT

 private:
  friend class device;
  float* data_ = nullptr;
  std::size_t size_ = 0;
  bool gpu_ = false;
};

/// n floats in host memory that the GPU copies from and to asynchronously (pinned:
/// cudaMallocHost on the GPU; plain heap memory on the simulated device). Move-only.
class host_floats {
 public:
  host_floats() = default;
  host_floats(host_floats&& other) noexcept;
  host_floats& operator=(host_floats&& other) noexcept;
  ~host_floats();
  float* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  float& operator[](std::size_t i) const noexcept { return data_[i]; }
  float* begin() const noexcept { return data_; }
  float* end() const noexcept { return data_ + size_; }
  operator std::span<float>() const noexcept { return {data_, size_}; }  // NOLINT: a buffer view
  operator std::span<const float>() const noexcept { return {data_, size_}; }  // NOLINT

 private:
  friend class device;
  float* data_ = nullptr;
  std::size_t size_ = 0;
  bool gpu_ = false;
};

class device {
 public:
  /// Opens the device `choice` names (auto: the GPU when there is one; cuda; sim: evr's
  /// simulated device, with `sim_devices` devices; see example_cli.hpp for --device) and prints
  /// which one the example runs on. Throws std::invalid_argument for another choice,
  /// std::runtime_error for cuda without a usable GPU.
  explicit device(const std::string& choice, int sim_devices = 1);
  ~device();
  device(const device&) = delete;
  device& operator=(const device&) = delete;

  bool on_gpu() const noexcept { return sim_ == nullptr; }
  /// What evr talks to: the CUDA backend or the simulated device.
  evr::device::backend& backend() const noexcept { return *backend_; }
  /// Number of devices visible (GPUs, or the simulated device's count).
  int count() const noexcept { return count_; }
  /// "GPU" or "simulated device", for messages.
  const char* kind() const noexcept { return on_gpu() ? "GPU" : "simulated device"; }

  device_floats alloc_device(std::size_t n, int device_index = 0);
  host_floats alloc_host(std::size_t n);

  // --- work queued on a stream (the stream's device must own the device memory) --------------
  void copy_to_device(const evr::stream& s, std::span<float> dst, std::span<const float> src);
  void copy_to_host(const evr::stream& s, std::span<float> dst, std::span<const float> src);
  /// A kernel: data[i] = a * data[i] + b.
  void affine(const evr::stream& s, std::span<float> data, float a, float b);
  /// A kernel that does nothing but take `how_long` (stands for real work that takes a while).
  void busy(const evr::stream& s, std::chrono::milliseconds how_long);

 private:
  std::unique_ptr<evr::sim::device> sim_;  ///< null on the GPU
  evr::device::backend* backend_ = nullptr;
  int count_ = 0;
};

/// Milliseconds since the first call (for the examples' timelines).
double ms_since_start();

}  // namespace examples
