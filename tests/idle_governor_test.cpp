// The idle governor's rule for the streams a host covers (reactor/src/idle_governor.hpp,
// docs/architecture.md, "The last hop"): a host's pass runs only while the reactor thread sleeps
// or between its passes, so only a reactor that rests by sleeping may leave a covered stream to
// its host: the predictive one, also while it spins through a window of its own (bounded; it naps
// after). A reactor that never sleeps while waits pend (idle_mode::spin, the ladder's spin and
// yield) and left it was a reactor that looked at nobody's waits: on a GPU machine's simulated
// device evr-bench idle's fence-spin and ladder rows, posted, hung that way (issue 43).
#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include <evr/reactor/detail/wait_op.hpp>
#include <evr/sim/device.hpp>

#include "idle_governor.hpp"
#include "stream_state.hpp"
#include "support/governor_alone.hpp"

namespace {

using namespace std::chrono_literals;
using evr::test::governor_alone;
using evr::test::hosted_stream;
using evr::test::lone_wait;

}  // namespace

TEST_CASE("idle governor: a covered stream is left to its host only by a reactor that sleeps") {
  struct mode_case {
    evr::idle_mode mode;
    bool leaves_it;
  };
  for (const mode_case c :
       {mode_case{evr::idle_mode::predictive, true}, mode_case{evr::idle_mode::ladder, false},
        mode_case{evr::idle_mode::spin, false}}) {
    CAPTURE(std::string(evr::to_string(c.mode)));
    governor_alone g(evr::strategy::fence, c.mode);
    evr::detail::idle_governor& idle = g.idle;

    const auto now = std::chrono::steady_clock::now();
    hosted_stream h(now);
    evr::detail::stream_state& st = h.st;
    st.plan.host_look = now;  // planned for the host: its look is due
    evr::detail::poll_tick tick{true, 0};
    // Covered: the host promised a look within its grace. A sleeping (predictive) reactor leaves
    // it; one that spins must look itself, or nobody does.
    CHECK(idle.wants_look(st, now, tick) == !c.leaves_it);
    // A second past the promise and its grace, every reactor looks (the safety net).
    CHECK(idle.wants_look(st, now + 2s, tick));
  }
}

TEST_CASE("idle governor: a predictive reactor spinning for its own stream leaves covered ones") {
  // The predictive reactor spins through the window of a stream it looks at itself (a missed
  // prediction, a stream learning) and gives up the pass lock after every pass, so the hosts'
  // passes get in: its sweeps leave the streams a host covers to the host. Looking at them while
  // it spun made it the poller of a server's every stream in its window (an H200, two io threads,
  // /busy?us=1000 with stream waits: half the completions, half a core).
  governor_alone g(evr::strategy::fence, evr::idle_mode::predictive);
  const auto now = std::chrono::steady_clock::now();
  lone_wait own(g, now);
  for (int i = 0; i < 8; ++i) own.st.plan.model.add(1ms);  // steady 1 ms work: a narrow window
  const auto in_window = now + 1ms;
  hosted_stream h(in_window);  // the host promised to look a second from then
  h.st.plan.host_look = in_window;
  // In the own stream's window the reactor spins.
  const evr::detail::rest_step step = g.idle.rest(in_window, false, false, false);
  REQUIRE(own.st.plan.spin);
  REQUIRE(step.what == evr::detail::rest_step::kind::go_on);  // no sleep: the next pass at once
  evr::detail::poll_tick tick = g.idle.begin_sweep(in_window);
  CHECK(g.idle.wants_look(own.st, in_window, tick));      // its own stream: looked at
  CHECK_FALSE(g.idle.wants_look(h.st, in_window, tick));  // the host's: left to the host
  // Once the host's promise has passed by its grace, the spinning reactor looks in its place.
  CHECK(g.idle.wants_look(h.st, in_window + 2s, tick));
}

