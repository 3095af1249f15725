// probe_cuda(): the CUDA backend's readiness on this machine, in words a user can act on.
#include <evr/device/cuda_status.hpp>
#include <evr/device/error.hpp>

#if defined(EVR_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace evr::device {

std::string cuda_version_text(int version) {
  if (version <= 0) return "none";
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

#if defined(EVR_WITH_CUDA)
namespace {

/// The oldest Linux driver branch that supports a CUDA major (NVIDIA's compatibility table).
std::string driver_branch_for(int runtime_version) {
  switch (runtime_version / 1000) {
    case 12: return " (Linux driver r525 or newer)";
    case 13: return " (Linux driver r580 or newer)";
    default: return "";
  }
}

std::string needs(int runtime_version) {
  return "evr's CUDA backend was built with CUDA " + cuda_version_text(runtime_version) +
         " and needs a driver for CUDA " + std::to_string(runtime_version / 1000) + ".0 or newer" +
         driver_branch_for(runtime_version);
}

/// Clears the runtime's last-error state after a failed call (as the backend does).
int value_of(cudaError_t status) {
  if (status != cudaSuccess) (void)cudaGetLastError();
  return static_cast<int>(status);
}

}  // namespace

cuda_status probe_cuda() {
  cuda_status s;
  s.compiled_in = true;
  s.runtime_version = CUDART_VERSION;
  // Without libcuda.so.1 the runtime reports driver version 0 (its documented answer).
  if (value_of(cudaDriverGetVersion(&s.driver_version)) != 0) s.driver_version = 0;
  if (s.driver_version == 0) {
    s.reason = "no NVIDIA driver was found (libcuda.so.1 could not be loaded); " +
               needs(s.runtime_version);
    return s;
  }
  if (s.driver_version / 1000 < s.runtime_version / 1000) {
    s.reason = "the NVIDIA driver supports CUDA " + cuda_version_text(s.driver_version) + ", but " +
               needs(s.runtime_version) + ": update the driver, or build evr with a CUDA " +
               std::to_string(s.driver_version / 1000) + " toolkit";
    return s;
  }
  int count = 0;
  if (const int err = value_of(cudaGetDeviceCount(&count)); err != 0) {
    s.reason = "the NVIDIA driver (CUDA " + cuda_version_text(s.driver_version) +
               ") reports: " + make_cuda_error(err).message();
    return s;
  }
  if (count <= 0) {
    s.reason = "the NVIDIA driver (CUDA " + cuda_version_text(s.driver_version) +
               ") reports no CUDA device";
    return s;
  }
  s.device_count = count;
  s.usable = true;
  return s;
}

#else  // !EVR_WITH_CUDA

cuda_status probe_cuda() {
  cuda_status s;
  s.reason =
      "this evr was built without the CUDA backend (no CUDA toolkit when it was built, or "
      "EVR_WITH_CUDA=OFF): only the simulated device is available";
  return s;
}

#endif  // EVR_WITH_CUDA

}  // namespace evr::device
