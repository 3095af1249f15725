// evr/callbacks/gpu_waiter.hpp — an Asio I/O object whose async_wait completes when the GPU work
// queued so far on a stream (or captured by an event) is done.
//
//   evr::gpu_waiter waiter{io.get_executor(), reactor};
//   kernel<<<g, b, 0, stream.native()>>>(...);
//   co_await waiter.async_wait(stream, asio::use_awaitable);
//
// Completion signature: void(evr::asio_error_code) — std::error_code with standalone Asio (the same
// type as asio::error_code), boost::system::error_code with Boost.Asio (evr::evr_boost), so that
// every token treats it as the error: use_awaitable throws, use_future stores the exception.
//   {}                              the work before the wait is done
//   a cuda_category() error         the device failed (sticky errors fail every wait on it)
//   asio::error::operation_aborted  cancelled (cancel(), the slot, the waiter destroyed) or the
//                                   reactor stopped before the work was done: the flavour's own
//                                   value. It equals std::errc::operation_canceled with Boost.Asio
//                                   and standalone Asio 1.38+ (older Asio lacks that mapping)
//   an evr_category() error         refused: errc::reactor_stopped, backend_mismatch,
//                                   event_never_recorded, per_thread_default_stream, ...
// A boost::system::error_code carrying a cuda_category() or evr_category() error keeps that
// category: `ec == evr::errc::reactor_stopped` and `ec.message()` work with either flavour.
//
// Per-operation cancellation: terminal, partial and total, through the handler's associated
// cancellation slot. Emit the signal where the handler's executor runs (Asio's usual rule). The
// wait completes with operation_aborted exactly once, also when cancellation races completion;
// cancelling twice is harmless. The GPU work goes on; the wait's event returns to the pool only
// after the GPU is past it. With inline delivery the slot is cleared on the reactor thread, so
// use cancel() there instead of a slot.
//
// Delivery: posted to the handler's associated executor (default: the waiter's executor), never
// run inside async_wait. By default (delivery::post), when that executor runs on the waiter's
// io_context, a thread of the context wakes itself shortly before the wait's predicted completion
// and looks for it in place of the reactor (detail/io_context_host.hpp), so the handler runs
// microseconds after the GPU finished rather than after a parked thread's wake-up; it costs that
// thread the polling through the prediction's window. delivery::post_woken has the reactor wake
// the thread instead; delivery::post_plain only posts. set_delivery(delivery::inline_on_reactor)
// runs handlers on the reactor thread: the lowest latency, but the handler must be short and must
// never block (it holds up every other completion), and a coroutine would resume on the reactor
// thread. An exception thrown by a posted handler leaves the executor's run(), as with any Asio
// handler; one thrown by an inline handler is reported on stderr and dropped
// (detail/callback_exception.hpp).
//
// Memory: each wait's operation is allocated with the handler's associated allocator (default:
// Asio's recycling allocator) and given back to it before the handler runs, also when the wait is
// cancelled or refused.
//
// Thread safety: distinct objects: safe. Shared object: async_wait and cancel may be called from
// any thread (the reactor is thread-safe); moving or destroying needs exclusive access.
// Lifetime: the reactor must outlive the waiter. The execution context need not: when it shuts
// down (is destroyed) with waits pending, their handlers are destroyed without running
// (reactor_service.hpp), and the waiter may be destroyed after it. Destroying the waiter cancels
// its waits (their handlers still run, with operation_aborted, if the context is alive).
#pragma once

#include <cstdint>
#include <utility>

#include <evr/callbacks/detail/asio_forward.hpp>
#include <evr/callbacks/detail/asio_wait_op.hpp>
#include <evr/callbacks/reactor_service.hpp>
#include <evr/reactor/reactor.hpp>
#include <evr/reactor/wait_target.hpp>

