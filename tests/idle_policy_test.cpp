// The idle policy on synthetic durations: no reactor, no device (reactor/src/idle_policy.hpp).
#include <doctest/doctest.h>

#include <chrono>
#include <random>

#include "idle_policy.hpp"

using namespace std::chrono_literals;
using evr::detail::budgeted_poll_period;
using evr::detail::idle_settings;
using evr::detail::idle_time;
using evr::detail::ladder;
using evr::detail::look_cost;
using evr::detail::next_scout;
using evr::detail::predict;
using evr::detail::service_time_model;
using evr::detail::sleep_overshoot;
using evr::detail::stream_outlook;
using phase = stream_outlook::phase;
using std::chrono::nanoseconds;

namespace {

idle_settings defaults() { return idle_settings::from(evr::reactor_options{}); }

/// Service times uniform in [d - d*jitter, d + d*jitter].
class work {
 public:
  work(nanoseconds d, double jitter, unsigned seed = 1) : d_(d), jitter_(jitter), rng_(seed) {}
  nanoseconds next() {
    std::uniform_real_distribution<double> u(-jitter_, jitter_);
    return nanoseconds(
        static_cast<std::int64_t>(static_cast<double>(d_.count()) * (1.0 + u(rng_))));
  }

 private:
  nanoseconds d_;
  double jitter_;
  std::mt19937 rng_;
};

const idle_time t0 = idle_time{} + 1000s;  // an arbitrary start on the steady clock

/// Timer overshoots of `margin` learned for sleeps of every length.
sleep_overshoot overshoot_of(nanoseconds margin) {
  sleep_overshoot o;
  for (nanoseconds sleep :
       {nanoseconds(10us), nanoseconds(500us), nanoseconds(5ms), nanoseconds(50ms)})
    for (int i = 0; i < sleep_overshoot::window; ++i) o.add(sleep, margin);
  return o;
}

}  // namespace

TEST_CASE("idle model: steady work converges to bounds around the work's range") {
  for (nanoseconds d : {200us, 1000us, 5000us, 20000us}) {
    CAPTURE(d.count());
    service_time_model m;
    work w(d, 0.05);
    for (int i = 0; i < 100; ++i) m.add(w.next());
    REQUIRE(m.ready());
    CHECK(m.samples() == service_time_model::window);
    // Within the jitter range, and narrow: the second smallest / largest of 16 uniform samples.
    CHECK(m.low() >= d * 95 / 100);
    CHECK(m.high() <= d * 105 / 100);
    CHECK(m.high() - m.low() <= d / 10);
    CHECK(m.high() - m.low() >= d / 20);
  }
}

TEST_CASE("idle model: one outlier on either side moves neither bound") {
  service_time_model m;
  for (int i = 0; i < 15; ++i) m.add(1000us + nanoseconds(i * 1000));  // 1.000 .. 1.014 ms
  const nanoseconds low = m.low(), high = m.high();
  m.add(50ms);  // one kernel that took far longer
  CHECK(m.high() <= high + 1us);
  m.add(10us);  // and one that was far shorter
  CHECK(m.low() >= low - 1us);
}

TEST_CASE("idle model: a jump in work length is learned within three samples") {
  SUBCASE("longer: 1 ms -> 5 ms") {
    service_time_model m;
    work before(1ms, 0.05), after(5ms, 0.05, 2);
    for (int i = 0; i < 40; ++i) m.add(before.next());
    for (int i = 0; i < service_time_model::regime_run; ++i) m.add(after.next());
    REQUIRE(m.ready());
    CHECK(m.low() >= 4750us);
    CHECK(m.high() <= 5250us);
  }
  SUBCASE("shorter: 5 ms -> 200 us") {
    service_time_model m;
    work before(5ms, 0.05), after(200us, 0.05, 3);
    for (int i = 0; i < 40; ++i) m.add(before.next());
    for (int i = 0; i < service_time_model::regime_run; ++i) m.add(after.next());
    CHECK(m.low() >= 190us);
    CHECK(m.high() <= 210us);
  }
  SUBCASE("jitter alone never resets it") {
    service_time_model m;
    work w(1ms, 0.05, 4);
    for (int i = 0; i < 16; ++i) m.add(w.next());
    for (int i = 0; i < 10000; ++i) {
      m.add(w.next());
      REQUIRE(m.samples() == service_time_model::window);
    }
  }
}

