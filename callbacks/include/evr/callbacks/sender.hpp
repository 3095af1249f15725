// evr/callbacks/sender.hpp — a GPU completion as a std::execution (P2300) sender. No Asio.
//
//   auto s = evr::async_wait(reactor, stream);   // lazy: nothing happens yet
//   auto op = evr::exec::connect(s, receiver);   // or any P2300 algorithm (see below)
//   evr::exec::start(op);                        // the wait starts here
//
// evr::async_wait(reactor, target) returns a basic_gpu_sender with the completion signatures
//   set_value_t()                      the work before the wait is done
//   set_error_t(std::error_code)       a cuda_category() error (the device failed; sticky errors
//                                      fail every wait on it), an evr::errc refusal of the wait
//                                      (reactor_stopped, empty_handle, event_never_recorded, ...),
//                                      or errc::operation_aborted when the reactor shut down
//                                      before the work was done (and no stop was requested)
//   set_stopped_t()                    stop was requested through the receiver's stop token
//                                      (before start, or while the wait was pending)
//
// What it waits for: the work queued on the stream when the operation is *started* (start(), not
// async_wait: senders are lazy), or the event as last recorded before start().
//
// Where it completes: on the reactor thread, exactly once, like an on_complete callback — the
// receiver's completion runs there and must be short and never block (it delays every other
// completion of the reactor). Move the rest of the work elsewhere with the library's
// continues_on (stdexec: `evr::async_wait(r, s) | stdexec::continues_on(pool.get_scheduler())`;
// `transfer` in older stdexec), whose hand-off is the only part that then runs on the reactor.
// Two exceptions complete inline, inside start(), on the starting thread: a stop already
// requested when start() is called (set_stopped), and a wait the reactor refuses (set_error with
// the refusal: a stopped reactor, an empty target, ...).
//
// Cancellation: if the receiver's environment has a stop token on which stop is possible, start()
// registers a stop callback. A stop request while the wait is pending cancels it with the same
// exactly-once handshake as evr::wait_handle::cancel() (the CAS on the wait's state): if the
// cancel wins, the receiver gets set_stopped; if the completion won, it gets set_value (or the
// error). The GPU work is not affected. Waits with an unstoppable token (e.g. none in the
// environment) register nothing.
//
// Lifetime: the operation state (connect's result) is the wait: it holds the reactor's operation,
// the receiver and the stop callback — no heap allocation per wait. The reactor must outlive
// start(); the operation state must live until the receiver is completed, and may be destroyed by
// the receiver's completion itself (nothing touches it afterwards: the stop callback is
// deregistered before the receiver is called, waiting for a stop callback that runs on another
// thread at that moment). The sender is a cheap value (a reactor pointer and a wait_target); it
// may be connected any number of times, and each operation state is a wait of its own.
//
// Protocol: the sender speaks the vocabulary of its Protocol template argument: evr::exec (the
// default, <evr/callbacks/exec.hpp>, for code without a P2300 library) or another library's, e.g.
// evr::stdexec_protocol (<evr/callbacks/stdexec.hpp>, which includes stdexec):
//   stdexec::sync_wait(evr::async_wait<evr::stdexec_protocol>(reactor, stream));
// It declares sender_concept, completion_signatures (a member alias, and the consteval
// get_completion_signatures<Self, Env...>() of C++26), connect() and get_env() as members;
// operation states declare operation_state_concept and a noexcept start().
//
// Thread safety: async_wait, connect and start may be called from any thread except inside a CUDA
// host function; a stop request may come from any thread, at any time.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>

#include <evr/callbacks/exec.hpp>
#include <evr/device/error.hpp>
#include <evr/reactor/reactor.hpp>

