// reactor/src/idle_plans.cpp — the idle policy's per-stream half: each stream's plan (when it is
// looked at next, and by whom: the reactor or its oldest wait's host), and the doorbells. The
// reactor-wide half is in idle_governor.cpp.
#include "idle_governor.hpp"

#include <algorithm>
#include <memory>

#include "tick_grid.hpp"

namespace evr::detail {
namespace {

/// An unhurried wait (wait_target::unhurried) in its window is looked at on the poll tick every
/// 1/32 of its stream's shorter work when that is longer than poll_period: found 1/64 of its work
/// late on average (1.6 %), which its consumer, woken through an eventfd tens of us later anyway,
/// hardly notices. 64 torch streams of 2 ms work take 4 ms each on 8 hardware queues: a tick
/// every 125 us instead of 50 (docs/notebook.md, "The poll tick at the pace of long work").
constexpr int unhurried_looks_per_work = 32;

std::int64_t ns_of(std::chrono::steady_clock::time_point t) noexcept {
  return t.time_since_epoch().count();
}

}  // namespace

void idle_governor::new_wait(stream_state& st, const wait_op& op, clock::time_point now,
                             bool activated) noexcept {
  stream_state::plan_state& p = st.plan;
  p.stale = true;
  if (!activated) return;
  // The stream's first wait is its host's: the host's next pass plans it (host_schedule.hpp).
  if (op.host_ != nullptr && op.host_->host_role() == poll_host::role::polls)
    op.host_->schedule.add({ns_of(now), &st, p.epoch},
                           [&](const host_schedule::entry& e) { return scheduled(e, *op.host_); });
  p.waiting_since = now;
  p.doorbell_armed = false;
  p.missed = false;
  // Its work cannot have finished before its marker was enqueued, during submission.
  p.last_look = op.submitted_at_;
}

void idle_governor::went_idle(stream_state& st) noexcept {
  stream_state::plan_state& p = st.plan;
  ++p.epoch;  // the hosts' entries for it are stale
  p.query_after = {};
  p.asleep_before_window = false;
  p.on_poll_tick = false;
  p.host_look = clock::time_point::max();
  p.host_spin = false;
  p.host_tick = false;
  p.scout_at = clock::time_point::max();
}

void idle_governor::plan(stream_state& st, clock::time_point now) {
  using phase = stream_outlook::phase;
  stream_state::plan_state& p = st.plan;
  p.stale = false;
  p.asleep_before_window = false;
  p.scout_at = clock::time_point::max();
  p.planned_seq = st.entries.front().seq;
  ++p.epoch;  // a new plan: a host schedules it anew (plan_host_polls)
  const clock::time_point start = service_start(st);
  stream_outlook o = predict(settings_, p.model, start, now, overshoot_);
  scout_if_due(st, o, start, now);
  if (o.where == phase::missed && !p.missed) {
    p.missed = true;
    bump(counters_.prediction_misses);
  }
  clock::time_point wake = clock::time_point::max();
  if (traits_.fault_probes) wake = st.last_probe + options_.fault_probe_interval;
  // A wait with a host (poll_host.hpp): a host that polls covers the window itself; the reactor
  // wakes one that must be woken, at `wake_host`.
  clock::time_point wake_host = clock::time_point::max();
  if (poll_host* host = host_of(st)) {
    if (plan_hosted(st, *host, o, now, wake_host)) {
      p.wake = std::min(wake, p.wake);  // plan_hosted set the look after the window
      return;
    }
    wake = std::min(wake, wake_host);
  } else {
    p.host_look = clock::time_point::max();
    p.host_spin = false;
    p.host_tick = false;
  }
  plan_reactor(st, o, start, now, wake);
}

void idle_governor::scout_if_due(stream_state& st, stream_outlook& o, clock::time_point start,
                                 clock::time_point now) const noexcept {
  // Steady work asleep before its window only: irregular work is polled from its shortest sample
  // on anyway. An unhurried oldest wait only while the stream's work just got shorter (its last
  // wait was found by a scout; a Python loop then stops predicting it, and its next wait is
  // unhurried): its consumer accepts some lateness, and 64 torch streams on a saturated GPU
  // would make two more looks every wait.
  // And only when the reactor rests by the plans (the predictive policy): under the ladder its
  // sweeps would look at the stream on every pass from the first scout on.
  if (!scouts_allowed() || o.where != stream_outlook::phase::before_window || !o.steady) return;
  const wait_op* front = st.entries.front().op;
  if (front != nullptr && front->unhurried_ && !st.plan.scout_found) return;
  if (const clock::time_point scout = next_scout(start, o.window_open, now); scout < o.next_look) {
    o.next_look = scout;
    st.plan.scout_at = scout;
  }
}

void idle_governor::plan_reactor(stream_state& st, stream_outlook o, clock::time_point start,
                                 clock::time_point now, clock::time_point wake) {
  using phase = stream_outlook::phase;
  stream_state::plan_state& p = st.plan;
  // Sweeps that other streams' windows ask for skip this stream until its own window opens (or
  // its fault probe is due), as a reactor with this stream alone would sleep until then: with 64
  // streams and event markers every sweep was 64 driver queries. Only once its model holds 8
  // samples: a young model (3 samples, or 3 after the work changed) can look steady by chance,
  // and a skipped stream whose work ended early is found only when its window opens.
  p.query_after = {};
  p.on_poll_tick = false;
  // A probed oldest wait (wait_target::probed): its caller reads the word itself until its
  // window closes; the reactor looks only then (and for a due fault probe), asleep meanwhile.
  // Its scouts are the reactor's, planned from the caller's window (which the caller's model
  // thought steady), whatever the reactor's own model says: one outlier in it (the first wait
  // found short) made the stream irregular, and then the next short wait slept until the window.
  const wait_op* front = st.entries.empty() ? nullptr : st.entries.front().op;
  if (const clock::time_point caller_until =
          front != nullptr ? probed_until(*front) : clock::time_point{};
      caller_until > now) {
    // next_scout gives max() when no scout is left before the caller's window closes.
    p.scout_at = scouts_allowed() ? next_scout(start, caller_until, now) : clock::time_point::max();
    const clock::time_point until = std::min(p.scout_at, caller_until);
    skip_until(st, until);
    p.spin = false;
    p.wake = std::min(wake, until);
    return;
  }
  // An unhurried oldest wait (wait_target::unhurried: its consumer takes it tens of us later
  // anyway) is not spun for: its steady window is looked at on the tick, as irregular work is,
  // and less often for long work.
  const bool unhurried =
      !st.entries.empty() && st.entries.front().op != nullptr && st.entries.front().op->unhurried_;
  if (o.where == phase::window_spin && unhurried) o.where = phase::window_poll;
  // Nor woken for its own sleeps towards its window while the poll tick runs (other streams'
  // windows wake the reactor for it anyway): a sleep cut final_sleep short of the window ends on
  // the first tick after the cut, if one comes before the window opens (the cut only keeps a long
  // sleep's late wake-ups away from the window); the last sleep (to the look at the window's
  // margin, which brackets an early end for learning) ends on the last tick before that look.
  // With no tick before a sleep's end (and, for a cut, none between it and the window: ticks as
  // far apart as final_sleep), the stream is on the tick from now, as in its window. So its wakes
  // fall on the tick's grid; the cut's look comes less than a tick later, the margin's less than
  // a tick earlier, and there are no more of them than before. 64 torch streams of 2 ms work each
  // woke the reactor for their own sleeps: 1.3-1.7 naps a wait (docs/notebook.md, "Where 64 torch
  // tasks' reactor goes"). With no tick running (a lone stream) it sleeps as before.
  if (o.where == phase::before_window && unhurried && p.scout_at == clock::time_point::max() &&
      ticking(now)) {
    const clock::time_point before = tick_at_or_before(o.next_look);
    const clock::time_point after = before + tick_period_;
    if (!o.last_sleep && after < o.window_open)
      o.next_look = after;
    else if (before > now)
      o.next_look = before;
    else
      o.where = phase::window_poll;
  }
  // Nor through the window of longer work its model remembers, when it missed its own
  // (look_at_longer_work): looked at every poll period at most, as its naps otherwise are.
  if (o.where == phase::missed && unhurried)
    o.next_look = std::max(o.next_look, now + settings_.window_poll_period);
  if (o.where == phase::before_window && p.model.samples() >= service_time_model::window / 2) {
    skip_until(st, o.next_look);
    // A scout looks when it comes; a wake-up towards the window plans again.
    p.asleep_before_window = p.scout_at == clock::time_point::max();
  } else if (o.where == phase::window_poll) {
    // Looked at on the poll tick, with every other stream in such a window, and not by the sweeps
    // other streams' completions ask for. A tick already due (no stream was on it) comes at once.
    const nanoseconds spacing =
        unhurried ? unhurried_spacing(p.model) : settings_.window_poll_period;
    o.next_look = std::max(now, join_poll_tick(st, spacing));
  }
  if (o.unpredicted()) {
    // Nothing learned yet, or the prediction failed: let the driver wake the reactor once the
    // wait is old (adaptive), and then rely on that doorbell and the probe rather than naps.
    if (traits_.doorbells && !p.doorbell_armed && now - start >= doorbell_age(p.model))
      arm_doorbell(st);
    if (p.doorbell_armed) {
      p.spin = false;
      p.wake = wake;
      return;
    }
  }
  p.spin = o.next_look <= now;
  p.wake = std::min(wake, o.next_look);
}

bool idle_governor::plan_hosted(stream_state& st, poll_host& host, const stream_outlook& o,
                                clock::time_point now, clock::time_point& reactor_wake) {
  stream_state::plan_state& p = st.plan;
  p.host_look = clock::time_point::max();
  p.host_spin = false;
  p.host_tick = false;
  if (o.unpredicted()) return false;  // learning or missed: the reactor's own policy (doorbells)
  // The reactor looks itself this long after the window closed: a safety net for a host that is
  // late, busy in a handler, or gone quiet (it then finds the wait and posts it as usual). Not
  // sooner: the reactor wakes for it once per hosted wait (a host finds it long before), and with
  // 200 us work 100 us after the window cost about 3 % of a core in wake-ups (H100).
  const nanoseconds grace = host_grace();
  if (host.host_role() == poll_host::role::polls) {
    plan_host_polls(st, host, o, now, grace);
    return true;
  }
  // role woken: the reactor finds the completion as usual; the host's thread must be awake then.
  const std::uint64_t seq = st.entries.front().seq;
  if (p.host_told_seq != seq) {
    const clock::time_point wake_at =
        o.window_open - nanoseconds(host.lead_ns.load(std::memory_order_relaxed));
    if (now >= wake_at) {
      p.host_told_seq = seq;
      host.wake_until(ns_of(o.window_close + grace));
    } else {
      reactor_wake = wake_at;
    }
  }
  return false;
}

void idle_governor::plan_host_polls(stream_state& st, poll_host& host, const stream_outlook& o,
                                    clock::time_point now, nanoseconds grace) {
  // The host looks through the window. The reactor does not wake for it before the window closed
  // (plus `grace`), but a sweep it makes anyway (for other streams) looks from the window on: a
  // hosted wait is a fence word, a look a memory read. Without that, with more busy streams than
  // the host's (16 in lockstep: 8 of fence words, 8 of events), the reactor spun through the
  // others' windows holding the pass lock, the host's passes found it taken, and its waits were
  // found only after the reactor's own windows closed: hundreds of us late at p99.
  using phase = stream_outlook::phase;
  stream_state::plan_state& p = st.plan;
  switch (o.where) {
    case phase::before_window:
      p.host_look = o.window_open;
      p.host_spin = o.steady;
      // A scout is the reactor's (scout_at, set with it): a nap of its own costs less than the
      // host's timer and pass, and it seldom finds anything (then it posts the completion
      // across, as a safety look does).
      break;
    case phase::window_spin:
      p.host_look = now;
      p.host_spin = true;
      break;
    default:
      // window_poll: irregular work, looked at every window_poll_period, on the points of the
      // host's tick (tick_grid.hpp): all of a host's streams in such windows come due together,
      // one pass of its thread for them all. Each stream's look a period after its own last one
      // came due at a time of its own, and the io thread woke, or spun towards the next, for each
      // (docs/notebook.md, "The hosts' looks on one tick").
      p.host_look = tick_grid::next_look(now, settings_.window_poll_period);
      p.host_tick = true;
      break;
  }
  const clock::time_point safety = o.window_close + grace;
  skip_until(st, std::min({p.host_look, safety, p.scout_at}));
  schedule(host, st);
  p.on_poll_tick = false;
  p.spin = false;
  p.wake = std::min(safety, p.scout_at);
  // A window the host does not know of (a wait submitted from another thread, or queued behind
  // others) is told to it once.
  const std::uint64_t seq = st.entries.front().seq;
  if (p.host_told_seq != seq) {
    p.host_told_seq = seq;
    const std::int64_t first = ns_of(p.host_look);
    if (host.looks_at_ns.load(std::memory_order_relaxed) > first) host.look_by(first);
  }
}

bool idle_governor::plan_for_host(stream_state& st, poll_host& host, clock::time_point now,
                                  poll_result& out) {
  if (host_of(st) != &host) return false;  // idle now, or another's wait is the oldest
  stream_state::plan_state& p = st.plan;
  bool handed = false;
  if (p.stale || p.wake <= now || p.host_look <= now) {
    const bool was_hosts = p.host_look != clock::time_point::max();
    plan(st, now);  // schedules the next look on the host (plan_host_polls)
    handed = was_hosts && p.host_look == clock::time_point::max();
  } else if (p.host_look != clock::time_point::max()) {
    schedule(host, st);  // not due yet: keep it scheduled
  }
  if (p.host_look != clock::time_point::max() && p.host_spin && p.host_look <= now) out.spin = true;
  return handed;
}

void idle_governor::schedule(poll_host& host, stream_state& st) {
  host.schedule.add({ns_of(st.plan.host_look), &st, st.plan.epoch},
                    [&](const host_schedule::entry& e) { return scheduled(e, host); });
}

bool idle_governor::scheduled(const host_schedule::entry& e, const poll_host& host) const noexcept {
  return e.epoch == e.stream->plan.epoch && host_of(*e.stream) == &host;
}

bool idle_governor::next_look_is_tick(const poll_host& host,
                                      const host_schedule::entry& next) const {
  // A current entry is its plan's own look, so the plan says whether it is a tick. The host arms
  // its timer for its earliest look only: a steady window that opens within the timer's margin
  // after the tick would be looked at late by up to the timer's excess lateness (the tick's
  // timer is armed early by the least lateness only, io_context_host::tick_lead).
  if (!next.stream->plan.host_tick) return false;
  const std::int64_t margin = host.timer_margin_ns.load(std::memory_order_relaxed);
  const auto steady = [&](const host_schedule::entry& e) {
    return !e.stream->plan.host_tick && scheduled(e, host);  // the cheap test first
  };
  return !host.schedule.any_until(next.look_ns + margin, steady);
}

poll_host* idle_governor::host_of(const stream_state& st) const noexcept {
  if (st.entries.empty()) return nullptr;
  // An event marker (more streams than hardware queues) costs the host a driver query per look
  // where a fence word costs a memory read: hosted unless reactor_options::host_event_waits is
  // off (docs/architecture.md, "The last hop").
  if (!options_.host_event_waits && st.entries.front().event != nullptr) return nullptr;
  return st.entries.front_host();  // nullptr for a ghost
}

const poll_host* idle_governor::covering_host(const stream_state& st) const noexcept {
  if (st.plan.host_look == clock::time_point::max()) return nullptr;
  const poll_host* h = host_of(st);
  return h != nullptr && h->host_role() == poll_host::role::polls ? h : nullptr;
}

idle_governor::clock::time_point idle_governor::covered_until(
    const stream_state& st, const poll_host& host) const noexcept {
  const std::int64_t promised = host.looks_at_ns.load(std::memory_order_relaxed);
  if (promised == poll_host::never) return st.plan.wake;  // told (look_by), not armed yet
  return std::max(clock::time_point(nanoseconds(promised)), st.plan.last_look) + grace_for(host);
}

nanoseconds idle_governor::grace_for(const poll_host& host) const noexcept {
  // A busy host's passes wait behind its thread's handlers (a server's io thread at full load:
  // milliseconds): it is alive and will look, only later than it promised. Looking in its place
  // then costs the reactor a query per stream with an event marker and a post across threads
  // per completion, for nothing the host would not find itself (on an H200 at /busy?us=200 with
  // stream waits, the reactor found 91 % of the completions, at 0.22 of a core). So the grace
  // grows to twice the host's recent queue delay, up to max_host_grace: the bound on how late the
  // reactor finds the waits of a host that has stopped looking.
  const nanoseconds queued(2 * host.queue_delay_ns.load(std::memory_order_relaxed));
  return std::clamp(queued, host_grace_, std::max(host_grace_, max_host_grace));
}

nanoseconds idle_governor::doorbell_age(const service_time_model& model) const noexcept {
  // A doorbell is a host function behind the stream's work: every later operation of the stream
  // waits for it to have run (tens of us after the work). A stream with a model missed its
  // window by a little, as a rule (a server's lane whose next kernel started late), and a doorbell
  // then delayed its next work too, which could miss again: on the H200, at 5 ms work on 128
  // lanes, a server fell into doorbells on most waits (the reactor thread at a whole core,
  // CUDA's host-function thread at 0.4). Such a stream is left to the missed phase's naps until
  // its wait has taken twice its longest work.
  if (!model.ready()) return options_.doorbell_after;
  return std::max<nanoseconds>(options_.doorbell_after, 2 * model.high());
}

idle_governor::clock::time_point idle_governor::join_poll_tick(stream_state& st,
                                                               nanoseconds spacing) noexcept {
  st.plan.on_poll_tick = true;
  st.plan.tick_spacing = spacing;
  // The tick was set for the spacings of the streams it looked at last: one that wants looking at
  // sooner brings it forward for all, as far as poll_looks_per_second lets it.
  if (spacing < tick_period_)
    poll_tick_ = std::min(poll_tick_, tick_began_ + std::max(spacing, tick_soonest_));
  return poll_tick_;
}

nanoseconds idle_governor::unhurried_spacing(const service_time_model& model) const noexcept {
  return std::max(settings_.window_poll_period, model.low() / unhurried_looks_per_work);
}

bool idle_governor::ticking(clock::time_point now) const noexcept {
  // A tick that came (or is due) within its period: a stream on it keeps it going (end_sweep).
  return tick_period_ > nanoseconds::zero() && poll_tick_ + tick_period_ > now;
}

idle_governor::clock::time_point idle_governor::tick_at_or_before(
    clock::time_point t) const noexcept {
  // Whole periods from the next tick, rounded down (towards the past). The ticks keep this grid
  // while they run (end_sweep) and their period holds, which is what makes a sleep to one of its
  // points meet a tick.
  const nanoseconds from_tick = t - poll_tick_;
  std::int64_t periods = from_tick / tick_period_;
  if (from_tick < nanoseconds::zero() && from_tick % tick_period_ != nanoseconds::zero()) --periods;
  return poll_tick_ + periods * tick_period_;
}

void idle_governor::skip_until(stream_state& st, clock::time_point t) const noexcept {
  // Never past its fault probe (strategies that have one).
  st.plan.query_after =
      traits_.fault_probes ? std::min(t, st.last_probe + options_.fault_probe_interval) : t;
}

idle_governor::clock::time_point idle_governor::service_start(
    const stream_state& st) const noexcept {
  // The oldest wait's work could start once it was submitted and the stream's previous wait was
  // done (a cancelled wait's marker has no submission time: the previous completion then).
  const timeline_entry& e = st.entries.front();
  clock::time_point s = st.plan.last_done;
  if (e.op != nullptr) s = std::max(s, e.op->submitted_at_);
  return s;
}

void idle_governor::arm_doorbell(stream_state& st) {
  if (backend_.stream_is_capturing(st.native)) return;  // never add work to a user's capture
  st.host_funcs_outstanding.fetch_add(1, std::memory_order_relaxed);
  st.doorbell_rang.store(false, std::memory_order_relaxed);
  std::error_code ec = backend_.launch_host_func(st.native, &idle_governor::doorbell_rang, &st);
  st.plan.doorbell_armed = true;  // on failure too: no retry every sweep, the probe covers it
  if (ec) {
    st.host_funcs_outstanding.fetch_sub(1, std::memory_order_relaxed);
    if (is_sticky(ec)) registry_.fail_device(st.device, ec);
    return;
  }
  bump(counters_.doorbells);
}

void idle_governor::doorbell_rang(void* state) noexcept {
  auto* st = static_cast<stream_state*>(state);
  // Copied first: once host_funcs_outstanding drops, a reactor being destroyed may delete `st`.
  std::shared_ptr<wakeup> wake = st->wake;
  st->doorbell_rang.store(true, std::memory_order_seq_cst);  // seq_cst: part of the wake handshake
  st->host_funcs_outstanding.fetch_sub(1, std::memory_order_release);  // last touch of `st`
  wake->wake_urgent();
}

}  // namespace evr::detail
