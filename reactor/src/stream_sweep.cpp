// reactor/src/stream_sweep.cpp — see stream_sweep.hpp.
#include "stream_sweep.hpp"

#include <atomic>

namespace evr::detail {
namespace {

std::uint64_t load_fence(const std::uint64_t* word) {
  // acquire: pairs with the device's write; what the GPU wrote before the fence is visible.
  return std::atomic_ref<std::uint64_t>(*const_cast<std::uint64_t*>(word))
      .load(std::memory_order_acquire);
}

}  // namespace

bool stream_sweep::sweep(clock::time_point now) {
  bump(counters_.sweeps);
  bool progress = false;
  // The poll tick: irregular work in its windows is looked at by this sweep if the tick has come
  // (all of it at once: one sweep and one wake-up per tick, however many streams).
  poll_tick tick = idle_.begin_sweep(now);
  for (std::size_t i = 0; i < registry_.active().size(); ++i) {
    stream_state& st = *registry_.active()[i];
    // A host function that ran on the stream (a doorbell, or host_func's marker) says its work
    // up to there is done, and it is what woke the reactor: the stream is looked at whatever its
    // window or host, or signalled() would stay true and every nap end at once.
    const bool rang =
        take_doorbell(st) || (traits_.host_func_markers &&
                              st.host_done.load(std::memory_order_acquire) > st.completed_seq);
    if (st.entries.empty()) continue;
    if (const std::error_code& fault = registry_.device_fault(st.device)) {
      registry_.fail_stream(st, fault);
      progress = true;
      continue;
    }
    if (!rang) {
      idle_.plan_unplanned(st, now);
      if (!idle_.reached_window(st, now) && !idle_.wants_look(st, now, tick)) continue;
    }
    progress |= look_at(st, now, /*may_probe=*/true);
  }
  drop_idle_streams();
  if (!registry_.loose_empty() &&
      registry_.look_at_loose(options_.loose_query_budget, now,
                              [this](wait_op* op) { return query_loose(op); }))
    progress = true;
  idle_.end_sweep(now, tick);
  return progress;
}

bool stream_sweep::look_at(stream_state& st, clock::time_point now, bool may_probe) {
  bool moved = false;
  if (traits_.event_markers) {
    moved = look_at_events(st, st.entries.size());
  } else if (traits_.fence_markers) {
    moved = look_at_fences(st);
  } else {  // host_func markers
    moved = retire_covered(st, st.host_done.load(std::memory_order_acquire));
  }
  if (may_probe && traits_.fault_probes && !moved) {
    moved = probe(st, now);
  } else if (moved) {
    // The stream moved: it was not faulted when its marker or signal landed, which is what a
    // probe would have told. The next probe is due fault_probe_interval after its last progress,
    // so a stream that keeps moving (under load, its host finding every wait) costs no probes and
    // no reactor wake-ups for them; one that stops is probed as before.
    st.last_probe = now;
  }
  idle_.looked_at(st, now, moved);
  return moved;
}

void stream_sweep::drop_idle_streams() {
  registry_.drop_idle_streams([this](stream_state& st) { idle_.went_idle(st); });
}

bool stream_sweep::take_doorbell(stream_state& st) noexcept {
  // A rung doorbell is a wake-up, taken once by the sweep after it, whatever the look finds: left
  // set until a look saw the stream move, it kept signalled() true, so the reactor's naps all
  // returned at once. A stream a host covers was then never looked at by the reactor, which thus
  // never slept, never gave up the pass lock, and the host's passes never ran: its waits hung
  // (issue 43). The relaxed load first: a store only when one rang. acq_rel pairs with the host
  // function's seq_cst store (the work before the doorbell is done when it is seen).
  if (!st.doorbell_rang.load(std::memory_order_relaxed) ||
      !st.doorbell_rang.exchange(false, std::memory_order_acq_rel))
    return false;
  st.plan.doorbell_armed = false;  // spent: a wait still pending may arm the next one
  return true;
}

bool stream_sweep::signalled() const noexcept {
  for (stream_state* st : registry_.active()) {
    if (st->doorbell_rang.load(std::memory_order_seq_cst)) return true;
    if (traits_.host_func_markers &&
        st->host_done.load(std::memory_order_seq_cst) > st->completed_seq)
      return true;
  }
  return false;
}

bool stream_sweep::look_at_events(stream_state& st, std::size_t run) {
  // The first `run` entries are event markers (0: as many as lead the timeline, counted only
  // once the oldest is known done). Oldest first: a pending stream costs one cheap query.
  if (auto ec = devices_.select(st.device)) {
    registry_.fail_stream(st, ec);
    return true;
  }
  bump(counters_.event_queries);
  std::error_code ec = backend_.query_event(st.entries.front().event);
  if (is_not_ready(ec)) return false;
  if (ec) {
    if (is_sticky(ec)) {
      registry_.fail_device(st.device, ec);
    } else {
      registry_.retire_front(st, 1, ec);  // this event alone is broken (e.g. destroyed handle)
    }
    return true;
  }
  if (run == 0) {  // the events at the front: counted only now, not on every pending sweep
    run = 1;
    while (run < st.entries.size() && st.entries.at(run).event != nullptr) ++run;
  }
  registry_.retire_front(st, done_in_run(st, run), {});
  return true;
}

std::size_t stream_sweep::done_in_run(stream_state& st, std::size_t run) {
  // The oldest of the run is done. If the newest is done too, all of it is (events of one stream
  // complete in record order, and seq order is record order): one more query covers the run.
  auto query = [&](std::size_t i) {
    bump(counters_.event_queries);
    return backend_.query_event(st.entries.at(i).event);
  };
  if (run <= 1) return 1;
  const std::error_code last = query(run - 1);
  if (!last) return run;
  if (!is_not_ready(last)) return 1;  // an error of the newest: met from the front later
  // Bisect between a done entry (lo) and a pending one (hi).
  std::size_t lo = 0, hi = run - 1;
  while (hi - lo > 1) {
    const std::size_t mid = lo + (hi - lo) / 2;
    const std::error_code m = query(mid);
    if (!m) {
      lo = mid;
    } else if (is_not_ready(m)) {
      hi = mid;
    } else {
      break;  // an error: retire what is known done; a later sweep meets the error first
    }
  }
  return lo + 1;
}

bool stream_sweep::look_at_fences(stream_state& st) {
  bool moved = retire_covered(st, load_fence(st.fence_host));
  // What the word cannot vouch for until a later fence lands, at the front, in turn:
  // device-signalled waits (their own words: memory reads) and a run of event markers (a busy
  // device's overflow, or more streams than hardware queues: then every new wait records one),
  // queried as poll queries a whole stream. One event run per look: a further run behind waits
  // for the next sweep (which comes at once after progress). What retired at the front may
  // uncover fence entries the word already vouches for.
  bool queried = false;
  while (!st.entries.empty() && !st.entries.front().is_fence()) {
    const bool events = st.entries.front().event != nullptr;
    if (events && queried) break;
    queried |= events;
    if (!(events ? look_at_events(st, 0) : retire_signalled(st))) break;
    moved = true;
    retire_covered(st, load_fence(st.fence_host));
  }
  return moved;
}

bool stream_sweep::retire_covered(stream_state& st, std::uint64_t word) {
  // Entries are in sequence order: count those the word covers, then retire them in one batch.
  std::size_t covered = 0;
  while (covered < st.entries.size() && st.entries.at(covered).seq <= word) ++covered;
  return retire_passed(st, covered);
}

bool stream_sweep::retire_passed(stream_state& st, std::size_t count) {
  // The stream is past these entries. A device-signalled wait among them has its signal, or its
  // work ended without giving it (no fence has its sequence number: a word at or past it means a
  // later marker landed, behind the kernel that was to signal).
  const bool any = count > 0;
  while (count > 0) {
    std::size_t run = 0;
    while (run < count && !st.entries.at(run).is_signal()) ++run;
    registry_.retire_front(st, run, {});
    count -= run;
    if (count == 0) break;
    const bool arrived = signal_arrived(*st.entries.front().op);
    registry_.retire_front(st, 1,
                           arrived ? std::error_code{} : make_error_code(errc::not_signalled));
    --count;
  }
  return any;
}

bool stream_sweep::retire_signalled(stream_state& st) {
  // The run of device-signalled waits at the front whose signals came (in order: a later one's
  // signal does not retire an earlier one that is still missing its own).
  std::size_t run = 0;
  while (run < st.entries.size() && st.entries.at(run).is_signal() &&
         signal_arrived(*st.entries.at(run).op))
    ++run;
  registry_.retire_front(st, run, {});
  return run > 0;
}

bool stream_sweep::probe(stream_state& st, clock::time_point now) {
  if (now - st.last_probe < options_.fault_probe_interval) return false;
  st.last_probe = now;
  if (auto ec = devices_.select(st.device)) {
    registry_.fail_stream(st, ec);
    return true;
  }
  bump(counters_.stream_queries);
  const clock::time_point asked = clock::now();
  std::error_code ec = backend_.query_stream(st.native);
  add_sample(counters_.fault_probe_time, clock::now() - asked);
  if (is_not_ready(ec)) return false;
  if (ec) {
    if (is_sticky(ec))
      registry_.fail_device(st.device, ec);
    else
      registry_.fail_stream(st, ec);
    return true;
  }
  // The stream is idle: every marker enqueued before this query has executed, which includes
  // every entry (the reactor accepted each after its marker was enqueued, and a signalling
  // kernel was queued before its wait started). A word that still lags would mean a lost write;
  // complete the waits rather than hang them. A signal that never came fails its wait.
  return retire_passed(st, st.entries.size());
}

std::error_code stream_sweep::query_loose(wait_op* op) {
  // Even a sticky error fails only this wait: the device a user's event belongs to is the one
  // the user named, which may be wrong; the device's own streams report their fault through
  // their own queries and probes.
  if (auto ec = devices_.select(op->device_)) return ec;
  bump(counters_.event_queries);
  return backend_.query_event(op->event_);
}

}  // namespace evr::detail
