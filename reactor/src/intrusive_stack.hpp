// reactor/src/intrusive_stack.hpp — the lock-free multi-producer / single-consumer stack that
// carries operations from any thread to the reactor. The consumer is whoever holds the pass lock
// (the reactor thread, or a host's pass: pass_lock.hpp), one at a time.
//
// push is a CAS loop on the head (lock-free; no allocation: the link lives in the element). The
// consumer takes the whole stack with one exchange and reverses it, which restores push order.
// close() swaps in a sentinel so that every later push fails: how stop() refuses late
// submissions without a race between "is the reactor stopping?" and "push".
//
// Memory order: the successful CAS is seq_cst (it publishes the element, release, and takes part in
// the sleep/wake handshake with the reactor, see wakeup.hpp); the consumer's exchange is acquire
// (sees every field written before the push).
#pragma once

#include <atomic>
#include <cstdint>

namespace evr::detail {

template <typename T, T* T::*Next>
class intrusive_stack {
 public:
  enum class push_result { pushed_to_empty, pushed, closed };

  push_result push(T* element) noexcept {
    T* old = head_.load(std::memory_order_relaxed);
    do {
      if (old == closed_marker()) return push_result::closed;
      element->*Next = old;
    } while (!head_.compare_exchange_weak(old, element, std::memory_order_seq_cst,
                                          std::memory_order_relaxed));
    return old == nullptr ? push_result::pushed_to_empty : push_result::pushed;
  }

  /// Consumer only. Returns the elements in push order (oldest first), linked through Next. A
  /// closed stack stays closed (nothing to take).
  T* take_all() noexcept {
    // A plain load first: the reactor polls this every pass, and an empty stack should cost a
    // read of a shared line, not a locked read-modify-write.
    T* h = head_.load(std::memory_order_relaxed);
    if (h == nullptr || h == closed_marker()) return nullptr;
    return reverse(detach(nullptr));
  }
  /// Consumer only. Takes what is there and refuses every later push.
  T* close() noexcept { return reverse(detach(closed_marker())); }

  /// Calls `f(element)` for each element of a list that take_all() or close() returned, in that
  /// order, reading each link before the call (f may free the element or push it elsewhere).
  template <typename F>
  static void for_each(T* list, F&& f) {
    while (list != nullptr) {
      T* next = list->*Next;
      f(list);
      list = next;
    }
  }

  /// seq_cst: the reactor's last look before sleeping (see wakeup.hpp).
  bool empty_or_closed() const noexcept {
    T* h = head_.load(std::memory_order_seq_cst);
    return h == nullptr || h == closed_marker();
  }

 private:
  static T* closed_marker() noexcept { return reinterpret_cast<T*>(std::uintptr_t{1}); }
  T* detach(T* replacement) noexcept {
    T* h = head_.exchange(replacement, std::memory_order_acquire);
    return h == closed_marker() ? nullptr : h;
  }
  static T* reverse(T* h) noexcept {
    T* out = nullptr;
    while (h != nullptr) {
      T* next = h->*Next;
      h->*Next = out;
      out = h;
      h = next;
    }
    return out;
  }
  std::atomic<T*> head_{nullptr};
};

}  // namespace evr::detail
