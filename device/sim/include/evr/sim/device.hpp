// evr/sim/device.hpp — a simulated GPU that models the CUDA semantics evr relies on, so that code
// using evr (and evr itself) can be tested without a GPU. Target evr::sim (library evr_sim):
//
//   find_package(evr CONFIG REQUIRED)
//   target_link_libraries(app_tests PRIVATE evr::evr evr::sim)
//
//   evr::sim::device sim{{.devices = 2, .mode = evr::sim::run_mode::threaded}};
//   evr::reactor reactor{sim};                      // any evr object that takes a backend
//
// Model (what evr relies on from CUDA; docs/architecture.md, "device/ — the seam"):
//   * A stream is an ordered queue of operations: kernels (a duration and/or a host callable that
//     plays the kernel's body), event records, host functions, 64-bit memory writes (fences) and
//     waits on an event. Operations of one stream complete in issue order.
//   * An event completes when its stream passes the record that captured it. A never-recorded
//     event queries as complete. Re-recording overwrites what the event watches.
//   * Sticky faults: a device can be made to fault at a chosen operation (or at once). From then
//     on every query/record/synchronize on that device returns the fault, host functions stop
//     running and fence writes stop landing, exactly as a CUDA context after an illegal address.
//   * Delays (a kernel's duration) and stalls (a stream stops advancing until resumed).
//
// Two modes:
//   * threaded: operations run as they come, on threads of the simulator: each stream has a
//     worker thread, which runs its kernels' durations and bodies and its host functions; its
//     cheap operations (records, fence writes, waits, kernels with neither) run on the worker or
//     on the device's runner thread, whichever gets there first.
//   * manual: nothing runs until the test calls step()/run_until_blocked(); deterministic.
//
// Details that differ from, or make precise, what CUDA does:
//   * Manual mode: synchronize_stream/synchronize_event run the stream concerned forward on the
//     calling thread. When it is stalled or waits on work nobody steps (and no other thread runs
//     an operation), they return std::errc::resource_deadlock_would_occur instead of hanging.
//   * destroy_stream returns at once, as in CUDA: work already queued still runs and events
//     recorded there still complete; the worker thread is joined later.
//   * stream_wait_event on a never-recorded event enqueues nothing (a no-op, as in CUDA).
//   * Counters: queries and records count every call, failed ones too; host_funcs_launched and
//     fence_writes_enqueued and fence_kernels_enqueued count successful enqueues only.
//   * write_fence_by_kernel (with options::fence_kernels) is a fence write in the model: it lands
//     when the work before it is done. The hardware queues it spares are not modelled.
//   * The legacy default stream (nullptr, 1) is not modelled: errc::invalid_argument.
//   * A fence write queued before its fence block was freed never lands, also when a new block
//     is later allocated at the same address.
//
// Cost (evr-bench sim): well under a microsecond per enqueued and per completed operation
// (0.05-0.5 us on a 2-core machine); an enqueue makes a system call only when the runner thread
// sleeps (it sleeps after 50 us without work).
//
// Thread safety: every member may be called from any thread concurrently. Host functions and
// kernel bodies run on the stream's worker thread (threaded) or on the thread calling step()
// (manual). Destroying the device with streams alive destroys them (pending work is dropped).
// The constructor throws std::system_error when the runner thread cannot be started, and
// std::invalid_argument for options it cannot model (a negative query_cost).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <evr/device/backend.hpp>

