// reactor/src/idle_governor.cpp — the idle policy's reactor-wide half: the submitter's wake-up
// rule, the poll tick, learning from what the sweep saw, and how the reactor thread rests between
// passes. The per-stream plans are in idle_plans.cpp.
#include "idle_governor.hpp"

#include <algorithm>
#include <limits>

namespace evr::detail {
namespace {

/// While spinning for a predicted completion, the plan is made again at least this often (and at
/// once after any progress or new wait): a window that closes, or another stream's window that
/// opens, is noticed this late at most, for a fraction of the cost of planning every sweep.
constexpr nanoseconds replan_interval = std::chrono::microseconds(10);
/// While stopping, sweeps are at most this far apart (the drain deadline is checked per pass).
constexpr nanoseconds closing_nap = std::chrono::milliseconds(1);

rest_step nap_until(std::chrono::steady_clock::time_point until, bool learn_overshoot) noexcept {
  return {rest_step::kind::nap, until, learn_overshoot};
}

}  // namespace

idle_governor::idle_governor(const reactor_options& options, const strategy_traits& traits,
                             device::backend& backend, wait_registry& registry,
                             reactor_counters& counters)
    : options_(options),
      traits_(traits),
      mode_(idle_traits::of(options.idle, traits)),
      backend_(backend),
      registry_(registry),
      counters_(counters),
      settings_(idle_settings::from(options)),
      // Not sooner: a host's busy io thread may run its handlers for a millisecond before it
      // looks again, and the reactor's own look adds cross-thread posts to that thread.
      host_grace_(std::max<nanoseconds>(std::chrono::milliseconds(1), 2 * options.poll_period)) {}

std::int64_t idle_governor::earliest_completion_ns(const stream_state* st,
                                                   std::uint64_t seq) const noexcept {
  // Under the ladder a napping reactor picks the wait up when its nap ends, and host_func's host
  // function wakes it.
  if (!mode_.wakes_for_submissions) return std::numeric_limits<std::int64_t>::max();
  const std::int64_t now = clock::now().time_since_epoch().count();
  if (st == nullptr) return now;  // a user's event: nothing is known of it
  // A wait queued behind pending waits of its stream cannot finish before them.
  if (seq > st->published_completed_seq.load(std::memory_order_relaxed) + 1)
    return std::numeric_limits<std::int64_t>::max();
  return now + st->published_low_ns.load(std::memory_order_relaxed);
}

idle_governor::scout_basis idle_governor::scout_basis::of(const wait_op& op) noexcept {
  return {op.seq_, op.submitted_at_, probed_until(op), op.unhurried_};
}

std::int64_t idle_governor::first_scout_ns(const stream_state* st,
                                           const scout_basis& w) const noexcept {
  // As the reactor will plan it (scout_if_due; a probed wait's from its caller's window), from
  // what the last sample published: a wait at its stream's front, started at its submission.
  constexpr std::int64_t none = std::numeric_limits<std::int64_t>::max();
  if (st == nullptr || !scouts_allowed() ||
      w.seq != st->published_completed_seq.load(std::memory_order_relaxed) + 1)
    return none;
  const clock::time_point start = w.submitted;
  clock::time_point horizon = w.covered_until;
  if (horizon <= start) {  // not probed: the reactor's model, steady work only
    using scouted = stream_state::scouted;
    const scouted rule = st->published_scouts.load(std::memory_order_relaxed);
    const std::int64_t open = st->published_open_ns.load(std::memory_order_relaxed);
    if (rule == scouted::none || (w.unhurried && rule != scouted::all_waits) || open == 0)
      return none;
    horizon = start + nanoseconds(open);
  }
  const clock::time_point scout = next_scout(start, horizon, start);
  return scout == clock::time_point::max() ? none : scout.time_since_epoch().count();
}

std::int64_t idle_governor::window_open_ns(const stream_state* st,
                                           const wait_op& op) const noexcept {
  // The wait's work starts now when nothing of its stream is pending before it; otherwise the
  // reactor tells the host once it knows. Only for a hosted marker (host_of says which).
  const bool hosted = op.marker_event() == nullptr || options_.host_event_waits;
  const std::int64_t open =
      st != nullptr && hosted ? st->published_open_ns.load(std::memory_order_relaxed) : 0;
  if (open > 0 && op.seq_ == st->published_completed_seq.load(std::memory_order_relaxed) + 1)
    return op.submitted_at_.time_since_epoch().count() + open;
  return 0;
}

void idle_governor::plan_unplanned(stream_state& st, clock::time_point now) {
  stream_state::plan_state& p = st.plan;
  if (!p.stale) return;
  const poll_host* h = host_of(st);
  if (h == nullptr) {
    // The reactor's own stream whose oldest wait was never planned: it made the stream active,
    // or came behind one just retired. It has no plan until the reactor rests, and a sweep that
    // found completions is followed by another at once, without a rest: each such sweep queried
    // the new wait (an event marker: a driver query) for work just enqueued (an H200, 64 torch
    // streams of 2 ms work: event queries a wait 6.8 -> 5.8 once planned here). A plan
    // that is only stale (its stream was looked at) still says what the sweeps should do, and a
    // spun window is planned again every replan_interval, not every sweep.
    if (mode_.between_looks == idle_traits::rest::predictive && !st.entries.empty() &&
        st.entries.front().seq != p.planned_seq)
      plan(st, now);
    return;
  }
  // A wait that made its stream active is the host's from the start (new_wait schedules it on
  // the host, which plans it at its next pass), but until someone plans it, it has no host look
  // and the stream looked uncovered: every sweep the reactor made meanwhile queried it in the
  // host's place, and under load, where the host's passes wait behind its thread's handlers, took
  // the completion and posted it back across threads. On an H200 with stream waits (event
  // markers) at /busy?us=200, 0.47 of those queries a wait and 28 % of the completions. Planned
  // here, the stream is covered like any other the host looks at (wants_look), with the same
  // safety look once the host is late by its grace.
  if (p.host_look != clock::time_point::max() || !leaves_covered_streams()) return;
  if (h->host_role() != poll_host::role::polls) return;
  plan(st, now);
}

bool idle_governor::reached_window(stream_state& st, clock::time_point now) {
  stream_state::plan_state& p = st.plan;
  if (!p.asleep_before_window || now < p.query_after) return false;
  // A long sleep towards a window ends early by its margin and is slept again with the narrower
  // margin of a shorter one (idle_policy.cpp, sleep_until): two or three wake-ups a wait. Each
  // used to look at the stream, an event marker's driver query for work not expected done (an
  // H200, 64 torch streams of 2 ms work: 2.5 such looks a wait, one find in 500). The last wake,
  // at the window's margin, still looks: a look that sees the work pending just before its window
  // brackets an early end for learning (without it the windows opened ever earlier; notebook,
  // "The poll tick at the pace of long work").
  plan(st, now);
  return !p.asleep_before_window && now >= p.query_after;
}

bool idle_governor::wants_look(const stream_state& st, clock::time_point now,
                               poll_tick& tick) const noexcept {
  // Before its window: the stream's work is not expected to be done, and looking would cost a
  // driver query on every sweep that other streams' windows ask for.
  if (now < st.plan.query_after) return false;
  // A stream its host covers (the host keeps its promise to look): the reactor's sweeps leave it
  // to the host, so that a sweep made for other reasons does not take the host's completions (and
  // post them across threads). Only while the reactor rests by sleeping (leaves_covered_streams):
  // and a late host's streams are looked at by the reactor, once per grace (covered_until moves
  // with each look).
  if (leaves_covered_streams()) {
    if (const poll_host* h = covering_host(st);
        h != nullptr && now < covered_until(st, *h) && now < st.plan.scout_at)
      return false;
  }
  if (st.plan.on_poll_tick) {
    // Off the tick, only a due fault probe (strategies that have one) makes this sweep look.
    const bool probe_due =
        traits_.fault_probes && now >= st.last_probe + options_.fault_probe_interval;
    if (!tick.due && !probe_due) return false;
    ++tick.polled;
    tick.spacing = std::min(tick.spacing, st.plan.tick_spacing);
  }
  return true;
}

void idle_governor::end_sweep(clock::time_point began, const poll_tick& tick) {
  if (!tick.due || tick.polled == 0) return;
  // The next tick: poll_period (or poll_budget's spacing) from now, or later when that many looks
  // would exceed poll_looks_per_second (the soonest a tick may come), or later still when every
  // stream it looked at asked for a longer spacing (unhurried waits of long work).
  tick_soonest_ = settings_.window_poll_period;
  if (options_.poll_looks_per_second > 0)
    tick_soonest_ = std::max(
        tick_soonest_, nanoseconds(static_cast<std::int64_t>(tick.polled) * 1'000'000'000 /
                                   static_cast<std::int64_t>(options_.poll_looks_per_second)));
  tick_period_ = std::max(tick_soonest_, tick.spacing);
  tick_began_ = began;
  // A period after the tick that was due, not after this sweep, which the reactor's wake-up made
  // late: so the ticks keep their phase while they run, and a sleep planned to a later point of
  // their grid (tick_at_or_before) meets a tick there instead of waking the reactor on its own
  // (docs/notebook.md, "The poll tick keeps its phase"). A sweep more than half a period late
  // starts the grid again from itself, so a tick set here comes at least half a period after its
  // sweep (join_poll_tick may still bring it forward, as before).
  const clock::time_point on_grid = poll_tick_ + tick_period_;
  poll_tick_ = on_grid - began >= tick_period_ / 2 ? on_grid : began + tick_period_;
  // What a tick's look costs (poll_budget spaces the ticks by it): the sweep, one clock read per
  // tick, only when there is a budget to keep.
  if (settings_.poll_budget > 0) look_cost_.add(clock::now() - began);
}

void idle_governor::looked_at(stream_state& st, clock::time_point now, bool moved) {
  stream_state::plan_state& p = st.plan;
  // The plan's scout, if this is its look: counted once (a stream whose young model is looked at
  // by every sweep is looked at again before it is planned again).
  const bool scout = now >= p.scout_at;
  if (scout) {
    bump(counters_.scout_looks);
    p.scout_at = clock::time_point::max();
  }
  if (moved) {
    const bool found = scout && st.retired_in_sweep;  // not a fault, nor cancelled markers only
    if (found) bump(counters_.scout_finds);
    p.scout_found = found;  // the work got shorter: the next waits are scouted too
    learn(st, now);
    p.waiting_since = now;
    p.missed = false;
    p.query_after = {};
    p.asleep_before_window = false;
    p.on_poll_tick = false;
    p.doorbell_armed = false;
    st.doorbell_rang.store(false, std::memory_order_relaxed);
  } else if (mode_.ladder_doorbells && !p.doorbell_armed &&
             now - p.waiting_since >= options_.doorbell_after) {
    arm_doorbell(st);  // (the predictive policy arms doorbells when it plans)
  }
  p.last_look = now;  // the oldest wait left, if any, was pending now
  p.stale = true;
}

void idle_governor::learn(stream_state& st, clock::time_point now) {
  // The look at `now` saw waits of `st` done that the one at last_look saw pending: the newest
  // of them finished in between (the midpoint is the estimate; the two are a few hundred ns apart
  // while the reactor polls). Its service started when it was submitted, or when the wait before
  // it finished, whichever is later (idle_policy.hpp).
  stream_state::plan_state& p = st.plan;
  if (!st.retired_in_sweep) {  // only cancelled waits' markers retired: nothing to sample
    p.last_done = p.last_look + (now - p.last_look) / 2;
    return;
  }
  st.retired_in_sweep = false;
  const clock::time_point start = std::max(st.retired_submit, p.last_done);
  clock::time_point done;
  if (!done_time(st, start, now, done)) {
    p.last_done = p.last_look + (now - p.last_look) / 2;
    return;
  }
  p.model.add(done - start);
  p.last_done = done;
  // For submitters deciding whether a new wait could finish before a napping reactor looks: the
  // shortest work seen lately; for irregular work also the spacing of its looks, which its waits
  // accept as lateness anyway (else every submission on 64 irregular streams woke the reactor for
  // a sweep of all of them, undoing poll_budget).
  const bool ready = p.model.ready();
  std::int64_t low = 0;
  if (ready) {
    low = p.model.low().count();
    if (mode_.predictive && !is_steady(settings_, p.model))
      low += std::max(settings_.window_poll_period, tick_period_).count();
  }
  st.published_low_ns.store(low, std::memory_order_relaxed);
  st.published_open_ns.store(
      ready ? std::max<std::int64_t>(1, window_open_offset(settings_, p.model).count()) : 0,
      std::memory_order_relaxed);
  using scouted = stream_state::scouted;
  const bool scouts = ready && scouts_allowed() && is_steady(settings_, p.model);
  st.published_scouts.store(!scouts         ? scouted::none
                            : p.scout_found ? scouted::all_waits
                                            : scouted::hurried_waits,
                            std::memory_order_relaxed);
}

bool idle_governor::done_time(const stream_state& st, clock::time_point start,
                              clock::time_point now, clock::time_point& done) const noexcept {
  const stream_state::plan_state& p = st.plan;
  if (st.retired_probed) {
    // Its caller looked through its window, the reactor did not: when the caller saw the word,
    // if it did (wait_probe::saw_reached), is the sample. Else only a look of the reactor after
    // the work started brackets the end, or a scout's (before the caller's window closed, long
    // before it opened): the work got much shorter, and the bracket from the start says so.
    const clock::time_point seen{nanoseconds(st.probe_seen_ns.load(std::memory_order_relaxed))};
    if (seen >= start && seen <= now) {
      done = seen;
      return true;
    }
    if (p.last_look <= start && now >= st.retired_covered_until) return false;
  }
  const clock::time_point seen_pending = std::max(p.last_look, start);
  done = seen_pending + (now - seen_pending) / 2;
  // A bracket that holds the model's earliest end (start + low) says nothing against the model:
  // its midpoint would drag it down. A look made late (a loaded host's, after the window opened)
  // following one long before (a scout's, or the submission) gave 44 ms samples of steady 60 ms
  // work on a loaded machine; the model then called the work irregular, gave it no scouts, and
  // opened its windows 20 ms early. So such a sample is no earlier than that end. A find before
  // it (the work got shorter) keeps its midpoint.
  if (p.model.ready() && now >= start + p.model.low()) done = std::max(done, start + p.model.low());
  return true;
}

rest_step idle_governor::rest(clock::time_point now, bool progress, bool took_new, bool closing) {
  if (progress) {
    ladder_.progress(now);
  } else if (took_new) {
    ladder_.new_waits();
  }
  if (progress || took_new) replan_at_ = {};
  // Nothing pending: zero wake-ups until a submission; hosts may run passes meanwhile.
  if (registry_.idle() && !closing) return {rest_step::kind::park};
  if (progress) {
    // More may be done by now: sweep again at once, or, batching (coalesce), once the interval
    // since this pass began is over. Not while stopping: the drain deadline wants passes.
    if (options_.coalesce.count() > 0 && !closing && clock::now() < now + options_.coalesce)
      return nap_until(now + options_.coalesce, /*learn_overshoot=*/false);
    return {};
  }
  switch (mode_.between_looks) {
    case idle_traits::rest::host_funcs:
      // A host function wakes the reactor; the timer is the fault probe.
      return nap_until(now + (closing ? std::min(closing_nap, options_.fault_probe_interval)
                                      : options_.fault_probe_interval),
                       /*learn_overshoot=*/false);
    case idle_traits::rest::spin: return {};
    case idle_traits::rest::ladder: return rest_ladder(now, closing);
    case idle_traits::rest::predictive: return rest_predictive(now, closing);
  }
  return {};
}

rest_step idle_governor::rest_ladder(clock::time_point now, bool closing) {
  nanoseconds nap{};
  switch (ladder_.next(options_, now, nap)) {
    case ladder::action::spin: return {};
    case ladder::action::yield: return {rest_step::kind::yield};
    case ladder::action::nap: break;
  }
  // adaptive: when every pending stream has a doorbell armed, a host function wakes the reactor;
  // the timer is only the fault probe.
  const auto& active = registry_.active();
  bool all_doorbells = traits_.doorbells && !active.empty() && registry_.loose_empty();
  for (std::size_t i = 0; all_doorbells && i < active.size(); ++i)
    all_doorbells = active[i]->plan.doorbell_armed;
  if (all_doorbells) nap = options_.fault_probe_interval;
  if (closing) nap = std::min(nap, closing_nap);
  return nap_until(now + nap, /*learn_overshoot=*/false);
}

rest_step idle_governor::rest_predictive(clock::time_point now, bool closing) {
  if (now < replan_at_) return {};  // spinning: the plan made at most replan_interval ago holds
  clock::time_point wake = now + options_.fault_probe_interval;
  bool spin = false, spun_window = false;
  // Wide windows are looked at every poll_period (the poll tick), or less often when a tick's
  // look costs more than poll_budget of a core allows (many streams, each queried on every tick).
  if (settings_.poll_budget > 0)
    settings_.window_poll_period =
        budgeted_poll_period(settings_.poll_period, look_cost_.mean(), settings_.poll_budget);
  for (stream_state* st : registry_.active()) {
    if (st->entries.empty()) continue;
    // A stream's plan holds until it is looked at, gets a new wait, or the plan's time comes.
    if (st->plan.stale || st->plan.wake <= now) plan(*st, now);
    // Covered by a polling host: the host looks, takes what is submitted on its thread and plans
    // the stream again as it goes; the reactor naps until the host's promise has passed by the
    // grace (then it looks itself, not before the stream's window), whatever the stream's
    // windows, or until the stream's scout, which is the reactor's. Under load that is one timed
    // wake-up per grace, however many streams and waits.
    if (const poll_host* h = covering_host(*st)) {
      clock::time_point look = std::max({covered_until(*st, *h), st->plan.query_after});
      look = std::min(look, st->plan.scout_at);  // its scout is the reactor's
      wake = std::min(wake, std::max(look, now + min_nap));
      continue;
    }
    if (st->plan.spin) {
      spin = true;
      // A stream on the poll tick whose tick is due is looked at by the next sweep, once: that
      // is no spin, and the sweep's look replans it (the tick moves on). Only a spun window
      // lets the plans stand for replan_interval; else every tick cost up to 10 us of spinning.
      spun_window |= !st->plan.on_poll_tick;
    } else {
      wake = std::min(wake, st->plan.wake);
    }
  }
  if (!registry_.loose_empty()) {
    // Waits on a user's event: no stream, no model. Spin briefly, then naps of a quarter of the
    // time since their last progress.
    const nanoseconds age = now - registry_.loose_since();
    if (age < options_.spin_window) {
      spin = spun_window = true;
    } else {
      wake = std::min(wake, now + std::clamp<nanoseconds>(age / 4, std::chrono::microseconds(10),
                                                          options_.max_sleep));
    }
  }
  if (closing) wake = std::min(wake, now + closing_nap);
  if (spin || wake - now < min_nap) {
    replan_at_ = spun_window ? now + replan_interval : clock::time_point{};
    return {};
  }
  replan_at_ = {};
  return nap_until(wake, /*learn_overshoot=*/true);
}

}  // namespace evr::detail
