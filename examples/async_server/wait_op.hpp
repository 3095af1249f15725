// A completion handler of void(std::error_code) behind a plain pointer: what a GPU wait written
// by hand (host_func_wait.hpp, event_poller.hpp) keeps while the GPU works, and what a host
// function can be given as its void* argument.
//
// Allocated with op_allocator (Asio's recycling allocator for a coroutine's handler: no malloc
// per request on a warm io thread). Holds work on the handler's executor, so that its io_context's
// run() does not return while the wait is pending (a server stopping with requests in flight
// lets them finish their GPU work).
#pragma once

#include <memory>
#include <system_error>
#include <type_traits>
#include <utility>

#include <asio/any_io_executor.hpp>
#include <asio/associated_executor.hpp>
#include <asio/bind_allocator.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>

#include "op_allocator.hpp"

/// operator new and delete, as an allocator (for what must not use Asio's per-thread caches).
template <typename T>
struct heap_allocator {
  using value_type = T;
  heap_allocator() = default;
  template <typename U>
  heap_allocator(const heap_allocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T))); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p); }
  friend bool operator==(const heap_allocator&, const heap_allocator&) noexcept { return true; }
};

class wait_op {
 public:
  /// The operation for `handler` (called once, with the wait's result, by complete()).
  template <typename Handler>
  static wait_op* create(Handler handler);

  /// On a thread that runs the handler's executor: frees the operation, then runs the handler
  /// with `ec` (inline, as asio::dispatch would).
  virtual void complete(std::error_code ec) = 0;
  /// From any thread: posts complete(ec) to the handler's executor. When that is an io_context's,
  /// the post (the function and Asio's operation around it) is allocated with operator new, not
  /// Asio's per-thread cache: posted from a thread Asio does not run (a host function's), it would
  /// be freed into the io thread's cache and crowd out the blocks that thread's own operations
  /// reuse (one malloc per request on the io thread, seen in the allocation test).
  virtual void post_complete(std::error_code ec) = 0;
  /// Frees the operation and destroys the handler without running it (teardown only: a pending
  /// wait whose io_context will not run again).
  virtual void destroy() noexcept = 0;

 protected:
  ~wait_op() = default;
};

template <typename Handler>
class wait_op_for final : public wait_op {
 public:
  using allocator_type = op_allocator_t<Handler, wait_op_for>;

  explicit wait_op_for(Handler&& h)
      : handler_(std::move(h)), work_(asio::get_associated_executor(handler_)) {}

  void complete(std::error_code ec) override {
    allocator_type alloc = op_allocator<wait_op_for>(handler_);
    Handler h = std::move(handler_);
    auto work = std::move(work_);  // released after the handler: run() keeps going meanwhile
    free(alloc);
    std::move(h)(ec);
  }
  void post_complete(std::error_code ec) override {
    // The work moves into this frame: once posted, `this` may be completed and freed by the io
    // thread at any time, and the io_context must outlive the post itself (its run() cannot
    // return, nor the context be destroyed, before this guard goes). The queued call is work too.
    auto work = std::move(work_);
    const executor_type ex = work.get_executor();
    auto call = asio::bind_allocator(heap_allocator<void>(), [this, ec] { complete(ec); });
    if constexpr (std::is_same_v<executor_type, asio::any_io_executor>) {
      // The allocator reaches Asio's operation only through the io_context's own executor type
      // (any_io_executor drops it).
      if (const auto* io = ex.template target<asio::io_context::executor_type>()) {
        asio::post(*io, std::move(call));
        return;
      }
    }
    asio::post(ex, std::move(call));
  }
  void destroy() noexcept override { free(op_allocator<wait_op_for>(handler_)); }

 private:
  void free(allocator_type alloc) noexcept {
    this->~wait_op_for();
    std::allocator_traits<allocator_type>::deallocate(alloc, this, 1);
  }

  using executor_type = asio::associated_executor_t<Handler>;
  Handler handler_;
  asio::executor_work_guard<executor_type> work_;
};

template <typename Handler>
wait_op* wait_op::create(Handler handler) {
  using op = wait_op_for<Handler>;
  typename op::allocator_type alloc = op_allocator<op>(handler);
  op* p = std::allocator_traits<typename op::allocator_type>::allocate(alloc, 1);
  return new (p) op(std::move(handler));
}
