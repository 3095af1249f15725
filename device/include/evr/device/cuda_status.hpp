// evr/device/cuda_status.hpp — whether the CUDA backend can run on this machine, and if not, why.
//
// evr links the CUDA runtime statically (EVR_CUDA_RUNTIME, the default "static"): a program or the
// Python module built with CUDA needs nothing from the toolkit where it runs, only the driver's
// libcuda.so.1, which the runtime loads on its first call. probe_cuda() makes that first call and
// turns its outcome into a sentence a user can act on: no driver, a driver too old for the
// runtime evr was built with (both versions named), or no device.
//
// Thread safety: probe_cuda() may be called from any thread at any time; it allocates (the
// message). It never throws for a missing driver or device: those are its answers.
#pragma once

#include <string>

namespace evr::device {

/// What probe_cuda() found. Versions are CUDA's integers: 1000 * major + 10 * minor (13000: 13.0).
struct cuda_status {
  bool compiled_in = false;  ///< the CUDA backend is part of this build (EVR_WITH_CUDA)
  bool usable = false;       ///< a driver new enough for the runtime, and at least one device
  int runtime_version = 0;   ///< the CUDA runtime evr was built with; 0 without the backend
  int driver_version = 0;    ///< the CUDA version the driver supports; 0: no driver was found
  int device_count = 0;      ///< devices the driver reports (0 unless usable)
  std::string reason;        ///< empty when usable; otherwise what is missing, naming versions
};

/// Asks the CUDA runtime (and through it the driver) whether the CUDA backend can run here.
cuda_status probe_cuda();

/// "13.0" for 13000; "none" for 0.
std::string cuda_version_text(int version);

}  // namespace evr::device
