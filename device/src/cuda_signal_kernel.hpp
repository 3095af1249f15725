// evr's own signal kernel on the CUDA backend: a one-thread kernel that does what evr::signal does
// (device/include/evr/device/signal.cuh), for work whose kernels cannot call it. Internal to the
// CUDA backend (cuda_backend.cpp's enqueue_signal).
#pragma once

#include <cuda_runtime_api.h>

#include <system_error>

#include <evr/device/signal_ref.h>

namespace evr::device::cuda_signal {

/// Loads the kernel into `device`'s primary context, once per device (later calls return the
/// first one's result, unless it failed for a reason that may pass, out of memory say). The
/// caller has bound `device`'s primary context (cudaSetDevice). Loading is a driver call that
/// must not run during a global-mode stream capture: the backend loads it when it makes a
/// device's signal slots, before any capture can name them.
std::error_code load(int device) noexcept;

/// Queues the kernel on `stream` (of `device`, which the caller has made current) with `s`:
/// loads it first if load() was never called for `device`. Allowed while `stream` is captured.
std::error_code launch(int device, cudaStream_t stream, const signal_ref& s) noexcept;

}  // namespace evr::device::cuda_signal
