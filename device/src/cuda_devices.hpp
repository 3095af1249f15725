// Which CUDA devices the process already uses, internal to the CUDA backend (cuda_backend.cpp):
// a reactor made now loads on them what its waits will need (backend::devices_in_use).
#pragma once

#include <vector>

namespace evr::device::cuda_devices {

/// The devices (runtime indices, in order) whose primary context is active: the process has
/// made CUDA calls there. Asking makes no context. Empty without a driver or a device, or when
/// the driver lacks the calls. Any thread.
std::vector<int> in_use() noexcept;

}  // namespace evr::device::cuda_devices