namespace evr {

template <class Protocol>
class basic_gpu_sender;

namespace detail {

/// Waits a moment for another thread: a few pauses, then yields.
inline void spin_pause(unsigned round) noexcept {
  if (round < 64) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  } else {
    std::this_thread::yield();
  }
}

struct no_stop_state {};

/// The operation state of basic_gpu_sender<Protocol> connected to a Receiver (see sender.hpp).
///
/// Exactly once, and its lifetime (the receiver's completion may destroy it):
///  * The reactor owns the wait from a successful submit until it calls do_complete. The outcome is
///    decided by wait_op::state_: the reactor's exchange to `done` against a cancel's CAS
///    pending -> cancel_requested (detail::cancel_wait), as for evr::wait_handle.
///  * With a stoppable token, start() registers the stop callback *before* submitting, so the
///    completion can always deregister it. stop_.flags then orders three parties:
///      - start() sets `submitted` as its very last access to the object (after a successful
///        submit); if it finds `stop_seen` set, it issues the cancel itself before that.
///      - the stop callback sets `stop_seen`; it cancels only if `submitted` was already set
///        (before that, the wait may not have reached the reactor, and start() cancels instead).
///      - do_complete (reactor thread) waits until `submitted` is set (start() is at most a few
///        instructions past the submission's push), destroys the stop callback (which waits for
///        a callback running on another thread), then completes the receiver: its last access.
///    So exactly one of start() and the callback calls cancel_wait, and neither touches the
///    object after the completion can run.
template <class Protocol, class Receiver>
class gpu_sender_op : private wait_op {
  using env_t = decltype(typename Protocol::get_env_t{}(std::declval<const Receiver&>()));
  using token_t = std::remove_cvref_t<decltype(
      typename Protocol::get_stop_token_t{}(std::declval<const env_t&>()))>;
  static constexpr bool stoppable = !exec::unstoppable_token<token_t>;

  struct on_stop {
    gpu_sender_op* self;
    void operator()() noexcept { self->stop_requested(); }
  };
  using callback_t = exec::stop_callback_for_t<token_t, on_stop>;

  enum : std::uint8_t { submitted = 1, stop_seen = 2 };

 public:
  /// This type is an operation state of the Protocol.
  using operation_state_concept = typename Protocol::operation_state_concept;

  /// Made by basic_gpu_sender::connect.
  template <class R>
  gpu_sender_op(reactor& r, const wait_target& target,
                R&& rcvr) noexcept(std::is_nothrow_constructible_v<Receiver, R>)
      : wait_op(&gpu_sender_op::do_complete),
        rcvr_(std::forward<R>(rcvr)),
        reactor_(&r),
        target_(target) {
    how_ = delivery::inline_on_reactor;
  }
  gpu_sender_op(const gpu_sender_op&) = delete;
  gpu_sender_op& operator=(const gpu_sender_op&) = delete;
  gpu_sender_op(gpu_sender_op&&) = delete;
  gpu_sender_op& operator=(gpu_sender_op&&) = delete;
  ~gpu_sender_op() = default;

  /// Starts the wait (see sender.hpp). Once per operation state.
  void start() & noexcept {
    if constexpr (stoppable) {
      token_t token = typename Protocol::get_stop_token_t{}(typename Protocol::get_env_t{}(rcvr_));
      if (token.stop_requested()) {
        typename Protocol::set_stopped_t{}(std::move(rcvr_));
        return;
      }
      stop_.core = reactor_access::core(*reactor_);
      stop_.callback.emplace(token, on_stop{this});
      if (stop_.flags.load(std::memory_order_acquire) & stop_seen) {
        // Stop was requested while the callback was being registered: nothing started.
        stop_.callback.reset();
        typename Protocol::set_stopped_t{}(std::move(rcvr_));
        return;
      }
    }
    if (std::error_code ec = reactor_access::submit(*reactor_, this, target_)) {
      // Refused: the reactor never saw the wait; completed here, on this thread.
      if constexpr (stoppable) {
        stop_.callback.reset();
        if (stop_.flags.load(std::memory_order_acquire) & stop_seen) {
          typename Protocol::set_stopped_t{}(std::move(rcvr_));
          return;
        }
      }
      typename Protocol::set_error_t{}(std::move(rcvr_), ec);
      return;
    }
    if constexpr (stoppable) publish_submitted();
    // Without a stop callback the reactor owns the wait from the push on: nothing touches *this.
  }

 private:
  friend class basic_gpu_sender<Protocol>;

  struct stop_state {
    std::atomic<std::uint8_t> flags{0};
    reactor_core* core = nullptr;  ///< for cancel_wait (a pending wait keeps its core alive)
    std::optional<callback_t> callback;
  };

  void publish_submitted() noexcept {
    std::uint8_t f = stop_.flags.load(std::memory_order_acquire);
    for (;;) {
      if (f & stop_seen) {
        // The callback ran before the wait was submitted and left the cancel to us. do_complete
        // cannot finish before `submitted` is set below, so *this is alive here.
        (void)cancel_wait(stop_.core, this);
        stop_.flags.fetch_or(submitted, std::memory_order_release);  // last access
        return;
      }
      // release: do_complete sees the callback (its acquire load of `submitted`).
      if (stop_.flags.compare_exchange_weak(f, f | submitted, std::memory_order_release,
                                            std::memory_order_acquire))
        return;  // last access
    }
  }

