// reactor/src/wakeup.hpp — how the reactor thread sleeps and how others wake it.
//
// Two kinds of sleep:
//   * parked: nothing is pending; only new work can give the reactor something to do, so every
//     waker (a submission too) wakes it. Zero wake-ups per second while idle.
//   * napping: waits are pending and the reactor sleeps a short, bounded time between sweeps.
//     Submissions do not wake it (they are picked up when the nap ends, at most max_sleep later);
//     urgent wakers — cancellations, host-function doorbells, stop — do.
// Only a sleeping reactor costs its wakers anything: a wake call is one seq_cst load when the
// reactor is awake. The handshake is Dekker's: the reactor stores its state (seq_cst) and then
// looks for work (seq_cst loads); a producer publishes work (seq_cst CAS or store) and then loads
// the state. With seq_cst on both sides at least one of them sees the other, so no wake-up is
// lost. The mutex and condition variable are used only on the slow path. Host functions call
// wake_urgent(): a short mutex is allowed there (no device API call).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace evr::detail {

class wakeup {
 public:
  enum state : std::uint32_t { awake = 0, napping = 1, parked = 2 };

  /// Any thread, after publishing a submission: wakes a parked reactor only.
  void wake_for_submission() noexcept {
    if (state_.load(std::memory_order_seq_cst) == parked) wake();
  }
  /// Any thread, after publishing urgent work (cancel, doorbell, host function, stop).
  void wake_urgent() noexcept {
    if (state_.load(std::memory_order_seq_cst) != awake) wake();
  }

  /// Reactor thread. Sleeps up to `timeout` (napping) or until woken (parked) unless has_work()
  /// is true after announcing the sleep.
  template <typename HasWork>
  void sleep(state how, std::chrono::nanoseconds timeout, HasWork has_work) {
    std::unique_lock<std::mutex> lock(mutex_);
    signaled_ = false;  // a stale signal's work is found by has_work() below
    state_.store(how, std::memory_order_seq_cst);
    if (!has_work()) {
      if (how == parked) {
        condition_.wait(lock, [this] { return signaled_; });
      } else {
        condition_.wait_for(lock, timeout, [this] { return signaled_; });
      }
    }
    state_.store(awake, std::memory_order_relaxed);
  }

  std::uint64_t wakeups() const noexcept { return wakeups_.load(std::memory_order_relaxed); }

 private:
  void wake() noexcept {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      signaled_ = true;
    }
    condition_.notify_one();
    wakeups_.fetch_add(1, std::memory_order_relaxed);
  }

  std::atomic<std::uint32_t> state_{awake};
  std::atomic<std::uint64_t> wakeups_{0};
  std::mutex mutex_;
  std::condition_variable condition_;
  bool signaled_ = false;  // guarded by mutex_
};

}  // namespace evr::detail
