// reactor/src/idle_governor.hpp — the idle policy as one object: when each stream is looked at
// next and by whom (the reactor, or the host its oldest wait is delivered to), and how the reactor
// thread waits meanwhile. idle_policy.hpp holds the pure logic it applies (the service-time model,
// predict(), the ladder); docs/architecture.md, "Idle policy", the why.
//
// Chosen once from reactor_options::idle and the strategy (idle_traits), as the strategy is
// through strategy_traits.
// Owns: the settings and the reactor-wide state (the ladder, how late sleeps end, the poll tick
// and what its sweeps cost, when to plan again while spinning); each stream's plan
// (stream_state::plan) and what is published of it for submitters and hosts (published_low_ns,
// published_open_ns, published_scouts); the doorbells (adaptive); the submitter's wake-up rule.
// Reads the wait registry's active streams and loose waits; may fail a device (a doorbell that
// cannot be armed). The sweep asks it which streams to look at (wants_look) and reports what it
// saw (looked_at); the registry reports new waits and streams gone idle.
//
// Threads: earliest_completion_ns, first_scout_ns and window_open_ns on any thread (they read
// immutable settings and relaxed atomics); everything else under the pass lock.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include <evr/device/backend.hpp>
#include <evr/reactor/detail/poll_host.hpp>
#include <evr/reactor/detail/wait_op.hpp>
#include <evr/reactor/options.hpp>

#include "counters.hpp"
#include "idle_policy.hpp"
#include "strategy_traits.hpp"
#include "stream_state.hpp"
#include "wait_registry.hpp"

namespace evr::detail {

/// What reactor_options::idle means for the reactor, with the strategy, computed once.
struct idle_traits {
  /// How the reactor thread waits while waits pend and its last pass found nothing: naps until a
  /// host function wakes it (host_func, whatever the mode), spins, climbs the ladder, or sleeps
  /// until the streams' plans want it (predictive).
  enum class rest : unsigned char { host_funcs, spin, ladder, predictive };
  rest between_looks = rest::predictive;
  /// idle_mode::predictive: irregular work's published shortest length includes its looks'
  /// spacing (learn()).
  bool predictive = false;
  /// ladder with doorbells (adaptive): a look that finds an old wait pending arms a doorbell.
  bool ladder_doorbells = false;
  /// A submission wakes a napping reactor when its wait could finish before the reactor looks:
  /// only the predictive policy plans its naps (host_func's host function wakes it anyway).
  bool wakes_for_submissions = false;

  static constexpr idle_traits of(idle_mode m, const strategy_traits& s) noexcept {
    idle_traits t;
    t.predictive = m == idle_mode::predictive;
    t.ladder_doorbells = s.doorbells && m == idle_mode::ladder;
    t.wakes_for_submissions = t.predictive && !s.host_func_markers;
    switch (m) {
      case idle_mode::spin: t.between_looks = rest::spin; break;
      case idle_mode::ladder: t.between_looks = rest::ladder; break;
      case idle_mode::predictive: t.between_looks = rest::predictive; break;
    }
    if (s.host_func_markers) t.between_looks = rest::host_funcs;
    return t;
  }
};

/// What the reactor thread does after a pass (reactor_core carries it out).
struct rest_step {
  enum class kind : unsigned char { go_on, yield, park, nap };
  kind what = kind::go_on;
  std::chrono::steady_clock::time_point until{};  // nap: until then, or until woken
  bool learn_overshoot = false;                   // nap: how late it ends teaches the sleep margins
};

/// The poll tick as one sweep sees it: whether it has come, the streams looked at on it, and the
/// shortest spacing they asked for (stream_state::plan_state::tick_spacing).
struct poll_tick {
  bool due = false;
  std::size_t polled = 0;
  std::chrono::nanoseconds spacing = std::chrono::nanoseconds::max();
};

class idle_governor {
 public:
  using clock = std::chrono::steady_clock;