namespace evr {
inline namespace EVR_ASIO_FLAVOUR_NAMESPACE {

/// An Asio I/O object whose async_wait completes when the GPU work before a point of a stream (or
/// captured by an event) is done. Completion signature, cancellation, delivery, memory, thread
/// safety and lifetime: see the file comment of <evr/callbacks/gpu_waiter.hpp> (also on the
/// reference's file page). `Executor`: the I/O executor (default: asio::any_io_executor).
template <typename Executor = asio::any_io_executor>
class basic_gpu_waiter {
 public:
  /// The I/O executor: handlers without an executor of their own are delivered there.
  using executor_type = Executor;

  /// Rebinds the waiter to another executor type (Asio convention).
  template <typename OtherExecutor>
  struct rebind_executor {
    /// The waiter type with `OtherExecutor` as its I/O executor.
    using other = basic_gpu_waiter<OtherExecutor>;
  };

  /// A waiter on `ex` whose waits `r` serves; `r` must outlive the waiter. Registers `r` with the
  /// reactor_service of `ex`'s execution context (whose shutdown detaches this waiter's waits).
  basic_gpu_waiter(const executor_type& ex, reactor& r) : impl_(ex, r) {}
  /// Finds the reactor through the executor's context (evr::reactor_service; attach one with
  /// evr::use_reactor). Throws evr::error when none is attached and CUDA is not compiled in.
  explicit basic_gpu_waiter(const executor_type& ex)
      : impl_(ex, reactor_service::of(asio::query(ex, asio::execution::context)).get()) {}
  /// As basic_gpu_waiter(const executor_type&) with `context.get_executor()`.
  template <typename ExecutionContext, typename = std::enable_if_t<std::is_convertible_v<
                                           ExecutionContext&, asio::execution_context&>>>
  explicit basic_gpu_waiter(ExecutionContext& context) : basic_gpu_waiter(context.get_executor()) {}

  /// Takes over `other`'s waits (cancel() and the destructor of `other` no longer reach them).
  basic_gpu_waiter(basic_gpu_waiter&&) noexcept = default;
  /// Cancels this waiter's pending waits, then takes over `other`'s.
  basic_gpu_waiter& operator=(basic_gpu_waiter&& other) noexcept {
    if (this != &other) {
      cancel();
      impl_ = std::move(other.impl_);
    }
    return *this;
  }
  basic_gpu_waiter(const basic_gpu_waiter&) = delete;
  basic_gpu_waiter& operator=(const basic_gpu_waiter&) = delete;

  /// Cancels every pending wait of this waiter.
  ~basic_gpu_waiter() { cancel(); }

  /// The I/O executor.
  executor_type get_executor() const noexcept { return impl_.executor; }
  /// The reactor that serves this waiter's waits.
  reactor& get_reactor() const noexcept { return *impl_.reactor_ptr; }

  /// How the waits started from now on reach their handlers (evr::delivery; default:
  /// delivery::post). Not thread-safe against async_wait on the same waiter. May allocate (the
  /// first use of a delivery on a context creates its poll host).
  void set_delivery(delivery how) {
    impl_.how = how;
    impl_.host = host_for(impl_.executor, *impl_.reactor_ptr, how);
  }
  /// The delivery of the waits started from now on.
  delivery get_delivery() const noexcept { return impl_.how; }

  /// Starts a wait for `target`: a stream (the work queued on it so far), an evr::event, or a raw
  /// cudaStream_t / cudaEvent_t on the CUDA backend. See the file comment for the completion.
  template <typename CompletionToken = asio::default_completion_token_t<executor_type>>
  auto async_wait(const wait_target& target,
                  CompletionToken&& token = asio::default_completion_token_t<executor_type>()) {
    return asio::async_initiate<CompletionToken, void(asio_error_code)>(initiate_wait{this}, token,
                                                                        target);
  }

  /// Cancels every pending wait of this waiter (each completes with operation_aborted). Safe from
  /// any thread, at any time.
  void cancel() noexcept {
    if (impl_.owner.value != 0)
      detail::reactor_access::cancel_owner(*impl_.reactor_ptr, impl_.owner.value);
  }

 private:
  /// An owner id that moves (a moved-from waiter cancels nothing). Ids come from the reactor
  /// library (unique in the process), not from a static of this template: each executor type
  /// would have its own counter, and waiters of two types would cancel each other's waits.
  struct owner_id {
    std::uintptr_t value = detail::reactor_access::new_owner_id();
    owner_id() = default;
    owner_id(owner_id&& o) noexcept : value(std::exchange(o.value, 0)) {}
    owner_id& operator=(owner_id&& o) noexcept {
      value = std::exchange(o.value, 0);
      return *this;
    }
  };

  /// Everything a waiter is; moved as one value.
  struct impl_type {
    impl_type(const executor_type& ex, reactor& r)
        : executor(ex),
          reactor_ptr(&r),
          group(register_with_context(ex, r)),
          host(host_for(ex, r, delivery::post)) {}
    executor_type executor;
    evr::reactor* reactor_ptr;
    std::uintptr_t group;  ///< its context (reactor_service::group)
    owner_id owner;        ///< its waits (cancel-all)
    delivery how = delivery::post;
    detail::io_context_host* host;  ///< the last hop for `how` on its context, or nullptr
  };

  struct initiate_wait {
    basic_gpu_waiter* self;
    using executor_type = Executor;
    executor_type get_executor() const noexcept { return self->impl_.executor; }

    template <typename Handler>
    void operator()(Handler&& handler, const wait_target& target) const {
      using op_type = detail::asio_wait_op<std::decay_t<Handler>, Executor>;
      const impl_type& w = self->impl_;
      // A decayed copy: a handler passed as an lvalue (a named function object) is copied, as
      // Asio's own operations do; an rvalue is moved.
      op_type* op = op_type::create(std::decay_t<Handler>(std::forward<Handler>(handler)),
                                    w.executor, *w.reactor_ptr);
      op->owner_ = w.owner.value;
      op->group_ = w.group;
      op->how_ = w.how;
      // Connected before submit: once submitted, the operation may complete (and be freed) on
      // another thread at any moment. A signal is only emitted after initiation returns.
      op->connect_cancellation();
      detail::io_context_host* host =
          w.host != nullptr && op->delivered_on(&w.host->context()) ? w.host : nullptr;
      if (host == nullptr) {
        if (std::error_code ec = detail::reactor_access::submit(*w.reactor_ptr, op, target))
          op_type::reject(op, ec);
        return;
      }
      op->host_ = host;
      host->wait_started();
      detail::host_window window;
      if (std::error_code ec =
              detail::reactor_access::submit_hosted(*w.reactor_ptr, op, target, window)) {
        op->host_ = nullptr;
        host->wait_finished();
        op_type::reject(op, ec);
        return;
      }
      host->wait_submitted(window.open_ns);  // `op` may be gone already
    }
  };

  /// Registers `r` with the reactor_service of `ex`'s context (see reactor_service.hpp: its
  /// shutdown detaches this waiter's pending waits); returns the context's group.
  static std::uintptr_t register_with_context(const executor_type& ex, reactor& r) {
    auto& service = reactor_service::of(asio::query(ex, asio::execution::context));
    service.track(r);
    return service.group();
  }

  /// The host of `ex`'s context for `how` (nullptr: plain delivery).
  static detail::io_context_host* host_for(const executor_type& ex, reactor& r, delivery how) {
    if (how != delivery::post && how != delivery::post_woken) return nullptr;
    asio::io_context* io = detail::io_context_of(ex);
    if (io == nullptr) return nullptr;
    return reactor_service::of(*io).host(
        r, *io,
        how == delivery::post ? detail::poll_host::role::polls : detail::poll_host::role::woken);
  }

  impl_type impl_;
};

/// The waiter most code uses: its I/O executor is an asio::any_io_executor.
using gpu_waiter = basic_gpu_waiter<>;

}  // namespace EVR_ASIO_FLAVOUR_NAMESPACE
}  // namespace evr
