// Progress notifications of a simulated device: how threads that wait for the device to move
// (synchronize_stream/synchronize_event, wait_idle, a worker whose head waits on another stream's
// record, manual-mode synchronize waiting for another thread's step) learn that it moved.
//
// Cost: notify() is one read-modify-write of the waiter count when nobody waits, which is the
// common case; the workers call it once per batch of operations (scheduler.hpp), not once per
// operation.
//
// Protocol (no lost wake-up): a waiter takes the mutex, counts itself in `waiters_` (an acq_rel
// RMW), then evaluates its condition and sleeps on the condition variable, which releases the
// mutex atomically. A notifier changes the state, then reads `waiters_` with an acq_rel RMW
// (fetch_add(0)); if anyone waits it takes and releases the mutex, then notifies. The two RMWs on
// one atomic are ordered: if the waiter's comes first the notifier sees the waiter; if the
// notifier's comes first the waiter's synchronizes with it and its evaluation sees the change.
// And a notifier that sees the waiter cannot notify between the waiter's evaluation and its
// sleep, because the waiter holds the mutex throughout. (RMWs rather than fences: ThreadSanitizer
// does not model fences.)
//
// Lock order: the condition a waiter evaluates runs with this mutex held and may lock the
// registry's stream table and streams' mutexes; so nobody may call notify() or wait while holding
// a stream's mutex.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>

namespace evr::sim::detail {

class progress_signal {
 public:
  /// Wakes every waiter, if any. Thread-safe; never blocks for long (the mutex is only held by
  /// waiters evaluating their condition).
  void notify() noexcept {
    if (!has_waiters()) return;
    { std::lock_guard lock(mutex_); }
    cv_.notify_all();
  }

  /// Whether anyone waits now: notify()'s first step, for a caller that wants to skip work when
  /// nobody does. It may be asked with a stream's mutex held; after `false`, a waiter that comes
  /// later sees every state change made before the call.
  bool has_waiters() noexcept {
    // An RMW, not a fence and a load: it reads the latest count, and if it comes first in the
    // count's modification order, the waiter's enter() (acq_rel) synchronizes with it.
    return waiters_.fetch_add(0, std::memory_order_acq_rel) != 0;
  }

  /// Blocks until `ready()` returns true. `ready` runs with the progress mutex held.
  template <typename Ready>
  void wait(Ready ready) {
    std::unique_lock lock(mutex_);
    enter();
    while (!ready()) cv_.wait(lock);
    leave();
  }

  /// Returns at once if `ready()` is true, else after the next notification (or a spurious
  /// wake-up). For callers that must re-evaluate more than `ready` can express.
  template <typename Ready>
  void wait_once(Ready ready) {
    std::unique_lock lock(mutex_);
    enter();
    if (!ready()) cv_.wait(lock);
    leave();
  }

 private:
  void enter() noexcept { waiters_.fetch_add(1, std::memory_order_acq_rel); }
  void leave() noexcept { waiters_.fetch_sub(1, std::memory_order_relaxed); }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::atomic<int> waiters_{0};
};

}  // namespace evr::sim::detail