  idle_governor(const reactor_options& options, const strategy_traits& traits,
                device::backend& backend, wait_registry& registry, reactor_counters& counters);
  idle_governor(const idle_governor&) = delete;
  idle_governor& operator=(const idle_governor&) = delete;

  // --- any thread ----------------------------------------------------------------------------
  /// The submitter's wake-up rule (wakeup::wake_for_submission): the earliest time (steady clock
  /// ns) a new wait of `st` (nullptr: a user's event) with sequence number `seq` could be done;
  /// INT64_MAX: never before a napping reactor looks anyway.
  std::int64_t earliest_completion_ns(const stream_state* st, std::uint64_t seq) const noexcept;
  /// What first_scout_ns needs of a wait: copied before its push (the reactor may complete and
  /// free it from then on), read after the wake-up handshake's seq_cst load (wakeup.hpp).
  struct scout_basis {
    std::uint64_t seq = 0;
    clock::time_point submitted{}, covered_until{};
    bool unhurried = false;
    static scout_basis of(const wait_op& op) noexcept;
  };
  /// The submitter's wake-up rule, for scouts: when the reactor will make the wait's first scout
  /// (steady clock ns; next_scout), a look of its own whoever covers the wait; INT64_MAX: none.
  /// Without it a reactor napping past the scout (its nap set before the wait came) made it
  /// late or not at all, and work that got much shorter was found at the old window. Called
  /// inside the wake-up rule, so that it reads the published values of the reactor's last pass
  /// (read before the push, they could be a retire behind, and the scout was then none).
  std::int64_t first_scout_ns(const stream_state* st, const scout_basis& w) const noexcept;
  /// When `op`'s window opens, for its host to arm a timer (host_window); 0: not known now.
  std::int64_t window_open_ns(const stream_state* st, const wait_op& op) const noexcept;
  /// The submitter's wake-up rule for a wait whose polling host was told when its window opens
  /// (`open_ns`): the host takes and finds it; the reactor need only be awake by then plus the
  /// grace it gives a host (its safety look).
  std::int64_t hosted_deadline_ns(std::int64_t open_ns, const poll_host& host) const noexcept {
    return open_ns + grace_for(host).count();
  }

  // --- the sweep and the registry ------------------------------------------------------------
  poll_tick begin_sweep(clock::time_point now) const noexcept { return {now >= poll_tick_}; }
  /// Before the sweep decides on `st`: a new wait is planned now, so that the sweep sees it
  /// before its window (skipped), or covered by its host, rather than unplanned (and looked at).
  /// The reactor's own stream (predictive policy) whose oldest wait was never planned; a polling
  /// host's stream with a stale plan and no look of its host (its wait came since the last plan,
  /// which the host would make at its next pass; or its last plan was the reactor's: learning,
  /// missed), while the reactor leaves covered streams to their hosts.
  void plan_unplanned(stream_state& st, clock::time_point now);
  /// Before the sweep decides on `st`: a stream asleep before its window whose wake has come is
  /// planned again, not looked at (its work is not expected done). True when the new plan is its
  /// window (or past it): the sweep then looks once, whatever the tick.
  bool reached_window(stream_state& st, clock::time_point now);
  /// Whether this sweep looks at `st` (before its window it is skipped; irregular work in its
  /// window only on the tick, or when its fault probe is due).
  bool wants_look(const stream_state& st, clock::time_point now, poll_tick& tick) const noexcept;
  /// The sweep begun at `began` is done: if this tick looked at streams, sets the next a period
  /// after it on the tick's grid (the grid keeps its phase while the tick runs).
  void end_sweep(clock::time_point began, const poll_tick& tick);
  /// `st` was looked at: `moved` when waits retired or failed (a service-time sample).
  void looked_at(stream_state& st, clock::time_point now, bool moved);
  void new_wait(stream_state& st, const wait_op& op, clock::time_point now,
                bool activated) noexcept;
  void went_idle(stream_state& st) noexcept;

