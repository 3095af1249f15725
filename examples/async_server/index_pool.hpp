// A pool of n interchangeable units named by index (0 .. n-1): the lanes of a GPU, the admission
// slots of large requests. Taking and giving back a unit is a compare-and-swap on a lock-free
// free list while units are free (no lock, no Asio operation); a caller that finds none queues a
// completion handler under a mutex, and the next unit given back goes to the oldest waiter.
//
// A waiter can be cancelled through its handler's Asio cancellation slot (any type): it leaves
// the queue and completes with `cancelled` instead of an index. Emit the signal where the
// handler's executor runs (Asio's rule): a waiter is completed on that executor, which clears the
// slot there, so a signal emitted on that executor finds either a waiter still queued (and
// cancels it) or nothing (a unit is on its way, or it completed).
//
// Thread safety: try_take, give_back and async_take from any thread. Lifetime: the handlers'
// executors outlive the pool or the waiters; waiters left when the pool is destroyed are dropped
// (their handlers destroyed without running).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>

#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>

#include "op_allocator.hpp"

class index_pool {
 public:
  static constexpr std::uint32_t none = 0xffffffffu;       ///< try_take: nothing free
  static constexpr std::uint32_t cancelled = 0xfffffffeu;  ///< async_take: the wait was cancelled

  /// `n` units, at most 65534.
  explicit index_pool(std::size_t n);
  ~index_pool();
  index_pool(const index_pool&) = delete;
  index_pool& operator=(const index_pool&) = delete;

  /// A free unit's index, or `none`. Lock-free.
  std::uint32_t try_take() noexcept;
  /// Gives unit `index` back: to the oldest waiter if there is one, else to the free list.
  void give_back(std::uint32_t index) noexcept;
  /// Waits for a unit (first come, first served), completing with void(std::uint32_t): the
  /// unit's index, or `cancelled`. Never completes inside the call; the handler runs on its
  /// associated executor.
  template <typename CompletionToken>
  auto async_take(CompletionToken&& token) {
    return asio::async_initiate<CompletionToken, void(std::uint32_t)>(
        [this](auto handler) {
          enqueue(waiter_for<decltype(handler)>::create(*this, std::move(handler)));
        },
        token);
  }

  std::size_t size() const noexcept { return size_; }
  /// Units taken now (a statistic; exact once nothing is in flight).
  std::size_t taken() const noexcept { return taken_.load(std::memory_order_relaxed); }
  /// Waiters queued now (a statistic).
  std::size_t waiting() const noexcept { return waiting_.load(std::memory_order_relaxed); }

 private:
  /// A queued handler, type-erased (Asio 1.22 has no any_completion_handler), allocated with the
  /// handler's associated allocator (Asio's recycling allocator for a coroutine: no malloc once
  /// warm) and linked into an intrusive list (no container to grow).
  struct waiter {
    waiter* prev = nullptr;
    waiter* next = nullptr;
    bool queued = false;  // in the list (guarded by the pool's mutex)
    /// Posts the completion (an index or `cancelled`) to the handler's executor, where the waiter
    /// clears its slot, frees itself and runs the handler. The waiter is out of the list.
    virtual void complete(std::uint32_t index) = 0;
    /// Frees the waiter and destroys its handler without running it (the pool is going away).
    virtual void drop() noexcept = 0;

   protected:
    ~waiter() = default;
  };
  template <typename Handler>
  struct waiter_for;
  /// What a waiter installs in its handler's cancellation slot.
  struct canceller {
    index_pool* pool;
    waiter* w;
    void operator()(asio::cancellation_type) const { pool->cancel(w); }
  };

  void push(std::uint32_t index) noexcept;
  void enqueue(waiter* w);
  void unlink(waiter* w) noexcept;  // mutex_ held
  void cancel(waiter* w);

  std::size_t size_;
  // The free list: a Treiber stack of indices. head_ = (tag << 32) | (index + 1), 0 when empty;
  // the tag changes on every pop, so a stale compare-and-swap fails (no ABA).
  std::unique_ptr<std::atomic<std::uint32_t>[]> next_;  // next_[i]: index + 1 below unit i
  alignas(64) std::atomic<std::uint64_t> head_{0};
  alignas(64) std::atomic<std::size_t> taken_{0};
  std::atomic<std::size_t> waiting_{0};  // waiters in the list, readable without the lock
  std::mutex mutex_;                     // guards the waiter list
  waiter* first_ = nullptr;              // the oldest waiter
  waiter* last_ = nullptr;               // the newest
};

template <typename Handler>
struct index_pool::waiter_for final : index_pool::waiter {
  using allocator_type = op_allocator_t<Handler, waiter_for>;

  static waiter* create(index_pool& pool, Handler&& h) {
    allocator_type alloc = op_allocator<waiter_for>(h);
    waiter_for* w = std::allocator_traits<allocator_type>::allocate(alloc, 1);
    new (w) waiter_for(std::move(h));
    if (w->slot.is_connected()) w->slot.template emplace<canceller>(canceller{&pool, w});
    return w;
  }
  void complete(std::uint32_t index) override {
    // The waiter stays alive until the posted call runs on the handler's executor: a cancellation
    // signal emitted there meanwhile finds it (not queued: nothing to do) rather than freed memory.
    auto ex = work.get_executor();
    asio::post(ex, [this, index] { finish(index); });
  }
  void drop() noexcept override {
    slot.clear();
    free(op_allocator<waiter_for>(handler));
  }

 private:
  explicit waiter_for(Handler&& h)
      : handler(std::move(h)),
        work(asio::get_associated_executor(handler)),
        slot(asio::get_associated_cancellation_slot(handler)) {}
  ~waiter_for() = default;

  void finish(std::uint32_t index) {
    if (slot.is_connected()) slot.clear();
    allocator_type alloc = op_allocator<waiter_for>(handler);
    Handler h = std::move(handler);
    auto guard = std::move(work);  // released after the handler: run() keeps going meanwhile
    free(alloc);
    std::move(h)(index);
  }
  void free(allocator_type alloc) noexcept {
    this->~waiter_for();
    std::allocator_traits<allocator_type>::deallocate(alloc, this, 1);
  }

  Handler handler;
  asio::executor_work_guard<asio::associated_executor_t<Handler>> work;
  asio::associated_cancellation_slot_t<Handler> slot;
};
