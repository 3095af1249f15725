// The scheduler of a simulated device: who runs a stream's operations, and when.
//
//   * threaded mode: each stream has a worker thread, and the device has one runner thread.
//     Operations that may block the thread running them (a kernel with a duration, which sleeps
//     or spins for it; a kernel body; a host function) run on the stream's worker. The others
//     (event records, fence writes, waits, kernels with neither duration nor body) are cheap and
//     run on whichever of the two gets to them: the worker when it is awake, else the runner.
//   * manual mode: nothing runs by itself; step()/run_until_blocked() and synchronize_* run
//     operations on the calling thread (run_one). synchronize_stream/synchronize_event run the
//     one stream concerned forward on the caller; when that stream cannot advance and no other
//     thread is running an operation of this device, they give up (would_deadlock).
//
// Either way a stream's operations run one at a time, in order: only its head starts, under the
// stream's mutex, and `busy` covers an operation that runs with the mutex released.
//
// What keeps it cheap (evr-bench sim measures it):
//   * Enqueuing locks only the stream (plus the registry's table for the handle lookup). When
//     the stream's worker sleeps idle and the new operation is a head that can run, the stream is
//     handed to the runner (a short mutex-guarded list); a stalled, faulted or busy stream, or one
//     that already has work queued, costs nothing more. The enqueuing thread makes a system call
//     only when the runner itself sleeps, and the runner sleeps only after `runner_spin` without
//     work: a burst of enqueues on many streams is served by one awake thread, without a wake-up
//     per operation, and without the enqueuing thread being preempted by the thread it wakes
//     (evr's reactor enqueues its markers under a spin lock).
//   * The runner runs every cheap operation at the head of the streams handed to it, and wakes a
//     stream's worker only when the head needs it (a blocking operation, or a wait on a record of
//     another stream, which the worker listens for). A worker, once awake, runs everything it can
//     before it sleeps again.
//   * Progress waiters (progress.hpp) are told once per batch: before a worker blocks (kernel
//     sleep, kernel body, host function, idle), every `announce_every` operations, and after each
//     runner batch; not after each operation, and nothing is notified when nobody waits.
//
// Faults: an operation starts only after fault_state::on_start() under its stream's mutex, and a
// fence write lands in that same critical section. Whoever sets a fault then runs after_fault(),
// which takes and releases the mutex of every stream of that device: once it returns, no
// operation of the device is between its fault check and its effect, so no fence lands and no
// host function starts after inject_fault() returns. Operations already running (a host function,
// a kernel body) finish.
//
// Lock order (outer first): progress → registry stream table → event_core::mutex →
// stream_state::mutex → fault_state::mutex. The runner's mutex is a leaf: nothing else is held
// with it. A stream's mutex is never held while another stream's is taken, nor across a call to
// progress_signal::notify() or wait*() (has_waiters() takes no lock and may be asked with it).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include <evr/sim/device.hpp>

#include "counters.hpp"
#include "model.hpp"
#include "progress.hpp"
#include "registry.hpp"

namespace evr::sim::detail {

class scheduler {
 public:
  /// `faults` has one entry per simulated GPU and outlives the scheduler, as do `reg`, `count`.
  /// Threaded mode: starts the runner thread (throws std::system_error if it cannot).
  scheduler(run_mode mode, fault_state* faults, registry& reg, counters& count);
  /// Stops and joins the runner; the device has stopped the workers (stop_all) before.
  ~scheduler();
  scheduler(const scheduler&) = delete;
  scheduler& operator=(const scheduler&) = delete;

  bool threaded() const noexcept { return mode_ == run_mode::threaded; }
  progress_signal& progress() noexcept { return progress_; }

  // --- enqueueing (any thread) ---------------------------------------------------------------
  /// Enqueues `op` on `s` unless its device has faulted (then returns the fault).
  std::error_code enqueue(const std::shared_ptr<stream_state>& s, operation op);
  /// Appends `op` to `s`, whose mutex the caller holds; returns true when `s` must be handed to
  /// the runner: then the caller calls hand_to_runner(s) once it has released the mutex.
  bool push_locked(stream_state& s, operation&& op);
  /// Puts `s` on the runner's list, waking the runner if it sleeps (no stream mutex held).
  void hand_to_runner(std::shared_ptr<stream_state> s);

