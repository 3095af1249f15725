// reactor/src/tick_grid.hpp — points on a grid of time: the whole multiples of a period on the
// steady clock. Looks of different streams planned with one period, each within a period of its
// last, fall on the same points, however their plans' times differ: one wake-up of the looking
// thread serves them all. Used for a polling host's looks at irregular work (idle_plans.cpp,
// plan_host_polls) and for scouts' times (idle_policy.cpp, next_scout); the reactor's own poll
// tick keeps a grid of its own, from its last due tick (idle_governor.cpp, end_sweep). A period
// that changes (poll_budget) moves the grid with it.
//
// Pure functions; no state.
#pragma once

#include <chrono>

namespace evr::detail::tick_grid {

using clock = std::chrono::steady_clock;
using std::chrono::nanoseconds;

/// The last point of the grid of `period` (> 0) at or before `t`.
constexpr clock::time_point at_or_before(clock::time_point t, nanoseconds period) noexcept {
  nanoseconds r = t.time_since_epoch() % period;
  if (r < nanoseconds::zero()) r += period;
  return t - r;
}

/// The first point of the grid of `period` (> 0) at or after `t`.
constexpr clock::time_point at_or_after(clock::time_point t, nanoseconds period) noexcept {
  const clock::time_point before = at_or_before(t, period);
  return before == t ? t : before + period;
}

/// The next look after one made at `now`: the first point of the grid at least a quarter of a
/// period after it, so at most a period and a quarter. A look made on a point is followed by the
/// next point, a period later; one made late (its thread was busy) by that same next point,
/// unless it was more than three quarters of a period late (then by the point after).
constexpr clock::time_point next_look(clock::time_point now, nanoseconds period) noexcept {
  return at_or_after(now + period / 4, period);
}

}  // namespace evr::detail::tick_grid