namespace evr::sim {

/// Who runs a simulated stream's operations.
enum class run_mode {
  threaded,  ///< a worker thread per stream runs operations as they come
  manual,    ///< operations run only when the test calls step()/run_until_blocked()
};

/// How a simulated device is built.
struct options {
  int devices = 1;                     ///< number of simulated GPUs (device indices 0..devices-1)
  run_mode mode = run_mode::threaded;  ///< who runs the operations
  /// How long each event or stream query takes, spent spinning before it answers (as the
  /// driver's does: a few hundred ns to a few us on a GPU, docs/architecture.md "Markers and
  /// hardware queues"). 0: as fast as the model allows. Negative: the constructor throws
  /// std::invalid_argument.
  std::chrono::nanoseconds query_cost{0};
  /// Whether write_fence_by_kernel works (fence_kernels() true), as on a GPU of compute
  /// capability 9.0 or later; false: it returns errc::unsupported, as on an older GPU.
  bool fence_kernels = false;
  /// With fence_kernels: the kernel is ready on a device only once load_fence_kernels was called
  /// for it (as on CUDA; here the load ends at once); false: it is ready from the start.
  bool fence_kernels_after_load = false;
  /// devices_in_use() reports devices 0..devices_in_use-1 (as CUDA reports those whose context
  /// is active); -1: all of them.
  int devices_in_use = -1;
};

/// Counters of the calls made into the simulated device (to assert, e.g., how many queries a
/// reactor sweep made). Read with device::counters(); reset with reset_counters().
struct call_counters {
  std::uint64_t event_queries = 0;           ///< query_event calls (failed ones too)
  std::uint64_t stream_queries = 0;          ///< query_stream calls (failed ones too)
  std::uint64_t event_records = 0;           ///< record_event calls (failed ones too)
  std::uint64_t host_funcs_launched = 0;     ///< host functions enqueued successfully
  std::uint64_t host_funcs_run = 0;          ///< host functions that ran
  std::uint64_t fence_writes_enqueued = 0;   ///< fence writes enqueued successfully
  std::uint64_t fence_kernels_enqueued = 0;  ///< fence kernels enqueued successfully
  std::uint64_t fence_kernel_loads = 0;      ///< load_fence_kernels calls
  std::uint64_t fence_writes_landed = 0;     ///< fence writes that reached their word
  std::uint64_t events_created = 0;          ///< events created (create_event, import_event)
  std::uint64_t events_destroyed = 0;        ///< events destroyed
};

/// A simulated GPU with the CUDA semantics evr relies on: pass it wherever evr takes a backend.
/// Thread safety: every member may be called from any thread concurrently. Lifetime: destroying
/// it destroys the streams still alive (pending work is dropped); reactors and events using it
/// must be gone first. Errors: the backend calls report std::error_code as CUDA would; the
/// constructor throws std::system_error when its threads cannot start and std::invalid_argument
/// for a negative options::query_cost. See the file comment for the model and the two run modes.
class device final : public evr::device::backend {
 public:
  /// A device of `opts.devices` simulated GPUs, run as `opts.mode` says.
  explicit device(options opts = {});
  ~device() override;
  device(const device&) = delete;
  device& operator=(const device&) = delete;

  // --- work a test enqueues (what a kernel launch would be on the GPU) -----------------------
  /// A kernel that occupies the stream for `duration` (threaded mode: the worker sleeps; manual
  /// mode: the duration is ignored) and then runs `body` if given.
  std::error_code launch_kernel(evr::device::native_stream stream,
                                std::chrono::nanoseconds duration = {},
                                std::function<void()> body = {});
  /// A kernel that faults when it runs: the device becomes sticky-failed with `fault`
  /// (default: cuda illegal address, 700).
  std::error_code launch_faulting_kernel(evr::device::native_stream stream,
                                         std::error_code fault = {});
  /// Makes `device_index` sticky-failed now.
  void inject_fault(int device_index, std::error_code fault = {});
  /// Makes the device fault when it starts its n-th operation from now (n >= 1), counting the
  /// operations of every stream of that device in the order they run.
  void inject_fault_after(int device_index, std::uint64_t operations, std::error_code fault = {});
  /// The sticky fault of a device, or {}.
  std::error_code fault(int device_index) const;

  /// A stalled stream runs no operation until resume().
  void stall(evr::device::native_stream stream);
  void resume(evr::device::native_stream stream);  ///< lets a stalled stream run again

  // --- manual mode -----------------------------------------------------------------------------
  /// Runs up to `n` operations of `stream` on the calling thread; returns how many ran (fewer if
  /// the stream is empty, stalled, faulted or blocked on an event wait).
  std::size_t step(evr::device::native_stream stream, std::size_t n = 1);
  /// Runs every stream until each is empty or blocked; returns the number of operations run.
  std::size_t run_until_blocked();
  /// Operations enqueued on `stream` and not yet run.
  std::size_t pending_operations(evr::device::native_stream stream) const;