  // --- running ---------------------------------------------------------------------------------
  enum class outcome {
    ran,      ///< the head ran and completed
    blocked,  ///< nothing could start (empty, stalled, busy, faulted, waiting on a record)
    faulted,  ///< the head was about to start and faulted the device: call after_fault()
  };
  /// Runs the head of `s` on the calling thread. `lock` holds s.mutex on entry and on return; it
  /// is released while a kernel sleeps or a kernel body or host function runs (s.busy keeps
  /// anyone else from starting the next operation meanwhile).
  outcome run_one(std::unique_lock<std::mutex>& lock, stream_state& s);
  /// After a fault was set (no stream mutex held): the barrier described above, then wakes the
  /// progress waiters (synchronize_* return the fault).
  void after_fault(int device);
  /// True when the head of `s` may start now (s.mutex held).
  bool can_start(const stream_state& s) const noexcept;

  /// Threaded mode: starts the worker thread of `s` (which must outlive it: the registry or the
  /// device's destructor joins it). Throws std::system_error when no thread can be made.
  void start_worker(stream_state& s);
  /// Stops every worker and the runner (pending work is dropped; a running body or host function
  /// finishes) and joins them. For the device's destructor.
  void stop_all();
  /// Joins the workers of destroyed streams that have drained (threaded) or drops drained
  /// destroyed streams (manual). Never joins a worker that is still running.
  void reap();

  // --- manual mode -----------------------------------------------------------------------------
  /// Runs up to `n` operations of `s` on the calling thread.
  std::size_t step(stream_state& s, std::size_t n);
  /// Runs every stream (in creation order, again and again) until none can advance.
  std::size_t run_until_blocked();
  /// A manual-mode synchronize that cannot run its stream forward: waits for one notification
  /// if another thread is running an operation (it may unblock us) and returns true; returns
  /// false when nobody is (nothing will ever change: the caller gives up). `advanced` (called
  /// with no stream mutex held) says whether the caller could go on now without waiting.
  template <typename Advanced>
  bool manual_wait_or_give_up(Advanced advanced) {
    bool give_up = false;
    progress_.wait_once([&] {
      if (advanced()) return true;
      if (!any_busy()) give_up = true;
      return give_up;
    });
    return !give_up;
  }

  // --- quiescence ------------------------------------------------------------------------------
  /// True when some operation of this device is running on some thread.
  bool any_busy() const;
  /// Nothing is running and (threaded) nothing can start: only a test action changes anything.
  /// The streams are checked one at a time, so a record that completes during the check (after
  /// its waiter was seen blocked, before its own stream was seen drained) would fool it: the check
  /// is taken again if `records_completed_` moved meanwhile.
  bool quiescent() const;

  /// The tag host functions run under (see in_host_func).
  const void* owner() const noexcept { return this; }
  /// True when the calling thread runs a host function of the scheduler tagged `owner`.
  static bool in_host_func(const void* owner) noexcept;

 private:
  static constexpr std::size_t announce_every = 1024;
  /// How long the runner polls for more work (yielding) before it sleeps.
  static constexpr std::chrono::microseconds runner_spin{50};

  void run_kernel(std::unique_lock<std::mutex>& lock, stream_state& s, operation& op);
  void worker_main(stream_state& s);
  void runner_main();
  /// The runner's part for one stream: its cheap head operations; then the worker, if needed.
  /// Returns true when it ran an operation.
  bool serve(stream_state& s);
  void stop_runner();
  fault_state& fault_of(const stream_state& s) const noexcept { return faults_[s.device]; }

  const run_mode mode_;
  fault_state* const faults_;
  registry& registry_;
  counters& count_;
  progress_signal progress_;
  /// Records completed so far, bumped (release) by whoever runs a record operation, under its
  /// stream's mutex; quiescent() reads it around its walk over the streams.
  std::atomic<std::uint64_t> records_completed_{0};

  // The runner (threaded mode).
  std::mutex runner_mutex_;
  std::condition_variable runner_cv_;
  std::vector<std::shared_ptr<stream_state>> ready_;  ///< streams handed to the runner
  std::atomic<bool> has_ready_{false};  ///< ready_ is not empty: polled without the mutex
  bool runner_idle_ = false;            ///< the runner sleeps on runner_cv_
  bool runner_stop_ = false;
  std::thread runner_;
};

}  // namespace evr::sim::detail