TEST_CASE("idle governor: a polling host's new wait is planned as covered before a sweep looks") {
  // A wait that makes its stream active is its host's, but is planned only at the host's next
  // pass; a sweep of the reactor in between saw it unplanned and queried it (an event marker:
  // a driver query) in the host's place. plan_unplanned plans it first.
  for (const bool learned : {true, false}) {
    CAPTURE(learned);
    governor_alone g(evr::strategy::poll, evr::idle_mode::predictive);
    evr::detail::idle_governor& idle = g.idle;

    const auto now = std::chrono::steady_clock::now();
    hosted_stream h(now);
    evr::detail::stream_state& st = h.st;
    // A model of steady 3 ms work (learned), or none yet (the reactor's to learn).
    for (int i = 0; learned && i < 8; ++i) st.plan.model.add(3ms);
    idle.new_wait(st, h.op, now, /*activated=*/true);
    evr::detail::poll_tick tick{true, 0};
    const auto in_window = now + 3ms;  // the work is expected done: a look would be due
    REQUIRE(idle.wants_look(st, in_window, tick));  // unplanned: nothing covers it yet
    idle.plan_unplanned(st, in_window);
    // Learned: the host covers it; the reactor looks only once the host's promise and its grace
    // have passed. Learning: the reactor's own plan, which looks.
    CHECK(idle.wants_look(st, in_window, tick) == !learned);
    CHECK(idle.wants_look(st, now + 2s, tick));
  }
}

TEST_CASE("idle governor: the reactor's own new wait is planned before a sweep looks") {
  // A wait on a stream without a host has no plan until the reactor rests, and a sweep that found
  // completions is followed by another at once, without a rest: each queried the new wait (an
  // event marker: a driver query) for work just enqueued. plan_unplanned plans it first: skipped
  // until its window once the stream's work is learned, looked at as before while learning.
  for (const bool learned : {true, false}) {
    CAPTURE(learned);
    governor_alone g(evr::strategy::poll, evr::idle_mode::predictive);
    const auto now = std::chrono::steady_clock::now();
    lone_wait w(g, now);
    for (int i = 0; learned && i < 8; ++i) w.st.plan.model.add(3ms);
    const auto soon = now + 10us;
    evr::detail::poll_tick tick = g.idle.begin_sweep(soon);
    REQUIRE(g.idle.wants_look(w.st, soon, tick));  // unplanned: every sweep looks
    g.idle.plan_unplanned(w.st, soon);
    CHECK(g.idle.wants_look(w.st, soon, tick) == !learned);
    CHECK(g.idle.wants_look(w.st, now + 3ms, tick));  // its window
    // Planned once: a plan that is only stale (the stream was looked at) is not made again by
    // the sweep; the reactor's rest plans it.
    g.idle.looked_at(w.st, soon, /*moved=*/false);
    const auto epoch = w.st.plan.epoch;
    g.idle.plan_unplanned(w.st, soon + 1us);
    CHECK(w.st.plan.epoch == epoch);
  }
}

TEST_CASE("idle governor: a sleep towards a window is slept again without a look") {
  // A long sleep towards a window ends early by its margin and is slept again with a narrower
  // one. The reactor's wake-ups before the window plan the stream again instead of looking at it
  // (an event marker: a driver query for work not expected done); the wake at the window's
  // margin looks, once, before the window opens: it brackets an early end for learning.
  for (const bool unhurried : {false, true}) {
    CAPTURE(unhurried);
    governor_alone g(evr::strategy::poll, evr::idle_mode::predictive);
    const auto now = std::chrono::steady_clock::now();
    lone_wait w(g, now);
    w.op.unhurried_ = unhurried;
    // Steady 1.8 ms work: its window opens before scout_min_span, so it has no scouts.
    for (int i = 0; i < 8; ++i) w.st.plan.model.add(1800us);
    g.idle.plan_unplanned(w.st, now);
    REQUIRE(w.st.plan.asleep_before_window);
    const auto first_wake = w.st.plan.query_after;
    REQUIRE(first_wake > now);
    CHECK_FALSE(g.idle.reached_window(w.st, first_wake - 1us));  // asleep: nothing to plan yet
    // 1.8 ms ahead, the first sleep ends final_sleep before the window: it is slept again.
    evr::detail::poll_tick tick = g.idle.begin_sweep(first_wake);
    CHECK_FALSE(g.idle.reached_window(w.st, first_wake));
    CHECK(w.st.plan.query_after > first_wake);
    CHECK_FALSE(g.idle.wants_look(w.st, first_wake, tick));
    // The later wakes, until one reaches the window's margin: that one looks, whatever the tick.
    auto wake = w.st.plan.query_after;
    int wakes = 1;
    while (!g.idle.reached_window(w.st, wake)) {
      REQUIRE(++wakes < 8);
      REQUIRE(w.st.plan.query_after > wake);
      wake = w.st.plan.query_after;
    }
    CHECK(wake < now + 1800us);  // before the work's expected end
    CHECK_FALSE(w.st.plan.asleep_before_window);
    CHECK(w.st.plan.on_poll_tick == unhurried);
    // Looked at then, the stream is not planned again by the sweeps until its wake: the next
    // sweep's decision is the plan's (an unhurried wait's on the tick).
    g.idle.looked_at(w.st, wake, /*moved=*/false);
    CHECK_FALSE(g.idle.reached_window(w.st, wake + 1us));
  }
}

