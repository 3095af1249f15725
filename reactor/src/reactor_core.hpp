// reactor/src/reactor_core.hpp — the reactor's machinery (the public evr::reactor holds one).
//
// Threads: submit / cancel / cancel_owner / stop / metrics run on any thread; everything named
// "(reactor)" runs only on the reactor thread and needs no lock. The reactor thread holds a
// shared_ptr to the core, so the core outlives the thread even when the reactor is destroyed from
// one of its own inline handlers.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <evr/pool/pool_set.hpp>
#include <evr/reactor/detail/deferred_posts.hpp>
#include <evr/reactor/detail/poll_host.hpp>
#include <evr/reactor/detail/wait_op.hpp>
#include <evr/reactor/metrics.hpp>
#include <evr/reactor/options.hpp>
#include <evr/reactor/wait_target.hpp>

#include "idle_policy.hpp"
#include "intrusive_stack.hpp"
#include "strategy_traits.hpp"
#include "stream_state.hpp"
#include "wakeup.hpp"

namespace evr::detail {

/// Cumulative counters (relaxed: they are statistics, read racily). Every one but `rejected` is
/// written under the pass lock only (the reactor thread, or a host's pass), with bump(): no
/// locked read-modify-write on the hot path.
struct atomic_metrics {
  std::atomic<std::uint64_t> submitted{0}, completed{0}, cancelled{0}, failed{0}, rejected{0},
      sweeps{0}, event_queries{0}, stream_queries{0}, doorbells{0}, parks{0}, device_faults{0},
      prediction_misses{0}, detached{0}, busy_ns{0}, host_passes{0}, host_completions{0};
  std::array<std::atomic<std::uint64_t>, latency_histogram::buckets> detect_to_deliver{};
  std::array<std::atomic<std::uint64_t>, latency_histogram::buckets> submit_to_deliver{};
  std::array<std::atomic<std::uint64_t>, latency_histogram::buckets> nap_overshoot{};
  std::array<std::atomic<std::uint64_t>, latency_histogram::buckets> fault_probe_time{};
};

/// What a wait aborted by cancellation or shutdown completes with (the Asio front end maps it to
/// its flavour's asio::error::operation_aborted; the core is Asio-free).
inline std::error_code aborted_error() noexcept { return make_error_code(errc::operation_aborted); }

/// Adds `n` to a counter that only the holder of the pass lock writes: a plain add published
/// with a relaxed store, readable from any thread with a relaxed load. Not for shared counters.
inline void bump(std::atomic<std::uint64_t>& c, std::uint64_t n = 1) noexcept {
  c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

/// Adds one sample to a latency histogram written only by the reactor thread (bump).
inline void add_sample(std::array<std::atomic<std::uint64_t>, latency_histogram::buckets>& h,
                       std::chrono::nanoseconds d) noexcept {
  const auto ns = static_cast<std::uint64_t>(std::max<std::int64_t>(d.count(), 1));
  const int bucket = std::min<int>(latency_histogram::buckets - 1, std::bit_width(ns) - 1);
  bump(h[static_cast<std::size_t>(bucket)]);
}

class reactor_core : public std::enable_shared_from_this<reactor_core> {
 public:
  reactor_core(device::backend& backend, reactor_options options);
  ~reactor_core();

  void start();  // launches the thread (needs shared_from_this)
  /// `window`: for a hosted wait (op->host_), its expected window (reactor_access::submit_hosted).
  std::error_code submit(wait_op* op, const wait_target& target,
                         host_window* window = nullptr) noexcept;
  /// See detail::poll_here (reactor.hpp). Any thread but the reactor's.
  poll_result poll_here(poll_host& host) noexcept;
  bool cancel(wait_op* op) noexcept;  ///< true: this call moved op from pending to cancelled
  /// The two halves of cancel(): the CAS pending -> cancel_requested (touches only `op`), and,
  /// for the winner only, the push onto the cancellation stack.
  static bool request_cancel(wait_op* op) noexcept;
  void push_cancel(wait_op* op) noexcept;
  void cancel_owner(std::uintptr_t owner) noexcept;
  void stop(bool destroying) noexcept;
  /// See detail::detach_group (reactor.hpp). Any thread; blocks for the reactor's answer.
  std::vector<wait_op*> detach_group(std::uintptr_t group);
  reactor_metrics metrics() const noexcept;
  std::chrono::nanoseconds cpu_time() const noexcept;
  /// (reactor) hold_until_batch_end for this reactor's batch under way (deferred_posts.hpp).
  bool hold_posts(deferred_posts& d) noexcept;
  bool on_reactor_thread() const noexcept {
    return thread_id_.load(std::memory_order_acquire) == std::this_thread::get_id();
  }

  device::backend& backend_;
  const reactor_options options_;
  const strategy_traits traits_;
  pool_set pools_;

 private:
  using clock = std::chrono::steady_clock;
  static constexpr int max_devices = pool_set::max_devices;

  // --- submit side ---------------------------------------------------------------------------
  std::error_code find_stream(const wait_target& target, stream_state*& out) noexcept;
  std::error_code put_marker(stream_state& st, wait_op& op) noexcept;
  static void host_func_done(void* state) noexcept;  // host_func strategy marker
  static void doorbell_rang(void* state) noexcept;   // adaptive doorbell

  // --- the pass lock ---------------------------------------------------------------------------
  // Everything named "(reactor)" below runs under it: on the reactor thread, or in a host's pass
  // (poll_here) on the host's thread. acquire/release: a pass sees every field the previous one
  // wrote, whichever thread ran it. The reactor thread holds it for each pass of its loop and
  // never while it sleeps or runs user code (an inline handler may call poll_here's front end).
  bool try_begin_pass() noexcept {
    return !in_pass_.load(std::memory_order_relaxed) &&
           !in_pass_.exchange(true, std::memory_order_acquire);
  }
  void begin_pass() noexcept {
    while (!try_begin_pass()) {
      // A host's pass is a sweep of its streams: microseconds.
    }
  }
  void end_pass() noexcept { in_pass_.store(false, std::memory_order_release); }
  /// (reactor thread) Takes the pass lock unless it holds it; leave_pass gives it up before the
  /// thread blocks (while it sleeps, hosts may run passes).
  void enter_pass() noexcept {
    if (!holds_pass_) begin_pass();
    holds_pass_ = true;
  }
  void leave_pass() noexcept {
    if (holds_pass_) end_pass();
    holds_pass_ = false;
  }

  // --- reactor thread ------------------------------------------------------------------------
  void run(std::shared_ptr<reactor_core> self);
  bool take_inputs(clock::time_point now);                     // (reactor) controls + submissions
  void report_fault(int device, std::error_code ec) noexcept;  // any thread
  bool take_reported_faults();                                 // (reactor)
  bool accept_submissions(clock::time_point now);   // (reactor) takes the submission stack
  void accept(wait_op* op, clock::time_point now);  // (reactor)
  void handle_cancel(wait_op* op);                  // (reactor)
  void handle_owner_cancel(std::uintptr_t owner);   // (reactor)
  /// One detach_group call: what the reactor hands back. Answered once no cancel request is in
  /// flight (a wait retired with one pending is in no list until it arrives).
  struct detach_request {
    std::uintptr_t group = 0;
    std::vector<wait_op*> detached;  // (reactor) until done
    bool done = false;               // guarded by detach_mutex_
  };
  void take_detach_requests();               // (reactor)
  void detach_collect(detach_request& req);  // (reactor) timelines, loose_, ready_
  bool detach_claims(wait_op* op);  // (reactor) a retired wait's cancel came: group detaching?
  void finish_detach(detach_request& req) noexcept;     // (reactor) answers the requester
  void close_detach_requests() noexcept;                // (reactor) at the end of the thread
  std::vector<wait_op*> detach_here(std::uintptr_t g);  // (reactor) from an inline handler
  bool sweep(clock::time_point now);                    // (reactor) all active streams + loose
  /// (reactor) Looks at `st` once (its strategy's markers, then a due fault probe when
  /// `may_probe`); learns from what retired. Returns true when something retired or failed.
  bool look_at(stream_state& st, clock::time_point now, bool may_probe);
  void drop_idle_streams() noexcept;  // (reactor) active_ keeps only streams with entries
  /// (reactor, a host's pass) Looks at the streams whose oldest wait is `host`'s and whose host
  /// plan is due; then plans them and says when the host should look next.
  void sweep_for_host(poll_host& host, clock::time_point now, poll_result& out);
  /// (reactor) The host of `st`'s oldest wait (nullptr: none, or a cancelled wait's ghost).
  static poll_host* host_of(const stream_state& st) noexcept;
  /// (reactor) plan_stream's part for a stream whose oldest wait has a host; true when the host
  /// covers the window and the reactor only looks after it (the plan is then complete).
  /// Sets the host's plan (stream_state::host_look, host_spin) and tells the host when it does
  /// not know; for a host that polls also the reactor's (skip, plan_wake: the window's end). For
  /// a host to be woken, `wake_host` is when the reactor must wake it, if not yet.
  bool plan_hosted(stream_state& st, poll_host& host, const stream_outlook& o,
                   clock::time_point now, clock::time_point& wake_host);
  bool sweep_poll(stream_state& st);
  bool sweep_word(stream_state& st, std::uint64_t word);
  bool sweep_event_front(stream_state& st);  // fence strategies: event markers at the front
  /// The first `run` entries of `st` are event markers (0: as many as lead the timeline, counted
  /// only once the oldest is known done): retires those that are done, from the front, after one
  /// query of the oldest, one of the newest of the run and a bisection between (events of one
  /// stream complete in record order). An error of the oldest fails it, or its device. Returns
  /// true when something was retired or failed.
  bool sweep_event_run(stream_state& st, std::size_t run);
  bool probe(stream_state& st, clock::time_point now);
  /// (reactor) Sweeps skip `st` until `t`, or until its fault probe is due if that comes first.
  void skip_until(stream_state& st, clock::time_point t) const noexcept;
  bool sweep_loose();
  void arm_doorbell(stream_state& st);
  void learn(stream_state& st, clock::time_point now);  // (reactor) a service-time sample
  /// Retires the `count` oldest entries of `st` (all of them at most) with `ec`.
  void retire_front(stream_state& st, std::size_t count, std::error_code ec);
  /// The exactly-once handshake with cancel for a pending wait the reactor is done with: true when
  /// the reactor now owns its completion; false when a cancel request is in flight (that request
  /// delivers it: the wait is parked as retired_awaiting_cancel).
  bool settle(wait_op* op) noexcept;
  void retire_op(wait_op* op, std::error_code ec);  // settle, then deliver with `ec`
  /// Every pending wait (timelines, loose_) for which `take(op)` returns true leaves its list: a
  /// timeline entry keeps its marker (op nulled, the GPU must still pass it), a loose_ wait is
  /// removed. `take` must settle the wait. (reactor)
  template <class Take>
  void take_pending_if(Take&& take);
  void fail_stream(stream_state& st, std::error_code ec);
  void fail_device(int device, std::error_code ec);
  void abort_everything();
  void deliver_batch(clock::time_point detected);
  void release_events();             // (reactor) returns retired markers to their pools
  void flush_held_posts() noexcept;  // (reactor) every front end's held posts, posted now
  // idle policy (reactor/src/reactor_idle.cpp)
  void idle(clock::time_point now, bool progress, bool took_new);
  void idle_ladder(clock::time_point now);
  void idle_predictive(clock::time_point now);
  /// (reactor) Predicts `st` again: its skip (query_after, on_poll_tick), doorbell and plan_*.
  void plan_stream(stream_state& st, clock::time_point now);
  void nap_until(clock::time_point until, bool learn_overshoot);
  clock::time_point service_start(const stream_state& st) const noexcept;
  bool has_inputs() const noexcept;
  std::error_code select_device(int device) noexcept;
  /// (a host's pass) Undoes what select_device changed on the host's thread: its current device
  /// and stream-capture mode are the user's.
  void end_borrowed_thread() noexcept;

  std::shared_ptr<wakeup> wake_ = std::make_shared<wakeup>();
  stream_table streams_;
  fence_allocator fences_;
  intrusive_stack<wait_op, &wait_op::next_> submissions_;
  intrusive_stack<wait_op, &wait_op::cancel_next_> cancels_;
  std::mutex owner_cancel_mutex_;
  std::vector<std::uintptr_t> owner_cancels_;  // guarded by owner_cancel_mutex_
  std::atomic<bool> owner_cancel_pending_{false};
  // detach_group requests (reactor_service::shutdown): queued under the mutex, flagged for the
  // reactor's input check (seq_cst: part of the wake handshake), answered through the condition.
  std::mutex detach_mutex_;
  std::condition_variable detach_cv_;
  std::vector<detach_request*> detach_queue_;  // guarded by detach_mutex_
  bool detach_closed_ = false;                 // guarded by detach_mutex_: the thread has ended
  std::atomic<bool> detach_pending_{false};
  std::vector<detach_request*> detaching_;  // (reactor) waiting for cancels in flight
  // Sticky errors met by submitters (a marker that could not be enqueued): the driver reports a
  // fault lazily, sometimes only to calls on the faulted stream, so a submitter may learn of it
  // before any of the reactor's own queries do. The reactor then fails the whole device.
  std::array<std::atomic<int>, max_devices> reported_fault_{};
  // fence / adaptive: fence markers enqueued and not yet retired, per device (submitters add,
  // the reactor subtracts; relaxed: a threshold, not a synchronization).
  std::array<std::atomic<std::int64_t>, max_devices> pending_fences_{};
  // fence / adaptive: streams with markers pending, per device (a stream counts while its
  // stream_state::pending_markers is non-zero: whoever moves that from 0 to 1 adds, whoever moves
  // it from 1 to 0 subtracts). While more than fence_stream_limit_ streams of a device are busy,
  // every new wait there records an event (put_marker says why).
  std::array<std::atomic<std::int64_t>, max_devices> busy_streams_{};
  std::int64_t fence_stream_limit_ = 0;
  void marker_enqueued(stream_state& st, bool fence) noexcept {
    if (fence) pending_fences_[st.device].fetch_add(1, std::memory_order_relaxed);
    if (st.pending_markers.fetch_add(1, std::memory_order_relaxed) == 0)
      busy_streams_[st.device].fetch_add(1, std::memory_order_relaxed);
  }
  /// `count` markers of `st` retired, `fences` of them fence writes.
  void markers_retired(stream_state& st, std::int64_t count, std::int64_t fences) noexcept {
    if (fences > 0) pending_fences_[st.device].fetch_sub(fences, std::memory_order_relaxed);
    if (st.pending_markers.fetch_sub(count, std::memory_order_relaxed) == count)
      busy_streams_[st.device].fetch_sub(1, std::memory_order_relaxed);
  }
  int device_count_ = 0;  // at construction; names the device of a fault when only one exists
  std::atomic<bool> fault_reported_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> in_pass_{false};  // the pass lock (try_begin_pass)
  bool holds_pass_ = false;           // (reactor thread) it holds the pass lock now
  std::mutex stop_mutex_;             // serializes stop() callers (join once)
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};
  std::atomic<bool> cpu_clock_valid_{false};
  std::uint64_t cpu_clock_id_ = 0;  // clockid_t of the reactor thread, set before cpu_clock_valid_
  atomic_metrics m_;

  // (reactor) state
  std::vector<stream_state*> active_;  // streams with entries
  std::vector<wait_op*> loose_;        // waits on user events
  std::size_t loose_cursor_ = 0;
  std::vector<std::pair<wait_op*, std::error_code>> ready_;               // retired, to deliver
  std::vector<std::pair<event_pool*, device::native_event>> abandoned_;   // pending at abort
  std::vector<std::pair<event_pool*, device::native_event>> to_release_;  // GPU past them
  // Front ends holding posts back until the end of the batch under way (deferred_posts.hpp): one
  // per Asio flavour in use, so a few slots are plenty (a front end beyond them posts at once).
  std::array<deferred_posts*, 4> held_posts_{};
  std::size_t held_posts_count_ = 0;
  std::array<std::error_code, max_devices> device_fault_{};
  std::size_t pending_ops_ = 0;      // ops in timelines or loose_ (not ghosts)
  std::size_t awaiting_cancel_ = 0;  // retired while a cancel request is in flight
  int current_device_ = -1;          // the reactor thread's (select_device caches it)
  // A host's pass (poll_here) runs on the host's thread: select_device saves what it changes.
  bool borrowed_ = false;           // the pass under way is a host's
  bool borrowed_changed_ = false;   // ... and it changed the thread's device or capture mode
  int borrowed_device_ = -1;        // the device it made current (-1: none yet)
  int borrowed_saved_device_ = -1;  // the thread's own, to restore
  int borrowed_capture_mode_ = 0;   // the thread's own capture mode, to restore
  bool closed_ = false;
  bool aborted_fences_ = false;
  clock::time_point drain_deadline_{};
  // idle policy state (reactor thread)
  idle_settings idle_settings_;    // window_poll_period is re-planned (poll_budget); the rest fixed
  ladder ladder_;                  // idle_mode::ladder
  sleep_overshoot overshoot_;      // idle_mode::predictive: how late timed sleeps end
  look_cost look_cost_;            // predictive: what a poll tick's sweep costs (poll_budget)
  clock::time_point poll_tick_{};  // predictive: when irregular work in its windows is looked at
  std::chrono::nanoseconds tick_period_{};  // predictive: the last spacing of the ticks
  clock::time_point replan_at_{};    // predictive: while spinning, re-plan no sooner than this
  clock::time_point loose_since_{};  // last progress of the loose waits (or the first one)
};

}  // namespace evr::detail