TEST_CASE(
    "idle model: the settled regimes before restarts, and the run since the work got longer") {
  service_time_model m;
  nanoseconds low{}, high{};
  const auto none_longer = [&] {
    for (int i = 0; i < service_time_model::remembered; ++i)
      if (m.longer_previous_regime(i, low, high)) return false;
    return true;
  };
  work longer(5ms, 0.02, 5), shorter(200us, 0.02, 6), passing(3ms, 0.02, 7);
  for (int i = 0; i < 20; ++i) m.add(longer.next());
  CHECK(none_longer());  // one regime so far
  CHECK_FALSE(m.run_above(low, high));
  for (int i = 0; i < 20; ++i) m.add(shorter.next());
  // Restarted from 200 us work: the settled 5 ms regime is remembered.
  REQUIRE(m.high() <= 204us);
  CHECK_FALSE(m.run_above(low, high));
  REQUIRE(m.longer_previous_regime(0, low, high));
  CHECK(low >= 4900us);
  CHECK(high <= 5100us);
  // Back to 5 ms: the run so far (one sample, then two) is the longer work.
  const nanoseconds first = longer.next();
  m.add(first);
  REQUIRE(m.run_above(low, high));
  CHECK(low == first);
  CHECK(high == first);
  const nanoseconds second = longer.next();
  m.add(second);
  REQUIRE(m.run_above(low, high));
  CHECK(low == std::min(first, second));
  CHECK(high == std::max(first, second));
  // Three in a row: the model is the 5 ms regime; the regimes it remembers are not longer.
  m.add(longer.next());
  CHECK(m.low() >= 4900us);
  CHECK_FALSE(m.run_above(low, high));
  CHECK(none_longer());
  for (int i = 0; i < 20; ++i) m.add(longer.next());
  // Down to 200 us through a passing 3 ms regime (three samples, as scouts' brackets give): the
  // passing one is not remembered; the settled 5 ms one is, the most recent.
  for (int i = 0; i < 3; ++i) m.add(passing.next());
  for (int i = 0; i < 20; ++i) m.add(shorter.next());
  REQUIRE(m.longer_previous_regime(0, low, high));
  CHECK(low >= 4900us);
}

TEST_CASE("idle predict: a missed window looks at the longer regime's window") {
  // 200 us work after a 5 ms phase. A wait that outlives the 200 us window is in the missed
  // phase; besides its naps it sleeps towards the 5 ms regime's window and spins through it.
  idle_settings s = defaults();
  s.prespin = 10us;
  s.final_sleep = 0us;
  const nanoseconds margin = 15us;
  const sleep_overshoot timers = overshoot_of(margin);
  service_time_model m;
  for (int i = 0; i < 16; ++i) m.add(5ms);
  for (int i = 0; i < 16; ++i) m.add(200us);
  const idle_time long_open = t0 + 5ms - s.prespin;  // spread 0
  stream_outlook o = predict(s, m, t0, t0 + 300us, timers);
  CHECK(o.where == phase::missed);
  CHECK(o.next_look <= t0 + 300us + s.max_sleep);  // the naps go on
  o = predict(s, m, t0, t0 + 4ms, timers);
  CHECK(o.where == phase::missed);
  CHECK(o.next_look == long_open - margin);  // the longer window, before the next nap's end
  o = predict(s, m, t0, long_open, timers);
  CHECK(o.next_look == long_open);  // spun through
  o = predict(s, m, t0, t0 + 5ms + margin, timers);
  CHECK(o.next_look == t0 + 5ms + margin);
  // Past it too: naps, grown from its close (half the time since), not from the 200 us
  // window's (max_sleep by now).
  o = predict(s, m, t0, t0 + 6ms, timers);
  CHECK(o.next_look == t0 + 6ms + (6ms - (5ms + margin)) / 2);
  // A run of somewhat longer short work (one 320 us sample) is looked at, and the 5 ms regime
  // still is once that run's window has passed.
  m.add(320us);
  o = predict(s, m, t0, t0 + 315us, timers);
  CHECK(o.where == phase::missed);
  CHECK(o.next_look == t0 + 315us);  // in the 320 us sample's window: spun
  o = predict(s, m, t0, t0 + 4ms, timers);
  CHECK(o.next_look == long_open - margin);
  // Without a longer regime (200 us work from the start), the same wait only naps.
  service_time_model plain;
  for (int i = 0; i < 16; ++i) plain.add(200us);
  o = predict(s, plain, t0, t0 + 4ms, timers);
  CHECK(o.next_look == t0 + 4ms + s.max_sleep);
}