TEST_CASE("idle governor: an unhurried wait's steady window is looked at on the tick, not spun") {
  // wait_target::unhurried(): the Python module's waits that reach their loop through its eventfd
  // (the loop wakes tens of us later anyway). In its window the reactor naps until the poll tick
  // instead of spinning; a prompt wait of the same stream spins.
  for (const bool unhurried : {false, true}) {
    CAPTURE(unhurried);
    governor_alone g(evr::strategy::fence, evr::idle_mode::predictive);
    const auto now = std::chrono::steady_clock::now();
    lone_wait w(g, now);
    evr::detail::stream_state& st = w.st;
    w.op.unhurried_ = unhurried;
    // Steady 1 ms work (before the fault probe, 2 ms after the wait came, is due).
    for (int i = 0; i < 8; ++i) st.plan.model.add(1ms);
    const auto in_window = now + 1ms;  // the work is expected to end now
    // The first pass in the window plans the stream and looks at it at once (a tick that no
    // stream was on is due).
    (void)g.idle.rest(in_window, false, false, false);
    CHECK(st.plan.on_poll_tick == unhurried);
    evr::detail::poll_tick tick = g.idle.begin_sweep(in_window);
    REQUIRE(g.idle.wants_look(st, in_window, tick));
    g.idle.looked_at(st, in_window, /*moved=*/false);  // still pending
    g.idle.end_sweep(in_window, tick);
    // A pass soon after (past the spin's replanning interval, before the next tick): the prompt
    // wait spins on, the unhurried one naps until the tick, which looks at it again.
    const auto later = in_window + 20us;
    const evr::detail::rest_step step = g.idle.rest(later, false, false, false);
    CHECK(st.plan.spin == !unhurried);
    CHECK((step.what == evr::detail::rest_step::kind::nap) == unhurried);
    if (unhurried) {
      CHECK(step.until > later);
      CHECK(step.until <= in_window + g.options.poll_period);  // a 32nd of 1 ms is less
      evr::detail::poll_tick at_tick = g.idle.begin_sweep(step.until);
      CHECK(g.idle.wants_look(st, step.until, at_tick));
    }
  }
}