  void stop_requested() noexcept {
    // acq_rel: pairs with start()'s release of `submitted` (stop_.core is then visible).
    const std::uint8_t prev = stop_.flags.fetch_or(stop_seen, std::memory_order_acq_rel);
    // Pending or completing: the CAS in cancel_wait decides. *this is alive: do_complete destroys
    // this callback (and so waits for this call) before it completes the receiver.
    if (prev & submitted) (void)cancel_wait(stop_.core, this);
  }

  static void do_complete(wait_op* base, std::error_code ec) noexcept {
    auto* self = static_cast<gpu_sender_op*>(base);
    bool stopped = false;
    if constexpr (stoppable) {
      // start() may still be between the submission's push and its last access (`submitted`).
      std::uint8_t f = self->stop_.flags.load(std::memory_order_acquire);
      for (unsigned round = 0; !(f & submitted); ++round) {
        spin_pause(round);
        f = self->stop_.flags.load(std::memory_order_acquire);
      }
      // From here no stop callback runs, or will: one running on another thread has returned.
      self->stop_.callback.reset();
      stopped = (self->stop_.flags.load(std::memory_order_acquire) & stop_seen) != 0;
    }
    // The last access to *this: the receiver may destroy the operation state.
    if (!ec) {
      typename Protocol::set_value_t{}(std::move(self->rcvr_));
    } else if (stopped && ec == errc::operation_aborted) {
      typename Protocol::set_stopped_t{}(std::move(self->rcvr_));
    } else {
      typename Protocol::set_error_t{}(std::move(self->rcvr_), ec);
    }
  }

  Receiver rcvr_;
  reactor* reactor_;
  wait_target target_;
  [[no_unique_address]] std::conditional_t<stoppable, stop_state, no_stop_state> stop_;
};

}  // namespace detail

/// A sender of one GPU completion: what evr::async_wait returns. See sender.hpp for the contract
/// (completion signatures, the thread it completes on, cancellation, lifetime).
///
/// @tparam Protocol the P2300 vocabulary it speaks: evr::exec::protocol (default) or another
///         library's (evr::stdexec_protocol).
template <class Protocol = exec::protocol>
class basic_gpu_sender {
 public:
  /// This type is a sender of the Protocol.
  using sender_concept = typename Protocol::sender_concept;
  /// set_value_t(), set_error_t(std::error_code), set_stopped_t(), in the Protocol's types.
  using completion_signatures = typename Protocol::template completion_signatures<
      typename Protocol::set_value_t(), typename Protocol::set_error_t(std::error_code),
      typename Protocol::set_stopped_t()>;

  /// The completion signatures, C++26 style (the same in every environment).
  template <class Self, class... Env>
  static consteval completion_signatures get_completion_signatures() noexcept {
    return {};
  }

  /// A wait on `target` through `r`; nothing starts before the operation state's start().
  basic_gpu_sender(reactor& r, const wait_target& target) noexcept
      : reactor_(&r), target_(target) {}

  /// The operation state: this wait connected to `rcvr`. Starts nothing.
  template <class Receiver>
  requires std::is_invocable_v<typename Protocol::set_value_t, std::decay_t<Receiver> &&>&&
      std::is_invocable_v<typename Protocol::set_error_t, std::decay_t<Receiver>&&,
                          std::error_code>&&
          std::is_invocable_v<typename Protocol::set_stopped_t, std::decay_t<Receiver>&&>
              detail::gpu_sender_op<Protocol, std::decay_t<Receiver>> connect(Receiver&& rcvr) const
      noexcept(std::is_nothrow_constructible_v<std::decay_t<Receiver>, Receiver>) {
    return detail::gpu_sender_op<Protocol, std::decay_t<Receiver>>(*reactor_, target_,
                                                                   std::forward<Receiver>(rcvr));
  }

  /// The sender's attributes: none.
  exec::empty_env get_env() const noexcept { return {}; }

 private:
  reactor* reactor_;
  wait_target target_;
};

/// basic_gpu_sender in evr's own protocol (evr::exec).
using gpu_sender = basic_gpu_sender<>;

/// A sender that completes once the GPU is past `target` (see sender.hpp): `set_value()` on the
/// reactor thread; `set_error(std::error_code)`; `set_stopped()` when the receiver's stop token
/// asks. Lazy: the wait is submitted by the operation state's start().
template <class Protocol = exec::protocol>
basic_gpu_sender<Protocol> async_wait(reactor& r, const wait_target& target) noexcept {
  return basic_gpu_sender<Protocol>(r, target);
}

}  // namespace evr
