// A backend that forwards every call to another one and counts what the pool tests care about:
// events created and destroyed (and on which threads), with optional failure injection for
// create_event. Works over any backend (sim or CUDA), so the generic pool tests can check
// backend-level balance on the GPU too.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include <evr/device/backend.hpp>

#include "support/forwarding_backend.hpp"

namespace evr::test {

class counting_backend final : public forwarding_backend {
 public:
  using forwarding_backend::forwarding_backend;

  std::uint64_t created() const { return created_.load(); }
  std::uint64_t destroyed() const { return destroyed_.load(); }
  std::uint64_t live() const { return created() - destroyed(); }
  /// Threads that created at least one event.
  std::set<std::thread::id> creator_threads() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return creators_;
  }
  std::set<std::thread::id> destroyer_threads() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return destroyers_;
  }
  /// The next `n` create_event calls succeed, the ones after fail with `error` (until reset).
  void fail_creates_after(std::uint64_t n,
                          std::error_code error = make_cuda_error(cuda_value::invalid_value)) {
    fail_error_ = error;
    creates_left_.store(static_cast<std::int64_t>(n));
  }
  void stop_failing() { creates_left_.store(-1); }

  std::string describe() const override { return "counting(" + inner_.describe() + ")"; }

  std::error_code create_event(int device, device::event_flags flags,
                               device::native_event& out) noexcept override {
    std::int64_t left = creates_left_.load();
    while (left >= 0) {
      if (left == 0) return fail_error_;
      if (creates_left_.compare_exchange_weak(left, left - 1)) break;
    }
    std::error_code ec = inner_.create_event(device, flags, out);
    if (!ec) {
      created_.fetch_add(1);
      std::lock_guard<std::mutex> lock(mutex_);
      creators_.insert(std::this_thread::get_id());
    }
    return ec;
  }
  void destroy_event(device::native_event event) noexcept override {
    destroyed_.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      destroyers_.insert(std::this_thread::get_id());
    }
    inner_.destroy_event(event);
  }

 private:
  std::atomic<std::uint64_t> created_{0};
  std::atomic<std::uint64_t> destroyed_{0};
  std::atomic<std::int64_t> creates_left_{-1};  ///< -1: never fail
  std::error_code fail_error_;
  mutable std::mutex mutex_;
  std::set<std::thread::id> creators_;
  std::set<std::thread::id> destroyers_;
};

/// A lock-free "who owns this event" map for the hammer tests: claim() fails if the event is
/// already owned, so an event handed out twice at once is caught at the second hand-out.
class ownership_map {
 public:
  static constexpr std::size_t capacity = 1 << 16;

  /// true if `key` was free and is now owned.
  bool claim(const void* key) { return slot(key).exchange(1) == 0; }
  /// true if `key` was owned and is now free.
  bool unclaim(const void* key) { return slot(key).exchange(0) == 1; }

 private:
  std::atomic<int>& slot(const void* key) {
    std::size_t h = (reinterpret_cast<std::uintptr_t>(key) >> 4) * 0x9E3779B97F4A7C15ull;
    for (std::size_t i = 0; i < capacity; ++i) {
      std::size_t at = (h + i) & (capacity - 1);
      const void* k = keys_[at].load();
      if (k == key) return owned_[at];
      if (k == nullptr) {
        const void* expected = nullptr;
        if (keys_[at].compare_exchange_strong(expected, key) || expected == key) return owned_[at];
      }
    }
    return overflow_;  // never reached in the tests (far fewer events than capacity)
  }
  std::atomic<const void*> keys_[capacity] = {};
  std::atomic<int> owned_[capacity] = {};
  std::atomic<int> overflow_{0};
};

}  // namespace evr::test
