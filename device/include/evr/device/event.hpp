// evr/device/event.hpp — a move-only RAII event with lazy creation.
//
// The native event is created on the first record(), on the device of the recording stream; the
// event keeps that device and refuses (errc::device_mismatch) a later record on a stream of
// another device. Flags: timing (needed for elapsed_time), blocking_sync, interprocess (requires
// no timing: said at construction with errc::interprocess_requires_no_timing).
//
// Thread safety: distinct objects may be used concurrently. One object must not be recorded
// concurrently from two threads (as with CUDA's own events); const members may run concurrently.
#pragma once

#include <optional>
#include <system_error>

#include <evr/device/backend.hpp>

namespace evr {

class stream;

/// A move-only RAII GPU event, created lazily on its first record() on the recording stream's
/// device. Errors: the throwing members throw evr::error, the std::error_code overloads never
/// throw. Thread safety: distinct objects concurrently; one object not recorded from two threads
/// at once; const members concurrently. Lifetime: an owned native event is destroyed with the
/// object (CUDA defers the free while work still uses it). See the file comment.
class event {
 public:
  /// An empty handle. Operations on it fail with errc::empty_handle.
  event() noexcept = default;
  /// An event of `backend` with `flags`, created lazily on first record. Throws evr::error
  /// (errc::interprocess_requires_no_timing) for interprocess|timing.
  explicit event(device::backend& backend, device::event_flags flags = device::event_flags::none);
  /// Opens an event exported by another process (interprocess). Throws evr::error.
  static event open(device::backend& backend, const device::ipc_event_handle& handle, int device);
  /// Wraps a user's native event of `device` without owning it.
  static event wrap(device::backend& backend, device::native_event native, int device) noexcept;

  event(event&& other) noexcept;             ///< takes `other`'s event; `other` becomes empty
  event& operator=(event&& other) noexcept;  ///< destroys the event held before, if owned
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  ~event();

  /// false for an empty (default-constructed or moved-from) handle.
  explicit operator bool() const noexcept { return backend_ != nullptr; }

  /// Captures the work enqueued on `s` so far. Creates the native event on first use.
  void record(const stream& s);
  /// Records only if never recorded before; returns whether it recorded.
  bool record_once(const stream& s);
  /// Makes later work on `s` wait for this event (cudaStreamWaitEvent). Unrecorded: no-op.
  void block(const stream& s) const;
  /// true when complete (or never recorded, as in CUDA); false when pending; throws on error.
  bool query() const;
  /// Blocks until the event completes (cudaEventSynchronize); throws on error.
  void synchronize() const;
  /// Milliseconds between this event (start) and `end`. Both must be timing events, recorded,
  /// and complete; otherwise errc::timing_disabled / errc::event_never_recorded or the CUDA error.
  float elapsed_time(const event& end) const;
  /// Exports an interprocess event (must have been created with interprocess and recorded).
  device::ipc_event_handle ipc_handle() const;

  // error_code overloads: never throw.
  void record(const stream& s, std::error_code& ec) noexcept;  ///< record(), errors in `ec`
  std::error_code query(std::error_code& ec) const noexcept;   ///< {} / not_ready / error

  bool recorded() const noexcept { return recorded_; }          ///< true once recorded (or opened)
  bool created() const noexcept { return native_ != nullptr; }  ///< the native event exists
  device::native_event native() const noexcept { return native_; }  ///< nullptr before creation
  device::backend* backend() const noexcept { return backend_; }    ///< nullptr when empty
  device::event_flags flags() const noexcept { return flags_; }     ///< as constructed
  /// Device of the first recording stream; nullopt before the first record.
  std::optional<int> device() const noexcept;

  /// Releases ownership and returns the native handle.
  device::native_event release() noexcept;

 private:
  void reset() noexcept;
  device::backend* backend_ = nullptr;
  device::native_event native_ = nullptr;
  device::event_flags flags_ = device::event_flags::none;
  int device_ = -1;
  bool recorded_ = false;
  bool owned_ = true;
};

}  // namespace evr
