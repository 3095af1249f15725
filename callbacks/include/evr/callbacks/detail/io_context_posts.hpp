// evr/callbacks/detail/io_context_posts.hpp — the completions of one delivery batch bound for one
// io_context, posted to it together.
//
// Why: posting costs the reactor thread a lock of the context's queue and, when a thread of the
// context idles, a wake-up (a futex or eventfd system call) per completion; in a batch of many
// completions that is most of the reactor's cost per completion (docs/architecture.md, "Where a
// wait's bytes and time go"). Asio's own reactor queues a pass's completed operations and hands
// them to the scheduler under one lock; this does the same for evr's batch, through the same
// scheduler calls (asio::detail: stable from Asio 1.22 to 1.38, checked by the tests of both
// flavours).
//
// What is held: only completions whose handler executor is a plain io_context executor (directly,
// or behind an any_io_executor), delivered by the reactor inside a batch (deferred_posts.hpp has
// the protocol) on a thread that does not run that context; on one that does (a host's pass),
// each is queued at once (post() says why). Each stays its own scheduler operation, so several
// threads running the context share a batch as they would share separate posts, and a context that
// shuts down destroys the ones still queued (the operation is destroyed unrun, as any posted
// function is). Completions for other executors (strands, thread pools, user executors) are posted
// at once. Each executor's handlers keep the batch's order; across executors there is none to keep
// (an idle strand's first handler brings the strand's whole queue with it, in Asio with or without
// this).
//
// Threads: one object per thread (this_thread()); only the reactor thread ever holds anything.
// Lifetime: flush() forgets every context: nothing refers to a context between batches.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include <evr/callbacks/detail/asio_forward.hpp>
#include <evr/reactor/detail/deferred_posts.hpp>

#if defined(EVR_ASIO_BOOST)
#include <boost/asio/detail/executor_op.hpp>
#include <boost/asio/detail/op_queue.hpp>
#include <boost/asio/detail/scheduler.hpp>
#else
#include <asio/detail/executor_op.hpp>
#include <asio/detail/op_queue.hpp>
#include <asio/detail/scheduler.hpp>
#endif

