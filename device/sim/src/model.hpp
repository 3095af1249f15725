// The model of the simulated device (evr/sim/device.hpp): what a stream, an operation, an event,
// a record, a fence block and a device's fault state are, and which lock guards each field.
//
// Model
// -----
// A sim::device simulates `options::devices` GPUs ("device indexes"). Streams and events belong to
// one device index.
//   * A stream is a FIFO of operations (kernel, faulting kernel, event record, host function,
//     fence write, wait on an event record). Only the head may run, one at a time, so the
//     operations of a stream complete in issue order.
//   * record_event creates a new `record_state` and points the event at it; the record operation
//     marks it done (with a steady_clock timestamp) when it runs. An event is complete when it was
//     never recorded or its current record is done. Re-recording points the event at a new record;
//     a wait already enqueued keeps the record it captured (as cudaStreamWaitEvent does).
//   * A device faults when a faulting kernel reaches the head of its stream, when its fault
//     countdown reaches zero as an operation is about to start, or on inject_fault(). From then on
//     nothing of that device starts (the operation that faulted stays at its stream's head and
//     never completes), and every call on that device returns the fault. An operation already
//     running when the fault arrives (a kernel body, a host function) finishes.
//   * Handles are pointers to objects registered in the device (registry.hpp).
//
// Locks (see also scheduler.hpp for the order in which they nest)
// -----
//   * stream_state::mutex guards the stream's queue and flags. It is held for short, non-blocking
//     steps only: never while a kernel sleeps, a kernel body or a host function runs.
//   * event_core::mutex guards which record an event watches.
//   * fault_state::mutex serializes the setters of a device's fault (the first one sticks); the
//     fault itself is read lock-free (an acquire load of `faulted`).
//   * record_state::done and fence_block_state's fields are atomics (see each).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <evr/device/backend.hpp>
#include <evr/device/error.hpp>

