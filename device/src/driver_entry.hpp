// A driver function fetched at run time through the runtime (cudaGetDriverEntryPointByVersion),
// so that evr links no driver symbol and a program built with CUDA starts without a driver.
// Internal to the CUDA backend (cuda_fences.cpp, cuda_kernels.cpp, cuda_devices.cpp).
#pragma once
#if defined(EVR_WITH_CUDA)

#include <cuda_runtime_api.h>

#include <system_error>

#include <evr/device/cuda_status.hpp>
#include <evr/device/error.hpp>

namespace evr::device::detail {

/// Fetches `name` as of the CUDA 12.0 ABI into `out`: {} on success, the runtime's error (no
/// driver, say), or errc::unsupported when the driver lacks the symbol. Clears the runtime's
/// last error on failure. Thread-safe.
template <typename Fn>
std::error_code fetch_driver_entry(const char* name, Fn& out) noexcept {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e =
      cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return make_cuda_error(static_cast<int>(e));
  }
  if (found != cudaDriverEntryPointSuccess || fn == nullptr)
    return make_error_code(errc::unsupported);
  out = reinterpret_cast<Fn>(fn);
  return {};
}

}  // namespace evr::device::detail

#endif  // EVR_WITH_CUDA
