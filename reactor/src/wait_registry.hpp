// reactor/src/wait_registry.hpp — every wait the reactor has accepted and not yet handed to the
// delivery batch: where it is, and how it leaves.
//
// Owns: the active streams (those with timeline entries), the loose waits (on users' events: no
// stream), the count of pending waits and of waits retired while their cancel request is in
// flight, the devices known to be faulted, and the marker events retired (back to their pools
// after the batch) or abandoned (the GPU may never pass them: destroyed with the reactor). Writes
// each stream's timeline and its bookkeeping (stream_state, "the timeline").
//
// How a wait leaves: retire_front (a stream's oldest waits, in order: the sweep, faults, abort),
// retire (one wait: settle, then into the batch), cancel (its cancel request came), or remove_if
// (the one walk over every pending wait: owner cancel, detach, device failure, abort). settle()
// is the reactor's half of the exactly-once handshake with cancellation (wait_op::state_).
//
// Threads: under the pass lock.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <system_error>
#include <utility>
#include <vector>

#include <evr/pool/pool_set.hpp>
#include <evr/reactor/detail/wait_op.hpp>

#include "counters.hpp"
#include "delivery_batch.hpp"
#include "marker_budget.hpp"
#include "strategy_traits.hpp"
#include "stream_state.hpp"

namespace evr::detail {

class wait_registry {
 public:
  using clock = std::chrono::steady_clock;

  wait_registry(const strategy_traits& traits, delivery_batch& batch, marker_budget& markers,
                reactor_counters& counters);
  wait_registry(const wait_registry&) = delete;
  wait_registry& operator=(const wait_registry&) = delete;

  /// A wait on a stream that accept() put in its timeline; `activated`: the stream had none.
  struct accepted {
    stream_state* stream = nullptr;
    bool activated = false;
  };
  /// Takes a submitted wait: into its stream's timeline, the loose waits, or (its device is
  /// faulted) straight into the batch with the fault.
  accepted accept(wait_op* op, clock::time_point now);
  /// The cancel request of a pending wait arrived: it leaves (a timeline entry stays as a ghost:
  /// its marker is still ahead of the GPU) and completes with operation_aborted.
  void cancel(wait_op* op);
  /// The cancel request of a wait retired meanwhile arrived (settle() returned false for it).
  void cancel_arrived() noexcept { --awaiting_cancel_; }

  /// The exactly-once handshake with cancel for a pending wait the reactor is done with: true
  /// when the reactor now owns its completion; false when a cancel request is in flight (that
  /// request delivers it: the wait is parked as retired_awaiting_cancel).
  bool settle(wait_op* op) noexcept;
  void retire(wait_op* op, std::error_code ec) {  // settle, then into the batch with `ec`
    if (settle(op)) batch_.add(op, ec);
  }
  /// Retires the `count` oldest entries of `st` (all of them at most) with `ec`; returns how many
  /// had no event (fence words, host functions).
  std::int64_t retire_front(stream_state& st, std::size_t count, std::error_code ec);
  void fail_stream(stream_state& st, std::error_code ec) {
    retire_front(st, st.entries.size(), ec);
  }
  /// A sticky fault: every pending wait of `device` fails, and later ones at once.
  void fail_device(int device, std::error_code ec);
  const std::error_code& device_fault(int device) const noexcept { return device_fault_[device]; }
  /// Shutdown's end: every pending wait completes with operation_aborted.
  void abort_everything();
  /// Every pending wait for which `take(op)` returns true leaves its list: a timeline entry stays
  /// as a ghost (op nulled: its marker is still ahead of the GPU), a loose wait is removed.
  /// `take` must settle the wait (settle or retire).
  template <class Take>
  void remove_if(Take&& take);

  /// Looks at up to `budget` loose waits, round robin: `look(op)` returns a not-ready error or
  /// the wait's outcome, which retires it. True when one retired (the loose waits' last progress
  /// is then `now`).
  template <class Look>
  bool look_at_loose(std::size_t budget, clock::time_point now, Look&& look);
  /// Streams without entries leave the active list; `went_idle(st)` is called for each. Only
  /// after an entry left some timeline: a pass that retired nothing (most of a busy host's) does
  /// not walk the active streams.
  template <class WentIdle>
  void drop_idle_streams(WentIdle&& went_idle);

