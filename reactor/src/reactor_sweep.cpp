// reactor/src/reactor_sweep.cpp — how far each stream got: per strategy (event queries with
// bisection, fence words, host-function counters), fault probes, user-event waits; retiring
// waits in stream order, failing streams and devices, aborting at shutdown; the service-time
// samples the idle policy learns from. Everything here runs on the reactor thread.
#include <algorithm>
#include <atomic>

#include "reactor_core.hpp"

namespace evr::detail {
namespace {

std::uint64_t load_fence(const std::uint64_t* word) {
  // acquire: pairs with the device's write; what the GPU wrote before the fence is visible.
  return std::atomic_ref<std::uint64_t>(*const_cast<std::uint64_t*>(word))
      .load(std::memory_order_acquire);
}

}  // namespace

bool reactor_core::settle(wait_op* op) noexcept {
  // acq_rel: the winner of pending→{done, cancel_requested} decides the outcome exactly once.
  std::uint8_t prev = op->state_.exchange(wait_op::done, std::memory_order_acq_rel);
  --pending_ops_;
  if (prev == wait_op::cancel_requested) {
    op->phase_ = wait_op::phase::retired_awaiting_cancel;  // its cancel request delivers it
    ++awaiting_cancel_;
    return false;
  }
  return true;
}

void reactor_core::retire_op(wait_op* op, std::error_code ec) {
  if (settle(op)) ready_.emplace_back(op, ec);
}

void reactor_core::retire_front(stream_state& st, std::size_t count, std::error_code ec) {
  count = std::min(count, st.entries.size());
  std::int64_t fences = 0;
  for (std::size_t i = 0; i < count; ++i) {
    timeline_entry e = st.entries.front();
    st.entries.pop_front();
    if (e.event == nullptr) ++fences;
    st.completed_seq = std::max(st.completed_seq, e.seq);
    if (e.op != nullptr && !ec) {
      st.retired_submit = e.op->submitted_at_;  // the newest retired wait: learn() samples it
      st.retired_in_sweep = true;
    }
    if (e.event != nullptr) {
      event_pool* pool = st.marker_pool.load(std::memory_order_relaxed);
      if (!ec) {
        // The GPU is past it: back to the pool, after this sweep's completions are delivered
        // (returning it is not on the latency path).
        to_release_.emplace_back(pool, e.event);
      } else {
        // Failed: never reuse it; destroyed with the reactor, off this thread.
        abandoned_.emplace_back(pool, e.event);
      }
    }
    if (e.op != nullptr) retire_op(e.op, ec);
  }
  // Counters shared with submitters move once per batch, not once per wait.
  if (traits_.fence_markers && count > 0)
    markers_retired(st, static_cast<std::int64_t>(count), fences);
  st.published_completed_seq.store(st.completed_seq, std::memory_order_relaxed);
}

bool reactor_core::sweep_event_run(stream_state& st, std::size_t run) {
  if (auto ec = select_device(st.device)) {
    fail_stream(st, ec);
    return true;
  }
  // Oldest first: a pending stream costs one cheap query (~0.17 us on the H100).
  auto query = [&](std::size_t i) {
    bump(m_.event_queries);
    return backend_.query_event(st.entries.at(i).event);
  };
  std::error_code ec = query(0);
  if (is_not_ready(ec)) return false;
  if (ec) {
    if (is_sticky(ec)) {
      fail_device(st.device, ec);
    } else {
      retire_front(st, 1, ec);  // this event alone is broken (e.g. destroyed handle)
    }
    return true;
  }
  // The oldest is done. If the newest of the run is done too, all of it is (events of one stream
  // complete in record order, and seq order is record order): one more query covers the run.
  if (run == 0) {  // the events at the front: counted only now, not on every pending sweep
    run = 1;
    while (run < st.entries.size() && st.entries.at(run).event != nullptr) ++run;
  }
  std::size_t done = 1;
  if (run > 1) {
    std::error_code last = query(run - 1);
    if (!last) {
      done = run;
    } else if (is_not_ready(last)) {
      // Bisect between a done entry (lo) and a pending one (hi).
      std::size_t lo = 0, hi = run - 1;
      while (hi - lo > 1) {
        std::size_t mid = lo + (hi - lo) / 2;
        std::error_code m = query(mid);
        if (!m) {
          lo = mid;
        } else if (is_not_ready(m)) {
          hi = mid;
        } else {
          break;  // an error: retire what is known done; a later sweep meets the error first
        }
      }
      done = lo + 1;
    }  // else an error of the newest: met from the front on the next sweeps
  }
  retire_front(st, done, {});
  return true;
}

bool reactor_core::sweep_poll(stream_state& st) { return sweep_event_run(st, st.entries.size()); }

bool reactor_core::sweep_word(stream_state& st, std::uint64_t word) {
  // Entries are in sequence order: count those the word covers, then retire them in one batch.
  std::size_t covered = 0;
  while (covered < st.entries.size() && st.entries.at(covered).seq <= word) ++covered;
  retire_front(st, covered, {});
  return covered > 0;
}

bool reactor_core::sweep_event_front(stream_state& st) {
  // Event markers among fence entries (a busy device's overflow, or more busy streams than
  // hardware queues: then every new wait records one): the word cannot vouch for an event entry
  // at the front until a later fence lands, so the run of events at the front is queried as
  // sweep_poll queries a whole stream. A further run behind fence entries waits for the next
  // sweep (which comes at once after progress).
  return !st.entries.empty() && st.entries.front().event != nullptr && sweep_event_run(st, 0);
}

bool reactor_core::probe(stream_state& st, clock::time_point now) {
  if (now - st.last_probe < options_.fault_probe_interval) return false;
  st.last_probe = now;
  if (auto ec = select_device(st.device)) {
    fail_stream(st, ec);
    return true;
  }
  bump(m_.stream_queries);
  const clock::time_point asked = clock::now();
  std::error_code ec = backend_.query_stream(st.native);
  add_sample(m_.fault_probe_time, clock::now() - asked);
  if (is_not_ready(ec)) return false;
  if (ec) {
    if (is_sticky(ec))
      fail_device(st.device, ec);
    else
      fail_stream(st, ec);
    return true;
  }
  // The stream is idle: every marker enqueued before this query has executed, which includes
  // every entry (the reactor accepted each after its marker was enqueued). A word that still lags
  // would mean a lost write; complete the waits rather than hang them.
  const bool progress = !st.entries.empty();
  retire_front(st, st.entries.size(), {});
  return progress;
}

void reactor_core::skip_until(stream_state& st, clock::time_point t) const noexcept {
  st.query_after =
      traits_.fault_probes ? std::min(t, st.last_probe + options_.fault_probe_interval) : t;
}

void reactor_core::arm_doorbell(stream_state& st) {
  if (backend_.stream_is_capturing(st.native)) return;  // never add work to a user's capture
  st.host_funcs_outstanding.fetch_add(1, std::memory_order_relaxed);
  st.doorbell_rang.store(false, std::memory_order_relaxed);
  std::error_code ec = backend_.launch_host_func(st.native, &reactor_core::doorbell_rang, &st);
  if (ec) {
    st.host_funcs_outstanding.fetch_sub(1, std::memory_order_relaxed);
    if (is_sticky(ec)) fail_device(st.device, ec);
    st.doorbell_armed = true;  // do not retry every sweep; the fault probe covers this stream
    return;
  }
  st.doorbell_armed = true;
  bump(m_.doorbells);
}

bool reactor_core::sweep_loose() {
  bool progress = false;
  std::size_t budget = std::min(options_.loose_query_budget, loose_.size());
  for (std::size_t n = 0; n < budget && !loose_.empty(); ++n) {
    if (loose_cursor_ >= loose_.size()) loose_cursor_ = 0;
    wait_op* op = loose_[loose_cursor_];
    if (auto ec = select_device(op->device_)) {
      loose_[loose_cursor_] = loose_.back();
      loose_.pop_back();
      retire_op(op, ec);
      progress = true;
      continue;
    }
    bump(m_.event_queries);
    std::error_code ec = backend_.query_event(op->event_);
    if (is_not_ready(ec)) {
      ++loose_cursor_;
      continue;
    }
    progress = true;
    // Even a sticky error fails only this wait: the device a user's event belongs to is the one
    // the user named, which may be wrong; the device's own streams report their fault through
    // their own queries and probes.
    loose_[loose_cursor_] = loose_.back();
    loose_.pop_back();
    retire_op(op, ec);
  }
  return progress;
}

bool reactor_core::sweep(clock::time_point now) {
  bump(m_.sweeps);
  bool progress = false;
  // The poll tick: irregular work in its windows is looked at by this sweep if the tick has come
  // (all of it at once: one sweep and one wake-up per window_poll_period, however many streams).
  const bool poll_tick = now >= poll_tick_;
  std::size_t polled = 0;  // streams looked at on the tick
  for (std::size_t i = 0; i < active_.size(); ++i) {
    stream_state& st = *active_[i];
    if (st.entries.empty()) continue;
    if (device_fault_[st.device]) {
      fail_stream(st, device_fault_[st.device]);
      progress = true;
      continue;
    }
    // Before its window (reactor_idle.cpp sets this): the stream's work is not expected to be
    // done, and looking would cost a driver query on every sweep that other streams' windows ask.
    if (now < st.query_after) continue;
    if (st.on_poll_tick) {
      // Off the tick, only a due fault probe (strategies that have one) makes this sweep look.
      const bool probe_due =
          traits_.fault_probes && now >= st.last_probe + options_.fault_probe_interval;
      if (!poll_tick && !probe_due) continue;
      ++polled;
    }
    progress |= look_at(st, now, /*may_probe=*/true);
  }
  drop_idle_streams();
  if (!loose_.empty() && sweep_loose()) {
    progress = true;
    loose_since_ = now;
  }
  if (poll_tick && polled > 0) {
    // The next tick: poll_period (or poll_budget's spacing) from now, or later when that many
    // looks would exceed poll_looks_per_second.
    tick_period_ = idle_settings_.window_poll_period;
    if (options_.poll_looks_per_second > 0)
      tick_period_ = std::max(
          tick_period_,
          std::chrono::nanoseconds(static_cast<std::int64_t>(polled) * 1'000'000'000 /
                                   static_cast<std::int64_t>(options_.poll_looks_per_second)));
    poll_tick_ = now + tick_period_;
    // What a tick's look costs (poll_budget spaces the ticks by it): the sweep, one clock read
    // per tick, only when there is a budget to keep.
    if (idle_settings_.poll_budget > 0) look_cost_.add(clock::now() - now);
  }
  return progress;
}

bool reactor_core::look_at(stream_state& st, clock::time_point now, bool may_probe) {
  bool moved = false;
  if (traits_.event_markers) {
    moved = sweep_poll(st);
  } else if (traits_.fence_markers) {
    moved = sweep_word(st, load_fence(st.fence_host));
    // Events retired at the front may uncover fence entries the word already vouches for.
    if (sweep_event_front(st)) {
      moved = true;
      sweep_word(st, load_fence(st.fence_host));
    }
  } else {  // host_func markers
    moved = sweep_word(st, st.host_done.load(std::memory_order_acquire));
  }
  if (may_probe && traits_.fault_probes && !moved) moved = probe(st, now);
  if (moved) {
    learn(st, now);
    st.waiting_since = now;
    st.missed = false;
    st.query_after = {};
    st.on_poll_tick = false;
    st.doorbell_armed = false;
    st.doorbell_rang.store(false, std::memory_order_relaxed);
  } else if (traits_.doorbells && options_.idle == idle_mode::ladder && !st.doorbell_armed &&
             now - st.waiting_since >= options_.doorbell_after) {
    arm_doorbell(st);  // (the predictive policy arms doorbells itself, in reactor_idle.cpp)
  }
  st.last_look = now;  // the oldest wait left, if any, was pending now
  st.plan_stale = true;
  return moved;
}

void reactor_core::drop_idle_streams() noexcept {
  // Swap-remove keeps this O(active).
  for (std::size_t i = 0; i < active_.size();) {
    stream_state& st = *active_[i];
    if (st.entries.empty()) {
      st.active = false;
      st.query_after = {};
      st.on_poll_tick = false;
      st.host_look = clock::time_point::max();
      st.host_spin = false;
      active_[i] = active_.back();
      active_.pop_back();
    } else {
      ++i;
    }
  }
}

void reactor_core::learn(stream_state& st, clock::time_point now) {
  // The sweep at `now` saw waits of `st` done that the one at st.last_look saw pending: the
  // newest of them finished in between (the midpoint is the estimate; the two are a few hundred
  // ns apart while the reactor polls). Its service started when it was submitted, or when the
  // wait before it finished, whichever is later (idle_policy.hpp).
  if (!st.retired_in_sweep) {  // only cancelled waits' markers retired: nothing to sample
    st.last_done = st.last_look + (now - st.last_look) / 2;
    return;
  }
  st.retired_in_sweep = false;
  const clock::time_point start = std::max(st.retired_submit, st.last_done);
  const clock::time_point seen_pending = std::max(st.last_look, start);
  const clock::time_point done = seen_pending + (now - seen_pending) / 2;
  st.model.add(done - start);
  st.last_done = done;
  // For submitters deciding whether a new wait could finish before a napping reactor looks:
  // the shortest work seen lately; for irregular work also the spacing of its looks, which its
  // waits accept as lateness anyway (else every submission on 64 irregular streams woke the
  // reactor for a sweep of all of them, undoing poll_budget).
  std::int64_t low = 0;
  if (st.model.ready()) {
    low = st.model.low().count();
    if (options_.idle == idle_mode::predictive && !is_steady(idle_settings_, st.model))
      low += std::max(idle_settings_.window_poll_period, tick_period_).count();
  }
  st.published_low_ns.store(low, std::memory_order_relaxed);
  const bool ready = st.model.ready();
  st.published_open_ns.store(
      ready ? std::max<std::int64_t>(1, window_open_offset(idle_settings_, st.model).count()) : 0,
      std::memory_order_relaxed);
}

void reactor_core::fail_stream(stream_state& st, std::error_code ec) {
  retire_front(st, st.entries.size(), ec);
}

void reactor_core::fail_device(int device, std::error_code ec) {
  if (device < 0 || device >= max_devices) return;
  if (!device_fault_[device]) bump(m_.device_faults);
  device_fault_[device] = ec;
  for (stream_state* st : active_)
    if (st->device == device) fail_stream(*st, ec);
  for (std::size_t i = 0; i < loose_.size();) {
    if (loose_[i]->device_ == device) {
      wait_op* op = loose_[i];
      loose_[i] = loose_.back();
      loose_.pop_back();
      retire_op(op, ec);
    } else {
      ++i;
    }
  }
}

void reactor_core::abort_everything() {
  for (stream_state* st : active_) {
    const auto count = static_cast<std::int64_t>(st->entries.size());
    std::int64_t fences = 0;
    while (!st->entries.empty()) {
      timeline_entry e = st->entries.front();
      st->entries.pop_front();
      // The GPU may not be past the marker: keep pooled events out of the pool for good.
      if (e.event != nullptr)
        abandoned_.emplace_back(st->marker_pool.load(std::memory_order_relaxed), e.event);
      else
        ++fences;
      if (e.op != nullptr) retire_op(e.op, aborted_error());
    }
    if (traits_.fence_markers && count > 0) {
      aborted_fences_ = aborted_fences_ || fences > 0;
      markers_retired(*st, count, fences);
    }
    st->active = false;
  }
  active_.clear();
  for (wait_op* op : loose_) retire_op(op, aborted_error());
  loose_.clear();
}

}  // namespace evr::detail
