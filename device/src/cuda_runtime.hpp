// Helpers the files of the CUDA backend use around the runtime API, internal to it
// (cuda_backend.cpp, cuda_fences.cpp, cuda_kernels.cpp, cuda_devices.cpp): a status mapped to an
// error_code, the handle casts, and a scope that makes a device current.
#pragma once
#if defined(EVR_WITH_CUDA)

#include <cuda_runtime_api.h>

#include <system_error>

#include <evr/device/backend.hpp>
#include <evr/device/cuda_status.hpp>

namespace evr::device::detail {

/// Maps a runtime status to an error_code and clears the thread's last-error state on failure,
/// so a failure seen by evr never resurfaces in the user's own cudaGetLastError. Sticky errors
/// stay (CUDA keeps them in the context).
inline std::error_code check(cudaError_t status) noexcept {
  if (status == cudaSuccess) return {};
  // "Not ready" is a status, not a failure: nothing to clear, and the reactor's polling loop
  // should not pay for a second runtime call per pending query.
  if (status == cudaErrorNotReady) return make_cuda_error(static_cast<int>(status));
  (void)cudaGetLastError();
  return make_cuda_error(static_cast<int>(status));
}

// native_stream and native_event are both void*: two names, not overloads.
inline cudaStream_t cuda_stream(native_stream s) noexcept { return static_cast<cudaStream_t>(s); }
inline cudaEvent_t cuda_event(native_event e) noexcept { return static_cast<cudaEvent_t>(e); }

/// Makes a device current for a scope and restores the caller's device when leaving it. Only
/// calls cudaSetDevice when the device differs from the current one (no context is touched
/// needlessly), unless forced. One thread; not copyable.
class device_guard {
 public:
  device_guard() = default;
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  ~device_guard() {
    if (previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
  }
  /// `force`: call cudaSetDevice even when `device` is already current (it also binds the
  /// device's primary context to the thread, which cudaGetDevice alone does not).
  std::error_code enter(int device, bool force = false) noexcept {
    int current = 0;
    if (auto ec = check(cudaGetDevice(&current))) return ec;
    if (current == device && !force) return {};
    if (auto ec = check(cudaSetDevice(device))) return ec;
    if (current != device) previous_ = current;
    return {};
  }

 private:
  int previous_ = -1;
};

}  // namespace evr::device::detail

#endif  // EVR_WITH_CUDA
