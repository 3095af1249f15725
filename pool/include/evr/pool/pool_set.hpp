// evr/pool/pool_set.hpp — the pools of one backend: event pools, one per device and event class,
// and signal-slot pools (signal_pool.hpp), one per device; each created on first use.
//
// Thread safety: every member is thread-safe. get() is lock-free once the pool exists (an array of
// atomic pointers, acquire/release); creating a pool takes a mutex.
// Lifetime: pools live as long as the pool_set; events still out when it is destroyed are
// destroyed when released (see event_pool).
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <mutex>

#include <evr/pool/event_pool.hpp>
#include <evr/pool/signal_pool.hpp>

namespace evr {

/// The event pools of one backend, one per device and event_class, created on first use.
/// Thread safety: every member is thread-safe. Lifetime: the pools live as long as the set.
/// Errors: evr::error, or std::error_code with the non-throwing get(). See the file comment.
class pool_set {
 public:
  static constexpr int max_devices = 64;  ///< device indices are in [0, max_devices)

  /// An empty set over `backend` (which must outlive it); `options` for every pool it makes.
  explicit pool_set(device::backend& backend, pool_options options = {});
  ~pool_set();
  pool_set(const pool_set&) = delete;
  pool_set& operator=(const pool_set&) = delete;

  /// The pool of `device` and `klass`, created on first use. Throws evr::error(errc::no_device)
  /// for a device index outside [0, max_devices) or beyond the backend's device count (the
  /// backend's own error when it cannot count its devices, e.g. CUDA without a driver;
  /// errc::invalid_argument for a class out of range; the backend's error when options.initial
  /// events cannot be created). The message names the device and the class.
  event_pool& get(int device, event_class klass = event_class::plain);
  /// Same, never throws: nullptr and `ec` set on failure.
  event_pool* get(int device, event_class klass, std::error_code& ec) noexcept;

  /// The signal slots of `device` (signal_pool.hpp), created on first use. Throws evr::error
  /// (errc::no_device for a device outside the backend's, as get()).
  signal_pool& signals(int device);
  /// Same, never throws: nullptr and `ec` set on failure.
  signal_pool* signals(int device, std::error_code& ec) noexcept;

  /// empty_cache() on every pool.
  void empty_cache() noexcept;
  /// Sum of the stats of every pool (peak_in_use: the sum of the pools' peaks).
  pool_stats stats() const noexcept;

  device::backend& backend() const noexcept { return backend_; }  ///< its backend

 private:
  device::backend& backend_;
  pool_options options_;
  int device_count_ = 0;  ///< guarded by create_mutex_
  std::mutex create_mutex_;
  std::array<std::atomic<event_pool*>, max_devices * event_class_count> pools_{};
  std::array<std::atomic<signal_pool*>, max_devices> signal_pools_{};
  /// (create_mutex_) ec when `device` is not one of the backend's.
  std::error_code check_device(int device) noexcept;
};

}  // namespace evr
