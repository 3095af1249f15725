// cuda_fences.hpp: fence words and signal slots on the CUDA runtime, and cuStreamWriteValue64
// fetched from the driver at run time (nothing linked).
#if defined(EVR_WITH_CUDA)

#include "cuda_fences.hpp"

#include <cuda.h>  // driver types only (CUresult, CUstream, CUdeviceptr): never linked
#include <cuda_runtime_api.h>

#include <cstring>
#include <limits>

#include <evr/device/error.hpp>

#include "cuda_kernels.hpp"
#include "cuda_runtime.hpp"
#include "driver_entry.hpp"

namespace evr::device::cuda_fences {
namespace {

using detail::check;
using detail::cuda_stream;
using detail::device_guard;

static_assert(fence_block::stride_words * sizeof(std::uint64_t) == 64);

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

CUresult write_value(write_value64_fn fn, native_stream stream, std::uint64_t device_address,
                     std::uint64_t value) noexcept {
  return fn(reinterpret_cast<CUstream>(stream), static_cast<CUdeviceptr>(device_address),
            static_cast<cuuint64_t>(value), CU_STREAM_WRITE_VALUE_DEFAULT);
}

}  // namespace

std::error_code allocate_fence_block(int device, std::size_t words, fence_block& out) noexcept {
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

void free_fence_block(fence_block& block) noexcept {
  if (block.allocation != nullptr) (void)check(cudaFreeHost(block.allocation));
  block = fence_block{};
}

std::error_code allocate_signal_block(int device, std::size_t slots, signal_block& out) noexcept {
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

void free_signal_block(signal_block& block) noexcept {
  // cudaFree and cudaFreeHost wait for the device's work: a signal still to come lands first.
  if (block.device_allocation != nullptr) (void)check(cudaFree(block.device_allocation));
  if (block.host_allocation != nullptr) (void)check(cudaFreeHost(block.host_allocation));
  block = signal_block{};
}

std::error_code enqueue_signal(int device, native_stream stream, const signal_ref& s) noexcept {
  device_guard guard;  // forced: the driver's launch needs the device's context bound
  if (auto ec = guard.enter(device, true)) return ec;
  return cuda_kernels::launch_signal(device, cuda_stream(stream), s);
}

std::error_code write_fence(native_stream stream, std::uint64_t device_address,
                            std::uint64_t value) noexcept {
  const auto& entry = write_value64();
  if (entry.fn == nullptr) return entry.error;
  CUresult r = write_value(entry.fn, stream, device_address, value);
  if (r == CUDA_ERROR_INVALID_CONTEXT) {
    // Driver calls want a current context; a thread that never made a runtime call that binds
    // one (cudaSetDevice does) may have none. Bind the stream's device and retry once. Off the
    // fast path: only this failure pays for it.
    int device = 0;
    device_guard guard;
    if (!check(cudaStreamGetDevice(cuda_stream(stream), &device)) &&
        !guard.enter(device, /*force=*/true)) {
      r = write_value(entry.fn, stream, device_address, value);
    }
  }
  // CUresult and cudaError_t coincide for the values evr reasons about (not ready, illegal
  // address, launch failure, invalid value, ...), so the driver's value is kept as is.
  if (r == CUDA_SUCCESS) return {};
  (void)cudaGetLastError();
  return make_cuda_error(static_cast<int>(r));
}

std::error_code write_fence_by_kernel(int device, native_stream stream,
                                      std::uint64_t device_address, std::uint64_t value) noexcept {
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

}  // namespace evr::device::cuda_fences

#endif  // EVR_WITH_CUDA
