// evr/reactor/reactor.hpp — the background thread that turns GPU progress into completions.
//
// Data path (docs/architecture.md has the long version): submit (any thread: a marker on the
// stream, a lock-free push) → timeline (per stream, in marker order) → sweep (how far each stream
// got, by strategy: see evr::strategy) → deliver (each retired wait completed once, in batches).
//
// Guarantees: every submitted wait completes exactly once: with {} when the work before it is
// done; with the device error when it failed (sticky errors fail every wait of that device, and
// the reactor keeps serving other devices); with errc::operation_aborted (== the condition
// std::errc::operation_canceled) when cancelled or aborted at shutdown; with errc::reactor_stopped
// when submitted after stop(). The Asio front end hands its handlers Asio's operation_aborted
// instead of errc::operation_aborted.
//
// Public surface: construction, stop(), metrics and accessors. Waits are started through the
// front ends (gpu_waiter, on_complete, release_after); the operation-level calls (submit, cancel,
// cancel_owner) are private and reached by the in-repo front ends through detail::reactor_access.
//
// Thread safety: every member may be called from any thread (submit, cancel and cancel_owner
// too).
// Lifetime: destroying the reactor stops it (see stop()), which completes every wait still
// pending: whatever a wait's completion touches (a callback's captures) must outlive the reactor.
// Destroying it from one of its own inline handlers is allowed: the thread then finishes the
// shutdown by itself and frees what it holds.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <system_error>
#include <vector>

#include <evr/device/backend.hpp>
#include <evr/pool/pool_set.hpp>
#include <evr/reactor/delivery.hpp>
#include <evr/reactor/detail/poll_host.hpp>
#include <evr/reactor/detail/wait_op.hpp>
#include <evr/reactor/metrics.hpp>
#include <evr/reactor/options.hpp>
#include <evr/reactor/wait_target.hpp>

namespace evr {

namespace detail {
class reactor_core;
struct reactor_access;

/// Per-operation cancellation through the core, for front ends whose handle may outlive the
/// evr::reactor object (evr::wait_handle). Returns true if this call moved `op` from pending to
/// cancel_requested (the reactor then completes it with operation_aborted), false if it had
/// already completed or was being cancelled. `core` is dereferenced only when the call wins, and a
/// pending wait keeps its core alive, so a core already freed (every wait completed) is never
/// touched. `op` must not be freed (callers keep it alive with a reference count).
bool cancel_wait(reactor_core* core, wait_op* op) noexcept;

/// Detaches every wait whose group_ is `group` (an execution context that is shutting down): the
/// reactor forgets them (their markers stay in the timelines as detached entries and go back to
/// the pool only once the GPU is past them), marks them detached_ and hands them back, not
/// completed; the caller then calls complete() on each, which destroys it without running its
/// handler. Afterwards the reactor never touches them, so nothing of that group is delivered any
/// more. A handshake with the reactor thread (blocks until the thread has done it); done directly
/// when called on the reactor thread itself; returns nothing once the thread has finished (every
/// wait completed). Thread-safe.
std::vector<wait_op*> detach_group(reactor_core& core, std::uintptr_t group);

/// One pass of the reactor on the calling thread, for `host` (poll_host.hpp): under the reactor's
/// pass lock it looks at the streams whose oldest wait is the host's, retires what is done and
/// hands the completions over (posted: it runs no user code; a batch with an inline completion is
/// left to the reactor thread), then says when the host should look next. Returns at once with
/// outcome::busy when another pass is under way. Thread-safe; never blocks. `core` must be alive
/// (hold the shared_ptr from reactor_access::weak_core while calling).
poll_result poll_here(reactor_core& core, poll_host& host) noexcept;
}  // namespace detail

/// The background thread that watches GPU progress and completes waits, each exactly once (see
/// the file comment for the data path and the guarantees). Waits are started through the front
/// ends: gpu_waiter, on_complete, async_wait (a sender), release_after. Thread safety: every member
/// may be called from any thread. Lifetime: destroying it stops it (stop()); it may be destroyed
/// from one of its own inline handlers. Errors: the constructor throws std::invalid_argument for
/// invalid options; waits report theirs to their handlers.
class reactor {
 public:
  /// A reactor on the CUDA backend with default options. Starts its thread.
  reactor();
  /// A reactor on `backend` (which must outlive it) with `options`, validated (throws
  /// std::invalid_argument naming a bad option). Starts its thread.
  explicit reactor(device::backend& backend, reactor_options options = {});
  ~reactor();  ///< stop() and join
  reactor(const reactor&) = delete;
  reactor& operator=(const reactor&) = delete;

  /// Stops accepting waits (later submits fail with errc::reactor_stopped), lets pending waits
  /// complete for up to options.shutdown_drain, aborts the rest with operation_aborted, and joins
  /// the thread. Every wait completes exactly once. Idempotent; concurrent calls are safe. Events
  /// still pending on the GPU are destroyed (CUDA frees them once they complete) rather than
  /// returned to the pool. Called from one of the reactor's own inline handlers, it only requests
  /// the stop and returns (a thread cannot join itself); the destructor or a later stop() from
  /// another thread waits for the shutdown to finish.
  void stop() noexcept;

