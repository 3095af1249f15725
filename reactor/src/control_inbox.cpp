// reactor/src/control_inbox.cpp — see control_inbox.hpp.
#include "control_inbox.hpp"

namespace evr::detail {

bool control_inbox::request_cancel(wait_op* op) noexcept {
  std::uint8_t expected = wait_op::pending;
  // acq_rel: exactly one of {this CAS, the reactor's exchange to done} wins.
  return op->state_.compare_exchange_strong(expected, wait_op::cancel_requested,
                                            std::memory_order_acq_rel, std::memory_order_acquire);
}

void control_inbox::push_cancel(wait_op* op) noexcept {
  if (cancels_.push(op) == cancel_stack::push_result::pushed_to_empty) wake_->wake_urgent();
}

void control_inbox::cancel_owner(std::uintptr_t owner) noexcept {
  try {
    std::lock_guard<std::mutex> lock(owner_cancel_mutex_);
    owner_cancels_.push_back(owner);
  } catch (...) {
    return;  // out of memory: nothing was cancelled, every wait still completes normally
  }
  owner_cancel_pending_.store(true, std::memory_order_seq_cst);
  wake_->wake_urgent();
}

void control_inbox::report_fault(int device, std::error_code ec) noexcept {
  if (device < 0 || device >= pool_set::max_devices) return;
  int expected = 0;
  reported_fault_[static_cast<std::size_t>(device)].compare_exchange_strong(
      expected, ec.value(), std::memory_order_relaxed);
  fault_reported_.store(true, std::memory_order_seq_cst);  // seq_cst: part of the wake handshake
  wake_->wake_urgent();
}

void control_inbox::request_stop() noexcept {
  stopping_.store(true, std::memory_order_seq_cst);
  wake_->wake_urgent();
}

std::vector<std::uintptr_t> control_inbox::take_owner_cancels() {
  std::vector<std::uintptr_t> owners;
  if (owner_cancel_pending_.load(std::memory_order_relaxed) &&
      owner_cancel_pending_.exchange(false, std::memory_order_acq_rel)) {
    std::lock_guard<std::mutex> lock(owner_cancel_mutex_);
    owners.swap(owner_cancels_);
  }
  return owners;
}

bool control_inbox::pending(bool stop_counts) const noexcept {
  return !cancels_.empty_or_closed() || owner_cancel_pending_.load(std::memory_order_seq_cst) ||
         fault_reported_.load(std::memory_order_seq_cst) ||
         (stop_counts && stopping_.load(std::memory_order_seq_cst));
}

}  // namespace evr::detail
