// evr/device/stream.hpp — a move-only RAII stream, created by evr or wrapping a user's stream.
//
// Thread safety: distinct objects may be used concurrently; one object may be used concurrently
// for const members and enqueueing (as CUDA streams allow), but not moved/destroyed meanwhile.
#pragma once

#include <cstdint>
#include <system_error>

#include <evr/device/backend.hpp>

namespace evr {

class event;

/// A move-only RAII GPU stream: created by evr (owned, destroyed with the object) or wrapping a
/// user's stream (not owned). Errors: the throwing members throw evr::error, the std::error_code
/// overloads never throw. Thread safety: const members and enqueueing concurrently (as CUDA
/// streams allow), but not while the object is moved or destroyed. See the file comment.
class stream {
 public:
  /// An empty handle (no stream). Every operation on it fails with errc::empty_handle.
  stream() noexcept = default;
  /// Creates a non-blocking stream on `device` of `backend` with `priority` (lower is higher
  /// priority, as in CUDA). Throws evr::error on failure.
  stream(device::backend& backend, int device, int priority = 0);
  /// Wraps an existing stream without taking ownership (destroying the wrapper leaves it alive).
  static stream wrap(device::backend& backend, device::native_stream native) noexcept;
#if defined(EVR_WITH_CUDA)
  /// Wraps a user's cudaStream_t (CUDA backend), not owning it.
  static stream wrap(CUstream_st* native) { return wrap(device::cuda_backend(), native); }
#endif

  stream(stream&& other) noexcept;             ///< takes `other`'s stream; `other` becomes empty
  stream& operator=(stream&& other) noexcept;  ///< destroys the stream held before, if owned
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  ~stream();

  /// True unless empty. (The legacy default stream has a null native handle and is not empty.)
  explicit operator bool() const noexcept { return backend_ != nullptr; }
  device::native_stream native() const noexcept { return native_; }  ///< the native handle
  device::backend* backend() const noexcept { return backend_; }     ///< nullptr when empty
  bool owns() const noexcept { return owned_; }  ///< true when destroying it destroys the stream
  /// Identity for maps and logs (the native handle's address).
  std::uintptr_t id() const noexcept { return reinterpret_cast<std::uintptr_t>(native_); }

  int device() const;    ///< throws evr::error
  int priority() const;  ///< throws evr::error
  /// true when all work enqueued so far is done; false when pending; throws on device error.
  bool query() const;
  void synchronize() const;                     ///< throws evr::error
  void wait_event(const event& e) const;        ///< later work waits for `e` (throws)
  void wait_stream(const stream& other) const;  ///< later work waits for other's work so far

  // error_code overloads: never throw.
  std::error_code query(std::error_code& ec) const noexcept;  ///< returns {} / not_ready / error
  void synchronize(std::error_code& ec) const noexcept;       ///< synchronize(), errors in `ec`

  /// Releases ownership and returns the native handle.
  device::native_stream release() noexcept;

 private:
  stream(device::backend* b, device::native_stream n, bool owned) noexcept
      : backend_(b), native_(n), owned_(owned) {}
  void reset() noexcept;
  device::backend* backend_ = nullptr;
  device::native_stream native_ = nullptr;
  bool owned_ = false;
};

}  // namespace evr
