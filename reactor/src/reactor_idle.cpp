// reactor/src/reactor_idle.cpp — how the reactor thread waits between sweeps: park when nothing
// is pending; otherwise what reactor_options::idle says (idle_policy.hpp holds the predictive
// logic and the ladder; this file applies them to the reactor's streams). Reactor thread only.
#include <algorithm>
#include <thread>

#include "reactor_core.hpp"

namespace evr::detail {
namespace {

/// While spinning for a predicted completion, the plan is made again at least this often (and at
/// once after any progress or new wait): a window that closes, or another stream's window that
/// opens, is noticed this late at most, for a fraction of the cost of planning every sweep.
constexpr std::chrono::nanoseconds replan_interval = std::chrono::microseconds(10);
/// While stopping, sweeps are at most this far apart (the drain deadline is checked per pass).
constexpr std::chrono::nanoseconds closing_nap = std::chrono::milliseconds(1);

}  // namespace

void reactor_core::idle(clock::time_point now, bool progress, bool took_new) {
  if (progress) {
    ladder_.progress(now);
  } else if (took_new) {
    ladder_.new_waits();
  }
  if (progress || took_new) replan_at_ = {};
  const bool nothing_pending = active_.empty() && loose_.empty() && pending_ops_ == 0;
  if (nothing_pending && !closed_) {
    bump(m_.parks);
    // Zero wake-ups until a submission; hosts may run passes meanwhile.
    wake_->park([this] { return has_inputs(); }, [this] { leave_pass(); });
    enter_pass();
    ladder_.progress(clock::now());
    return;
  }
  if (progress) {
    // More may be done by now: sweep again at once, or, batching (coalesce), once the interval
    // since this pass began is over. Not while stopping: the drain deadline wants passes.
    if (options_.coalesce.count() > 0 && !closed_ && clock::now() < now + options_.coalesce)
      nap_until(now + options_.coalesce, /*learn_overshoot=*/false);
    return;
  }
  if (traits_.woken_by_host_funcs) {
    // host_func: a host function wakes the reactor; the timer is the fault probe.
    nap_until(now + (closed_ ? std::min(closing_nap, options_.fault_probe_interval)
                             : options_.fault_probe_interval),
              /*learn_overshoot=*/false);
    return;
  }
  switch (options_.idle) {
    case idle_mode::spin: return;
    case idle_mode::ladder: idle_ladder(now); return;
    case idle_mode::predictive: idle_predictive(now); return;
  }
}

void reactor_core::idle_ladder(clock::time_point now) {
  std::chrono::nanoseconds nap{};
  switch (ladder_.next(options_, now, nap)) {
    case ladder::action::spin: return;
    case ladder::action::yield: std::this_thread::yield(); return;
    case ladder::action::nap: break;
  }
  // adaptive: when every pending stream has a doorbell armed, a host function wakes the reactor;
  // the timer is only the fault probe.
  bool all_doorbells = traits_.doorbells && !active_.empty() && loose_.empty();
  for (std::size_t i = 0; all_doorbells && i < active_.size(); ++i)
    all_doorbells = active_[i]->doorbell_armed;
  if (all_doorbells) nap = options_.fault_probe_interval;
  if (closed_) nap = std::min(nap, closing_nap);
  nap_until(now + nap, /*learn_overshoot=*/false);
}

void reactor_core::idle_predictive(clock::time_point now) {
  if (now < replan_at_) return;  // spinning: the plan made at most replan_interval ago holds
  clock::time_point wake = now + options_.fault_probe_interval;
  bool spin = false;
  // Wide windows are looked at every poll_period (the poll tick), or less often when a tick's
  // look costs more than poll_budget of a core allows (many streams, each queried on every tick).
  if (idle_settings_.poll_budget > 0)
    idle_settings_.window_poll_period = budgeted_poll_period(
        idle_settings_.poll_period, look_cost_.mean(), idle_settings_.poll_budget);
  for (stream_state* st : active_) {
    if (st->entries.empty()) continue;
    // A stream's plan holds until it is looked at, gets a new wait, or the plan's time comes.
    if (st->plan_stale || st->plan_wake <= now) plan_stream(*st, now);
    if (st->plan_spin) {
      spin = true;
    } else {
      wake = std::min(wake, st->plan_wake);
    }
  }
  if (!loose_.empty()) {
    // Waits on a user's event: no stream, no model. Spin briefly, then naps of a quarter of the
    // time since their last progress.
    const std::chrono::nanoseconds age = now - loose_since_;
    if (age < options_.spin_window) {
      spin = true;
    } else {
      wake = std::min(wake, now + std::clamp<std::chrono::nanoseconds>(
                                      age / 4, std::chrono::microseconds(10), options_.max_sleep));
    }
  }
  if (closed_) wake = std::min(wake, now + closing_nap);
  if (spin || wake - now < min_nap) {
    replan_at_ = now + replan_interval;
    return;
  }
  replan_at_ = {};
  nap_until(wake, /*learn_overshoot=*/true);
}

void reactor_core::plan_stream(stream_state& st, clock::time_point now) {
  using phase = stream_outlook::phase;
  st.plan_stale = false;
  const clock::time_point start = service_start(st);
  stream_outlook o = predict(idle_settings_, st.model, start, now, overshoot_);
  if (o.where == phase::missed && !st.missed) {
    st.missed = true;
    bump(m_.prediction_misses);
  }
  clock::time_point wake = clock::time_point::max();
  if (traits_.fault_probes) wake = st.last_probe + options_.fault_probe_interval;
  // A wait with a host (poll_host.hpp): a host that polls covers the window itself; the reactor
  // wakes one that must be woken, at `wake_host` (reactor_hosts.cpp).
  clock::time_point wake_host = clock::time_point::max();
  if (poll_host* host = host_of(st)) {
    if (plan_hosted(st, *host, o, now, wake_host)) {
      st.plan_wake = std::min(wake, st.plan_wake);  // plan_hosted set the look after the window
      return;
    }
    wake = std::min(wake, wake_host);
  } else {
    st.host_look = clock::time_point::max();
    st.host_spin = false;
  }
  // Sweeps that other streams' windows ask for skip this stream until its own window opens
  // (or its fault probe is due), as a reactor with this stream alone would sleep until then:
  // with 64 streams and event markers every sweep was 64 driver queries, and the streams in
  // their windows were found 15-40 us late at p50 instead of 9-15 (H100). Only once its model
  // holds 8 samples: a young model (3 samples, or 3 after the work changed) can look steady by
  // chance, and a skipped stream whose work ended early is found only when its window opens.
  st.query_after = {};
  st.on_poll_tick = false;
  if (o.where == phase::before_window && st.model.samples() >= service_time_model::window / 2) {
    skip_until(st, o.next_look);
  } else if (o.where == phase::window_poll) {
    // Irregular work: looked at on the poll tick, with every other stream in such a window, and
    // not by the sweeps other streams' completions ask for (64 streams of it: each completion's
    // sweep queried all of them again). A tick already due (no stream was on it) comes at once.
    st.on_poll_tick = true;
    o.next_look = std::max(now, poll_tick_);
  }
  if (o.unpredicted()) {
    // Nothing learned yet, or the prediction failed: let the driver wake the reactor once the
    // wait is old (adaptive), and then rely on that doorbell and the probe rather than naps.
    if (traits_.doorbells && !st.doorbell_armed && now - start >= options_.doorbell_after)
      arm_doorbell(st);
    if (st.doorbell_armed) {
      st.plan_spin = false;
      st.plan_wake = wake;
      return;
    }
  }
  st.plan_spin = o.next_look <= now;
  st.plan_wake = std::min(wake, o.next_look);
}

void reactor_core::nap_until(clock::time_point until, bool learn_overshoot) {
  bump(m_.parks);
  const clock::time_point asked_at = clock::now();
  const bool timed_out = wake_->nap_until(
      until, [this] { return has_inputs(); }, [this] { leave_pass(); });
  const clock::time_point woke = clock::now();  // before a host's pass may delay it
  enter_pass();
  // Only a nap that ran its course says how late this machine's timers fire.
  if (!timed_out) return;
  add_sample(m_.nap_overshoot, woke - until);
  if (learn_overshoot) overshoot_.add(until - asked_at, woke - until);
}

reactor_core::clock::time_point reactor_core::service_start(const stream_state& st) const noexcept {
  // The oldest wait's work could start once it was submitted and the stream's previous wait was
  // done (a cancelled wait's marker has no submission time: the previous completion then).
  const timeline_entry& e = st.entries.front();
  clock::time_point s = st.last_done;
  if (e.op != nullptr) s = std::max(s, e.op->submitted_at_);
  return s;
}

}  // namespace evr::detail
