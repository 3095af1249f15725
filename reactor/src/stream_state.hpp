// reactor/src/stream_state.hpp — what the reactor knows of one stream, and the lock-free table
// that finds it from any submitting thread.
//
// A stream_state is created by the first submission on its stream (on the submitting thread:
// allocation and fence-word allocation never happen on the reactor thread) and lives as long as
// the reactor (a stream's identity is its handle; see docs/architecture.md). A record shared by
// the reactor's parts, each section written by the one named:
//   * submit side (submitter, any thread): marker_lock_ orders markers; next_seq_ is guarded by it.
//   * device side: fence_host is written by the GPU (fence strategy); host_done, doorbell_rang
//     and host_funcs_outstanding by host functions on a driver thread.
//   * reactor side (under the pass lock: the reactor thread, or a host's pass): the timeline and
//     its bookkeeping (wait_registry; the fault probe's time: stream_sweep), and the plan
//     (idle_governor: the stream's model and when it is looked at next, and by whom). A few
//     values are published for submitters (relaxed atomics: a submission reads them only after
//     seeing the reactor napping, and the reactor stores them before announcing the nap, see
//     wakeup.hpp; a host's submit-time estimate is a hint either way).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <system_error>
#include <vector>

#include <evr/device/backend.hpp>

#include "idle_policy.hpp"
#include "timeline.hpp"
#include "wakeup.hpp"

namespace evr {
class event_pool;
}  // namespace evr

namespace evr::detail {

struct stream_state {
  // --- identity: immutable once published in the table ---------------------------------------
  device::native_stream native = nullptr;
  int key_device = -1;  // the current device for the legacy default stream, else -1
  int device = -1;

  // --- submit side ---------------------------------------------------------------------------
  std::atomic_flag marker_lock_ = ATOMIC_FLAG_INIT;
  std::uint64_t next_seq_ = 0;  // guarded by marker_lock_
  /// The pool of this stream's event markers (the plain pool of its device), set by the first
  /// submission that takes one (every writer stores the same pointer) and read by the reactor
  /// when it retires an entry with an event: the op's push / take publishes it. Kept here rather
  /// than in every wait and every timeline entry.
  std::atomic<event_pool*> marker_pool{nullptr};

  void lock_markers() noexcept {
    // acquire: the previous holder's next_seq_ update and marker enqueue happen-before ours.
    while (marker_lock_.test_and_set(std::memory_order_acquire)) {
      while (marker_lock_.test(std::memory_order_relaxed)) {
      }
    }
  }
  void unlock_markers() noexcept { marker_lock_.clear(std::memory_order_release); }

  // --- device side ---------------------------------------------------------------------------
  std::uint64_t* fence_host = nullptr;  // read with acquire loads (std::atomic_ref)
  std::uint64_t fence_device = 0;
  /// host_func strategy: host functions run so far on this stream (release by the host function,
  /// acquire by the reactor: makes the GPU's progress visible with the count).
  std::atomic<std::uint64_t> host_done{0};
  std::atomic<bool> doorbell_rang{false};
  std::atomic<std::int64_t> host_funcs_outstanding{0};
  std::shared_ptr<wakeup> wake;  // shared: a host function may outlive the reactor
  /// When a probed wait's caller last saw the fence word reach its value (steady clock ns;
  /// wait_probe::saw_reached, any thread, relaxed): the plan learns the work from it, as the
  /// reactor did not look during the caller's window.
  std::atomic<std::int64_t> probe_seen_ns{0};
  /// The window end of the latest probed signalled wait submitted on this stream (steady clock
  /// ns; written by its submitter before the wait is pushed, read by the reactor after it took
  /// the wait: the push orders them, and the reactor may see a later submission's value): a
  /// signalled wait's own bytes hold its count (wait_op::probed_). With several such waits
  /// pending (one loop's, or several loops' on one stream), they share the latest submission's
  /// window: the reactor's first look at an older one may come later than its own caller's window
  /// closes (as late as the newer window's end) or sooner.
  std::atomic<std::int64_t> signal_covered_until_ns{0};

  // --- reactor side: the timeline (wait_registry) --------------------------------------------
  // On cache lines of its own: submitters write the fields above on every submission, and the
  // reactor reads these for every active stream on every sweep and plan.
  alignas(64) timeline entries;
  bool active = false;  // in the registry's active streams (it has entries)
  std::uint64_t completed_seq = 0;
  idle_time retired_submit{};     // submission of the newest wait retired by the current look
  bool retired_in_sweep = false;  // ... and one was (idle_governor learns from it, then clears it)
  bool retired_probed = false;    // ... and it was probed (wait_target::probed): not looked at
  idle_time retired_covered_until{};  // ... until then by the reactor, but for scouts
  idle_time last_probe{};             // the last fault probe (stream_sweep), or the activation

