// evr/pool/event_pool.hpp — events of one device and one class, recycled through a lock-free
// queue (moodycamel::ConcurrentQueue) instead of a mutex-guarded deque.
//
// * acquire() takes a cached event or, when none is cached, creates a batch of `batch` events on
//   the calling thread (growth is serialized by a mutex that only growing threads touch); the
//   reactor thread never creates or destroys events.
// * release returns the event to the cache. Contract: the caller returns an event only when the GPU
//   is known to be past every record of it that anyone still observes (the reactor does so only
//   after the event's last record completed); re-recording a pooled event overwrites it.
// * Lifetime: the pool's state is shared by the pool object and by every event handed out. An
//   event released after the event_pool object was destroyed is destroyed instead of cached, and
//   the state is freed with the last of them. Releasing on any thread is fine, including after
//   the acquiring thread exited (the event is then cached as usual).
//
// Thread safety: every member is thread-safe. acquire/release never block unless a batch must be
// created or the calling thread uses the pool for the first time (it then registers itself under a
// process-wide mutex). Memory order: the queue gives release/acquire between release() and the next
// acquire() of the same event, so whatever the releasing thread did with the event happens-before
// its reuse.
//
// How it stays fast (pool/src/event_pool.cpp has the details): every thread that uses a pool gets
// a small per-thread record for it: a one-event cache (the "spare"), a moodycamel producer token
// and consumer token, and its own counters. A thread releases into its spare, else into its own
// sub-queue, and acquires from them first, so a thread that acquires and releases touches no cache
// line another thread writes; an event in a thread's spare is taken by others only when they would
// otherwise grow, and by empty_cache(). The counters behind stats() and behind the lifetime rule
// are per thread and summed on demand. Consequences:
//   * stats() walks those records under a process-wide mutex: call it for monitoring, not per
//   event.
//   * peak_in_use is sampled (at growth, empty_cache() and stats()), not tracked per acquire.
//   * Cached events are not handed out in FIFO order.
//   * The backend must outlive every pool and every event taken from one.
// Bisecting: compile pool/ with -DEVR_POOL_USE_MUTEX to replace the lock-free queue by a
// mutex-guarded std::deque (the rest is unchanged).
#pragma once

#include <cstddef>
#include <cstdint>
#include <system_error>

#include <evr/device/backend.hpp>

namespace evr {

namespace pool_detail {
struct pool_state;  // the shared state of one event_pool (pool/src/event_pool.cpp)
}  // namespace pool_detail

/// The four kinds of events that never mix in one pool (their creation flags differ).
enum class event_class : unsigned char {
  plain = 0,         ///< no timing, spin synchronize: what the reactor uses
  timing = 1,        ///< timing enabled (elapsed_time)
  interprocess = 2,  ///< interprocess | no timing
  blocking = 3,      ///< blocking-sync | no timing
};
inline constexpr int event_class_count = 4;  ///< the number of event_class values
/// The creation flags of a class: plain none, timing timing, interprocess interprocess,
/// blocking blocking_sync.
device::event_flags flags_of(event_class c) noexcept;
/// "plain", "timing", "interprocess", "blocking" ("invalid" for a value out of range).
const char* to_string(event_class c) noexcept;

/// How an event_pool grows.
struct pool_options {
  std::size_t initial = 0;  ///< events created by the constructor (on the constructing thread)
  std::size_t batch = 32;   ///< events created at once when the cache runs dry (>= 1)
};

/// A snapshot; fields are read without a common lock, so they are consistent only when the pool
/// is quiescent. When it is, created == destroyed + cached + in_use.
struct pool_stats {
  std::uint64_t created = 0;    ///< events ever created by this pool
  std::uint64_t destroyed = 0;  ///< events destroyed (empty_cache, release after owner gone, dtor)
  std::uint64_t cached = 0;     ///< events waiting in the cache (approximate under concurrency)
  std::uint64_t in_use = 0;     ///< events handed out and not yet released
  /// High-water mark of in_use, sampled when the cache runs dry (growth), at empty_cache() and at
  /// stats(): never above the true peak, and below it by less than `batch` when quiescent.
  std::uint64_t peak_in_use = 0;
  std::uint64_t acquires = 0;  ///< successful acquires
  std::uint64_t growths = 0;   ///< times a batch was created because the cache was empty
};

class event_pool;

/// A move-only handle to an event taken from a pool; returns it on destruction or release().
class pooled_event {
 public:
  pooled_event() noexcept = default;
  pooled_event(pooled_event&& other) noexcept;  ///< takes `other`'s event; `other` is empty
  pooled_event& operator=(pooled_event&& other) noexcept;  ///< releases the event held before
  pooled_event(const pooled_event&) = delete;
  pooled_event& operator=(const pooled_event&) = delete;
  ~pooled_event();

