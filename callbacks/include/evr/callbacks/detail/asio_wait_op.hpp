// evr/callbacks/detail/asio_wait_op.hpp — the operation behind gpu_waiter::async_wait.
//
// Life of one operation:
//   1. initiation (user's thread): allocated with the handler's associated allocator (default:
//      Asio's recycling allocator, a per-thread cache: no heap allocation in steady state); work
//      is tracked on the I/O executor and, when the handler has an executor of its own, on that
//      one too; a cancellation handler is installed in the handler's slot; then the reactor gets it
//      (reactor_access::submit).
//   2. completion (reactor thread): do_complete either runs finish() right there (inline
//      delivery) or posts a small function to the handler's executor. The posted function carries
//      its own allocator, which hands out the operation's own bytes that the reactor no longer
//      needs (wait_op::reusable_after_complete), so posting to an io_context allocates nothing.
//      Posts to a plain io_context are held until the end of the reactor's batch and queued
//      together (io_context_posts.hpp). (A handler bound to a strand is posted to the strand from
//      here, which keeps its order; the idle strand's own invoker is then allocated from this
//      thread's recycling cache and freed into another's: see docs/architecture.md.)
//   3. finish (handler's executor, or reactor thread when inline): clears the cancellation slot,
//      moves the handler and the work out, frees the operation, then calls the handler — the
//      operation's memory is back in the allocator's cache before the upcall, as Asio requires.
//   A refused submission (stopped reactor, bad input) is posted the same way: a handler never
//   runs inside the initiating call.
//   4. context shutdown: when the I/O executor's execution context shuts down with the wait
//      pending, reactor_service::shutdown detaches it from the reactor (group_ = the context) and
//      calls complete() with detached_ set: the operation is destroyed, its handler never runs
//      (as Asio's own services do with their pending operations).
// The core's outcome (std::error_code) reaches the handler through to_asio_error: the flavour's
// asio::error::operation_aborted for errc::operation_aborted, the code itself otherwise.
// A handler that throws: posted, the exception leaves the executor's run() as with any Asio
// handler; inline on the reactor thread, it is reported on stderr and dropped (the reactor goes
// on serving the other waits).
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <system_error>
#include <type_traits>
#include <utility>

#include <evr/callbacks/detail/asio_forward.hpp>
#include <evr/callbacks/detail/callback_exception.hpp>
#include <evr/callbacks/detail/io_context_host.hpp>
#include <evr/callbacks/detail/io_context_posts.hpp>
#include <evr/callbacks/detail/slot_allocator.hpp>
#include <evr/reactor/reactor.hpp>

