// reactor/src/wakeup.hpp — how the reactor thread sleeps and how others wake it.
//
// Two kinds of sleep:
//   * parked: nothing is pending; only new work can give the reactor something to do, so every
//     waker (a submission too) wakes it. Zero wake-ups per second while idle.
//   * napping: waits are pending and the reactor sleeps until a deadline it chose (the idle
//     policy's next look). Urgent wakers — cancellations, host-function doorbells, stop — always
//     wake it. A submission wakes it only when the new wait could be done before the deadline
//     (the submitter asks `earliest()`: a wait queued behind pending ones cannot finish before
//     them, a stream's model says how soon its work can end), so a burst of submissions behind
//     long GPU work costs no wake-ups, and a short wait is never found late because the reactor
//     slept through a long prediction.
// Only a sleeping reactor costs its wakers anything: a wake call is one seq_cst load when the
// reactor is awake. The handshake is Dekker's: the reactor stores its state (seq_cst) and then
// looks for work (seq_cst loads); a producer publishes work (seq_cst CAS or store) and then loads
// the state. With seq_cst on both sides at least one of them sees the other, so no wake-up is
// lost. What the reactor stores before its seq_cst state store (the deadline, the streams'
// published model values) is visible to a producer that loads the napping state. The mutex and
// condition variable are used only on the slow path. Host functions call wake_urgent(): a short
// mutex is allowed there (no device API call).
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

  /// Any thread, after publishing a submission. `pushed_to_empty`: this push made the submission
  /// stack non-empty. `earliest()` returns the earliest time (steady clock, ns since its epoch)
  /// the new wait's work could be done; it is called only while the reactor naps, and a napping
  /// reactor is woken when that is before its deadline. Pass a function returning INT64_MAX to
  /// never wake a napping reactor.
  template <typename Earliest>
  void wake_for_submission(bool pushed_to_empty, Earliest earliest) noexcept {
    const std::uint32_t s = state_.load(std::memory_order_seq_cst);
    if (s == awake) return;
    if (s == parked) {
      // A parked reactor looked at an empty stack last: the push that made it non-empty wakes it.
      if (pushed_to_empty) wake();
      return;
    }
    // Napping: every push decides for its own wait (an earlier pusher may have decided not to).
    if (earliest() < deadline_ns_.load(std::memory_order_relaxed)) wake();
  }
  /// Any thread, after publishing urgent work (cancel, doorbell, host function, stop).
  void wake_urgent() noexcept {
    if (state_.load(std::memory_order_seq_cst) != awake) wake();
  }

  /// Reactor thread: sleeps until woken, unless has_work() is true after announcing the sleep.
  /// `blocking()` runs right before it blocks (under this object's mutex: it must not take a
  /// lock a waker holds while waking).
  template <typename HasWork, typename Blocking>
  void park(HasWork has_work, Blocking blocking) {
    std::unique_lock<std::mutex> lock(mutex_);
    signaled_ = false;  // a stale signal's work is found by has_work() below
    wake_requested_.store(false, std::memory_order_relaxed);
    state_.store(parked, std::memory_order_seq_cst);
    if (!has_work()) {
      blocking();
      condition_.wait(lock, [this] { return signaled_; });
    }
    state_.store(awake, std::memory_order_relaxed);
  }

  /// Reactor thread: sleeps until `deadline` or a wake-up, unless has_work() is true after
  /// announcing the nap; `blocking` as for park. Returns true when the nap ended because the
  /// deadline passed (the caller may learn the timer's overshoot from it).
  template <typename HasWork, typename Blocking>
  bool nap_until(std::chrono::steady_clock::time_point deadline, HasWork has_work,
                 Blocking blocking) {
    std::unique_lock<std::mutex> lock(mutex_);
    signaled_ = false;
    wake_requested_.store(false, std::memory_order_relaxed);
    deadline_ns_.store(deadline.time_since_epoch().count(), std::memory_order_relaxed);
    state_.store(napping, std::memory_order_seq_cst);
    bool timed_out = false;
    if (!has_work()) {
      blocking();
      timed_out = !condition_.wait_until(lock, deadline, [this] { return signaled_; });
    }
    state_.store(awake, std::memory_order_relaxed);
    return timed_out;
  }

  std::uint64_t wakeups() const noexcept { return wakeups_.load(std::memory_order_relaxed); }

 private:
  void wake() noexcept {
    // Many producers may see the same sleep: only the first pays for the mutex and the signal.
    // Reset (relaxed) before the reactor's seq_cst state store, so a producer that sees this
    // sleep's state also sees the reset, or a later `true` set by a producer that did signal.
    if (wake_requested_.exchange(true, std::memory_order_acq_rel)) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      signaled_ = true;
    }
    condition_.notify_one();
    wakeups_.fetch_add(1, std::memory_order_relaxed);
  }

  std::atomic<std::uint32_t> state_{awake};
  std::atomic<std::int64_t> deadline_ns_{0};  // while napping: when the reactor looks again
  std::atomic<bool> wake_requested_{false};   // this sleep has been signalled already
  std::atomic<std::uint64_t> wakeups_{0};
  std::mutex mutex_;
  std::condition_variable condition_;
  bool signaled_ = false;  // guarded by mutex_
};

}  // namespace evr::detail
