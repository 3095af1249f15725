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
//   event released after the event_pool object was destroyed (or after its acquiring thread
//   exited) is destroyed instead of cached; the state is freed with the last of them.
//
// Thread safety: every member is thread-safe. acquire/release never block unless a batch must be
// created. Memory order: the queue gives release/acquire between release() and the next acquire()
// of the same event, so whatever the releasing thread did with the event happens-before its reuse.
#pragma once

#include <cstddef>
#include <cstdint>
#include <system_error>

#include <evr/device/backend.hpp>

namespace evr {

/// The four kinds of events that never mix in one pool (their creation flags differ).
enum class event_class : unsigned char {
  plain = 0,         ///< no timing, spin synchronize: what the reactor uses
  timing = 1,        ///< timing enabled (elapsed_time)
  interprocess = 2,  ///< interprocess | no timing
  blocking = 3,      ///< blocking-sync | no timing
};
inline constexpr int event_class_count = 4;
device::event_flags flags_of(event_class c) noexcept;
const char* to_string(event_class c) noexcept;

struct pool_options {
  std::size_t initial = 0;  ///< events created by the constructor (on the constructing thread)
  std::size_t batch = 32;   ///< events created at once when the cache runs dry (>= 1)
};

/// A snapshot; fields are read without a common lock, so they are consistent only when the pool
/// is quiescent.
struct pool_stats {
  std::uint64_t created = 0;    ///< events ever created by this pool
  std::uint64_t destroyed = 0;  ///< events destroyed (empty_cache, release after owner gone, dtor)
  std::uint64_t cached = 0;     ///< events waiting in the cache (approximate under concurrency)
  std::uint64_t in_use = 0;     ///< events handed out and not yet released
  std::uint64_t peak_in_use = 0;///< the most events handed out at once (high-water mark)
  std::uint64_t acquires = 0;   ///< successful acquires
  std::uint64_t growths = 0;    ///< times a batch was created because the cache was empty
};

class event_pool;

/// A move-only handle to an event taken from a pool; returns it on destruction or release().
class pooled_event {
 public:
  pooled_event() noexcept = default;
  pooled_event(pooled_event&& other) noexcept;
  pooled_event& operator=(pooled_event&& other) noexcept;  ///< releases the event held before
  pooled_event(const pooled_event&) = delete;
  pooled_event& operator=(const pooled_event&) = delete;
  ~pooled_event();

  explicit operator bool() const noexcept { return native_ != nullptr; }
  device::native_event native() const noexcept { return native_; }
  int device() const noexcept;
  event_class klass() const noexcept;
  /// Returns the event to its pool now (see the pool's contract). Idempotent.
  void release() noexcept;

 private:
  friend class event_pool;
  struct state_ref;
  pooled_event(void* state, device::native_event native) noexcept : state_(state), native_(native) {}
  void* state_ = nullptr;  // event_pool's shared state (pool/src/event_pool.cpp)
  device::native_event native_ = nullptr;
};

class event_pool {
 public:
  event_pool(device::backend& backend, int device, event_class klass, pool_options options = {});
  ~event_pool();  ///< destroys the cached events; events still out are destroyed when released
  event_pool(const event_pool&) = delete;
  event_pool& operator=(const event_pool&) = delete;

  /// Throws evr::error when an event cannot be created.
  pooled_event acquire();
  pooled_event acquire(std::error_code& ec) noexcept;

  /// Raw interface for evr's own machinery (the reactor): the same accounting as pooled_event.
  device::native_event acquire_native(std::error_code& ec) noexcept;
  void release_native(device::native_event event) noexcept;

  /// Destroys every cached event (not those in use). Call from a thread that may block.
  void empty_cache() noexcept;
  pool_stats stats() const noexcept;

  int device() const noexcept;
  event_class klass() const noexcept;
  device::backend& backend() const noexcept;

 private:
  struct state;
  state* state_;
};

}  // namespace evr
