// reactor/src/control_inbox.hpp — what other threads ask of the reactor, besides submissions
// (submitter.hpp) and context shutdown (detach_coordinator.hpp): cancel a wait, cancel an owner's
// waits, a sticky fault a submitter met, stop.
//
// The posting side runs on any thread and wakes the reactor (wake_urgent); the taking side runs
// on the reactor thread (take_*). Memory order: the cancel stack as the submission stack
// (intrusive_stack.hpp); the flags are seq_cst, part of the wake handshake (wakeup.hpp), and
// taken with an exchange (acq_rel) that pairs with the poster's mutex or store.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <system_error>
#include <vector>

#include <evr/pool/pool_set.hpp>
#include <evr/reactor/detail/wait_op.hpp>

#include "intrusive_stack.hpp"
#include "wakeup.hpp"

namespace evr::detail {

class control_inbox {
 public:
  using cancel_stack = intrusive_stack<wait_op, &wait_op::cancel_next_>;

  explicit control_inbox(std::shared_ptr<wakeup> wake) : wake_(std::move(wake)) {}

  // --- any thread ------------------------------------------------------------------------------
  /// Per-operation cancellation, in two halves (detail::cancel_wait joins them): the CAS from
  /// pending to cancel_requested, which touches only `op` (true: this call won; false: `op` had
  /// completed or was being cancelled, and cancelling twice is harmless), and, for the winner
  /// only, the push that hands `op` to the reactor (which completes it with operation_aborted,
  /// and will not free it before it has seen the push).
  static bool request_cancel(wait_op* op) noexcept;
  void push_cancel(wait_op* op) noexcept;
  void cancel_owner(std::uintptr_t owner) noexcept;
  /// A submitter met sticky error `ec` on `device` (-1: unknown): the reactor fails the device.
  void report_fault(int device, std::error_code ec) noexcept;
  void request_stop() noexcept;
  bool stop_requested() const noexcept { return stopping_.load(std::memory_order_acquire); }

  // --- reactor thread --------------------------------------------------------------------------
  /// The cancelled waits, oldest first, linked through cancel_next_ (cancel_stack::for_each).
  wait_op* take_cancels() noexcept { return cancels_.take_all(); }
  std::vector<std::uintptr_t> take_owner_cancels();
  /// Calls `fail(device, value)` for each device a submitter reported (the cuda error value);
  /// `fail` returns whether it failed the device now. True when one was failed.
  template <class Fail>
  bool take_reported_faults(Fail&& fail);
  /// Something is waiting here (seq_cst: the reactor's last look before it sleeps); a stop
  /// request counts only while `stop_counts`.
  bool pending(bool stop_counts) const noexcept;

 private:
  std::shared_ptr<wakeup> wake_;
  cancel_stack cancels_;
  std::mutex owner_cancel_mutex_;
  std::vector<std::uintptr_t> owner_cancels_;  // guarded by owner_cancel_mutex_
  std::atomic<bool> owner_cancel_pending_{false};
  // Sticky errors met by submitters (a marker that could not be enqueued): the driver reports a
  // fault lazily, sometimes only to calls on the faulted stream, so a submitter may learn of it
  // before any of the reactor's own queries do.
  std::array<std::atomic<int>, pool_set::max_devices> reported_fault_{};
  std::atomic<bool> fault_reported_{false};
  std::atomic<bool> stopping_{false};
};

template <class Fail>
bool control_inbox::take_reported_faults(Fail&& fail) {
  if (!fault_reported_.load(std::memory_order_relaxed) ||
      !fault_reported_.exchange(false, std::memory_order_acq_rel))
    return false;
  bool any = false;
  for (int d = 0; d < pool_set::max_devices; ++d) {
    const int v = reported_fault_[static_cast<std::size_t>(d)].load(std::memory_order_relaxed);
    if (v != 0 && fail(d, v)) any = true;
  }
  return any;
}

}  // namespace evr::detail
