// evr/callbacks/on_complete.hpp — completions for code that does not use Asio.
//
//   evr::on_complete(reactor, stream, [](std::error_code ec) { ... });
//
// The callback runs exactly once on the reactor thread (the "delivery thread"). It must be short
// and must never block: it delays every other completion of the reactor. Hand real work to your
// own thread or pool from it. It receives a std::error_code (this header needs no Asio):
//   {}                         the work before the wait is done
//   a cuda_category() error    the device failed (sticky errors fail every wait on it)
//   errc::operation_aborted    cancelled through a wait_handle, or the reactor stopped before the
//                              work was done (compares equal to std::errc::operation_canceled)
//
// Returns {} when the wait started. On refusal (stopped reactor, bad input, a device error putting
// the marker on the stream) returns the error and the callback is neither called nor kept.
//
// Cancellation: the overload with an evr::wait_handle& (evr/callbacks/wait_handle.hpp) makes the
// wait cancellable through handle.cancel(). On success the handle holds the new wait (whatever it
// held before is forgotten, not cancelled); on refusal it is left empty. The three-argument form
// cannot be cancelled (it allocates nothing for a handle).
//
// Exceptions: the callback should not throw. If it does, the exception is caught on the reactor
// thread, reported on stderr with its what() and dropped; the reactor goes on serving every other
// wait (there is no caller to rethrow it to, and letting it escape would end the process).
// Thread safety: callable from any thread except inside a CUDA host function.
#pragma once

#include <memory>
#include <new>
#include <system_error>
#include <type_traits>
#include <utility>

#include <evr/callbacks/detail/callback_exception.hpp>
#include <evr/callbacks/wait_handle.hpp>
#include <evr/reactor/reactor.hpp>

namespace evr {
namespace detail {

template <typename Fn>
class callback_op final : public wait_op {
 public:
  template <typename F>
  explicit callback_op(F&& fn) : wait_op(&callback_op::do_complete), fn_(std::forward<F>(fn)) {
    how_ = delivery::inline_on_reactor;
  }

 private:
  static void do_complete(wait_op* base, std::error_code ec) noexcept {
    std::unique_ptr<callback_op> self(static_cast<callback_op*>(base));
    Fn fn(std::move(self->fn_));
    self.reset();  // freed before the upcall
    try {
      fn(ec);
    } catch (...) {
      report_callback_exception("an on_complete callback");  // see the file comment
    }
  }
  Fn fn_;
};

/// callback_op's cancellable twin: shared with a wait_handle (see wait_handle.hpp).
template <typename Fn>
class shared_callback_op final : public shared_wait_op {
 public:
  template <typename F>
  shared_callback_op(F&& fn, reactor_core* core)
      : shared_wait_op(&shared_callback_op::do_complete, &shared_callback_op::do_destroy, core),
        fn_(std::forward<F>(fn)) {
    how_ = delivery::inline_on_reactor;
  }

 private:
  static void do_complete(wait_op* base, std::error_code ec) noexcept {
    auto* self = static_cast<shared_callback_op*>(base);
    Fn fn(std::move(self->fn_));
    self->release();  // the handle may still hold the storage; its cancel() now returns false
    try {
      fn(ec);
    } catch (...) {
      report_callback_exception("an on_complete callback");  // see the file comment
    }
  }
  static void do_destroy(shared_wait_op* base) noexcept {
    delete static_cast<shared_callback_op*>(base);
  }
  Fn fn_;
};

}  // namespace detail

/// Calls `fn(std::error_code)` once, on the reactor thread, when the GPU is past `target` (see the
/// file comment for the outcomes). Returns {} when the wait started; on refusal returns the error
/// and `fn` is neither called nor kept. Not cancellable (the overload with a wait_handle is).
template <typename Fn>
std::error_code on_complete(reactor& r, const wait_target& target, Fn&& fn) {
  static_assert(std::is_invocable_v<std::decay_t<Fn>&, std::error_code>,
                "on_complete needs a callable taking std::error_code");
  auto op = std::make_unique<detail::callback_op<std::decay_t<Fn>>>(std::forward<Fn>(fn));
  if (std::error_code ec = detail::reactor_access::submit(r, op.get(), target))
    return ec;   // op (and fn) destroyed here
  op.release();  // the reactor completes and frees it
  return {};
}

/// As above, and `handle` can cancel the wait (see wait_handle.hpp). On success `handle` holds
/// the wait; on refusal it is empty and the callback is neither called nor kept.
template <typename Fn>
std::error_code on_complete(reactor& r, const wait_target& target, Fn&& fn, wait_handle& handle) {
  static_assert(std::is_invocable_v<std::decay_t<Fn>&, std::error_code>,
                "on_complete needs a callable taking std::error_code");
  using op_type = detail::shared_callback_op<std::decay_t<Fn>>;
  handle.reset();
  auto* op = new op_type(std::forward<Fn>(fn), detail::reactor_access::core(r));
  // Into the handle before the wait starts: the callback may run at once (on the reactor thread)
  // and may use the handle; submit's push (release) publishes this write to it.
  detail::wait_handle_access::adopt(handle, op);
  if (std::error_code ec = detail::reactor_access::submit(r, op, target)) {
    detail::wait_handle_access::forget(handle);
    delete op;  // refused: never shared, fn destroyed here
    return ec;
  }
  // Both references are live from here: the reactor's (its completion drops it, possibly already
  // under way on the reactor thread) and the handle's.
  return {};
}

}  // namespace evr