namespace evr::detail {
inline namespace EVR_ASIO_FLAVOUR_NAMESPACE {

template <typename Executor>
struct is_io_context_executor : std::false_type {};
template <typename Allocator, std::uintptr_t Bits>
struct is_io_context_executor<asio::io_context::basic_executor_type<Allocator, Bits>>
    : std::true_type {};

/// The io_context that `ex` posts to when it is a plain io_context executor (any allocator, any
/// work tracking; also behind an any_io_executor); nullptr for every other executor.
template <typename Executor>
asio::io_context* plain_io_context(const Executor& ex) noexcept {
  if constexpr (is_io_context_executor<Executor>::value) {
    return &ex.context();
  } else if constexpr (std::is_same_v<Executor, asio::any_io_executor>) {
    using tracked =
        std::decay_t<decltype(asio::prefer(std::declval<const asio::io_context::executor_type&>(),
                                           asio::execution::outstanding_work.tracked))>;
    if (const auto* io = ex.template target<tracked>()) return &io->context();
    if (const auto* io = ex.template target<asio::io_context::executor_type>())
      return &io->context();
    return nullptr;
  } else {
    return nullptr;
  }
}

template <typename Executor>
struct is_strand : std::false_type {};
template <typename Inner>
struct is_strand<asio::strand<Inner>> : std::true_type {};

/// The io_context whose threads run what is posted to `ex`: a plain io_context executor, a strand
/// of one, or either behind an any_io_executor; nullptr for every other executor.
template <typename Executor>
asio::io_context* io_context_of(const Executor& ex) noexcept {
  if constexpr (is_strand<Executor>::value) {
    return io_context_of(ex.get_inner_executor());
  } else if constexpr (std::is_same_v<Executor, asio::any_io_executor>) {
    if (asio::io_context* io = plain_io_context(ex)) return io;
    using strand = asio::strand<asio::io_context::executor_type>;
    if (const auto* s = ex.template target<strand>()) return io_context_of(*s);
    return nullptr;
  } else {
    return plain_io_context(ex);
  }
}

class io_context_posts final : public deferred_posts {
 public:
  /// The calling thread's object.
  static io_context_posts& this_thread() noexcept {
    static thread_local io_context_posts posts;
    return posts;
  }

  /// Posts `f` to `ctx` as asio::post would (allocated with `f`'s associated allocator). On a
  /// thread of `ctx` (a poll host's pass: the last hop) into the context's shared queue at once,
  /// never the thread's private one: Asio appends that to the shared queue only when the running
  /// handler returns, so a later completion of the same stream that the reactor thread posted
  /// meanwhile ran first (host_func markers on an H200); queued now, under the pass lock, they
  /// keep the stream's order, and holding them would save no lock. Elsewhere held back until the
  /// end of the reactor's batch when this thread is delivering one, at once otherwise. Throws
  /// what the allocator throws (then `f` was destroyed).
  template <typename F>
  void post(asio::io_context& ctx, F&& f) {
    using function = std::decay_t<F>;
    using allocator = asio::associated_allocator_t<function>;
    using op = asio::detail::executor_op<function, allocator, asio::detail::operation>;
    const allocator alloc = asio::get_associated_allocator(f);
    const bool here = ctx.get_executor().running_in_this_thread();
    if (!here && !hold_until_batch_end(*this)) {
      asio::post(ctx.get_executor(), std::forward<F>(f));
      return;
    }
    typename op::ptr p = {std::addressof(alloc), op::ptr::allocate(alloc), nullptr};
    p.p = ::new (p.v) op(std::forward<F>(f), alloc);
    if (here) {
      scheduler_of(ctx).do_dispatch(p.p);  // counts its work and queues it under the lock
    } else {
      hold(ctx, p.p);
    }
    p.v = p.p = nullptr;
  }

  /// Posts everything held, one call per context (one lock, at most one wake-up), and forgets
  /// the contexts.
  void flush() noexcept override {
    for (std::size_t i = 0; i < count_; ++i) {
      held& h = held_[i];
      // Counts the work of the n operations and queues them under one lock (the scheduler's
      // run loop finishes one unit of work per operation it runs, as after post()).
      h.scheduler->post_immediate_completions(h.count, h.ops, false);  // empties h.ops
      h.context = nullptr;
      h.scheduler = nullptr;
      h.count = 0;
    }
    count_ = 0;
  }

 private:
  struct held {
    asio::io_context* context = nullptr;
    asio::detail::scheduler* scheduler = nullptr;
    asio::detail::op_queue<asio::detail::operation> ops;  // destroys what it still holds
    std::size_t count = 0;
  };

  void hold(asio::io_context& ctx, asio::detail::operation* o) {
    held* h = nullptr;
    for (std::size_t i = 0; i < count_ && h == nullptr; ++i) {
      if (held_[i].context == &ctx) h = &held_[i];
    }
    if (h == nullptr) {
      if (count_ == held_.size()) flush();  // many contexts in one batch: post what is held
      h = &held_[count_++];
      h->context = &ctx;
      h->scheduler = &scheduler_of(ctx);
    }
    h->ops.push(o);
    ++h->count;
  }

  /// The io_context's scheduler: its implementation, which Asio hands out without a lookup.
  static asio::detail::scheduler& scheduler_of(asio::io_context& ctx) noexcept {
    return asio::use_service<asio::detail::io_context_impl>(ctx);
  }

  io_context_posts() = default;
  ~io_context_posts() = default;

  std::array<held, 8> held_;
  std::size_t count_ = 0;
};

}  // namespace EVR_ASIO_FLAVOUR_NAMESPACE
}  // namespace evr::detail
