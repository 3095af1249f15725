// cuda_devices.hpp: cuDevicePrimaryCtxGetState, fetched at run time (nothing linked).
#if defined(EVR_WITH_CUDA)

#include "cuda_devices.hpp"

#include <cuda.h>  // driver types only: never linked
#include <cuda_runtime_api.h>

#include <new>

#include "cuda_runtime.hpp"
#include "driver_entry.hpp"

namespace evr::device::cuda_devices {
namespace {

using device_get_fn = CUresult(CUDAAPI*)(CUdevice*, int);
using primary_state_fn = CUresult(CUDAAPI*)(CUdevice, unsigned*, int*);

struct driver_calls {
  device_get_fn device_get = nullptr;
  primary_state_fn primary_state = nullptr;
};

const driver_calls& driver() noexcept {
  static const driver_calls calls = [] {
    driver_calls c;
    if (detail::fetch_driver_entry("cuDeviceGet", c.device_get) ||
        detail::fetch_driver_entry("cuDevicePrimaryCtxGetState", c.primary_state))
      c = {};
    return c;
  }();
  return calls;
}

bool primary_context_active(const driver_calls& d, int index) noexcept {
  CUdevice device = 0;
  unsigned flags = 0;
  int active = 0;
  return d.device_get(&device, index) == CUDA_SUCCESS &&
         d.primary_state(device, &flags, &active) == CUDA_SUCCESS && active != 0;
}

}  // namespace

std::vector<int> in_use() noexcept {
  int count = 0;
  if (detail::check(cudaGetDeviceCount(&count))) return {};
  const driver_calls& d = driver();
  if (d.primary_state == nullptr) return {};
  std::vector<int> out;
  try {
    for (int i = 0; i < count; ++i)
      if (primary_context_active(d, i)) out.push_back(i);
  } catch (const std::bad_alloc&) {  // no room for a few ints: report none rather than throw
    return {};
  }
  return out;
}

}  // namespace evr::device::cuda_devices

#endif  // EVR_WITH_CUDA