  /// Makes ready on `device` what this reactor's waits there will use, so that neither a wait
  /// nor taking a signal slot has to: with a fence or adaptive strategy (the ones that serve
  /// signal slots), the first batch of pools().signals(device) and, on CUDA, evr's signal kernel;
  /// with options().kernel_fences as well, evr's fence kernel (the constructor already loaded it
  /// on the devices the process used then). Blocks: CUDA's load waits for the kernels running on
  /// the device to end and holds up other threads' CUDA calls meanwhile, so call it before
  /// launching kernels that wait for the host. Returns {} when all is ready or there is nothing
  /// to make; errc::no_device for an index the backend does not have;
  /// errc::called_from_host_func inside a CUDA host function (a load would wait for it);
  /// otherwise the first failure (out of memory, a CUDA error; errc::unsupported for the fence
  /// kernel on a GPU before compute capability 9.0, whose waits then record events past the
  /// stream limit). A backend without signal slots is no failure. Thread-safe; idempotent.
  std::error_code prepare_device(int device) noexcept;

  /// A snapshot of the counters and latency histograms (see reactor_metrics).
  reactor_metrics metrics() const noexcept;
  /// CPU time the reactor thread has used so far (thread CPU clock; 0 where unsupported).
  std::chrono::nanoseconds cpu_time() const noexcept;
  const reactor_options& options() const noexcept;  ///< the options, as validated
  device::backend& backend() const noexcept;        ///< the backend it watches
  /// The pools of the reactor's own marker events (strategy::poll).
  pool_set& pools() noexcept;
  /// true while the calling thread is the reactor's thread (e.g. inside an inline handler).
  bool running_in_this_thread() const noexcept;

 private:
  friend struct detail::reactor_access;

  /// Hands `op` to the reactor. Thread-safe, lock-free (see the file comment for the per-stream
  /// marker lock). On success the reactor owns `op` and will complete it exactly once. On failure
  /// (stopped reactor, another backend, a never-recorded evr::event, a device error putting the
  /// marker on the stream, ...) returns the error and `op` stays with the caller, not completed.
  /// Must not be called from a host function (errc::called_from_host_func).
  std::error_code submit(detail::wait_op* op, const wait_target& target) noexcept;

  /// Per-operation cancellation: if `op` is still pending it completes with operation_aborted
  /// (on the reactor thread, soon); if it already completed, nothing happens. Exactly-once is kept
  /// by detail::wait_op::state_. The GPU work is not affected; the wait's event returns to the pool
  /// only once the GPU is past it. `op` must have been submitted successfully and — the caller's
  /// contract, as with Asio's cancellation slots — must not yet have been freed by its completion.
  void cancel(detail::wait_op* op) noexcept;

  /// Cancels every pending wait whose owner_ is `owner` (an I/O object's cancel()). Always safe.
  void cancel_owner(std::uintptr_t owner) noexcept;

  /// A new owner id for an I/O object's waits (wait_op::owner_), never 0, unique in the process
  /// across every front end, executor type and reactor: one counter, defined in reactor.cpp (a
  /// counter in a header template would be one per instantiation, and two waiters of different
  /// executor types would share ids, so one's cancel() would abort the other's waits).
  /// Thread-safe, lock-free.
  static std::uintptr_t new_owner_id() noexcept;

  std::shared_ptr<detail::reactor_core> core_;
};

namespace detail {
/// What the in-repo front ends (callbacks/) reach inside a reactor and a wait_target; not for
/// users (the contracts are those of the private members they forward to).
struct reactor_access {
  static reactor_core* core(reactor& r) noexcept { return r.core_.get(); }
  /// For front ends that must reach the core after the reactor object may be gone (it stays
  /// alive while its thread runs).
  static std::weak_ptr<reactor_core> weak_core(reactor& r) noexcept { return r.core_; }
  static std::error_code submit(reactor& r, wait_op* op, const wait_target& target) noexcept {
    return r.submit(op, target);
  }
  /// submit() for a wait with a host (op->host_ set): also says when the wait's window is
  /// expected to open and close, so that the host can arm its timer now (host_window).
  static std::error_code submit_hosted(reactor& r, wait_op* op, const wait_target& target,
                                       host_window& window) noexcept;
  static void cancel(reactor& r, wait_op* op) noexcept { r.cancel(op); }
  static void cancel_owner(reactor& r, std::uintptr_t owner) noexcept { r.cancel_owner(owner); }
  static std::uintptr_t new_owner_id() noexcept { return reactor::new_owner_id(); }
  /// Blocks until the GPU is past `t` (errors ignored); nothing for an empty target.
  static void synchronize(const wait_target& t) noexcept {
    if (t.backend_ == nullptr) return;
    if (t.what_ != wait_target::kind::event) {  // a stream, or the stream a signal comes from
      (void)t.backend_->synchronize_stream(t.native_);
    } else if (t.native_ != nullptr) {
      (void)t.backend_->synchronize_event(t.native_);
    }
  }
};
}  // namespace detail

}  // namespace evr