  const std::vector<stream_state*>& active() const noexcept { return active_; }
  bool loose_empty() const noexcept { return loose_.empty(); }
  clock::time_point loose_since() const noexcept { return loose_since_; }
  /// Streams or loose waits to look at.
  bool has_work() const noexcept { return !active_.empty() || !loose_.empty(); }
  /// Nothing pending at all: the reactor may park.
  bool idle() const noexcept { return active_.empty() && loose_.empty() && pending_ops_ == 0; }
  /// Every wait completed or handed over, none awaiting its cancel: a stopping reactor may end.
  bool drained() const noexcept {
    return pending_ops_ == 0 && awaiting_cancel_ == 0 && active_.empty();
  }
  std::size_t awaiting_cancel() const noexcept { return awaiting_cancel_; }

  /// Retired markers back to their pools (after the batch that retired them is delivered).
  void release_markers();
  /// At destruction: abandoned markers destroyed (CUDA frees a recorded event once it completes).
  void discard_abandoned();
  /// abort_everything() left fence writes that may still land: keep the fence words.
  bool aborted_fences() const noexcept { return aborted_fences_; }

 private:
  using marker = std::pair<event_pool*, device::native_event>;
  /// Entry `i` of `st` no longer has a wait: a ghost keeps its marker until the GPU is past it;
  /// a device-signalled wait's entry (no marker) leaves the timeline.
  void forget_entry(stream_state& st, std::size_t i) noexcept {
    if (st.entries.at(i).is_signal()) {
      st.entries.erase(i);
      entries_left_ = true;
    } else {
      st.entries.make_ghost(i);
    }
  }
  void take_loose(std::size_t i) noexcept {  // swap-remove: order among loose waits is free
    loose_[i] = loose_.back();
    loose_.pop_back();
  }
  template <class Take>
  void remove_loose_if(Take&& take);

  const strategy_traits& traits_;
  delivery_batch& batch_;
  marker_budget& markers_;
  reactor_counters& counters_;
  std::vector<stream_state*> active_;  // streams with entries
  std::vector<wait_op*> loose_;        // waits on user events
  std::size_t loose_cursor_ = 0;
  clock::time_point loose_since_{};  // last progress of the loose waits (or the first one)
  std::size_t pending_ops_ = 0;      // ops in timelines or loose_ (not ghosts)
  std::size_t awaiting_cancel_ = 0;  // retired while a cancel request is in flight
  std::array<std::error_code, pool_set::max_devices> device_fault_{};
  std::vector<marker> to_release_;  // the GPU is past them
  std::vector<marker> abandoned_;   // it may never be
  bool aborted_fences_ = false;
  bool entries_left_ = false;  // an entry left a timeline since drop_idle_streams last looked
};

template <class Take>
void wait_registry::remove_loose_if(Take&& take) {
  for (std::size_t i = 0; i < loose_.size();) {
    if (take(loose_[i])) {
      take_loose(i);
    } else {
      ++i;
    }
  }
}

template <class Take>
void wait_registry::remove_if(Take&& take) {
  for (stream_state* st : active_) {
    for (std::size_t i = 0; i < st->entries.size();) {
      const timeline_entry& e = st->entries.at(i);
      const bool leaves = e.is_signal();  // read before take(): it may free the operation
      if (e.op == nullptr || !take(e.op)) {
        ++i;
      } else if (leaves) {
        st->entries.erase(i);  // nothing of it on the stream
        entries_left_ = true;
      } else {
        st->entries.make_ghost(i);  // the marker stays
        ++i;
      }
    }
  }
  remove_loose_if(take);
}

template <class Look>
bool wait_registry::look_at_loose(std::size_t budget, clock::time_point now, Look&& look) {
  bool progress = false;
  budget = std::min(budget, loose_.size());
  for (std::size_t n = 0; n < budget && !loose_.empty(); ++n) {
    if (loose_cursor_ >= loose_.size()) loose_cursor_ = 0;
    wait_op* op = loose_[loose_cursor_];
    const std::error_code ec = look(op);
    if (is_not_ready(ec)) {
      ++loose_cursor_;
      continue;
    }
    take_loose(loose_cursor_);
    retire(op, ec);
    progress = true;
  }
  if (progress) loose_since_ = now;
  return progress;
}

template <class WentIdle>
void wait_registry::drop_idle_streams(WentIdle&& went_idle) {
  if (!std::exchange(entries_left_, false)) return;
  // Swap-remove keeps this O(active).
  for (std::size_t i = 0; i < active_.size();) {
    stream_state& st = *active_[i];
    if (st.entries.empty()) {
      st.active = false;
      went_idle(st);
      active_[i] = active_.back();
      active_.pop_back();
    } else {
      ++i;
    }
  }
}

}  // namespace evr::detail
