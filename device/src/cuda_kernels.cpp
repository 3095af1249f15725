// evr's own kernels (cuda_kernels.hpp): PTX text, compiled by the driver when a device first loads
// it, and launched through driver entry points fetched at run time. So the library needs no nvcc
// to build and nothing from the toolkit to run. The signal kernel's PTX targets sm_70: the driver
// compiles it for any GPU of compute capability 7.0 or later (an older GPU refuses the load with a
// CUDA error, which enqueue_signal returns). The fence kernel's targets sm_90 (griddepcontrol):
// on an older GPU its load fails and the reactor records events instead.
#if defined(EVR_WITH_CUDA)

#include "cuda_kernels.hpp"
#include "cuda_runtime.hpp"
#include "driver_entry.hpp"

#include <cuda.h>  // driver types only: never linked

#include <array>
#include <atomic>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>

#include <evr/device/error.hpp>

namespace evr::device::cuda_kernels {
namespace {

// What evr::signal(s) does, for one thread (the code nvcc makes of it, written out):
// the counter (s.counter, offset 0) gains one atomically, a system-wide fence makes what the
// work before wrote visible first, and the new count is stored to the host word (s.word, offset
// 16). signal_ref is three 8-byte pointers: the parameter is its 24 bytes.
constexpr char signal_ptx[] = R"ptx(
.version 7.0
.target sm_70
.address_size 64

.visible .entry evr_signal_kernel(.param .align 8 .b8 evr_signal_kernel_ref[24])
{
	.reg .b64 %rd<7>;
	ld.param.u64 %rd1, [evr_signal_kernel_ref];
	ld.param.u64 %rd2, [evr_signal_kernel_ref+16];
	cvta.to.global.u64 %rd3, %rd1;
	cvta.to.global.u64 %rd4, %rd2;
	atom.global.add.u64 %rd5, [%rd3], 1;
	add.s64 %rd6, %rd5, 1;
	membar.sys;
	st.volatile.global.u64 [%rd4], %rd6;
	ret;
}
)ptx";
static_assert(sizeof(signal_ref) == 24, "the kernel's parameter is signal_ref's 24 bytes");

// The fence kernel: griddepcontrol.wait returns once the grid this launch depends on (the kernel
// before it on the stream) has completed and its memory operations are visible; a system-wide
// fence, then the value is stored to the host word (a fence word: mapped host memory). Launched
// as a programmatic dependent launch, the kernel leaves the hardware queue before the work
// before it has ended, and waits on the GPU instead. Behind anything but a kernel (a copy, a host
// function) the launch is an ordinary one, held in the queue until that work is done, and
// griddepcontrol.wait returns at once.
constexpr char fence_ptx[] = R"ptx(
.version 7.8
.target sm_90
.address_size 64

.visible .entry evr_fence_kernel(.param .u64 evr_fence_kernel_word, .param .u64 evr_fence_kernel_value)
{
	.reg .b64 %rd<4>;
	ld.param.u64 %rd1, [evr_fence_kernel_word];
	ld.param.u64 %rd2, [evr_fence_kernel_value];
	griddepcontrol.wait;
	cvta.to.global.u64 %rd3, %rd1;
	membar.sys;
	st.volatile.global.u64 [%rd3], %rd2;
	ret;
}
)ptx";

struct kernel_source {
  const char* ptx;
  const char* name;
};
constexpr kernel_source sources[] = {{signal_ptx, "evr_signal_kernel"},
                                     {fence_ptx, "evr_fence_kernel"}};
constexpr std::size_t kernel_count = std::size(sources);

using module_load_data_fn = CUresult(CUDAAPI*)(CUmodule*, const void*);
using module_get_function_fn = CUresult(CUDAAPI*)(CUfunction*, CUmodule, const char*);
using launch_kernel_fn = CUresult(CUDAAPI*)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                                            unsigned, unsigned, unsigned, CUstream, void**, void**);
using launch_kernel_ex_fn = CUresult(CUDAAPI*)(const CUlaunchConfig*, CUfunction, void**, void**);

/// The driver functions, fetched once (function-local static); `error` says why one is missing.
struct driver_calls {
  module_load_data_fn module_load_data = nullptr;
  module_get_function_fn module_get_function = nullptr;
  launch_kernel_fn launch_kernel = nullptr;
  launch_kernel_ex_fn launch_kernel_ex = nullptr;  ///< null on a driver before 12.0
  std::error_code error;
};

const driver_calls& driver() noexcept {
  static const driver_calls calls = [] {
    driver_calls c;
    // 12000: each symbol's ABI as of CUDA 12.0 (unchanged since 4.0 for all but
    // cuLaunchKernelEx, which came with 11.8).
    using detail::fetch_driver_entry;
    c.error = fetch_driver_entry("cuModuleLoadData", c.module_load_data);
    if (!c.error) c.error = fetch_driver_entry("cuModuleGetFunction", c.module_get_function);
    if (!c.error) c.error = fetch_driver_entry("cuLaunchKernel", c.launch_kernel);
    if (!c.error && fetch_driver_entry("cuLaunchKernelEx", c.launch_kernel_ex))
      c.launch_kernel_ex = nullptr;
    return c;
  }();
  return calls;
}

/// The driver's CUresult as an error_code of cuda_category(): for what these calls return
/// (invalid value 1, invalid context 201, no binary for the GPU 209, invalid PTX 218, invalid
/// handle 400, capture errors 900-908) the driver's values equal the runtime's.
std::error_code driver_error(CUresult r) noexcept {
  return r == CUDA_SUCCESS ? std::error_code{} : make_cuda_error(static_cast<int>(r));
}