  /// Threaded mode: blocks until every stream is empty (or stalled/faulted). For test teardown.
  void wait_idle();

  call_counters counters() const;  ///< the calls made so far (since reset_counters())
  void reset_counters();           ///< zeroes counters()
  run_mode mode() const noexcept;  ///< as constructed

  // --- evr::device::backend --------------------------------------------------------------------
  std::string_view name() const noexcept override;
  bool is_simulated() const noexcept override;
  std::string describe() const override;
  std::error_code device_count(int& count) noexcept override;
  std::error_code create_event(int device, evr::device::event_flags flags,
                               evr::device::native_event& out) noexcept override;
  void destroy_event(evr::device::native_event event) noexcept override;
  std::error_code record_event(evr::device::native_event event,
                               evr::device::native_stream stream) noexcept override;
  std::error_code query_event(evr::device::native_event event) noexcept override;
  std::error_code synchronize_event(evr::device::native_event event) noexcept override;
  std::error_code elapsed_ms(evr::device::native_event start, evr::device::native_event end,
                             float& ms) noexcept override;
  std::error_code export_event(evr::device::native_event event,
                               evr::device::ipc_event_handle& out) noexcept override;
  std::error_code import_event(const evr::device::ipc_event_handle& handle,
                               evr::device::native_event& out) noexcept override;
  std::error_code create_stream(int device, int priority,
                                evr::device::native_stream& out) noexcept override;
  void destroy_stream(evr::device::native_stream stream) noexcept override;
  std::error_code stream_device(evr::device::native_stream stream, int& device) noexcept override;
  std::error_code stream_priority(evr::device::native_stream stream,
                                  int& priority) noexcept override;
  std::error_code query_stream(evr::device::native_stream stream) noexcept override;
  std::error_code synchronize_stream(evr::device::native_stream stream) noexcept override;
  std::error_code stream_wait_event(evr::device::native_stream stream,
                                    evr::device::native_event event) noexcept override;
  std::error_code launch_host_func(evr::device::native_stream stream, void (*fn)(void*),
                                   void* arg) noexcept override;
  std::error_code allocate_fence_block(int device, std::size_t words,
                                       evr::device::fence_block& out) noexcept override;
  void free_fence_block(evr::device::fence_block& block) noexcept override;
  /// Host memory ("device" addresses are host addresses): a simulated kernel's body signals a
  /// slot with evr::sim::signal.
  std::error_code allocate_signal_block(int device, std::size_t slots,
                                        evr::device::signal_block& out) noexcept override;
  void free_signal_block(evr::device::signal_block& block) noexcept override;
  /// A zero-length kernel whose body is evr::sim::signal(s).
  std::error_code enqueue_signal(int device, evr::device::native_stream stream,
                                 const evr::signal_ref& s) noexcept override;
  std::error_code write_fence(evr::device::native_stream stream, std::uint64_t device_address,
                              std::uint64_t value) noexcept override;
  std::error_code load_fence_kernels(int device) noexcept override;
  std::vector<int> devices_in_use() noexcept override;
  bool fence_kernels(int device) noexcept override;
  /// As write_fence (when fence_kernels(device); else errc::unsupported); `stream` must be of
  /// `device` (errc::device_mismatch).
  std::error_code write_fence_by_kernel(int device, evr::device::native_stream stream,
                                        std::uint64_t device_address,
                                        std::uint64_t value) noexcept override;
  std::error_code set_current_device(int device) noexcept override;
  std::error_code current_device(int& device) noexcept override;
  void prepare_polling_thread() noexcept override;
  bool in_host_func() const noexcept override;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// What evr::signal (<evr/device/signal.cuh>) does on the GPU, for the body of a simulated kernel
/// (device::launch_kernel): counts one more signal of the slot `s` names and publishes the count
/// in its word (release: what the body wrote before is seen by whoever sees the count). `s` must
/// come from a slot of a simulated device, whose addresses are host addresses.
void signal(const evr::signal_ref& s) noexcept;

}  // namespace evr::sim
