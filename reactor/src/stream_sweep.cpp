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
    if (st.entries.empty()) continue;
    if (const std::error_code& fault = registry_.device_fault(st.device)) {
      registry_.fail_stream(st, fault);
      progress = true;
      continue;
    }
    if (!idle_.wants_look(st, now, tick)) continue;
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
  if (may_probe && traits_.fault_probes && !moved) moved = probe(st, now);
  idle_.looked_at(st, now, moved);
  return moved;
}

void stream_sweep::drop_idle_streams() {
  registry_.drop_idle_streams([this](stream_state& st) { idle_.went_idle(st); });
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
  // Event markers among fence entries (a busy device's overflow, or more busy streams than
  // hardware queues: then every new wait records one): the word cannot vouch for an event entry
  // at the front until a later fence lands, so the run of events at the front is queried as poll
  // queries a whole stream. A further run behind fence entries waits for the next sweep (which
  // comes at once after progress). Events retired at the front may uncover fence entries the
  // word already vouches for.
  if (!st.entries.empty() && st.entries.front().event != nullptr && look_at_events(st, 0)) {
    moved = true;
    retire_covered(st, load_fence(st.fence_host));
  }
  return moved;
}

bool stream_sweep::retire_covered(stream_state& st, std::uint64_t word) {
  // Entries are in sequence order: count those the word covers, then retire them in one batch.
  std::size_t covered = 0;
  while (covered < st.entries.size() && st.entries.at(covered).seq <= word) ++covered;
  registry_.retire_front(st, covered, {});
  return covered > 0;
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
  // every entry (the reactor accepted each after its marker was enqueued). A word that still lags
  // would mean a lost write; complete the waits rather than hang them.
  const bool progress = !st.entries.empty();
  registry_.retire_front(st, st.entries.size(), {});
  return progress;
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
