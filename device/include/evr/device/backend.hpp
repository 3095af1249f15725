// evr/device/backend.hpp — the seam between evr and a GPU.
//
// Everything above this header (pool/, reactor/, callbacks/) talks to a device only through
// `evr::device::backend`. Two implementations exist:
//   * cuda_backend()  — the CUDA runtime (device/src/cuda_backend.cpp), linked statically by
//                       default; driver entry points are fetched at run time, libcuda is never
//                       linked (<evr/device/cuda_status.hpp>: can it run here, and why not).
//   * evr::sim::device — a simulated device (<evr/sim/device.hpp>, target evr::sim, in
//                       device/sim/) that models the CUDA semantics evr relies on, so every
//                       reactor property can be tested without a GPU.
//
// Contract for implementers:
//   * Every function is noexcept and reports failure through std::error_code, in cuda_category()
//     for device errors (same values as cudaError_t) or evr_category() for misuse.
//   * A query returns {} when the work is complete, an error equal to cuda "not ready" (600,
//     test with evr::is_not_ready) when it is pending, and anything else on failure.
//   * Thread safety: all functions may be called from any thread concurrently, as the CUDA runtime
//     allows, except where a function says otherwise. Handles are plain pointers owned by the
//     caller; using a destroyed handle is undefined (as in CUDA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <system_error>
#include <vector>

#include <evr/device/signal_ref.h>
#include <evr/device/error.hpp>

// The CUDA runtime's handle types, declared without including the CUDA headers so that evr's
// public headers compile for users without the toolkit. They are the same types as cudaStream_t
// and cudaEvent_t.
struct CUstream_st;
struct CUevent_st;

namespace evr::device {

using native_stream = void*;  ///< cudaStream_t on the CUDA backend, an opaque pointer on sim
using native_event = void*;   ///< cudaEvent_t on the CUDA backend, an opaque pointer on sim

/// How an event is created. Values may be or-ed together.
enum class event_flags : unsigned {
  none = 0,           ///< cheapest: no timing, spin-waits (cudaEventDisableTiming)
  timing = 1,         ///< records a timestamp: usable with elapsed_time; ~10x costlier to query
  blocking_sync = 2,  ///< synchronize() sleeps instead of spinning (cudaEventBlockingSync)
  interprocess = 4,   ///< may be exported to another process; requires !timing
};
/// The union of two flag sets.
constexpr event_flags operator|(event_flags a, event_flags b) noexcept {
  return static_cast<event_flags>(static_cast<unsigned>(a) | static_cast<unsigned>(b));
}
/// true when `set` contains `f`.
constexpr bool has_flag(event_flags set, event_flags f) noexcept {
  return (static_cast<unsigned>(set) & static_cast<unsigned>(f)) != 0;
}

/// An exported interprocess event (64 bytes, same layout as cudaIpcEventHandle_t).
struct ipc_event_handle {
  unsigned char bytes[64] = {};  ///< the driver's opaque handle bytes
};

/// A block of 64-bit words in host memory that the device can write with stream memory
/// operations (mapped, not write-combined). Words are spaced one per 64-byte line so that the
/// reactor's reads of one word never share a line with the device's writes of another.
struct fence_block {
  std::uint64_t* host = nullptr;                  ///< host address of word 0
  std::uint64_t device_address = 0;               ///< device address of word 0
  std::size_t words = 0;                          ///< number of words
  static constexpr std::size_t stride_words = 8;  ///< 64 bytes between consecutive words
  void* allocation = nullptr;  ///< backend-private: what free_fence_block releases

  /// Host address of word `i` (what the host reads).
  std::uint64_t* host_word(std::size_t i) const noexcept { return host + i * stride_words; }
  /// Device address of word `i` (what write_fence is given).
  std::uint64_t device_word(std::size_t i) const noexcept {
    return device_address + i * stride_words * sizeof(std::uint64_t);
  }
};

/// Memory for device-signalled waits (evr::signal_slot, evr/pool/signal_pool.hpp), `slots` of
/// them: per slot a 64-bit word in mapped host memory (one per 64-byte line, as fence words) that
/// a kernel writes and the reactor reads, and 16 bytes of device memory that the kernel counts in
/// (signal_ref.h: the signal counter, then the block counter). All zero at first.
struct signal_block {
  std::uint64_t* host = nullptr;      ///< host address of slot 0's word
  std::uint64_t device_words = 0;     ///< device address of slot 0's word
  std::uint64_t device_counters = 0;  ///< device address of slot 0's counters
  std::size_t slots = 0;              ///< number of slots
  static constexpr std::size_t word_stride = fence_block::stride_words;  ///< 64 bytes
  static constexpr std::size_t counter_bytes = 16;  ///< between consecutive slots' counters
  void* host_allocation = nullptr;    ///< backend-private: what free_signal_block releases
  void* device_allocation = nullptr;  ///< backend-private: what free_signal_block releases

