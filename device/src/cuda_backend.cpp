// The CUDA backend: evr::device::backend on the CUDA runtime API.
//
// Built by the host C++ compiler; nothing here needs nvcc. The backend's other files: fence words
// and signal slots (cuda_fences.cpp), evr's kernels (cuda_kernels.cpp), the devices in use
// (cuda_devices.cpp), the helpers they share (cuda_runtime.hpp). libcuda is never linked: the
// driver functions evr uses (cuStreamWriteValue64, evr's kernels' launches) are fetched at run
// time through the runtime's cudaGetDriverEntryPointByVersion, so a program built with CUDA still
// starts on a machine without a GPU driver; its calls then report the runtime's error
// (cudaErrorInsufficientDriver or cudaErrorNoDevice).
//
// Conventions of every function below:
//   * noexcept; failures are returned as make_cuda_error(value) (cuda_category(), value equal to
//     the cudaError_t) or as evr::errc for misuse found before calling CUDA;
//   * after any CUDA failure the runtime's last-error state is cleared (cudaGetLastError), so a
//     failure seen here never resurfaces in an unrelated cudaGetLastError/cudaPeekAtLastError of
//     the user. Sticky errors are not cleared by that (CUDA keeps them in the context).
//   * functions that take a device index make it current for the call and restore the caller's
//     current device afterwards (only when it differs: no context is touched needlessly).
//
// Thread safety: everything may be called from any thread concurrently (the runtime is
// thread-safe; the driver entry point is fetched once under a function-local static).
#include <evr/device/backend.hpp>
#include <evr/device/cuda_status.hpp>
#include <evr/device/error.hpp>

#include <string>

#if defined(EVR_WITH_CUDA)

#include <cuda_runtime_api.h>

#include "cuda_devices.hpp"
#include "cuda_fences.hpp"
#include "cuda_kernels.hpp"
#include "cuda_runtime.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

namespace evr::device {
namespace {

static_assert(sizeof(cudaIpcEventHandle_t) == sizeof(ipc_event_handle),
              "ipc_event_handle must have the layout of cudaIpcEventHandle_t");

using detail::check;
using detail::cuda_event;
using detail::cuda_stream;
using detail::device_guard;

// --- host functions ------------------------------------------------------------------------

// in_host_func() must know whether the calling thread is inside one of our host functions. CUDA
// runs host functions on a driver thread that evr does not own, so the flag is set by a
// trampoline around the user's function. Cost: one small heap allocation per launch_host_func
// (the {fn, arg} pair, freed before the user's function runs) — tens of nanoseconds against the
// ~75 µs a host function takes to be called (CUDA-NOTES). After a device fault CUDA never calls
// host functions, so the pairs of host functions enqueued before the fault are leaked (16 bytes
// each); the device is unusable by then anyway.
thread_local bool t_in_host_func = false;

struct host_call {
  void (*fn)(void*);
  void* arg;
};

// noexcept: an exception escaping the user's function would unwind into the driver; this turns
// it into std::terminate instead of undefined behaviour.
void CUDART_CB host_trampoline(void* p) noexcept {
  const host_call call = *static_cast<host_call*>(p);
  delete static_cast<host_call*>(p);
  const bool outer = t_in_host_func;
  t_in_host_func = true;
  call.fn(call.arg);
  t_in_host_func = outer;
}

class cuda_backend_impl final : public backend {
 public:
  std::string_view name() const noexcept override { return "cuda"; }
  bool is_simulated() const noexcept override { return false; }

