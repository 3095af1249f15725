// pool/src/event_queue.hpp (private) — the queue behind event_pool's cache and event_registry's
// free slots.
//
// Default: moodycamel::ConcurrentQueue. With a producer token a thread enqueues into its own
// sub-queue; pop(own, consumer, v) first takes from that sub-queue (no cache line shared with other
// threads when a thread acquires what it released) and then from any other (a consumer token
// sticks to a sub-queue that had items, so a thread fed by another, e.g. by the reactor, keeps
// finding them cheaply). Tokenless push/pop work from any thread (an implicit per-thread producer).
//
// EVR_POOL_USE_MUTEX: the same interface over a mutex-guarded std::deque (FIFO), for bisecting a
// suspected lock-free bug (STYLE.md, habit 5). Tokens are then empty.
//
// Memory order: in both variants a push happens-before the pop that takes the same item (moodycamel
// publishes items with release stores and reads them after acquire loads; the mutex does the same).
// Neither variant gives "pop fails only if empty" under concurrency: a pop racing with other pops
// may fail while items remain (moodycamel: "likely but not guaranteed to be empty"). Callers treat
// a failed pop as "probably empty".
//
// Thread safety: every member is thread-safe; a producer token must be used by one thread at a
// time, and destroyed before its queue.
#pragma once

#include <cstddef>

#if defined(EVR_POOL_USE_MUTEX)
#include <deque>
#include <mutex>
#include <new>
#else
#include <concurrentqueue/concurrentqueue.h>
#endif

namespace evr::pool_detail {

#if !defined(EVR_POOL_USE_MUTEX)

inline constexpr bool queue_is_lock_free = true;

template <class T>
class queue {
 public:
  using producer_token = moodycamel::ProducerToken;
  using consumer_token = moodycamel::ConsumerToken;

  explicit queue(std::size_t capacity = 0) : q_(capacity) {}

  /// Tokenless enqueue (an implicit producer for the calling thread). False when out of memory.
  bool push(const T& v) noexcept { return q_.enqueue(v); }
  /// Enqueue into the token's sub-queue. False when out of memory.
  bool push(producer_token& own, const T& v) noexcept { return q_.enqueue(own, v); }
  bool push_bulk(producer_token& own, const T* v, std::size_t n) noexcept {
    return q_.enqueue_bulk(own, v, n);
  }
  bool push_bulk(const T* v, std::size_t n) noexcept { return q_.enqueue_bulk(v, n); }
  /// Tokenless dequeue from any sub-queue.
  bool pop(T& v) noexcept { return q_.try_dequeue(v); }
  /// From the caller's own sub-queue first, then from any other.
  bool pop(producer_token& own, consumer_token& any, T& v) noexcept {
    return q_.try_dequeue_from_producer(own, v) || q_.try_dequeue(any, v);
  }
  /// Exact only when the queue is quiescent.
  std::size_t size_approx() const noexcept { return q_.size_approx(); }
  /// What a producer / consumer token is constructed from (the moodycamel queue itself).
  moodycamel::ConcurrentQueue<T>& token_source() noexcept { return q_; }
  /// A token can fail to be created when out of memory.
  static bool valid(const producer_token& t) noexcept { return t.valid(); }

 private:
  moodycamel::ConcurrentQueue<T> q_;
};

#else  // EVR_POOL_USE_MUTEX

inline constexpr bool queue_is_lock_free = false;

template <class T>
class queue {
 public:
  struct producer_token {
    explicit producer_token(queue&) noexcept {}
  };
  struct consumer_token {
    explicit consumer_token(queue&) noexcept {}
  };

  explicit queue(std::size_t = 0) {}

  bool push(const T& v) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      items_.push_back(v);
    } catch (const std::bad_alloc&) {
      return false;
    }
    return true;
  }
  bool push(producer_token&, const T& v) noexcept { return push(v); }
  bool push_bulk(const T* v, std::size_t n) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      items_.insert(items_.end(), v, v + n);
    } catch (const std::bad_alloc&) {
      return false;
    }
    return true;
  }
  bool push_bulk(producer_token&, const T* v, std::size_t n) noexcept { return push_bulk(v, n); }
  bool pop(T& v) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    if (items_.empty()) return false;
    v = items_.front();
    items_.pop_front();
    return true;
  }
  bool pop(producer_token&, consumer_token&, T& v) noexcept { return pop(v); }
  queue& token_source() noexcept { return *this; }
  std::size_t size_approx() const noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    return items_.size();
  }
  static bool valid(const producer_token&) noexcept { return true; }

 private:
  mutable std::mutex mutex_;
  std::deque<T> items_;
};

#endif

}  // namespace evr::pool_detail
