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
// run inside async_wait. set_delivery(delivery::inline_on_reactor) runs handlers on the reactor
// thread instead: the lowest latency, but the handler must be short and must never block (it
// holds up every other completion), and a coroutine would resume on the reactor thread. An
// exception thrown by a posted handler leaves the executor's run(), as with any Asio handler; one
// thrown by an inline handler is reported on stderr and dropped (detail/callback_exception.hpp).
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

#include <atomic>
#include <cstdint>
#include <utility>

#include <evr/callbacks/detail/asio_forward.hpp>
#include <evr/callbacks/detail/asio_wait_op.hpp>
#include <evr/callbacks/reactor_service.hpp>
#include <evr/reactor/reactor.hpp>
#include <evr/reactor/wait_target.hpp>

namespace evr {
inline namespace EVR_ASIO_FLAVOUR_NAMESPACE {

template <typename Executor = asio::any_io_executor>
class basic_gpu_waiter {
 public:
  using executor_type = Executor;

  /// Rebinds the waiter to another executor type (Asio convention).
  template <typename OtherExecutor>
  struct rebind_executor {
    using other = basic_gpu_waiter<OtherExecutor>;
  };

  basic_gpu_waiter(const executor_type& ex, reactor& r)
      : executor_(ex), reactor_(&r), group_(register_with_context(ex, r)) {}
  /// Finds the reactor through the executor's context (evr::reactor_service; attach one with
  /// evr::use_reactor). Throws evr::error when none is attached and CUDA is not compiled in.
  explicit basic_gpu_waiter(const executor_type& ex)
      : executor_(ex),
        reactor_(&reactor_service::of(asio::query(ex, asio::execution::context)).get()),
        group_(register_with_context(ex, *reactor_)) {}
  template <typename ExecutionContext, typename = std::enable_if_t<std::is_convertible_v<
                                           ExecutionContext&, asio::execution_context&>>>
  explicit basic_gpu_waiter(ExecutionContext& context) : basic_gpu_waiter(context.get_executor()) {}

  basic_gpu_waiter(basic_gpu_waiter&& other) noexcept
      : executor_(other.executor_),
        reactor_(other.reactor_),
        group_(other.group_),
        owner_(std::exchange(other.owner_, 0)),
        delivery_(other.delivery_) {}
  basic_gpu_waiter& operator=(basic_gpu_waiter&& other) noexcept {
    if (this != &other) {
      cancel();
      executor_ = other.executor_;
      reactor_ = other.reactor_;
      group_ = other.group_;
      owner_ = std::exchange(other.owner_, 0);
      delivery_ = other.delivery_;
    }
    return *this;
  }
  basic_gpu_waiter(const basic_gpu_waiter&) = delete;
  basic_gpu_waiter& operator=(const basic_gpu_waiter&) = delete;

  /// Cancels every pending wait of this waiter.
  ~basic_gpu_waiter() { cancel(); }

  executor_type get_executor() const noexcept { return executor_; }
  reactor& get_reactor() const noexcept { return *reactor_; }

  void set_delivery(delivery how) noexcept { delivery_ = how; }
  delivery get_delivery() const noexcept { return delivery_; }

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
    if (owner_ != 0) detail::reactor_access::cancel_owner(*reactor_, owner_);
  }

 private:
  struct initiate_wait {
    basic_gpu_waiter* self;
    using executor_type = Executor;
    executor_type get_executor() const noexcept { return self->executor_; }

    template <typename Handler>
    void operator()(Handler&& handler, const wait_target& target) const {
      using op_type = detail::asio_wait_op<std::decay_t<Handler>, Executor>;
      // A decayed copy: a handler passed as an lvalue (a named function object) is copied, as
      // Asio's own operations do; an rvalue is moved.
      op_type* op = op_type::create(std::decay_t<Handler>(std::forward<Handler>(handler)),
                                    self->executor_, *self->reactor_);
      op->owner_ = self->owner_;
      op->group_ = self->group_;
      op->how_ = self->delivery_;
      // Connected before submit: once submitted, the operation may complete (and be freed) on
      // another thread at any moment. A signal is only emitted after initiation returns.
      op->connect_cancellation();
      if (std::error_code ec = detail::reactor_access::submit(*self->reactor_, op, target))
        op_type::reject(op, ec);
    }
  };

  /// Registers `r` with the reactor_service of `ex`'s context (see reactor_service.hpp: its
  /// shutdown detaches this waiter's pending waits); returns the context's group.
  static std::uintptr_t register_with_context(const executor_type& ex, reactor& r) {
    auto& service = reactor_service::of(asio::query(ex, asio::execution::context));
    service.track(r);
    return service.group();
  }

  static std::uintptr_t next_owner() noexcept {
    static std::atomic<std::uintptr_t> counter{0};
    return counter.fetch_add(1, std::memory_order_relaxed) + 1;
  }

  executor_type executor_;
  reactor* reactor_;
  std::uintptr_t group_;  ///< its context (reactor_service::group)
  std::uintptr_t owner_ = next_owner();
  delivery delivery_ = delivery::post;
};

using gpu_waiter = basic_gpu_waiter<>;

}  // namespace EVR_ASIO_FLAVOUR_NAMESPACE
}  // namespace evr