namespace evr::sim::detail {

using sim_clock = std::chrono::steady_clock;

// Stream priorities are clamped to the range an H100 reports (cudaDeviceGetStreamPriorityRange).
inline constexpr int least_priority = 0;
inline constexpr int greatest_priority = -5;
// Kernel durations below this are spun (a timed condvar wait oversleeps by ~50 us on Linux).
inline constexpr std::chrono::nanoseconds spin_below{50'000};

inline std::error_code not_ready() { return make_cuda_error(cuda_value::not_ready); }
inline std::error_code bad_handle() { return make_cuda_error(cuda_value::invalid_resource_handle); }
inline std::error_code default_fault() { return make_cuda_error(cuda_value::illegal_address); }
inline std::error_code would_deadlock() {
  return std::make_error_code(std::errc::resource_deadlock_would_occur);
}

struct stream_state;

/// What one record_event captured. Shared by the event (until re-recorded or destroyed), the
/// record operation that completes it, and the waits enqueued on it.
struct record_state {
  explicit record_state(std::weak_ptr<stream_state> on) : stream(std::move(on)) {}
  /// The stream it was recorded on (manual-mode synchronize_event steps that stream).
  const std::weak_ptr<stream_state> stream;
  /// Set once, with release, after done_at; read with acquire (then done_at may be read).
  std::atomic<bool> done{false};
  sim_clock::time_point done_at{};

  bool is_done() const noexcept { return done.load(std::memory_order_acquire); }
  /// Called by whoever runs the record operation.
  void complete() noexcept {
    done_at = sim_clock::now();
    done.store(true, std::memory_order_release);
  }
};

/// The state an event handle watches. An exported event and the events imported from its handle
/// share one core, so a record on either is seen by all.
struct event_core {
  explicit event_core(int dev) : device(dev) {}
  const int device;
  std::mutex mutex;                      ///< guards `record`
  std::shared_ptr<record_state> record;  ///< nullptr: never recorded
  std::uint64_t ipc_token = 0;           ///< 0: never exported (guarded by the registry)

  std::shared_ptr<record_state> current() {
    std::lock_guard lock(mutex);
    return record;
  }
  /// True when never recorded or the current record is done (what cudaEventQuery reports).
  bool complete() {
    std::lock_guard lock(mutex);
    return !record || record->is_done();
  }
};

/// One event handle. Immutable once registered, apart from what `core` guards itself.
struct event_state {
  int device = 0;
  evr::device::event_flags flags = evr::device::event_flags::none;
  bool imported = false;
  std::shared_ptr<event_core> core;
};

/// A block of fence words handed out by allocate_fence_block. It outlives the memory: a write
/// still queued when the block is freed finds `live` false and does not land.
struct fence_block_state {
  fence_block_state(std::uintptr_t b, std::size_t n) : base(b), bytes(n) {}
  const std::uintptr_t base;
  const std::size_t bytes;
  std::atomic<bool> live{true};
  std::atomic<int> writers{0};  ///< writes in progress (see land and retire)

  bool contains(std::uintptr_t address) const noexcept {
    return address % alignof(std::uint64_t) == 0 && address >= base &&
           address + sizeof(std::uint64_t) <= base + bytes;
  }
  /// Stores `value` (release) unless the block was freed. Dekker's pattern with retire(): the
  /// writer announces itself then reads `live`; retire() clears `live` then waits for writers to
  /// leave. seq_cst on both sides: either the writer sees the block dead, or retire() sees it.
  bool land(std::uint64_t* word, std::uint64_t value) noexcept {
    writers.fetch_add(1, std::memory_order_seq_cst);
    const bool ok = live.load(std::memory_order_seq_cst);
    if (ok) std::atomic_ref<std::uint64_t>(*word).store(value, std::memory_order_release);
    writers.fetch_sub(1, std::memory_order_release);
    return ok;
  }
  /// After this returns no write lands in the block: the memory may be freed.
  void retire() noexcept {
    live.store(false, std::memory_order_seq_cst);
    while (writers.load(std::memory_order_acquire) != 0) std::this_thread::yield();
  }
};

enum class op_kind : std::uint8_t { kernel, faulting_kernel, record, host_func, fence, wait };

/// What only some kernels carry (kept out of `operation` so that the common ones stay small).
struct kernel_extra {
  std::function<void()> body;  ///< kernel: its body, if any
  std::error_code fault;       ///< faulting_kernel: the fault it raises
};

/// One enqueued operation. Move-only; 64 bytes.
struct operation {
  op_kind kind = op_kind::kernel;
  std::uint64_t value = 0;               ///< fence: the value; kernel: the duration in ns
  void* target = nullptr;                ///< fence: the word; host_func: the argument
  void (*fn)(void*) = nullptr;           ///< host_func
  fence_block_state* block = nullptr;    ///< fence: the block holding `target`
  std::shared_ptr<record_state> record;  ///< record (completes it), wait (waits for it)
  std::unique_ptr<kernel_extra> extra;   ///< kernel with a body, faulting_kernel

  std::chrono::nanoseconds duration() const noexcept {
    return std::chrono::nanoseconds(static_cast<std::int64_t>(value));
  }
};

/// A FIFO of operations in a ring buffer that grows by doubling and never shrinks: enqueuing
/// allocates nothing in steady state. Not thread-safe (guarded by stream_state::mutex).
class op_queue {
 public:
  bool empty() const noexcept { return size_ == 0; }
  std::size_t size() const noexcept { return size_; }
  operation& front() noexcept { return ring_[head_]; }
  const operation& front() const noexcept { return ring_[head_]; }
  void push_back(operation&& op) {
    if (size_ == ring_.size()) grow();
    ring_[(head_ + size_) & (ring_.size() - 1)] = std::move(op);
    ++size_;
  }
  operation pop_front() noexcept {
    operation op = std::move(ring_[head_]);
    head_ = (head_ + 1) & (ring_.size() - 1);
    --size_;
    return op;
  }

 private:
  void grow() {
    std::vector<operation> bigger(ring_.empty() ? 64 : ring_.size() * 2);
    for (std::size_t i = 0; i < size_; ++i) {
      bigger[i] = std::move(ring_[(head_ + i) & (ring_.size() - 1)]);
    }
    ring_ = std::move(bigger);
    head_ = 0;
  }
  std::vector<operation> ring_;  // size 0 or a power of two
  std::size_t head_ = 0;
  std::size_t size_ = 0;
};

/// One stream. Every non-const field but `worker` is guarded by `mutex`.
struct stream_state : std::enable_shared_from_this<stream_state> {
  stream_state(std::uint64_t creation, int dev, int prio)
      : id(creation), device(dev), priority(prio) {}
  const std::uint64_t id;  ///< creation order: run_until_blocked visits streams in this order
  const int device;
  const int priority;

  std::mutex mutex;
  /// The worker's (threaded mode): woken by the runner when the head needs the worker, by
  /// resume(), destroy_stream and the device's destruction; also cuts a kernel's sleep short then.
  std::condition_variable cv;
  op_queue queue;     ///< not started yet; the head is next
  bool busy = false;  ///< an operation was popped and is running (lock released)
  bool stalled = false;
  bool retired = false;  ///< destroy_stream was called: drain, then end
  bool stop = false;     ///< the sim::device is being destroyed: drop everything
  bool idle = false;     ///< threaded: the worker sleeps on `cv` until woken (runner, resume, stop)
  bool on_runner = false;  ///< threaded: on the runner's list (at most once)
  bool exited = false;     ///< threaded: the worker returned (join will not block)
  /// threaded: started before the stream is registered; joined by scheduler::reap (destroyed and
  /// drained) or scheduler::stop_all (the device's destruction), never by two threads.
  std::thread worker;
};

/// The sticky fault and the fault countdown of one simulated GPU.
struct fault_state {
  std::mutex mutex;  ///< serializes setters; a leaf lock (nothing is locked while holding it)
  /// Set once, with seq_cst, after `fault` was written; read with acquire (then `fault` may be
  /// read: it never changes again).
  std::atomic<bool> faulted{false};
  std::error_code fault;
  /// inject_fault_after: operations left before the fault (0: off).
  std::atomic<std::uint64_t> countdown{0};
  std::error_code countdown_fault;  ///< guarded by `mutex`

  std::error_code get() const noexcept {
    return faulted.load(std::memory_order_acquire) ? fault : std::error_code{};
  }
  bool is_faulted() const noexcept { return faulted.load(std::memory_order_acquire); }

  /// Makes the device faulted with `f` unless it already is (the first fault sticks). Only the
  /// flag: the caller then runs scheduler::after_fault. Safe while holding a stream's mutex.
  void set(std::error_code f) {
    std::lock_guard lock(mutex);
    set_locked(f);
  }

  /// Arms the countdown: the `operations`-th operation to start from now faults.
  void arm(std::uint64_t operations, std::error_code f) {
    std::lock_guard lock(mutex);
    if (faulted.load(std::memory_order_relaxed)) return;
    countdown_fault = f ? f : default_fault();
    countdown.store(operations, std::memory_order_release);
  }

  enum class start { go, faults_now, faulted };
  /// Called as an operation is about to start (under its stream's mutex): whether it may start,
  /// is the one the countdown picked (the device is then faulted), or the device has faulted.
  /// The countdown is read before the flag: set_locked() writes the flag before it clears the
  /// countdown (release), so an operation that reads the cleared countdown also sees the flag.
  start on_start() {
    if (countdown.load(std::memory_order_acquire) != 0) {
      std::lock_guard lock(mutex);
      if (faulted.load(std::memory_order_relaxed)) return start::faulted;
      const std::uint64_t left = countdown.load(std::memory_order_relaxed);
      if (left == 1) {
        set_locked(countdown_fault);
        return start::faults_now;
      }
      if (left != 0) countdown.store(left - 1, std::memory_order_relaxed);
      return start::go;
    }
    return is_faulted() ? start::faulted : start::go;
  }

 private:
  void set_locked(std::error_code f) {
    if (faulted.load(std::memory_order_relaxed)) return;
    fault = f ? f : default_fault();
    faulted.store(true, std::memory_order_seq_cst);
    countdown.store(0, std::memory_order_release);
  }
};

}  // namespace evr::sim::detail