TEST_CASE("idle governor: unhurried long work is polled at a 32nd of its length, others sooner") {
  // Irregular work in its window is looked at on the shared poll tick. An unhurried wait asks for
  // a look every 1/32 of its stream's shorter work (4 ms here: 125 us), so a tick with only such
  // streams comes that far apart; a prompt stream joining brings the next tick forward to
  // poll_period after the last.
  governor_alone g(evr::strategy::poll, evr::idle_mode::predictive);
  const auto now = std::chrono::steady_clock::now();
  lone_wait slow(g, now), prompt(g, now);
  slow.op.unhurried_ = true;
  // Irregular 4-8 ms work on both streams (the spread is wider than spin_fraction of it).
  for (int i = 0; i < 8; ++i) {
    slow.st.plan.model.add(i % 2 == 0 ? 4ms : 8ms);
    prompt.st.plan.model.add(i % 2 == 0 ? 4ms : 8ms);
  }
  const auto spacing = std::chrono::nanoseconds(4ms) / 32;
  REQUIRE(spacing > g.options.poll_period);
  const auto in_window = now + 4ms;
  const auto later = in_window + spacing;  // the slow stream's second tick
  // The prompt stream's work was submitted later: its window opens (2.99 ms after its start: its
  // shortest work less a quarter of the spread and prespin) 100 us after that second tick.
  prompt.op.submitted_at_ = later + 100us - 2990us;
  (void)g.idle.rest(in_window, false, false, false);
  REQUIRE(slow.st.plan.on_poll_tick);
  REQUIRE_FALSE(prompt.st.plan.on_poll_tick);
  evr::detail::poll_tick tick = g.idle.begin_sweep(in_window);
  REQUIRE(g.idle.wants_look(slow.st, in_window, tick));
  CHECK_FALSE(g.idle.wants_look(prompt.st, in_window, tick));  // before its window
  g.idle.looked_at(slow.st, in_window, /*moved=*/false);
  g.idle.end_sweep(in_window, tick);
  // Only the unhurried stream on the tick: the reactor naps a 32nd of its work.
  evr::detail::rest_step step = g.idle.rest(in_window + 10us, false, false, false);
  REQUIRE(step.what == evr::detail::rest_step::kind::nap);
  CHECK(step.until == later);
  CHECK_FALSE(g.idle.begin_sweep(in_window + g.options.poll_period).due);
  tick = g.idle.begin_sweep(later);
  REQUIRE(tick.due);
  REQUIRE(g.idle.wants_look(slow.st, later, tick));
  g.idle.looked_at(slow.st, later, /*moved=*/false);
  g.idle.end_sweep(later, tick);
  // The prompt stream's window is about to open: it joins the tick, which then comes
  // poll_period after the last (already past) rather than a 32nd of the slow work after it.
  const auto joined = later + 90us;
  step = g.idle.rest(joined, false, false, false);
  REQUIRE(prompt.st.plan.on_poll_tick);
  CHECK(step.what != evr::detail::rest_step::kind::nap);
  tick = g.idle.begin_sweep(joined);
  CHECK(tick.due);
  CHECK(g.idle.wants_look(prompt.st, joined, tick));
}

TEST_CASE("idle governor: a probed wait is not looked at before its caller's window closes") {
  // wait_target::probed() with a fence marker or a signal: the caller (Python's event loop) reads
  // the word itself until its window closes (a fence wait's covered_until_ns_; a signalled
  // wait's stream's signal_covered_until_ns, as its own bytes hold its count). The reactor naps
  // through that time, even where its own model says the work ends and it would spin, and looks
  // once it has passed.
  for (const bool signalled : {false, true}) {
    CAPTURE(signalled);
    governor_alone g(evr::strategy::fence, evr::idle_mode::predictive);
    const auto now = std::chrono::steady_clock::now();
    lone_wait w(g, now);
    evr::detail::stream_state& st = w.st;
    const evr::detail::wait_op& op = w.op;
    const std::int64_t window_end = (now + 1500us).time_since_epoch().count();  // before the probe
    w.op.probed_ = true;
    if (signalled) {
      w.op.signalled_ = true;
      w.op.signal_value_ = 1;
      st.signal_covered_until_ns.store(window_end);
    } else {
      w.op.covered_until_ns_ = window_end;
    }
    REQUIRE(evr::detail::probed_until(op).time_since_epoch().count() == window_end);
    for (int i = 0; i < 8; ++i) st.plan.model.add(1ms);  // steady 1 ms work: the window is at 1 ms
    const auto in_window = now + 1ms;
    const evr::detail::rest_step step = g.idle.rest(in_window, false, false, false);
    CHECK_FALSE(st.plan.spin);
    CHECK(step.what == evr::detail::rest_step::kind::nap);
    CHECK(step.until == evr::detail::probed_until(op));
    evr::detail::poll_tick tick = g.idle.begin_sweep(in_window);
    CHECK_FALSE(g.idle.wants_look(st, in_window, tick));  // a sweep for other streams skips it
    g.idle.end_sweep(in_window, tick);
    // The window closed without the caller seeing the word: the reactor looks now.
    const auto after = evr::detail::probed_until(op);
    (void)g.idle.rest(after, false, false, false);
    evr::detail::poll_tick at_close = g.idle.begin_sweep(after);
    CHECK(g.idle.wants_look(st, after, at_close));
  }
}