  /// Host address of slot `i`'s word (what the reactor reads).
  std::uint64_t* host_word(std::size_t i) const noexcept { return host + i * word_stride; }
  /// What a kernel needs to signal slot `i`.
  signal_ref ref(std::size_t i) const noexcept {
    const std::uint64_t counters = device_counters + i * counter_bytes;
    return signal_ref{reinterpret_cast<unsigned long long*>(counters),
                      reinterpret_cast<unsigned int*>(counters + sizeof(std::uint64_t)),
                      reinterpret_cast<unsigned long long*>(
                          device_words + i * word_stride * sizeof(std::uint64_t))};
  }
};

/// The device interface. See the file comment for the contract.
class backend {
 public:
  virtual ~backend() = default;

  /// "cuda" or "sim".
  virtual std::string_view name() const noexcept = 0;
  /// true for a simulated device (evr::sim::device): no timing claims.
  virtual bool is_simulated() const noexcept = 0;
  /// One human-readable line: device name(s), driver and runtime versions.
  virtual std::string describe() const = 0;
  /// The number of devices (0 and an error when there is none or no driver).
  virtual std::error_code device_count(int& count) noexcept = 0;

  // --- events --------------------------------------------------------------------------------
  /// Creates an event on `device` (cudaEventCreateWithFlags). Slow: never on the reactor thread.
  virtual std::error_code create_event(int device, event_flags flags,
                                       native_event& out) noexcept = 0;
  /// May block in the driver (see CUDA-NOTES): never called on the reactor thread.
  virtual void destroy_event(native_event event) noexcept = 0;
  /// Records on `stream`; the event and the stream must belong to the same device.
  virtual std::error_code record_event(native_event event, native_stream stream) noexcept = 0;
  /// {} complete (also for a never-recorded event, as in CUDA), not_ready, or an error.
  virtual std::error_code query_event(native_event event) noexcept = 0;
  /// Blocks the calling thread until `event` completes (cudaEventSynchronize).
  virtual std::error_code synchronize_event(native_event event) noexcept = 0;
  /// Milliseconds between two completed timing events (cudaEventElapsedTime).
  virtual std::error_code elapsed_ms(native_event start, native_event end, float& ms) noexcept = 0;
  /// Exports an interprocess event (cudaIpcGetEventHandle); errc::unsupported on sim.
  virtual std::error_code export_event(native_event event, ipc_event_handle& out) noexcept = 0;
  /// Opens an event exported by another process (cudaIpcOpenEventHandle).
  virtual std::error_code import_event(const ipc_event_handle& handle,
                                       native_event& out) noexcept = 0;

  // --- streams -------------------------------------------------------------------------------
  /// Creates a non-blocking stream (never synchronizes with the legacy default stream).
  virtual std::error_code create_stream(int device, int priority, native_stream& out) noexcept = 0;
  /// Destroys `stream`; work already queued on it still runs (as cudaStreamDestroy).
  virtual void destroy_stream(native_stream stream) noexcept = 0;
  /// The device `stream` belongs to.
  virtual std::error_code stream_device(native_stream stream, int& device) noexcept = 0;
  /// The priority `stream` was created with.
  virtual std::error_code stream_priority(native_stream stream, int& priority) noexcept = 0;
  /// {} when every operation enqueued so far is done, not_ready, or an error.
  virtual std::error_code query_stream(native_stream stream) noexcept = 0;
  /// Blocks the calling thread until every operation enqueued on `stream` so far is done.
  virtual std::error_code synchronize_stream(native_stream stream) noexcept = 0;
  /// Later work on `stream` waits until `event` completes (cudaStreamWaitEvent).
  virtual std::error_code stream_wait_event(native_stream stream, native_event event) noexcept = 0;
  /// Enqueues fn(arg) (cudaLaunchHostFunc). fn runs on a backend thread, must not call evr or
  /// the device API, and is never called once the device has faulted.
  virtual std::error_code launch_host_func(native_stream stream, void (*fn)(void*),
                                           void* arg) noexcept = 0;
  /// How many hardware queues the device spreads streams over (work of streams in one queue may
  /// wait on each other behind a stream memory operation); 0 when unknown or unlimited.
  virtual std::size_t hardware_queues() const noexcept { return 0; }
  /// True while `stream` is being captured into a graph: nothing may then be enqueued on it by
  /// anyone but the capturing code (the reactor checks before arming a doorbell).
  virtual bool stream_is_capturing(native_stream /*stream*/) noexcept { return false; }