  explicit operator bool() const noexcept { return native_ != nullptr; }  ///< holds an event
  device::native_event native() const noexcept { return native_; }        ///< nullptr when empty
  /// The pool's device and class; -1 and plain for an empty handle.
  int device() const noexcept;
  event_class klass() const noexcept;  ///< see device()
  /// Returns the event to its pool now (see the pool's contract). Idempotent. Thread-safe with
  /// respect to other handles; one handle must not be used by two threads at once.
  void release() noexcept;

 private:
  friend class event_pool;
  pooled_event(pool_detail::pool_state* state, device::native_event native) noexcept
      : state_(state), native_(native) {}
  pool_detail::pool_state* state_ = nullptr;  // keeps the pool's state alive while non-empty
  device::native_event native_ = nullptr;
};

/// The events of one device and one event_class, recycled without locks. Thread safety: every
/// member is thread-safe. Lifetime: events handed out may outlive the pool (they are destroyed
/// when released then); the backend must outlive both. Errors: evr::error, or std::error_code
/// with the non-throwing overloads. Contract and costs: see the file comment.
class event_pool {
 public:
  /// Creates options.initial events at once. Throws evr::error: errc::invalid_argument for
  /// batch == 0 or a class out of range, or the backend's error when an initial event cannot be
  /// created.
  event_pool(device::backend& backend, int device, event_class klass, pool_options options = {});
  ~event_pool();  ///< destroys the cached events; events still out are destroyed when released
  event_pool(const event_pool&) = delete;
  event_pool& operator=(const event_pool&) = delete;

  /// Throws evr::error when an event cannot be created. When growth creates fewer than `batch`
  /// events because the backend failed part-way, acquire still succeeds with one of them.
  pooled_event acquire();
  /// Never throws: an empty handle and `ec` set on failure.
  pooled_event acquire(std::error_code& ec) noexcept;

  /// Raw interface for evr's own machinery (the reactor): the same accounting as pooled_event.
  /// nullptr and `ec` set on failure. Every event acquired must be given back exactly once,
  /// through release_native or discard_native of this pool object (which must still exist then).
  device::native_event acquire_native(std::error_code& ec) noexcept;
  void release_native(device::native_event event) noexcept;  ///< gives back an acquire_native event
  /// Destroys an acquired event instead of caching it (accounted as released): for an event the
  /// GPU may never get past (aborted at shutdown, or of a faulted device). CUDA frees a recorded
  /// event once it completes.
  void discard_native(device::native_event event) noexcept;

  /// Destroys every cached event (not those in use). Call from a thread that may block. Events
  /// released concurrently may stay cached.
  void empty_cache() noexcept;
  /// Walks every thread's counters under a process-wide mutex (see the file comment).
  pool_stats stats() const noexcept;

  int device() const noexcept;                ///< the device its events belong to
  event_class klass() const noexcept;         ///< the class of its events
  device::backend& backend() const noexcept;  ///< the backend that creates them

 private:
  pool_detail::pool_state* state_;
};

}  // namespace evr