  std::string describe() const override {
    int runtime = 0, driver = 0;
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) (void)cudaGetLastError();
    if (cudaDriverGetVersion(&driver) != cudaSuccess) (void)cudaGetLastError();
    std::string text =
        "cuda: runtime " + cuda_version_text(runtime) + ", driver " + cuda_version_text(driver);
    int count = 0;
    if (auto ec = check(cudaGetDeviceCount(&count)); ec || count <= 0) {
      text += "; no usable device";
      if (ec) text += ": " + ec.message();
      return text;
    }
    text += "; " + std::to_string(count) + (count == 1 ? " device:" : " devices:");
    for (int d = 0; d < count; ++d) {
      cudaDeviceProp prop{};
      text += d == 0 ? " " : "; ";
      text += std::to_string(d) + ": ";
      if (auto ec = check(cudaGetDeviceProperties(&prop, d))) {
        // Appended piece by piece: "(" + message + ")" makes GCC 12 warn (-Wrestrict, a false
        // positive inside std::string's operator+).
        text.append("(").append(ec.message()).append(")");
        continue;
      }
      char buf[384];
      std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %d SMs, %.1f GiB, PCI %04x:%02x:%02x)",
                    prop.name, prop.major, prop.minor, prop.multiProcessorCount,
                    static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0),
                    static_cast<unsigned>(prop.pciDomainID), static_cast<unsigned>(prop.pciBusID),
                    static_cast<unsigned>(prop.pciDeviceID));
      text += buf;
    }
    return text;
  }

  std::error_code device_count(int& count) noexcept override {
    count = 0;
    int n = 0;
    if (auto ec = check(cudaGetDeviceCount(&n))) return ec;
    count = n;
    return {};
  }

  // --- events --------------------------------------------------------------------------------
  std::error_code create_event(int device, event_flags flags, native_event& out) noexcept override {
    out = nullptr;
    constexpr unsigned known = static_cast<unsigned>(
        event_flags::timing | event_flags::blocking_sync | event_flags::interprocess);
    if ((static_cast<unsigned>(flags) & ~known) != 0)
      return make_error_code(errc::invalid_argument);
    unsigned cuda_flags = 0;
    if (has_flag(flags, event_flags::interprocess)) {
      if (has_flag(flags, event_flags::timing)) {
        return make_error_code(errc::interprocess_requires_no_timing);
      }
      cuda_flags |= cudaEventInterprocess | cudaEventDisableTiming;
    } else if (!has_flag(flags, event_flags::timing)) {
      cuda_flags |= cudaEventDisableTiming;
    }
    if (has_flag(flags, event_flags::blocking_sync)) cuda_flags |= cudaEventBlockingSync;

    device_guard guard;
    if (auto ec = guard.enter(device)) return ec;
    cudaEvent_t event = nullptr;
    if (auto ec = check(cudaEventCreateWithFlags(&event, cuda_flags))) return ec;
    out = event;
    return {};
  }

  void destroy_event(native_event event) noexcept override {
    if (event != nullptr) (void)check(cudaEventDestroy(cuda_event(event)));
  }

  std::error_code record_event(native_event event, native_stream stream) noexcept override {
    return check(cudaEventRecord(cuda_event(event), cuda_stream(stream)));
  }

  std::error_code query_event(native_event event) noexcept override {
    // Not-ready is cleared from the last-error state too (as PyTorch does): a pending query must
    // leave nothing behind for the user's own error checks.
    return check(cudaEventQuery(cuda_event(event)));
  }

  std::error_code synchronize_event(native_event event) noexcept override {
    return check(cudaEventSynchronize(cuda_event(event)));
  }

  std::error_code elapsed_ms(native_event start, native_event end, float& ms) noexcept override {
    ms = 0.0f;
    float value = 0.0f;
    if (auto ec = check(cudaEventElapsedTime(&value, cuda_event(start), cuda_event(end))))
      return ec;
    ms = value;
    return {};
  }

  std::error_code export_event(native_event event, ipc_event_handle& out) noexcept override {
    cudaIpcEventHandle_t handle{};
    if (auto ec = check(cudaIpcGetEventHandle(&handle, cuda_event(event)))) return ec;
    std::memcpy(out.bytes, &handle, sizeof out.bytes);
    return {};
  }

  std::error_code import_event(const ipc_event_handle& handle,
                               native_event& out) noexcept override {
    out = nullptr;
    cudaIpcEventHandle_t h{};
    std::memcpy(&h, handle.bytes, sizeof h);
    cudaEvent_t event = nullptr;
    if (auto ec = check(cudaIpcOpenEventHandle(&event, h))) return ec;
    out = event;
    return {};
  }

  // --- streams -------------------------------------------------------------------------------
  std::error_code create_stream(int device, int priority, native_stream& out) noexcept override {
    out = nullptr;
    device_guard guard;
    if (auto ec = guard.enter(device)) return ec;
    cudaStream_t stream = nullptr;
    // CUDA clamps a priority outside [greatest, least] to the nearest valid one.
    if (auto ec = check(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, priority))) {
      return ec;
    }
    out = stream;
    return {};
  }

  void destroy_stream(native_stream stream) noexcept override {
    // A null handle is the legacy default stream: never destroyed.
    if (stream != nullptr) (void)check(cudaStreamDestroy(cuda_stream(stream)));
  }

  std::error_code stream_device(native_stream stream, int& device) noexcept override {
    int d = -1;
    if (auto ec = check(cudaStreamGetDevice(cuda_stream(stream), &d))) return ec;
    device = d;
    return {};
  }

  std::error_code stream_priority(native_stream stream, int& priority) noexcept override {
    int p = 0;
    if (auto ec = check(cudaStreamGetPriority(cuda_stream(stream), &p))) return ec;
    priority = p;
    return {};
  }

  std::error_code query_stream(native_stream stream) noexcept override {
    return check(cudaStreamQuery(cuda_stream(stream)));
  }

  std::error_code synchronize_stream(native_stream stream) noexcept override {
    return check(cudaStreamSynchronize(cuda_stream(stream)));
  }

  std::error_code stream_wait_event(native_stream stream, native_event event) noexcept override {
    return check(cudaStreamWaitEvent(cuda_stream(stream), cuda_event(event), cudaEventWaitDefault));
  }

  std::error_code launch_host_func(native_stream stream, void (*fn)(void*),
                                   void* arg) noexcept override {
    if (fn == nullptr) return make_error_code(errc::invalid_argument);
    auto* call = new (std::nothrow) host_call{fn, arg};
    if (call == nullptr) return std::make_error_code(std::errc::not_enough_memory);
    if (auto ec = check(cudaLaunchHostFunc(cuda_stream(stream), &host_trampoline, call))) {
      delete call;
      return ec;
    }
    return {};
  }

  std::size_t hardware_queues() const noexcept override {
    // The driver spreads streams over CUDA_DEVICE_MAX_CONNECTIONS hardware queues (8 unless the
    // process sets it, 1..32), read once when the context is created.
    static const std::size_t queues = [] {
      const char* env = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
      if (env == nullptr) return std::size_t{8};
      char* end = nullptr;
      const long v = std::strtol(env, &end, 10);
      if (end == env || v < 1) return std::size_t{8};
      return static_cast<std::size_t>(std::min(v, 32L));
    }();
    return queues;
  }

  bool stream_is_capturing(native_stream stream) noexcept override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaError_t r = cudaStreamIsCapturing(cuda_stream(stream), &status);
    if (r == cudaSuccess) return status != cudaStreamCaptureStatusNone;  // active or invalidated
    (void)cudaGetLastError();
    // The legacy default stream while another stream captures in global mode: enqueueing on it
    // would invalidate that capture, so it counts as capturing.
    return r == cudaErrorStreamCaptureImplicit;
  }

  // --- fences and signal slots (cuda_fences.cpp) -----------------------------------------------
  std::error_code allocate_fence_block(int device, std::size_t words,
                                       fence_block& out) noexcept override {
    return cuda_fences::allocate_fence_block(device, words, out);
  }

  void free_fence_block(fence_block& block) noexcept override {
    cuda_fences::free_fence_block(block);
  }

  std::error_code allocate_signal_block(int device, std::size_t slots,
                                        signal_block& out) noexcept override {
    return cuda_fences::allocate_signal_block(device, slots, out);
  }

  std::error_code enqueue_signal(int device, native_stream stream,
                                 const signal_ref& s) noexcept override {
    return cuda_fences::enqueue_signal(device, stream, s);
  }

  void free_signal_block(signal_block& block) noexcept override {
    cuda_fences::free_signal_block(block);
  }

  std::error_code write_fence(native_stream stream, std::uint64_t device_address,
                              std::uint64_t value) noexcept override {
    return cuda_fences::write_fence(stream, device_address, value);
  }

  std::error_code load_fence_kernels(int device) noexcept override {
    return cuda_kernels::load_and_wait(device, cuda_kernels::kernel::fence);
  }

  std::error_code load_signal_kernel(int device) noexcept override {
    return cuda_kernels::load_and_wait(device, cuda_kernels::kernel::signal);
  }

  std::vector<int> devices_in_use() noexcept override { return cuda_devices::in_use(); }

  bool fence_kernels(int device) noexcept override {
    return cuda_kernels::loaded(device, cuda_kernels::kernel::fence);
  }

  std::error_code write_fence_by_kernel(int device, native_stream stream,
                                        std::uint64_t device_address,
                                        std::uint64_t value) noexcept override {
    return cuda_fences::write_fence_by_kernel(device, stream, device_address, value);
  }

  // --- threads -------------------------------------------------------------------------------
  std::error_code set_current_device(int device) noexcept override {
    return check(cudaSetDevice(device));
  }

  std::error_code current_device(int& device) noexcept override {
    int d = 0;
    if (auto ec = check(cudaGetDevice(&d))) return ec;
    device = d;
    return {};
  }

  void prepare_polling_thread() noexcept override {
    // Relaxed: this thread's queries never invalidate a stream capture running on another thread
    // (under the default global mode they would: PyTorch #104555).
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    (void)check(cudaThreadExchangeStreamCaptureMode(&mode));
  }

  int begin_borrowed_polling() noexcept override {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if (check(cudaThreadExchangeStreamCaptureMode(&mode))) return -1;
    return static_cast<int>(mode);
  }

  void end_borrowed_polling(int previous_mode) noexcept override {
    if (previous_mode < 0) return;  // the switch failed: nothing to put back
    auto mode = static_cast<cudaStreamCaptureMode>(previous_mode);
    (void)check(cudaThreadExchangeStreamCaptureMode(&mode));
  }

  bool in_host_func() const noexcept override { return t_in_host_func; }
};

}  // namespace

bool cuda_compiled_in() noexcept { return true; }

backend& cuda_backend() {
  // Never destroyed: objects with static storage may still use it while the process exits.
  static auto* const instance = new cuda_backend_impl;
  return *instance;
}

bool cuda_device_available() noexcept {
  int count = 0;
  return !cuda_backend().device_count(count) && count > 0;
}

}  // namespace evr::device

#else  // !EVR_WITH_CUDA

namespace evr::device {

bool cuda_compiled_in() noexcept { return false; }

backend& cuda_backend() {
  throw evr::error(make_error_code(errc::unsupported),
                   "evr::device::cuda_backend(): evr was built without CUDA (EVR_WITH_CUDA is off; "
                   "reconfigure with -DEVR_WITH_CUDA=ON and the CUDA toolkit installed)");
}

bool cuda_device_available() noexcept { return false; }

}  // namespace evr::device

#endif  // EVR_WITH_CUDA