namespace evr::detail {
inline namespace EVR_ASIO_FLAVOUR_NAMESPACE {

/// The slot of the posted delivery function: the operation's reusable bytes
/// (wait_op::reusable_after_complete, 64 bytes the reactor no longer needs once it completed the
/// wait), used once, then the heap. Measured (Asio 1.22, x86-64): an io_context's wrapper of the
/// delivery function is 56 bytes (its operation header, delivery_fn, this allocator), also behind
/// an any_io_executor; a strand's and a thread_pool's 56-64. A larger one goes to the heap
/// (tests/sim_delivery_test.cpp counts allocations). wait_op::front_end_flag_ says "in use".
class op_bytes_slot {
 public:
  explicit op_bytes_slot(wait_op* op) noexcept : op_(op) {}
  void* take(std::size_t bytes, std::size_t align) noexcept {
    if (op_->front_end_flag_ || bytes > wait_op::reusable_size || align > alignof(std::uintptr_t))
      return nullptr;
    op_->front_end_flag_ = true;
    return op_->reusable_after_complete();
  }
  bool give_back(void* p) noexcept {
    if (p != op_->reusable_after_complete()) return false;
    op_->front_end_flag_ = false;
    return true;
  }
  bool operator==(const op_bytes_slot& o) const noexcept { return op_ == o.op_; }

 private:
  wait_op* op_;
};
template <typename T>
using slab_allocator = slot_allocator<T, op_bytes_slot>;

/// The posted function: owns the operation until it runs (or is destroyed unrun, e.g. by an
/// io_context shutting down, which then frees the operation without calling the handler).
template <typename Op>
class delivery_fn {
 public:
  using allocator_type = slab_allocator<void>;
  delivery_fn(Op* op, std::error_code ec) noexcept : op_(op), ec_(ec) {}
  delivery_fn(delivery_fn&& other) noexcept
      : op_(std::exchange(other.op_, nullptr)), ec_(other.ec_) {}
  delivery_fn& operator=(delivery_fn&&) = delete;
  ~delivery_fn() {
    if (op_ != nullptr) Op::destroy(op_);
  }
  void operator()() { Op::finish(std::exchange(op_, nullptr), ec_); }
  allocator_type get_allocator() const noexcept { return allocator_type(op_bytes_slot(op_)); }

 private:
  Op* op_;
  std::error_code ec_;
};

template <typename Executor>
using tracked_executor_t = std::decay_t<decltype(asio::prefer(
    std::declval<const Executor&>(), asio::execution::outstanding_work.tracked))>;

/// True when `Handler` has an associated executor of its own (bind_executor, a coroutine's
/// handler, a member executor_type, a specialization of associated_executor): asked with a
/// private executor type that nothing can be bound to.
struct no_associated_executor_probe {};
template <typename Handler>
inline constexpr bool has_own_executor_v =
    !std::is_same_v<asio::associated_executor_t<Handler, no_associated_executor_probe>,
                    no_associated_executor_probe>;

/// Stands in for the handler's tracked executor when the handler has none of its own: its
/// completion goes to the I/O executor, whose work the operation tracks already.
struct no_handler_work {};

template <typename Handler, typename IoExecutor>
class asio_wait_op final : public wait_op {
 public:
  using handler_executor = asio::associated_executor_t<Handler, IoExecutor>;
  using base_allocator = asio::associated_allocator_t<Handler, asio::recycling_allocator<void>>;
  using allocator =
      typename std::allocator_traits<base_allocator>::template rebind_alloc<asio_wait_op>;

  /// Allocates and constructs with the handler's allocator. Throws what the allocator throws.
  static asio_wait_op* create(Handler&& handler, const IoExecutor& io_ex, reactor& r) {
    allocator alloc(asio::get_associated_allocator(handler, asio::recycling_allocator<void>()));
    asio_wait_op* p = std::allocator_traits<allocator>::allocate(alloc, 1);
    try {
      ::new (static_cast<void*>(p)) asio_wait_op(std::move(handler), io_ex, r);
    } catch (...) {
      std::allocator_traits<allocator>::deallocate(alloc, p, 1);
      throw;
    }
    return p;
  }

  /// The handler's associated cancellation slot. The two-argument form: Boost 1.81's
  /// one-argument get() is ambiguous for a std::reference_wrapper handler (std::ref(fn)).
  static auto handler_slot(const Handler& h) noexcept {
    return asio::get_associated_cancellation_slot(h, asio::cancellation_slot());
  }

  /// Connects the handler's cancellation slot (if any) to reactor::cancel.
  void connect_cancellation() {
    auto slot = handler_slot(handler_);
    if (slot.is_connected()) slot.template emplace<cancel_handler>(this);
  }

  /// Undoes connect_cancellation: the slot no longer calls into this operation.
  void disconnect_cancellation() noexcept {
    auto slot = handler_slot(handler_);
    if (slot.is_connected()) slot.clear();
  }

  /// True when the handler runs on a thread of `io` (directly or through a strand): a poll host
  /// of `io` can then be the one that finds its completion.
  bool delivered_on(const asio::io_context* io) const noexcept {
    return io != nullptr && io_context_of(delivery_executor()) == io;
  }

  /// Completes a refused operation: posted, never inline.
  static void reject(asio_wait_op* self, std::error_code ec) noexcept {
    // done: a cancellation signal arriving before the posted completion runs is a no-op.
    self->state_.store(wait_op::done, std::memory_order_release);
    post_completion(self, ec);
  }

 private:
  template <typename>
  friend class delivery_fn;

  struct cancel_handler {
    explicit cancel_handler(asio_wait_op* o) noexcept : op(o) {}
    asio_wait_op* op;
    void operator()(asio::cancellation_type_t type) const {
      // Stopping a wait has no side effect on the GPU, so terminal, partial and total
      // cancellation are all honoured.
      if ((type & (asio::cancellation_type::terminal | asio::cancellation_type::partial |
                   asio::cancellation_type::total)) != asio::cancellation_type::none) {
        reactor_access::cancel(op->reactor_, op);
      }
    }
  };

  asio_wait_op(Handler&& handler, const IoExecutor& io_ex, reactor& r)
      : wait_op(&asio_wait_op::do_complete),
        handler_(std::move(handler)),
        io_work_(asio::prefer(io_ex, asio::execution::outstanding_work.tracked)),
        handler_work_(make_handler_work(handler_, io_ex)),
        reactor_(r) {}

  /// A handler with an executor of its own is posted there, and work is tracked on it too;
  /// every other handler is posted to the I/O executor (one tracked executor, not two copies of
  /// the same one: 56 bytes less per wait with an any_io_executor).
  static constexpr bool own_executor = has_own_executor_v<Handler>;
  using handler_work_type =
      std::conditional_t<own_executor, tracked_executor_t<handler_executor>, no_handler_work>;
  static handler_work_type make_handler_work(const Handler& h, const IoExecutor& io_ex) {
    if constexpr (own_executor) {
      return asio::prefer(asio::get_associated_executor(h, io_ex),
                          asio::execution::outstanding_work.tracked);
    } else {
      (void)h;
      (void)io_ex;
      return {};
    }
  }
  const auto& delivery_executor() const noexcept {
    if constexpr (own_executor) {
      return handler_work_;
    } else {
      return io_work_;
    }
  }

  static void do_complete(wait_op* base, std::error_code ec) noexcept {
    auto* self = static_cast<asio_wait_op*>(base);
    if (self->detached_) {
      destroy(self);  // its context is shutting down: destroy the handler, never run it
      return;
    }
    if (self->how_ == delivery::inline_on_reactor) {
      try {
        finish(self, ec);
      } catch (...) {
        // The handler threw on the reactor thread, where no caller can take the exception.
        report_callback_exception("a gpu_waiter handler delivered inline_on_reactor");
      }
    } else {
      post_completion(self, ec);
    }
  }

  static void post_completion(asio_wait_op* self, std::error_code ec) noexcept {
    try {
      if (asio::io_context* ctx = plain_io_context(self->delivery_executor())) {
        // Held back to the end of the reactor's batch when delivered from one; posted to the
        // io_context directly either way (also behind an any_io_executor, whose type erasure
        // would allocate on this thread instead of using the operation's reusable bytes).
        io_context_posts::this_thread().post(*ctx, delivery_fn<asio_wait_op>(self, ec));
      } else {
        asio::post(self->delivery_executor(), delivery_fn<asio_wait_op>(self, ec));
      }
    } catch (...) {
      // Posting failed (out of memory): the handler cannot be run anywhere safe. The delivery
      // function owned the operation, and whichever copy of it held the operation last has
      // destroyed it while the exception left post (destroying it here would be a second time);
      // the outstanding work it held is released with it.
    }
  }

  static void finish(asio_wait_op* self, std::error_code ec) {
    self->disconnect_cancellation();
    self->host_finished();
    allocator alloc(
        asio::get_associated_allocator(self->handler_, asio::recycling_allocator<void>()));
    Handler handler(std::move(self->handler_));
    auto io_work = std::move(self->io_work_);
    [[maybe_unused]] auto handler_work = std::move(self->handler_work_);
    // Memory back to the handler's allocator before the upcall.
    self->~asio_wait_op();
    std::allocator_traits<allocator>::deallocate(alloc, self, 1);
    std::move(handler)(to_asio_error(ec));
  }

  static void destroy(asio_wait_op* self) noexcept {
    // The handler is dropped unrun (its context shut down, or posting failed): disconnect its
    // cancellation slot too, or a signal the user keeps would later call into freed memory. This
    // runs where the context is being shut down (its handlers no longer run) or, after a failed
    // post, on the reactor thread.
    self->disconnect_cancellation();
    self->host_finished();
    allocator alloc(
        asio::get_associated_allocator(self->handler_, asio::recycling_allocator<void>()));
    self->~asio_wait_op();
    std::allocator_traits<allocator>::deallocate(alloc, self, 1);
  }

  /// Tells the wait's poll host (gpu_waiter set it) that it is done with the wait.
  void host_finished() noexcept {
    if (host_ != nullptr) static_cast<io_context_host*>(host_)->wait_finished();
  }

  Handler handler_;
  tracked_executor_t<IoExecutor> io_work_;
  [[no_unique_address]] handler_work_type handler_work_;
  reactor& reactor_;
};

}  // namespace EVR_ASIO_FLAVOUR_NAMESPACE
}  // namespace evr::detail