  // --- fences (stream memory operations) -----------------------------------------------------
  /// Allocates `words` fence words for `device`, zero-initialised. Slow; never on the reactor.
  virtual std::error_code allocate_fence_block(int device, std::size_t words,
                                               fence_block& out) noexcept = 0;
  /// Frees a block from allocate_fence_block; writes still queued to it never land.
  virtual void free_fence_block(fence_block& block) noexcept = 0;
  /// Enqueues a 64-bit write of `value` to `device_address` (cuStreamWriteValue64). Once the
  /// device faulted the write never lands.
  virtual std::error_code write_fence(native_stream stream, std::uint64_t device_address,
                                      std::uint64_t value) noexcept = 0;
  /// Loads the fence kernel on `device` and returns once it is ready (or why it cannot be: a GPU
  /// before compute capability 9.0, a driver before 12.0, a bad device). Blocks: CUDA's load of a
  /// module waits for the kernels running on the device to end and holds up every other
  /// thread's CUDA calls until then, so a kernel that waits for a host thread's next CUDA call
  /// deadlocks it (bench/studies/module_load.cu). Call it where no such kernel runs; never on a
  /// waiting thread's path. Idempotent, any thread. Default: errc::unsupported.
  virtual std::error_code load_fence_kernels(int device) noexcept {
    (void)device;
    return make_error_code(errc::unsupported);
  }
  /// The devices the process already uses (CUDA: whose primary context is active), in order:
  /// where a reactor made now loads what its waits will need. Default: none.
  virtual std::vector<int> devices_in_use() noexcept { return {}; }
  /// Whether write_fence_by_kernel works on `device` now (CUDA: compute capability 9.0 or later,
  /// once load_fence_kernels has loaded it). Any thread. Default: false.
  virtual bool fence_kernels(int device) noexcept {
    (void)device;
    return false;
  }
  /// Enqueues on `stream` (of `device`) evr's fence kernel, which writes `value` to
  /// `device_address` once the work before it is done: what write_fence does, but behind a
  /// kernel it does not wait in the stream's hardware queue (a programmatic dependent launch
  /// that waits on the GPU), so streams that share the queue go on; behind other work (a copy, a
  /// host function) it waits there as write_fence does. Costs the calling thread a kernel launch.
  /// Once the device faulted the write never lands. Default: errc::unsupported.
  virtual std::error_code write_fence_by_kernel(int device, native_stream stream,
                                                std::uint64_t device_address,
                                                std::uint64_t value) noexcept {
    (void)device;
    (void)stream;
    (void)device_address;
    (void)value;
    return make_error_code(errc::unsupported);
  }

  // --- device-signalled waits ------------------------------------------------------------------
  /// Allocates `slots` signal slots' memory on `device` (signal_block), zero-initialised. Slow;
  /// never on the reactor. The default: errc::unsupported (a backend without signal slots).
  virtual std::error_code allocate_signal_block(int device, std::size_t slots,
                                                signal_block& out) noexcept {
    (void)device;
    (void)slots;
    out = signal_block{};
    return make_error_code(errc::unsupported);
  }
  /// Frees a block from allocate_signal_block. The caller makes sure no kernel still signals it.
  virtual void free_signal_block(signal_block& block) noexcept { block = signal_block{}; }
  /// Queues on `stream` (of `device`), behind the work queued there, a one-thread kernel of evr's
  /// own that signals `s` once (what evr::signal does): the signal for work whose kernels cannot
  /// give it. Allowed while `stream` is being captured into a graph. The default:
  /// errc::unsupported.
  virtual std::error_code enqueue_signal(int device, native_stream stream,
                                         const signal_ref& s) noexcept {
    (void)device;
    (void)stream;
    (void)s;
    return make_error_code(errc::unsupported);
  }
  /// Loads evr's signal kernel (enqueue_signal's) on `device` and returns once it is loaded, or
  /// why it cannot be. Blocks as load_fence_kernels does (a load waits for the device's running
  /// kernels); never from a host function. A device's first allocate_signal_block loads it too,
  /// but cannot say that the load failed (the slots serve the user's own kernels without it).
  /// The default: {} (nothing to load).
  virtual std::error_code load_signal_kernel(int device) noexcept {
    (void)device;
    return {};
  }

  // --- threads -------------------------------------------------------------------------------
  /// Makes `device` current for the calling thread (cudaSetDevice).
  virtual std::error_code set_current_device(int device) noexcept = 0;
  /// The calling thread's current device (cudaGetDevice).
  virtual std::error_code current_device(int& device) noexcept = 0;
  /// Called once by a thread that will poll: switches it to the relaxed stream-capture mode so
  /// that its queries never invalidate a graph capture running on another thread.
  virtual void prepare_polling_thread() noexcept = 0;
  /// For a thread that polls for a while and then goes back to its owner's work (an io_context
  /// thread in a pass of its own, detail::poll_host): switches it to the relaxed capture mode as
  /// prepare_polling_thread does, and returns its previous mode, which end_borrowed_polling puts
  /// back. The default (no capture modes) does nothing.
  virtual int begin_borrowed_polling() noexcept { return 0; }
  /// Puts back the capture mode begin_borrowed_polling returned.
  virtual void end_borrowed_polling(int previous_mode) noexcept { (void)previous_mode; }
  /// True when the calling thread is running one of this backend's host functions.
  virtual bool in_host_func() const noexcept = 0;
};

/// True when the CUDA backend was compiled in (EVR_WITH_CUDA).
bool cuda_compiled_in() noexcept;

/// The process-wide CUDA backend. Throws evr::error(errc::unsupported) in a build without CUDA.
/// Obtaining it never fails on a machine without a GPU; its calls then report the CUDA error.
backend& cuda_backend();

/// True when the CUDA backend is compiled in and at least one GPU is usable.
bool cuda_device_available() noexcept;

}  // namespace evr::device