  // --- reactor side: the plan (idle_governor, idle_policy.hpp) --------------------------------
  struct plan_state {
    service_time_model model;
    idle_time last_look{};      // the last look that saw the oldest wait still pending
    idle_time last_done{};      // estimated completion of the newest retired wait
    idle_time waiting_since{};  // since the last progress
    bool missed = false;        // the oldest wait outlived its prediction (counted once)
    bool doorbell_armed = false;
    /// Looks before this skip the stream (its oldest wait is before its window; its fault probe
    /// still comes on time): each look at a stream with event markers is a driver query. {}: every
    /// sweep looks.
    idle_time query_after{};
    /// query_after is the reactor's wake before the window: a sweep that reaches it plans the
    /// stream again rather than looking (idle_governor::reached_window).
    bool asleep_before_window = false;
    /// The plan's scout (idle_policy.hpp, next_scout; the reactor's own, a hosted stream's or a
    /// probed wait's): the reactor looks then, although a host or the caller covers the stream;
    /// max() when none is planned or it has been made.
    idle_time scout_at = idle_time::max();
    /// The last wait retired was found by a scout: the work got shorter, and the stream's
    /// unhurried waits are scouted too until a wait is found otherwise.
    bool scout_found = false;
    /// Irregular work in its window (phase::window_poll): looked at only by the sweeps of the poll
    /// tick, or when its fault probe is due; not by the sweeps other streams' completions ask.
    bool on_poll_tick = false;
    /// On the tick: how often the stream wants looking at (the tick comes at this spacing or
    /// sooner; idle_governor::plan_reactor).
    nanoseconds tick_spacing{};
    /// The plan below is kept until the stream is looked at, gets a new wait, or its time comes:
    /// planning every active stream before every nap cost about as much as the looks themselves
    /// with 64 streams.
    bool stale = true;
    std::uint64_t planned_seq = 0;  // the oldest wait when the plan was made
    bool spin = false;              // the plan wants the reactor polling now
    idle_time wake{};  // when the plan wants the reactor awake (its next look, fault probe)
    /// When the oldest wait has a host (poll_host.hpp): when the host should look (max: not its
    /// business now), whether it should spin from then on, and whether the look is a tick of
    /// irregular work (poll_result::next_is_tick); and the last wait the host was told of
    /// (look_by, wake_until), so that it is told once.
    idle_time host_look = idle_time::max();
    bool host_spin = false;
    bool host_tick = false;
    std::uint64_t host_told_seq = 0;
    /// Bumped by every new plan (and when the stream goes idle): a host's schedule entry of an
    /// older epoch is stale (host_schedule.hpp).
    std::uint32_t epoch = 0;
  } plan;

  // --- published for submitters (idle_governor::earliest_completion_ns, window_open_ns) ------
  /// plan.model.low() once ready (irregular work: plus the spacing of its looks), else 0
  std::atomic<std::int64_t> published_low_ns{0};
  std::atomic<std::uint64_t> published_completed_seq{0};  // = completed_seq (wait_registry)
  /// When a wait's window opens, from its service start (window_open_offset), once the model is
  /// ready, else 0: a host arms its timer from it when it submits (reactor_access::submit_hosted).
  std::atomic<std::int64_t> published_open_ns{0};
  /// Which new waits the reactor scouts (idle_governor::scout_if_due): a napping reactor must be
  /// woken for a new wait's first scout (idle_governor::first_scout_ns).
  enum class scouted : std::uint8_t { none, hurried_waits, all_waits };
  std::atomic<scouted> published_scouts{scouted::none};
};

/// Keeps `st` alive, and reachable, for the rest of the process: for a state that a host function
/// still queued on its stream (one that may never run, after a fault) would touch later.
void retain_for_process_lifetime(stream_state* st);
/// Same for fence blocks that a queued fence write may still hit.
void retain_for_process_lifetime(const device::fence_block& block);

/// When a probed wait's caller stops looking (wait_target::probed); {} for any other wait.
inline std::chrono::steady_clock::time_point probed_until(const wait_op& op) noexcept {
  if (!op.probed_) return {};
  const std::int64_t ns = op.signalled_
                              ? op.stream_->signal_covered_until_ns.load(std::memory_order_relaxed)
                              : op.covered_until_ns_;
  return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(ns));
}

/// Lock-free (insert-only) open-addressing table: native stream (+ device for the legacy default
/// stream) → stream_state. Lookups are wait-free loads (acquire); an insert CASes a fully built
/// state into an empty slot (release), so a reader never sees a half-built state.
class stream_table {
 public:
  explicit stream_table(std::size_t max_streams);
  ~stream_table();
  stream_table(const stream_table&) = delete;
  stream_table& operator=(const stream_table&) = delete;

  stream_state* find(device::native_stream native, int key_device) const noexcept;
  /// Inserts `fresh` unless an equal key won the race; returns the state in the table (fresh or
  /// the winner: the caller deletes `fresh` if it lost), or nullptr when the table is full.
  stream_state* insert(stream_state* fresh) noexcept;
  std::size_t size() const noexcept { return count_.load(std::memory_order_relaxed); }

  /// Every state (for teardown), not thread-safe against concurrent inserts.
  template <typename F>
  void for_each(F&& f) {
    for (std::size_t i = 0; i <= mask_; ++i)
      if (stream_state* s = slots_[i].load(std::memory_order_acquire)) f(s);
  }

 private:
  std::size_t home(device::native_stream native, int key_device) const noexcept;
  std::unique_ptr<std::atomic<stream_state*>[]> slots_;
  std::size_t mask_ = 0;
  std::size_t max_ = 0;
  std::atomic<std::size_t> count_{0};
};

/// Fence words for the fence and adaptive strategies: blocks of 64 words per device, allocated on
/// a submitting thread under a mutex (once per 64 streams).
class fence_allocator {
 public:
  explicit fence_allocator(device::backend& backend) : backend_(backend) {}
  ~fence_allocator();
  std::error_code allocate(int device, std::uint64_t*& host, std::uint64_t& device_address);
  /// Keep the blocks alive past the allocator: a fence write still queued on a stream would
  /// otherwise land in freed memory. Used when stop() aborted fence waits.
  void leak_on_destruction() noexcept { leak_ = true; }

 private:
  static constexpr std::size_t block_words = 64;
  struct per_device {
    std::vector<device::fence_block> blocks;
    std::size_t used_in_last = block_words;
  };
  device::backend& backend_;
  std::mutex mutex_;
  std::vector<per_device> devices_;
  bool leak_ = false;
};

}  // namespace evr::detail
