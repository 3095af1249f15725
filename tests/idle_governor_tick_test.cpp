// The idle governor's poll tick and the sleeps of unhurried waits (reactor/src/idle_plans.cpp,
// plan_reactor; docs/architecture.md, "Unhurried waits"): while the tick runs, an unhurried
// wait's sleeps towards its window end on it; with no tick running they are a prompt wait's; and
// the tick keeps its grid when its sweeps come late (idle_governor.cpp, end_sweep).
#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <vector>

#include "idle_governor.hpp"
#include "stream_state.hpp"
#include "support/governor_alone.hpp"

namespace {

using namespace std::chrono_literals;
using evr::test::governor_alone;
using evr::test::lone_wait;

/// A governor whose poll tick runs every `period` from `first` on, as a stream of irregular 4-8
/// ms unhurried work in its window keeps it (`ticker`); run_ticks_until(t) makes the ticks' sweeps
/// up to `t`, exactly on time, sweep_at one sweep at any time.
struct ticking_governor {
  ticking_governor() : ticker(g, start) {
    ticker.op.unhurried_ = true;
    for (int i = 0; i < 8; ++i) ticker.st.plan.model.add(i % 2 == 0 ? 4ms : 8ms);
    (void)g.idle.rest(first, false, false, false);
    REQUIRE(ticker.st.plan.on_poll_tick);
    next = first;
    run_ticks_until(first);
  }
  void run_ticks_until(std::chrono::steady_clock::time_point t) {
    for (; next <= t; next += period) sweep_at(next);
  }
  /// The sweep of a due tick, begun at `at`.
  void sweep_at(std::chrono::steady_clock::time_point at) {
    evr::detail::poll_tick tick = g.idle.begin_sweep(at);
    REQUIRE(tick.due);
    REQUIRE(g.idle.wants_look(ticker.st, at, tick));
    g.idle.looked_at(ticker.st, at, /*moved=*/false);
    g.idle.end_sweep(at, tick);
  }
  bool on_tick(std::chrono::steady_clock::time_point t) const {
    return (t - first) % period == std::chrono::nanoseconds(0);
  }
  governor_alone g{evr::strategy::poll, evr::idle_mode::predictive};
  const std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  const std::chrono::steady_clock::time_point first = start + 4ms;  // the ticker's window
  const std::chrono::nanoseconds period = std::chrono::nanoseconds(4ms) / 32;
  lone_wait ticker;
  std::chrono::steady_clock::time_point next;
};

/// Steady work of `work`, its oldest wait submitted at `at`, planned then; then woken at each
/// wake its plan asks for (the ticks run up to each) until a wake looks at it. The wakes, the
/// last one the look.
std::vector<std::chrono::steady_clock::time_point> wakes_until_look(
    governor_alone& g, lone_wait& w, std::chrono::steady_clock::time_point at,
    std::chrono::nanoseconds work,
    const std::function<void(std::chrono::steady_clock::time_point)>& before_wake) {
  for (int i = 0; i < 8; ++i) w.st.plan.model.add(work);
  g.idle.plan_unplanned(w.st, at);
  REQUIRE(w.st.plan.asleep_before_window);
  std::vector<std::chrono::steady_clock::time_point> wakes{w.st.plan.query_after};
  for (;;) {
    REQUIRE(wakes.size() < 16);
    before_wake(wakes.back());
    if (g.idle.reached_window(w.st, wakes.back())) return wakes;
    REQUIRE(w.st.plan.query_after > wakes.back());
    wakes.push_back(w.st.plan.query_after);
  }
}

}  // namespace

TEST_CASE("idle governor: an unhurried wait sleeps towards its window on the running poll tick") {
  // 64 Python tasks on 64 streams: each wait's sleeps towards its window woke the reactor at
  // times of its own. While the poll tick runs (another stream's window keeps it), an unhurried
  // wait's sleeps end on ticks: the one cut final_sleep short of the window on the first tick
  // after the cut, the last one on the last tick before its end, from which the stream is on the
  // tick. So it wakes no more often than a prompt wait alone (its twin) and looks at its window's
  // margin less than a tick before the twin does.
  // (Longer work is looked at by scouts before its window, which this rule leaves alone.)
  for (const std::chrono::nanoseconds work :
       {std::chrono::nanoseconds(500us), std::chrono::nanoseconds(1ms),
        std::chrono::nanoseconds(2ms)}) {
    CAPTURE(work.count());
    ticking_governor t;
    const auto submitted = t.first + 7us;
    lone_wait unhurried(t.g, submitted);
    unhurried.op.unhurried_ = true;
    const auto wakes =
        wakes_until_look(t.g, unhurried, submitted, work, [&](auto at) { t.run_ticks_until(at); });
    governor_alone alone(evr::strategy::poll, evr::idle_mode::predictive);
    lone_wait prompt(alone, submitted);
    const auto prompt_wakes = wakes_until_look(alone, prompt, submitted, work, [](auto) {});
    int off_tick = 0;
    for (const auto w : wakes) off_tick += t.on_tick(w) ? 0 : 1;
    CHECK(off_tick == 0);
    CHECK(wakes.size() <= prompt_wakes.size());
    CHECK(wakes.back() <= prompt_wakes.back());
    CHECK(wakes.back() > prompt_wakes.back() - t.period);
    CHECK(unhurried.st.plan.on_poll_tick);
    CHECK_FALSE(prompt.st.plan.on_poll_tick);
  }
}

TEST_CASE("idle governor: with no poll tick running an unhurried wait sleeps as a prompt one") {
  // A lone stream: the tick it was on has lapsed. Its sleeps are its own, as a prompt wait's: a
  // grid of a lapsed tick would wake the reactor at times nobody else does.
  ticking_governor t;
  const auto submitted = t.first + 10ms;  // no tick since t.first
  lone_wait unhurried(t.g, submitted);
  unhurried.op.unhurried_ = true;
  const auto wakes = wakes_until_look(t.g, unhurried, submitted, 2ms, [](auto) {});
  governor_alone alone(evr::strategy::poll, evr::idle_mode::predictive);
  lone_wait prompt(alone, submitted);
  const auto prompt_wakes = wakes_until_look(alone, prompt, submitted, 2ms, [](auto) {});
  CHECK(wakes == prompt_wakes);
}

TEST_CASE("idle governor: the poll tick keeps its phase when its sweeps come late") {
  // Each sweep begins late by the reactor's wake-up. Were each tick set a period after its sweep,
  // the ticks would drift off the grid that sleeps are planned to (tick_at_or_before), and those
  // sleeps would wake the reactor on their own.
  ticking_governor t;
  const auto late = t.period / 8;
  for (int k = 1; k <= 16; ++k) t.sweep_at(t.first + k * t.period + late);
  const auto on_grid = t.first + 17 * t.period;
  CHECK_FALSE(t.g.idle.begin_sweep(on_grid - std::chrono::nanoseconds(1)).due);
  CHECK(t.g.idle.begin_sweep(on_grid).due);
  // A sweep over half a period late starts the grid again from itself: the next tick is not
  // crowded against it.
  const auto very_late = on_grid + t.period * 3 / 4;
  t.sweep_at(very_late);
  CHECK_FALSE(t.g.idle.begin_sweep(very_late + t.period - std::chrono::nanoseconds(1)).due);
  CHECK(t.g.idle.begin_sweep(very_late + t.period).due);
}