TEST_CASE("idle predict: learning, then sleep until the window, spin through it, back off after") {
  idle_settings s = defaults();
  s.prespin = 10us;
  s.final_sleep = 0us;  // one sleep to the window (the cut is the next test's subject)
  const nanoseconds margin = 15us;
  const sleep_overshoot timers = overshoot_of(margin);
  service_time_model m;

  // Nothing learned: spin spin_window, then naps of a quarter of the age, capped at max_sleep.
  stream_outlook o = predict(s, m, t0, t0 + 10us, timers);
  CHECK(o.where == phase::learning);
  CHECK(o.unpredicted());
  CHECK(o.next_look <= t0 + 10us);
  o = predict(s, m, t0, t0 + 400us, timers);
  CHECK(o.where == phase::learning);
  CHECK(o.next_look == t0 + 400us + 100us);
  o = predict(s, m, t0, t0 + 40ms, timers);
  CHECK(o.next_look == t0 + 40ms + s.max_sleep);

  work w(1ms, 0.05);
  for (int i = 0; i < 32; ++i) m.add(w.next());
  // The window opens a quarter of the spread before the shortest work seen lately, prespin and
  // the timer margin earlier still.
  const idle_time open = t0 + m.low() - (m.high() - m.low()) / 4 - s.prespin - margin;

  // Before the window: sleep until it opens, margin included.
  o = predict(s, m, t0, t0 + 100us, timers);
  CHECK(o.where == phase::before_window);
  CHECK_FALSE(o.unpredicted());
  CHECK(o.next_look == open);
  // In the window (narrow for steady work): spin.
  o = predict(s, m, t0, open, timers);
  CHECK(o.where == phase::window_spin);
  CHECK(o.next_look <= open);
  o = predict(s, m, t0, t0 + m.high(), timers);
  CHECK(o.where == phase::window_spin);
  // Far past it: the prediction missed; naps grow with the time since, up to max_sleep.
  o = predict(s, m, t0, t0 + 3ms, timers);
  CHECK(o.where == phase::missed);
  CHECK(o.unpredicted());
  CHECK(o.next_look > t0 + 3ms);
  CHECK(o.next_look <= t0 + 3ms + s.max_sleep);
  o = predict(s, m, t0, t0 + 1s, timers);
  CHECK(o.next_look == t0 + 1s + s.max_sleep);
}

