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

namespace evr::test {

class counting_backend final : public device::backend {
 public:
  explicit counting_backend(device::backend& inner) : inner_(inner) {}

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

  std::string_view name() const noexcept override { return inner_.name(); }
  bool is_simulated() const noexcept override { return inner_.is_simulated(); }
  std::string describe() const override { return "counting(" + inner_.describe() + ")"; }
  std::error_code device_count(int& count) noexcept override { return inner_.device_count(count); }

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
  std::error_code record_event(device::native_event e, device::native_stream s) noexcept override {
    return inner_.record_event(e, s);
  }
  std::error_code query_event(device::native_event e) noexcept override {
    return inner_.query_event(e);
  }
  std::error_code synchronize_event(device::native_event e) noexcept override {
    return inner_.synchronize_event(e);
  }
  std::error_code elapsed_ms(device::native_event a, device::native_event b,
                             float& ms) noexcept override {
    return inner_.elapsed_ms(a, b, ms);
  }
  std::error_code export_event(device::native_event e,
                               device::ipc_event_handle& out) noexcept override {
    return inner_.export_event(e, out);
  }
  std::error_code import_event(const device::ipc_event_handle& h,
                               device::native_event& out) noexcept override {
    return inner_.import_event(h, out);
  }
  std::error_code create_stream(int device, int priority,
                                device::native_stream& out) noexcept override {
    return inner_.create_stream(device, priority, out);
  }
  void destroy_stream(device::native_stream s) noexcept override { inner_.destroy_stream(s); }
  std::error_code stream_device(device::native_stream s, int& d) noexcept override {
    return inner_.stream_device(s, d);
  }
  std::error_code stream_priority(device::native_stream s, int& p) noexcept override {
    return inner_.stream_priority(s, p);
  }
  std::error_code query_stream(device::native_stream s) noexcept override {
    return inner_.query_stream(s);
  }
  std::error_code synchronize_stream(device::native_stream s) noexcept override {
    return inner_.synchronize_stream(s);
  }
  std::error_code stream_wait_event(device::native_stream s,
                                    device::native_event e) noexcept override {
    return inner_.stream_wait_event(s, e);
  }
  std::error_code launch_host_func(device::native_stream s, void (*fn)(void*),
                                   void* arg) noexcept override {
    return inner_.launch_host_func(s, fn, arg);
  }
  bool stream_is_capturing(device::native_stream s) noexcept override {
    return inner_.stream_is_capturing(s);
  }
  std::error_code allocate_fence_block(int device, std::size_t words,
                                       device::fence_block& out) noexcept override {
    return inner_.allocate_fence_block(device, words, out);
  }
  void free_fence_block(device::fence_block& block) noexcept override {
    inner_.free_fence_block(block);
  }
  std::error_code write_fence(device::native_stream s, std::uint64_t address,
                              std::uint64_t value) noexcept override {
    return inner_.write_fence(s, address, value);
  }
  std::error_code set_current_device(int device) noexcept override {
    return inner_.set_current_device(device);
  }
  std::error_code current_device(int& device) noexcept override {
    return inner_.current_device(device);
  }
  void prepare_polling_thread() noexcept override { inner_.prepare_polling_thread(); }
  bool in_host_func() const noexcept override { return inner_.in_host_func(); }

 private:
  device::backend& inner_;
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
