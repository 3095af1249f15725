// evr's own kernels on the CUDA backend, internal to it (cuda_backend.cpp, cuda_fences.cpp):
//   * the signal kernel: one thread does what evr::signal does (device/include/evr/device/
//     signal.cuh), for work whose kernels cannot call it (backend::enqueue_signal);
//   * the fence kernel: one thread, launched as a programmatic dependent launch, waits on the GPU
//     for the work before it (griddepcontrol.wait) and writes a fence word
//     (backend::write_fence_by_kernel). Behind a kernel its wait is not in the hardware queue,
//     which a stream memory write's is; it needs compute capability 9.0.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <system_error>

#include <evr/device/signal_ref.h>

namespace evr::device::cuda_kernels {

enum class kernel { signal, fence };

/// Loads `k` into `device`'s primary context, once per device and kernel (later calls return the
/// first one's result, unless it failed for a reason that may pass, out of memory say). The
/// caller has bound `device`'s primary context (cudaSetDevice). A load waits for the kernels
/// running on the device to end and holds up other threads' CUDA calls until then
/// (bench/studies/module_load.cu), and must not run during a global-mode stream capture: the
/// backend loads the signal kernel when it makes a device's signal slots, and the fence kernel
/// when asked (backend::load_fence_kernels: a reactor's constructor, reactor::prepare_device),
/// never on a waiting thread's path. The fence kernel's load fails with a CUDA error on a GPU
/// before compute capability 9.0.
std::error_code load(int device, kernel k) noexcept;

/// load(device, k) on a thread of its own, waited for: the caller's current device and context
/// stay as they were (a reactor's constructor calls it on the user's thread). Returns at once when
/// `k` is loaded on `device` already, and without a load errc::no_device for a device that does
/// not exist, errc::unsupported for the fence kernel on a GPU before compute capability 9.0. The
/// load runs in the default global capture mode: CUDA neither refuses it nor ends a global capture
/// on another thread (bench/studies/module_load.cu, "capture" cases).
std::error_code load_and_wait(int device, kernel k) noexcept;

/// Whether `k` was loaded on `device` (a load that failed or never ran: false). Any thread.
bool loaded(int device, kernel k) noexcept;

/// Queues the signal kernel on `stream` (of `device`, which the caller has made current) with
/// `s`: loads it first if it was never loaded on `device`. Allowed while `stream` is captured.
std::error_code launch_signal(int device, cudaStream_t stream, const signal_ref& s) noexcept;

/// Queues the fence kernel on `stream` (of `device`, which the caller has made current): it
/// writes `value` to `device_address` once the work before it on the stream is done and visible.
/// The kernel must have been loaded on `device` (errc::unsupported otherwise): this call runs on
/// the waiting thread's fast path and never loads.
std::error_code launch_fence(int device, cudaStream_t stream, std::uint64_t device_address,
                             std::uint64_t value) noexcept;

}  // namespace evr::device::cuda_kernels