  // --- hosts (host_pass.hpp) -----------------------------------------------------------------
  /// The host of `st`'s oldest wait (nullptr: none, or a marker its host does not look at).
  poll_host* host_of(const stream_state& st) const noexcept;
  /// After the host's look at `st`: waits remain but the oldest is no longer `host`'s (a wait
  /// of another host, or one the reactor delivers). The reactor planned the stream as the
  /// host's (trusting its looks), so it must plan again now.
  bool handed_back(const stream_state& st, const poll_host& host) const noexcept {
    return !st.entries.empty() && host_of(st) != &host;
  }
  /// A host's schedule entry (host_schedule.hpp) still stands: the stream was not planned again
  /// since, and its oldest wait is still the host's.
  bool scheduled(const host_schedule::entry& e, const poll_host& host) const noexcept;
  /// Whether `host`'s next look (`next`, its schedule's earliest current entry) is a tick of
  /// irregular work its timer need not meet early (poll_result::next_is_tick): a tick with no
  /// steady window of the host's opening within the timer's margin after it.
  bool next_look_is_tick(const poll_host& host, const host_schedule::entry& next) const;
  /// After a host's pass looked at `st` (or found its look not due): plans it when its plan is
  /// stale or due, schedules its next look on the host and says whether it spins now
  /// (out.spin). True when a stream the host covered became the reactor's (learning again, a
  /// missed prediction): the reactor, napping on the host's promise, must plan it now.
  bool plan_for_host(stream_state& st, poll_host& host, clock::time_point now, poll_result& out);
  /// How long past a polling host's promised look (poll_host::looks_at_ns) the reactor waits
  /// before it looks at the host's streams itself: the bound on a late host (docs/architecture.md,
  /// "The last hop", "Under load").
  nanoseconds host_grace() const noexcept { return host_grace_; }
  /// The grace given to `host`: host_grace(), or more for a host whose passes wait behind its
  /// thread's other handlers (poll_host::queue_delay_ns), up to max_host_grace.
  nanoseconds grace_for(const poll_host& host) const noexcept;
  /// The longest grace a busy host gets.
  static constexpr nanoseconds max_host_grace = std::chrono::milliseconds(10);

  // --- the reactor thread's rest -------------------------------------------------------------
  void start(clock::time_point now) noexcept { ladder_.progress(now); }
  /// After a pass that began at `now`: `progress` (waits retired or cancelled), `took_new`
  /// (inputs came), `closing` (stopping: naps are short).
  rest_step rest(clock::time_point now, bool progress, bool took_new, bool closing);
  void woke_from_park(clock::time_point now) noexcept { ladder_.progress(now); }
  /// A nap asked for `asked` ended by its deadline, `overshoot` late.
  void nap_timed_out(nanoseconds asked, nanoseconds overshoot) noexcept {
    overshoot_.add(asked, overshoot);
  }

