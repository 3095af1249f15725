#include "index_pool.hpp"

#include <stdexcept>

index_pool::index_pool(std::size_t n) : size_(n), next_(new std::atomic<std::uint32_t>[n]) {
  if (n >= 0xffff) throw std::invalid_argument("index_pool: at most 65534 units");
  for (std::size_t i = n; i-- > 0;) push(static_cast<std::uint32_t>(i));  // 0 on top
}

index_pool::~index_pool() {
  std::lock_guard lock(mutex_);
  while (waiter* w = first_) {
    first_ = w->next;
    w->drop();
  }
  last_ = nullptr;
}

std::uint32_t index_pool::try_take() noexcept {
  std::uint64_t head = head_.load(std::memory_order_acquire);
  for (;;) {
    const std::uint32_t top = static_cast<std::uint32_t>(head & 0xffffffffu);
    if (top == 0) return none;
    const std::uint64_t below = next_[top - 1].load(std::memory_order_relaxed);
    const std::uint64_t tag = (head >> 32) + 1;
    if (head_.compare_exchange_weak(head, (tag << 32) | below, std::memory_order_seq_cst,
                                    std::memory_order_acquire)) {
      taken_.fetch_add(1, std::memory_order_relaxed);
      return top - 1;
    }
  }
}

void index_pool::push(std::uint32_t index) noexcept {
  std::uint64_t head = head_.load(std::memory_order_relaxed);
  for (;;) {
    next_[index].store(static_cast<std::uint32_t>(head & 0xffffffffu), std::memory_order_relaxed);
    const std::uint64_t next = (head & ~std::uint64_t{0xffffffffu}) | (index + 1);
    if (head_.compare_exchange_weak(head, next, std::memory_order_seq_cst,
                                    std::memory_order_relaxed))
      return;
  }
}

void index_pool::enqueue(waiter* w) {
  std::unique_lock lock(mutex_);
  // Announce the waiter before looking at the free list once more: a give_back() that pushed a
  // unit after our last look is either seen by this try_take or sees waiting_ != 0 (both
  // seq_cst), so no unit stays in the list while someone waits.
  waiting_.fetch_add(1, std::memory_order_seq_cst);
  if (const std::uint32_t i = try_take(); i != none) {
    waiting_.fetch_sub(1, std::memory_order_relaxed);
    lock.unlock();
    w->complete(i);
    return;
  }
  w->queued = true;
  w->prev = last_;
  w->next = nullptr;
  (last_ != nullptr ? last_->next : first_) = w;
  last_ = w;
}

void index_pool::unlink(waiter* w) noexcept {
  (w->prev != nullptr ? w->prev->next : first_) = w->next;
  (w->next != nullptr ? w->next->prev : last_) = w->prev;
  w->queued = false;
  waiting_.fetch_sub(1, std::memory_order_relaxed);
}

void index_pool::give_back(std::uint32_t index) noexcept {
  taken_.fetch_sub(1, std::memory_order_relaxed);
  push(index);
  if (waiting_.load(std::memory_order_seq_cst) == 0) return;
  // Someone waits: hand units from the free list to the oldest waiters.
  std::lock_guard lock(mutex_);
  while (waiter* w = first_) {
    const std::uint32_t got = try_take();
    if (got == none) break;
    unlink(w);
    w->complete(got);
  }
}

void index_pool::cancel(waiter* w) {
  {
    std::lock_guard lock(mutex_);
    if (!w->queued) return;  // a unit is on its way to it already
    unlink(w);
  }
  w->complete(cancelled);
}