TEST_CASE("idle predict: final_sleep cuts a long sleep so its last part is slept on its own") {
  idle_settings s = defaults();
  s.prespin = 10us;
  const nanoseconds margin = 15us;
  const sleep_overshoot timers = overshoot_of(margin);
  service_time_model m;
  work w(20ms, 0.05);
  for (int i = 0; i < 32; ++i) m.add(w.next());
  const idle_time awake_by = t0 + m.low() - (m.high() - m.low()) / 4 - s.prespin;
  const idle_time open = awake_by - margin;

  // Off: one sleep to the window.
  s.final_sleep = 0us;
  CHECK(predict(s, m, t0, t0 + 100us, timers).next_look == open);
  // The default cuts it.
  CHECK(predict(defaults(), m, t0, t0 + 100us, timers).next_look ==
        awake_by - evr::reactor_options{}.final_sleep);

  s.final_sleep = 1ms;
  stream_outlook o = predict(s, m, t0, t0 + 100us, timers);
  CHECK(o.where == phase::before_window);
  CHECK(o.next_look == awake_by - 1ms);
  // Woken there (a little late): the rest is one short sleep, to the same window as without it.
  o = predict(s, m, t0, awake_by - 1ms + 30us, timers);
  CHECK(o.where == phase::before_window);
  CHECK(o.next_look == open);
  // Work shorter than final_sleep: nothing to cut.
  service_time_model short_work;
  work ws(500us, 0.05);
  for (int i = 0; i < 32; ++i) short_work.add(ws.next());
  const idle_time short_open =
      t0 + short_work.low() - (short_work.high() - short_work.low()) / 4 - s.prespin - margin;
  CHECK(predict(s, short_work, t0, t0 + 10us, timers).next_look == short_open);
}

TEST_CASE("idle scouts: an eighth and half way to the horizon, on a grid, for long spans only") {
  const nanoseconds span = 20ms;
  const nanoseconds grid = span / 32;  // 625 us
  const idle_time start = t0 + 7us;    // off the grid
  const idle_time horizon = start + span;
  const idle_time first = next_scout(start, horizon, start);
  // At an eighth of the way, rounded up to the grid (on the clock, not from the start).
  CHECK(first >= start + span / 8);
  CHECK(first < start + span / 8 + grid);
  CHECK(first.time_since_epoch() % grid == nanoseconds(0));
  // Then half way; none after that.
  const idle_time second = next_scout(start, horizon, first);
  CHECK(second >= start + span / 2);
  CHECK(second < start + span / 2 + grid);
  CHECK(next_scout(start, horizon, second) == idle_time::max());
  // Streams started a little apart share their scouts.
  CHECK(next_scout(start + 50us, horizon + 50us, start + 50us) == first);
  // A span shorter than scout_min_span has none.
  CHECK(next_scout(start, start + evr::detail::scout_min_span - 1us, start) == idle_time::max());
  // Short spans: the grid is at least 100 us.
  const idle_time s2 = next_scout(t0, t0 + 2ms, t0);
  CHECK(s2.time_since_epoch() % nanoseconds(100us) == nanoseconds(0));
  CHECK(s2 < t0 + nanoseconds(2ms) / 8 + 100us);
}