TEST_CASE("idle governor: a probed wait is learnt from when its caller saw the word") {
  // The reactor did not look during the caller's window, so its own looks (the wait's submission,
  // then 5 ms later) say nothing of when the work ended; wait_probe::saw_reached does.
  for (const bool reported : {false, true}) {
    CAPTURE(reported);
    governor_alone g(evr::strategy::fence, evr::idle_mode::predictive);
    const auto now = std::chrono::steady_clock::now();
    lone_wait w(g, now);
    evr::detail::stream_state& st = w.st;
    w.op.probed_ = true;
    w.op.covered_until_ns_ = (now + 1ms).time_since_epoch().count();
    if (reported) st.probe_seen_ns.store((now + 700us).time_since_epoch().count());
    // The wait retired by the reactor's first look, 5 ms on (as wait_registry::retire_front).
    st.retired_submit = now;
    st.retired_in_sweep = true;
    st.retired_probed = true;
    g.idle.looked_at(st, now + 5ms, /*moved=*/true);
    if (reported) {
      CHECK(st.plan.last_done == now + 700us);
      CHECK(st.plan.model.samples() == 1);
    } else {
      CHECK(st.plan.model.samples() == 0);  // no sample rather than a wrong one
    }
  }
}

TEST_CASE("idle governor: a late look does not drag a steady model down, an early find does") {
  // Steady 60 ms work, looked at half way (a scout: pending), then found done by a late look (a
  // loaded host's, 70 ms after the start): the work ended somewhere in [30, 70] ms, which holds
  // the model's 60 ms. The bracket's midpoint (50 ms) was the sample before, and a few such made
  // the model call the work irregular (no more scouts; windows opened 15-20 ms early). A find
  // before the model's earliest end (40 ms) does say the work got shorter: its midpoint stays.
  for (const auto found_at : {70ms, 40ms}) {
    CAPTURE(found_at.count());
    governor_alone g(evr::strategy::fence, evr::idle_mode::predictive);
    const auto now = std::chrono::steady_clock::now();
    lone_wait w(g, now);
    // A young model (fewer than 8 samples): its low is its shortest sample, so one sample moves
    // it, as on a machine that has only begun to see the work.
    for (int i = 0; i < 4; ++i) w.st.plan.model.add(60ms);
    w.st.plan.last_done = now;  // the wait before ended as this one was submitted
    g.idle.plan_unplanned(w.st, now);
    g.idle.looked_at(w.st, now + 30ms, /*moved=*/false);
    w.st.retired_in_sweep = true;  // what the sweep sets when the wait retires
    w.st.retired_submit = now;
    g.idle.looked_at(w.st, now + found_at, /*moved=*/true);
    if (found_at == 70ms) {
      CHECK(w.st.plan.model.low() == 60ms);
    } else {
      CHECK(w.st.plan.model.low() == 35ms);
    }
  }
}

TEST_CASE("idle governor: an unhurried wait is not spun for through a remembered longer window") {
  // A wait past its own window (200 us work) whose model remembers a longer regime (5 ms) is
  // looked at through that regime's window (idle_policy.hpp, missed): spun through for a hurried
  // wait. An unhurried one (a Python task's wait, taken through the loop's eventfd anyway) is
  // never spun for, there as in its own window: looked at every poll period at most.
  for (const bool unhurried : {false, true}) {
    CAPTURE(unhurried);
    governor_alone g(evr::strategy::fence, evr::idle_mode::predictive);
    const auto now = std::chrono::steady_clock::now();
    lone_wait w(g, now);
    w.op.unhurried_ = unhurried;
    for (int i = 0; i < 16; ++i) w.st.plan.model.add(5ms);   // a settled 5 ms regime ...
    for (int i = 0; i < 3; ++i) w.st.plan.model.add(200us);  // ... then the work got shorter
    REQUIRE(w.st.plan.model.high() < 1ms);
    const auto in_longer_window = now + 5ms;
    (void)g.idle.rest(in_longer_window, false, false, false);
    CHECK(w.st.plan.spin == !unhurried);
  }
}
