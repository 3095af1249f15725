// The CUDA backend: evr::device::backend on the CUDA runtime API.
//
// Built by the host C++ compiler; nothing here needs nvcc. libcuda is never linked: the driver
// functions evr uses (cuStreamWriteValue64 here; evr's kernels' in cuda_kernels.cpp)
// are fetched at run time through the runtime's cudaGetDriverEntryPointByVersion, so a program
// built with CUDA still starts on a machine without a GPU driver; its calls then report the
// runtime's error (cudaErrorInsufficientDriver or cudaErrorNoDevice).
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

#include <cuda.h>  // driver types only (CUresult, CUstream, CUdeviceptr): never linked
#include <cuda_runtime_api.h>

#include "cuda_devices.hpp"
#include "cuda_kernels.hpp"
#include "driver_entry.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

namespace evr::device {
namespace {

static_assert(sizeof(cudaIpcEventHandle_t) == sizeof(ipc_event_handle),
              "ipc_event_handle must have the layout of cudaIpcEventHandle_t");
static_assert(fence_block::stride_words * sizeof(std::uint64_t) == 64);

/// Maps a runtime status to an error_code and clears the thread's last-error state on failure.
std::error_code check(cudaError_t status) noexcept {
  if (status == cudaSuccess) return {};
  // "Not ready" is a status, not a failure: nothing to clear, and the reactor's polling loop
  // should not pay for a second runtime call per pending query.
  if (status == cudaErrorNotReady) return make_cuda_error(static_cast<int>(status));
  (void)cudaGetLastError();
  return make_cuda_error(static_cast<int>(status));
}

// native_stream and native_event are both void*: two names, not overloads.
cudaStream_t cuda_stream(native_stream s) noexcept { return static_cast<cudaStream_t>(s); }
cudaEvent_t cuda_event(native_event e) noexcept { return static_cast<cudaEvent_t>(e); }

/// Makes a device current for a scope and restores the caller's device when leaving it. Only
/// calls cudaSetDevice when the device differs from the current one.
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

/// Zeroes `bytes` of device memory at `p` and waits for it, on a stream of its own that does not
/// synchronize with the legacy default stream: the caller does not wait for other work.
std::error_code zero_device_memory(void* p, std::size_t bytes) noexcept {
  cudaStream_t s = nullptr;
  if (auto ec = check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking))) return ec;
  std::error_code ec = check(cudaMemsetAsync(p, 0, bytes, s));
  if (!ec) ec = check(cudaStreamSynchronize(s));
  (void)check(cudaStreamDestroy(s));
  return ec;
}

// --- cuStreamWriteValue64, fetched from the driver at run time --------------------------------

// The signature of cuStreamWriteValue64 (as cuStreamWriteValue64_v2 in cuda.h since CUDA 12).
// Declared here with the driver's types so that no driver symbol is referenced at link time.
using write_value64_fn = CUresult(CUDAAPI*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);

struct write_value64_entry {
  write_value64_fn fn = nullptr;
  std::error_code error;  ///< why fn is null
};