/// A load error that every later load would meet again: the driver cannot compile or run the
/// PTX on this GPU (invalid PTX 218, no binary for the GPU 209, JIT compiler missing 221, PTX
/// version unsupported 222, invalid image 200). Others (out of memory, say) are retried.
bool permanent(const std::error_code& ec) noexcept {
  switch (ec.value()) {
    case 200:
    case 209:
    case 218:
    case 221:
    case 222: return ec.category() == cuda_category();
    default: return false;
  }
}

constexpr int max_devices = 64;

/// Per kernel and device: the loaded function (published with release, read with acquire), the
/// first load's error, and a mutex that makes the loads happen once (one per kernel and device:
/// a load that waits for one device's kernels holds up no load on another).
struct device_kernels {
  using per_device_function = std::array<std::atomic<CUfunction>, max_devices>;
  std::array<per_device_function, kernel_count> function{};
  std::array<std::array<std::error_code, max_devices>, kernel_count> load_error{};
  std::array<std::array<bool, max_devices>, kernel_count> tried{};
  std::array<std::array<std::mutex, max_devices>, kernel_count> load_mutex;
};

device_kernels& kernels() noexcept {
  static device_kernels k;
  return k;
}

CUfunction function_of(int device, kernel k) noexcept {
  return kernels().function[static_cast<std::size_t>(k)][device].load(std::memory_order_acquire);
}

}  // namespace

std::error_code load(int device, kernel k) noexcept {
  if (device < 0 || device >= max_devices) return make_error_code(errc::invalid_argument);
  if (function_of(device, k) != nullptr) return {};
  const driver_calls& d = driver();
  if (d.error) return d.error;
  const auto i = static_cast<std::size_t>(k);
  if (k == kernel::fence && d.launch_kernel_ex == nullptr)
    return make_error_code(errc::unsupported);
  device_kernels& all = kernels();
  std::lock_guard lock(all.load_mutex[i][device]);
  if (all.tried[i][device]) return all.load_error[i][device];
  all.tried[i][device] = true;
  // The module stays loaded for the process: graphs captured with the kernel may outlive any
  // owner evr could give it.
  CUmodule module = nullptr;
  CUfunction function = nullptr;
  std::error_code ec = driver_error(d.module_load_data(&module, sources[i].ptx));
  if (!ec) ec = driver_error(d.module_get_function(&function, module, sources[i].name));
  if (ec && !permanent(ec)) {
    all.tried[i][device] = false;  // out of memory, say: the next load tries again
    return ec;
  }
  all.load_error[i][device] = ec;
  if (!ec) all.function[i][device].store(function, std::memory_order_release);
  return ec;
}

/// Why `k` cannot be loaded on `device` before any load is tried: no such device, or (the fence
/// kernel, griddepcontrol) a GPU before compute capability 9.0. Asks no context.
static std::error_code refused_before_loading(int device, kernel k) noexcept {
  int count = 0;
  if (auto ec = detail::check(cudaGetDeviceCount(&count))) return ec;
  if (device >= count || device >= max_devices) return make_error_code(errc::no_device);
  if (k != kernel::fence) return {};
  int major = 0;
  if (auto ec =
          detail::check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device)))
    return ec;
  return major < 9 ? make_error_code(errc::unsupported) : std::error_code{};
}

std::error_code load_and_wait(int device, kernel k) noexcept {
  if (device < 0 || device >= max_devices) return make_error_code(errc::no_device);
  if (function_of(device, k) != nullptr) return {};
  if (auto ec = refused_before_loading(device, k)) return ec;
  std::error_code ec;
  try {
    std::thread loader([&ec, device, k] {
      ec = detail::check(cudaSetDevice(device));
      if (!ec) ec = load(device, k);
    });
    loader.join();
  } catch (const std::system_error& e) {  // no thread: nothing loaded, said as the system's error
    return e.code();
  } catch (const std::bad_alloc&) {
    return std::make_error_code(std::errc::not_enough_memory);
  }
  return ec;
}

bool loaded(int device, kernel k) noexcept {
  return device >= 0 && device < max_devices && function_of(device, k) != nullptr;
}

std::error_code launch_signal(int device, cudaStream_t stream, const signal_ref& s) noexcept {
  if (auto ec = load(device, kernel::signal)) return ec;
  signal_ref arg = s;
  void* params[] = {&arg};
  return driver_error(driver().launch_kernel(function_of(device, kernel::signal), 1, 1, 1, 1, 1, 1,
                                             0, reinterpret_cast<CUstream>(stream), params,
                                             nullptr));
}

std::error_code launch_fence(int device, cudaStream_t stream, std::uint64_t device_address,
                             std::uint64_t value) noexcept {
  if (!loaded(device, kernel::fence)) return make_error_code(errc::unsupported);
  CUlaunchAttribute overlap{};
  overlap.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  overlap.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig config{};
  config.gridDimX = config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = config.blockDimY = config.blockDimZ = 1;
  config.hStream = reinterpret_cast<CUstream>(stream);
  config.attrs = &overlap;
  config.numAttrs = 1;
  unsigned long long word = device_address, v = value;
  void* params[] = {&word, &v};
  return driver_error(
      driver().launch_kernel_ex(&config, function_of(device, kernel::fence), params, nullptr));
}

}  // namespace evr::device::cuda_kernels

#endif  // EVR_WITH_CUDA