 private:
  rest_step rest_ladder(clock::time_point now, bool closing);
  rest_step rest_predictive(clock::time_point now, bool closing);
  void learn(stream_state& st, clock::time_point now);
  /// When the newest wait `learn` retired was done, as its looks (or its caller's, for a probed
  /// wait) tell; false when they do not bracket it.
  bool done_time(const stream_state& st, clock::time_point start, clock::time_point now,
                 clock::time_point& done) const noexcept;
  void plan(stream_state& st, clock::time_point now);
  /// Scouts (idle_policy.hpp, next_scout) are planned only under the predictive policy.
  bool scouts_allowed() const noexcept {
    return mode_.between_looks == idle_traits::rest::predictive;
  }
  /// Makes `o`'s next look a scout (next_scout) if one comes before it, the work is steady and
  /// the oldest wait of `st` is not unhurried (or the last one was found by a scout).
  void scout_if_due(stream_state& st, stream_outlook& o, clock::time_point start,
                    clock::time_point now) const noexcept;
  void plan_reactor(stream_state& st, stream_outlook o, clock::time_point start,
                    clock::time_point now, clock::time_point wake);
  bool plan_hosted(stream_state& st, poll_host& host, const stream_outlook& o,
                   clock::time_point now, clock::time_point& reactor_wake);
  void plan_host_polls(stream_state& st, poll_host& host, const stream_outlook& o,
                       clock::time_point now, nanoseconds grace);
  void skip_until(stream_state& st, clock::time_point t) const noexcept;
  /// How often an unhurried wait in its window is looked at (unhurried_looks_per_work).
  nanoseconds unhurried_spacing(const service_time_model& model) const noexcept;
  /// Whether the poll tick runs: some stream is on it (its last tick is less than a period ago).
  bool ticking(clock::time_point now) const noexcept;
  /// The last point at or before `t` of the poll tick's grid (poll_tick_, every tick_period_).
  /// Only while ticking().
  clock::time_point tick_at_or_before(clock::time_point t) const noexcept;
  /// Puts `st` (irregular work in its window) on the poll tick, looked at every `spacing` at
  /// least: the next tick comes no later than that after the last one.
  clock::time_point join_poll_tick(stream_state& st, nanoseconds spacing) noexcept;
  clock::time_point service_start(const stream_state& st) const noexcept;
  /// A stream planned for a polling host (its look is the host's): until when the host covers
  /// it. The host's promise to look (or the stream's last look, whoever made it, when later) plus
  /// the grace; the stream's own safety look when the host promised nothing yet (told by look_by,
  /// not armed). Past it, the reactor looks at the stream itself, once per grace.
  clock::time_point covered_until(const stream_state& st, const poll_host& host) const noexcept;
  /// Schedules `st`'s next look (plan.host_look) on `host`.
  void schedule(poll_host& host, stream_state& st);
  /// `st` is planned for a polling host (nullptr: not).
  const poll_host* covering_host(const stream_state& st) const noexcept;
  /// How old an unpredicted wait must be before a doorbell is armed for it.
  nanoseconds doorbell_age(const service_time_model& model) const noexcept;
  void arm_doorbell(stream_state& st);
  static void doorbell_rang(void* state) noexcept;

  const reactor_options& options_;
  const strategy_traits& traits_;
  const idle_traits mode_;
  device::backend& backend_;
  wait_registry& registry_;
  reactor_counters& counters_;
  idle_settings settings_;         // window_poll_period is re-planned (poll_budget); the rest fixed
  ladder ladder_;                  // idle_mode::ladder
  sleep_overshoot overshoot_;      // how late timed sleeps end
  look_cost look_cost_;            // what a poll tick's sweep costs (poll_budget)
  clock::time_point poll_tick_{};  // when irregular work in its windows is looked at
  nanoseconds tick_period_{};      // the last spacing of the ticks
  nanoseconds tick_soonest_{};     // ... the shortest it could have been (poll_looks_per_second)
  clock::time_point tick_began_{};  // when the last tick's sweep began
  clock::time_point replan_at_{};   // while spinning, plan again no sooner than this
  const nanoseconds host_grace_;    // host_grace()
  /// Whether the reactor's sweeps leave the streams a host covers to the host. A host's pass runs
  /// only while the reactor thread sleeps or between its passes (the pass lock), so only a reactor
  /// that rests by sleeping may leave them: the predictive policy, also while it spins through a
  /// window of its own (a bounded window, and a host its passes keep out makes no new promise, so
  /// the reactor looks in its place once the old one has passed by the grace), and host_func's
  /// naps. The spin mode never sleeps while waits pend, and the ladder spins and yields before it
  /// naps: left to hosts whose passes seldom get in, they were looked at by no one (issue 43:
  /// evr-bench idle's fence-spin and ladder rows, posted, hung on a GPU machine's simulated
  /// device). Why the predictive spin leaves them too: spinning for a few streams of its own (a
  /// missed prediction, a stream learning), the reactor had queried every hosted stream in its
  /// window on every sweep and taken the hosts' completions (docs/notebook.md, "The reactor as the
  /// poller of a server with two io threads").
  bool leaves_covered_streams() const noexcept {
    return mode_.between_looks == idle_traits::rest::host_funcs ||
           mode_.between_looks == idle_traits::rest::predictive;
  }
};

}  // namespace evr::detail