/// Fetched once, on first use (thread-safe: function-local static). A failure is remembered:
/// the driver does not appear while the process runs.
const write_value64_entry& write_value64() noexcept {
  static const write_value64_entry entry = [] {
    write_value64_entry e;
    // The CUDA 12.0 ABI: the _v2 entry point (64-bit flag semantics unchanged).
    e.error = detail::fetch_driver_entry("cuStreamWriteValue64", e.fn);
    return e;
  }();
  return entry;
}

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

  // --- fences --------------------------------------------------------------------------------
  std::error_code allocate_fence_block(int device, std::size_t words,
                                       fence_block& out) noexcept override {
    out = fence_block{};
    constexpr std::size_t line = fence_block::stride_words * sizeof(std::uint64_t);
    if (words == 0 || words > std::numeric_limits<std::size_t>::max() / line) {
      return make_error_code(errc::invalid_argument);
    }
    const std::size_t bytes = words * line;

    device_guard guard;
    if (auto ec = guard.enter(device)) return ec;
    // Mapped (the device writes it), portable (every context may use it), and NOT write-combined:
    // the host reads these words, and WC memory is uncached for host reads.
    void* host = nullptr;
    if (auto ec = check(cudaHostAlloc(&host, bytes, cudaHostAllocMapped | cudaHostAllocPortable))) {
      return ec;
    }
    std::memset(host, 0, bytes);
    void* dev = nullptr;
    if (auto ec = check(cudaHostGetDevicePointer(&dev, host, 0))) {
      (void)check(cudaFreeHost(host));
      return ec;
    }
    out.host = static_cast<std::uint64_t*>(host);
    out.device_address = reinterpret_cast<std::uintptr_t>(dev);
    out.words = words;
    out.allocation = host;
    return {};
  }

  void free_fence_block(fence_block& block) noexcept override {
    if (block.allocation != nullptr) (void)check(cudaFreeHost(block.allocation));
    block = fence_block{};
  }

  std::error_code allocate_signal_block(int device, std::size_t slots,
                                        signal_block& out) noexcept override {
    out = signal_block{};
    fence_block words;  // the host words: mapped, not write-combined, one per line, zeroed
    if (auto ec = allocate_fence_block(device, slots, words)) return ec;
    device_guard guard;
    void* counters = nullptr;
    std::error_code ec = guard.enter(device);
    if (!ec) ec = check(cudaMalloc(&counters, slots * signal_block::counter_bytes));
    if (!ec) ec = zero_device_memory(counters, slots * signal_block::counter_bytes);
    if (ec) {
      if (counters != nullptr) (void)check(cudaFree(counters));
      free_fence_block(words);
      return ec;
    }
    // The signal kernel is loaded now, while no capture can name these slots yet (a load may
    // not run during a global-mode capture); a failure is reported by enqueue_signal.
    if (!guard.enter(device, /*force=*/true))
      (void)cuda_kernels::load(device, cuda_kernels::kernel::signal);
    out.host = words.host;
    out.device_words = words.device_address;
    out.device_counters = reinterpret_cast<std::uintptr_t>(counters);
    out.slots = slots;
    out.host_allocation = words.allocation;
    out.device_allocation = counters;
    return {};
  }

  std::error_code enqueue_signal(int device, native_stream stream,
                                 const signal_ref& s) noexcept override {
    device_guard guard;  // forced: the driver's launch needs the device's context bound
    if (auto ec = guard.enter(device, true)) return ec;
    return cuda_kernels::launch_signal(device, cuda_stream(stream), s);
  }

  void free_signal_block(signal_block& block) noexcept override {
    // cudaFree and cudaFreeHost wait for the device's work: a signal still to come lands first.
    if (block.device_allocation != nullptr) (void)check(cudaFree(block.device_allocation));
    if (block.host_allocation != nullptr) (void)check(cudaFreeHost(block.host_allocation));
    block = signal_block{};
  }

  std::error_code write_fence(native_stream stream, std::uint64_t device_address,
                              std::uint64_t value) noexcept override {
    const auto& entry = write_value64();
    if (entry.fn == nullptr) return entry.error;
    CUresult r =
        entry.fn(reinterpret_cast<CUstream>(stream), static_cast<CUdeviceptr>(device_address),
                 static_cast<cuuint64_t>(value), CU_STREAM_WRITE_VALUE_DEFAULT);
    if (r == CUDA_ERROR_INVALID_CONTEXT) {
      // Driver calls want a current context; a thread that never made a runtime call that binds
      // one (cudaSetDevice does) may have none. Bind the stream's device and retry once. Off the
      // fast path: only this failure pays for it.
      int device = 0;
      device_guard guard;
      if (!stream_device(stream, device) && !guard.enter(device, /*force=*/true)) {
        r = entry.fn(reinterpret_cast<CUstream>(stream), static_cast<CUdeviceptr>(device_address),
                     static_cast<cuuint64_t>(value), CU_STREAM_WRITE_VALUE_DEFAULT);
      }
    }
    // CUresult and cudaError_t coincide for the values evr reasons about (not ready, illegal
    // address, launch failure, invalid value, ...), so the driver's value is kept as is.
    if (r == CUDA_SUCCESS) return {};
    (void)cudaGetLastError();
    return make_cuda_error(static_cast<int>(r));
  }

  std::error_code load_fence_kernels(int device) noexcept override {
    return cuda_kernels::load_and_wait(device, cuda_kernels::kernel::fence);
  }

  std::vector<int> devices_in_use() noexcept override { return cuda_devices::in_use(); }

  bool fence_kernels(int device) noexcept override {
    return cuda_kernels::loaded(device, cuda_kernels::kernel::fence);
  }

  std::error_code write_fence_by_kernel(int device, native_stream stream,
                                        std::uint64_t device_address,
                                        std::uint64_t value) noexcept override {
    device_guard guard;  // the launch needs the device's context current
    if (auto ec = guard.enter(device)) return ec;
    std::error_code ec =
        cuda_kernels::launch_fence(device, cuda_stream(stream), device_address, value);
    if (ec == make_cuda_error(CUDA_ERROR_INVALID_CONTEXT) && !guard.enter(device, true)) {
      // As write_fence: a thread that never bound the primary context (cudaGetDevice does not).
      ec = cuda_kernels::launch_fence(device, cuda_stream(stream), device_address, value);
    }
    return ec;
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
