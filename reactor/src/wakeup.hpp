// reactor/src/wakeup.hpp — how the reactor thread sleeps and how others wake it.
//
// Only a sleeping reactor costs its wakers anything: notify() is one seq_cst load when the reactor
// is awake. The handshake is Dekker's: the reactor stores sleeping_=true then looks for work
// (seq_cst loads); a producer publishes work (seq_cst CAS or store) then loads sleeping_. With
// seq_cst on both sides at least one of them sees the other, so a wake-up is never lost. The
// mutex and condition variable are used only on the slow path (a sleep or a wake of a sleeper).
// Host functions call notify(): a short mutex is allowed there (no device API call).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace evr::detail {

class wakeup {
 public:
  /// Any thread. Wakes the reactor if it sleeps (or is about to).
  void notify() noexcept {
    if (!sleeping_.load(std::memory_order_seq_cst)) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      signaled_ = true;
    }
    condition_.notify_one();
    wakeups_.fetch_add(1, std::memory_order_relaxed);
  }

  /// Reactor thread. Sleeps up to `timeout` (forever when `forever`) unless has_work() is true
  /// after announcing the sleep. Returns when woken, timed out, or there was work.
  template <typename HasWork>
  void sleep(std::chrono::nanoseconds timeout, bool forever, HasWork has_work) {
    std::unique_lock<std::mutex> lock(mutex_);
    signaled_ = false;  // a stale signal's work is found by has_work() below
    sleeping_.store(true, std::memory_order_seq_cst);
    if (!has_work()) {
      if (forever) {
        condition_.wait(lock, [this] { return signaled_; });
      } else {
        condition_.wait_for(lock, timeout, [this] { return signaled_; });
      }
    }
    sleeping_.store(false, std::memory_order_relaxed);
  }

  std::uint64_t wakeups() const noexcept { return wakeups_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> sleeping_{false};
  std::atomic<std::uint64_t> wakeups_{0};
  std::mutex mutex_;
  std::condition_variable condition_;
  bool signaled_ = false;  // guarded by mutex_
};

}  // namespace evr::detail