TEST_CASE("idle predict: irregular work is polled every poll_period inside its range") {
  const idle_settings s = defaults();
  service_time_model m;
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::int64_t> u(100'000, 5'000'000);  // 100 us .. 5 ms
  for (int i = 0; i < 64; ++i) m.add(nanoseconds(u(rng)));
  CHECK(m.low() < 2ms);
  CHECK(m.high() > 3ms);
  const idle_time mid = t0 + m.low() + (m.high() - m.low()) / 2;
  stream_outlook o = predict(s, m, t0, mid, overshoot_of(15us));
  CHECK(o.where == phase::window_poll);
  CHECK(o.next_look == mid + s.poll_period);
  // Irregular work's window opens a quarter of the spread before its shortest sample (not its
  // second shortest, which says little about how short it can be): here, at its start.
  o = predict(s, m, t0, t0 + 1us, overshoot_of(15us));
  CHECK(o.where == phase::window_poll);
  CHECK(o.next_look == t0 + 1us + s.poll_period);
  // Even when the second shortest seen lately is long: 16 samples of 100 us-5 ms with one below
  // 1.5 ms (about one wait in fifty).
  service_time_model late_low;
  late_low.add(150us);
  for (int i = 0; i < 15; ++i) late_low.add(nanoseconds(1'500'000 + 230'000 * i));
  REQUIRE(late_low.low() >= 1500us);
  REQUIRE(late_low.shortest() == 150us);
  CHECK(predict(s, late_low, t0, t0 + 1us, overshoot_of(15us)).where == phase::window_poll);
  // Long, moderately irregular work (4-6 ms) is not polled from its start: the reactor sleeps
  // until a quarter of the spread before the shortest sample.
  service_time_model long_work;
  for (int i = 0; i < 16; ++i) long_work.add(nanoseconds(4'000'000 + 130'000 * i));
  REQUIRE_FALSE(evr::detail::is_steady(s, long_work));
  o = predict(s, long_work, t0, t0 + 1us, overshoot_of(15us));
  CHECK(o.where == phase::before_window);
  CHECK(o.next_look >= t0 + 3ms);
  CHECK(o.next_look <= t0 + long_work.shortest() - (long_work.high() - long_work.low()) / 4);
}

TEST_CASE("idle predict: very short work is spun for from the start") {
  service_time_model m;
  work w(20us, 0.05);
  for (int i = 0; i < 16; ++i) m.add(w.next());
  const stream_outlook o = predict(defaults(), m, t0, t0, overshoot_of(15us));
  CHECK(o.where == phase::window_spin);
  CHECK(o.next_look <= t0);
}

TEST_CASE("idle predict: steady work is spun for even when this machine's timers are late") {
  // 200 us +-5 % with sleeps that end up to 45 us late: the window is wide because of the margin,
  // but the work is steady; polling it every poll_period would find it tens of us late.
  service_time_model m;
  work w(200us, 0.05);
  for (int i = 0; i < 16; ++i) m.add(w.next());
  const idle_time at = t0 + m.low() - 2us;
  const stream_outlook o = predict(defaults(), m, t0, at, overshoot_of(45us));
  CHECK(o.where == phase::window_spin);
  CHECK(o.next_look <= at);
}

TEST_CASE("idle predict: a wider spin_fraction spins where the default polls") {
  service_time_model m;
  for (int i = 0; i < 16; ++i) m.add(i % 2 ? 600us : 1000us);  // bimodal, 40 % apart
  idle_settings s = defaults();
  CHECK(predict(s, m, t0, t0 + 800us, overshoot_of(15us)).where == phase::window_poll);
  s.spin_fraction = 1.0;
  CHECK(predict(s, m, t0, t0 + 800us, overshoot_of(15us)).where == phase::window_spin);
}

TEST_CASE("idle poll budget: cheap looks keep poll_period, expensive ones are spread out") {
  // One stream: a look of 0.3 us at a budget of 10 % would allow one every 3 us; poll_period rules.
  CHECK(budgeted_poll_period(50us, 300ns, 0.1) == 50us);
  // 64 streams with event markers: a look of ~11 us may come every 110 us at 10 % of a core.
  CHECK(budgeted_poll_period(50us, 11us, 0.1) == 110us);
  CHECK(budgeted_poll_period(50us, 11us, 0.25) == 50us);  // 44 us: poll_period still rules
  // 0 turns the budget off; nothing measured yet changes nothing; absurd costs stay bounded.
  CHECK(budgeted_poll_period(50us, 11us, 0.0) == 50us);
  CHECK(budgeted_poll_period(50us, 0ns, 0.1) == 50us);
  CHECK(budgeted_poll_period(50us, nanoseconds(INT64_MAX), 1e-9) == 1s);
}

TEST_CASE("idle poll budget: the look cost is a running mean that follows a change") {
  look_cost c;
  CHECK(c.mean() == 0ns);
  for (int i = 0; i < 64; ++i) c.add(400ns);
  CHECK(c.mean() > 380ns);
  CHECK(c.mean() <= 400ns);
  for (int i = 0; i < 64; ++i) c.add(12us);  // 64 streams became busy
  CHECK(c.mean() > 11500ns);
  c.add(-5us);  // a clock oddity counts as 0, never as a negative cost
  CHECK(c.mean() > 10us);
  // A look during which the thread was preempted for a millisecond moves the mean a little.
  look_cost d;
  for (int i = 0; i < 64; ++i) d.add(400ns);
  d.add(1ms);
  CHECK(d.mean() < 800ns);
}

TEST_CASE("idle predict: irregular work's windows are looked at every stretched poll_period") {
  service_time_model m;
  for (int i = 0; i < 16; ++i) m.add(i % 2 ? 100us : 5ms);  // bimodal: polled, not spun
  idle_settings s = defaults();
  s.window_poll_period = budgeted_poll_period(s.poll_period, 16us, 0.1);
  const stream_outlook o = predict(s, m, t0, t0 + 2ms, overshoot_of(15us));
  CHECK(o.where == phase::window_poll);
  CHECK(o.next_look == t0 + 2ms + 160us);
  // Only the looks are spread: work steady enough to spin for is still judged by poll_period
  // (a stretched period of 5 ms must not make a spread of 900 us "narrow").
  service_time_model moderate;
  for (int i = 0; i < 16; ++i) moderate.add(i % 2 ? 1100us : 2000us);
  s.window_poll_period = 5ms;
  CHECK(predict(s, moderate, t0, t0 + 1500us, overshoot_of(15us)).where == phase::window_poll);
}

TEST_CASE("idle overshoot: starts conservative, learns per sleep length, bounded both ways") {
  sleep_overshoot o;
  CHECK(o.margin(5ms) == sleep_overshoot::initial);
  // Short sleeps overshoot a little, long ones more (a core waking from a deep idle state).
  for (int i = 0; i < 64; ++i) {
    o.add(50us, nanoseconds(3000 + (i % 8) * 100));    // 3.0 .. 3.7 us
    o.add(20ms, nanoseconds(40000 + (i % 4) * 1000));  // 40 .. 43 us
  }
  CHECK(o.margin(50us) == 3700ns);
  CHECK(o.margin(20ms) == 43us);
  CHECK(o.margin(2ms) == sleep_overshoot::initial);  // nothing learned for that length yet
  // One late wake-up counts for the next `window` sleeps of its class, then ages out.
  o.add(50us, 9us);
  CHECK(o.margin(50us) == 9us);
  for (int i = 0; i < sleep_overshoot::window; ++i) o.add(50us, 3us);
  CHECK(o.margin(50us) == 3us);
  // Never below the floor, never more than half the sleep it is for.
  sleep_overshoot fast;
  for (int i = 0; i < 64; ++i) fast.add(10us, 100ns);
  CHECK(fast.margin(10us) == sleep_overshoot::floor);
  sleep_overshoot slow;
  for (int i = 0; i < 64; ++i) slow.add(10us, 30us);
  CHECK(slow.margin(10us) == 5us);
}

TEST_CASE("idle ladder: spin, yield, then naps doubling from 10 us to max_sleep") {
  evr::reactor_options o;
  ladder l;
  l.progress(t0);
  nanoseconds nap{};
  CHECK(l.next(o, t0 + 10us, nap) == ladder::action::spin);
  CHECK(l.next(o, t0 + o.spin_window + 10us, nap) == ladder::action::yield);
  const idle_time late = t0 + o.spin_window + o.yield_window + 1us;
  nanoseconds expect = 10us;
  for (int i = 0; i < 12; ++i) {
    REQUIRE(l.next(o, late, nap) == ladder::action::nap);
    CHECK(nap == expect);
    expect = std::min<nanoseconds>(expect * 2, o.max_sleep);
  }
  l.new_waits();
  REQUIRE(l.next(o, late, nap) == ladder::action::nap);
  CHECK(nap == 10us);
}
