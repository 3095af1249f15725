// evr/pool/event_registry.hpp — pooled events named by integer ids, for language bindings (the
// shape of PyTorch's MPS event pool: acquireEvent → id, recordEvent(id), waitForEvent(id),
// queryEvent(id), synchronizeEvent(id), elapsedTime(start_id, end_id), releaseEvent(id)).
//
// An id is 64 bits: a slot index (low 32) and the slot's generation (high 32, never 0, so no valid
// id is 0). Releasing an id bumps its slot's generation before the slot is reused, so a stale id
// (already released, or from an earlier user of the slot) is refused with errc::unknown_event_id,
// as is an id that was never issued. Misuse never crashes and never touches another id's event.
// (The generation wraps after 2^32 reuses of one slot; an id held across that many reuses of its
// own slot could be taken for the new one.)
//
// Errors: every operation has a throwing overload (evr::error; what() names the call and the id,
// e.g. "evr::event_registry::release(id 0x100000003): unknown event id (never issued, or already
// released)") and an error_code overload that never throws.
//
// Thread safety: every member is thread-safe, and one id may be used by several threads at once.
// Each operation holds the id's event for its own duration (a use count in the slot), so an id
// released while another thread is, say, synchronizing on it stays valid for that call; the event
// goes back to its pool when the last such call returns, and every call that starts after the
// release fails with unknown_event_id. The hot paths (acquire, release, the per-id operations) are
// lock-free apart from the pool's growth and the backend's own calls: slots live in chunks that are
// never moved or freed while the registry lives, each with one atomic state word; free slots are
// recycled through a moodycamel queue.
//
// Lifetime: the registry's destructor returns the events of ids still live to their pools. The
// pool_set (owned, or borrowed and then required to outlive the registry) and its backend must
// outlive it. The destructor must not run concurrently with any other member.
#pragma once

#include <cstdint>
#include <memory>
#include <system_error>

#include <evr/device/backend.hpp>
#include <evr/pool/event_pool.hpp>
#include <evr/pool/pool_set.hpp>

namespace evr {

/// Pooled events named by integer ids, for language bindings: stale or unknown ids are refused
/// with errc::unknown_event_id, never a crash. Thread safety: every member is thread-safe (not the
/// destructor); one id may be used by several threads at once. Lifetime: its pool_set and backend
/// must outlive it; the destructor returns live ids' events. Errors: evr::error, or
/// std::error_code with the non-throwing overloads. See the file comment.
class event_registry {
 public:
  using id_type = std::uint64_t;  ///< slot index (low 32 bits) and generation (high 32)
  /// Never issued: acquire's error_code overload returns it on failure.
  static constexpr id_type invalid_id = 0;
  /// Ids live at once, at most (slots are recycled; acquire fails beyond).
  static constexpr std::uint64_t max_live_ids = std::uint64_t{1} << 22;

  /// A registry with its own pool_set over `backend`.
  explicit event_registry(device::backend& backend, pool_options options = {});
  /// A registry taking events from `pools`, which must outlive it.
  explicit event_registry(pool_set& pools);
  ~event_registry();
  event_registry(const event_registry&) = delete;
  event_registry& operator=(const event_registry&) = delete;

  // --- throwing (evr::error, what() names the call and the id) --------------------------------
  /// An event of `device` and `klass` from the pool, under a new id.
  id_type acquire(int device, event_class klass = event_class::plain);
  /// Gives the id's event back to its pool (once every call using it returned). The id is dead.
  void release(id_type id);
  /// Records the event on `stream` (which must belong to the event's device).
  void record(id_type id, device::native_stream stream);
  /// Makes later work on `stream` wait for the event (cudaStreamWaitEvent). A never-recorded
  /// event makes the stream wait for nothing, as in CUDA.
  void wait(id_type id, device::native_stream stream);
  /// true when the recorded work is complete (or the event was never recorded), false if pending.
  bool query(id_type id);
  /// Blocks until the recorded work is complete.
  void synchronize(id_type id);
  /// Milliseconds from `start` to `end`. Both must be of class timing (errc::timing_disabled
  /// otherwise), recorded (errc::event_never_recorded) and complete (cuda not ready otherwise).
  float elapsed_time(id_type start, id_type end);
  /// The id's native event, for handing to code that takes a cudaEvent_t. The registry gives no
  /// protection to this handle: it is valid until the id is released.
  device::native_event native(id_type id);

  // --- error_code overloads: never throw ------------------------------------------------------
  id_type acquire(int device, event_class klass,
                  std::error_code& ec) noexcept;           ///< invalid_id on failure
  void release(id_type id, std::error_code& ec) noexcept;  ///< release(id), errors in `ec`
  /// record(id, stream), errors in `ec`.
  void record(id_type id, device::native_stream stream, std::error_code& ec) noexcept;
  /// wait(id, stream), errors in `ec`.
  void wait(id_type id, device::native_stream stream, std::error_code& ec) noexcept;
  /// false and `ec` set on failure; `ec` stays clear when the work is merely pending.
  bool query(id_type id, std::error_code& ec) noexcept;
  void synchronize(id_type id, std::error_code& ec) noexcept;  ///< synchronize(id), errors in `ec`
  /// elapsed_time(start, end), errors in `ec` (0 then).
  float elapsed_time(id_type start, id_type end, std::error_code& ec) noexcept;
  /// native(id), errors in `ec` (nullptr then).
  device::native_event native(id_type id, std::error_code& ec) noexcept;

  /// The device and class of a live id; -1 / plain and `ec` set otherwise.
  int device_of(id_type id, std::error_code& ec) const noexcept;
  event_class class_of(id_type id, std::error_code& ec) const noexcept;  ///< see device_of

  /// The pools its events come from.
  pool_set& pools() noexcept { return pools_; }

 private:
  struct slot;
  struct impl;
  std::unique_ptr<pool_set> owned_pools_;
  pool_set& pools_;
  std::unique_ptr<impl> impl_;
};

}  // namespace evr
