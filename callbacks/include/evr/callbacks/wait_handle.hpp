// evr/callbacks/wait_handle.hpp — a handle that can cancel one on_complete wait.
//
//   evr::wait_handle h;
//   evr::on_complete(reactor, stream, [](std::error_code ec) { ... }, h);
//   ...
//   if (h.cancel()) { /* the callback runs (or ran) once with errc::operation_aborted */ }
//
// Contract of cancel(): returns true if this call moved the wait from pending to cancelled; the
// callback then runs exactly once, on the reactor thread, with errc::operation_aborted (soon, not
// inside cancel()). Returns false when the wait had already completed (or was being completed),
// was already cancelled, or the handle is empty; the callback runs, or ran, exactly once with its
// own outcome. Cancelling has no effect on the GPU work, and the wait's marker goes back to the
// pool only once the GPU is past it.
//
// Thread safety: cancel() may be called from any thread: before or after completion,
// concurrently with completion, from inside the callback itself (on_complete fills the handle
// before the wait starts), from several threads on the same
// handle at once (exactly one of them can return true), and after the reactor stopped or was
// destroyed (it returns false then: every wait completed by the time stop() returned), but not
// while the reactor's destructor runs (a winning cancel still wakes the reactor: order the two,
// as with any call on the reactor). Moving,
// assigning or destroying a handle must not race with other calls on that same handle object, as
// with any object.
//
// Lifetime: the handle keeps the operation's storage (not the callback: that is destroyed when the
// callback has run) alive through an intrusive reference count of two: the reactor's completion
// drops one, the handle the other; the last one frees it. So cancel() is memory-safe with no help
// from the caller, whatever the order of completion, handle destruction and reactor destruction.
// Destroying (or moving over) a handle never cancels and never blocks; the wait goes on.
//
// Memory order: the exactly-once outcome is wait_op::state_ (acq_rel CAS pending ->
// cancel_requested here against the reactor's acq_rel exchange to done); the reference count is
// dropped with acq_rel, so the thread that frees the operation sees every write of the other owner.
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>

#include <evr/reactor/reactor.hpp>

namespace evr {
namespace detail {

/// A wait_op shared by the reactor's completion and one wait_handle (two references).
class shared_wait_op : public wait_op {
 public:
  using destroy_fn = void (*)(shared_wait_op* op) noexcept;

  shared_wait_op(complete_fn complete, destroy_fn destroy, reactor_core* core) noexcept
      : wait_op(complete), core_(core), destroy_(destroy) {}

  /// Drops one reference; the last one destroys the operation. Thread-safe.
  void release() noexcept {
    // acq_rel: the releasing owner's writes happen before the destruction by the last one.
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) destroy_(this);
  }

  reactor_core* const core_;  ///< dereferenced only by a winning cancel (see detail::cancel_wait)

 private:
  std::atomic<std::uint32_t> refs_{2};  ///< the completion's and the handle's
  destroy_fn destroy_;
};

struct wait_handle_access;

}  // namespace detail

/// Cancels one wait started by on_complete(reactor, target, fn, handle). Default-constructible
/// (empty), move-only. See the file comment for the contract.
class wait_handle {
 public:
  wait_handle() noexcept = default;
  /// Takes `other`'s wait; `other` becomes empty.
  wait_handle(wait_handle&& other) noexcept : op_(std::exchange(other.op_, nullptr)) {}
  /// Forgets the wait held before (never cancels it) and takes `other`'s.
  wait_handle& operator=(wait_handle&& other) noexcept {
    if (this != &other) {
      reset();
      op_ = std::exchange(other.op_, nullptr);
    }
    return *this;
  }
  wait_handle(const wait_handle&) = delete;
  wait_handle& operator=(const wait_handle&) = delete;
  ~wait_handle() { reset(); }  ///< never cancels, never blocks

  /// true if this call moved the wait from pending to cancelled: its callback then runs exactly
  /// once with errc::operation_aborted. false otherwise (completed, already cancelled, empty).
  /// Thread-safe, lock-free, never blocks; safe after the reactor was destroyed.
  bool cancel() noexcept { return op_ != nullptr && detail::cancel_wait(op_->core_, op_); }

  /// Forgets the wait (does not cancel it); the handle becomes empty.
  void reset() noexcept {
    if (op_ != nullptr) std::exchange(op_, nullptr)->release();
  }

  /// true while the handle refers to a wait (whether or not it has completed).
  explicit operator bool() const noexcept { return op_ != nullptr; }

 private:
  friend struct detail::wait_handle_access;
  detail::shared_wait_op* op_ = nullptr;
};

namespace detail {
/// How a front end puts an operation into a handle (it holds one of the two references).
struct wait_handle_access {
  static void adopt(wait_handle& h, shared_wait_op* op) noexcept {
    h.reset();
    h.op_ = op;
  }
  /// Empties `h` without dropping a reference (the operation was never submitted).
  static void forget(wait_handle& h) noexcept { h.op_ = nullptr; }
};
}  // namespace detail

}  // namespace evr
