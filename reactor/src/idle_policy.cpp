// reactor/src/idle_policy.cpp — see idle_policy.hpp.
#include "idle_policy.hpp"

#include <algorithm>

#include "tick_grid.hpp"

namespace evr::detail {
namespace {

/// The second smallest and second largest of `v` (smallest and largest below 8 values): one
/// outlier on either side moves neither bound; and the smallest.
template <std::size_t N>
void robust_bounds(const ring<std::int64_t, N>& v, std::int64_t& low, std::int64_t& high,
                   std::int64_t& shortest) noexcept {
  std::array<std::int64_t, N> s{};
  const int n = static_cast<int>(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) s[i] = v.at(i);
  std::sort(s.begin(), s.begin() + n);
  const int trim = n >= 8 ? 1 : 0;
  low = s[trim];
  high = s[n - 1 - trim];
  shortest = s[0];
}

/// How far outside [low, high] a sample (or a regime's bound) must be to count as other work:
/// half the range's width, at least 1/16 of its high, at least 1 us.
std::int64_t far_beyond(std::int64_t low, std::int64_t high) noexcept {
  return std::max({(high - low) / 2, high / 16, std::int64_t{1000}});
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// service_time_model

void service_time_model::add(nanoseconds sample) noexcept {
  const std::int64_t v = std::max<std::int64_t>(0, sample.count());
  if (ready()) {
    // A sample well outside the range of the regime before it (by half the range's width, at
    // least 1/16 of its high, at least 1 us) counts towards a regime change; jitter within a
    // steady regime does not. The reference stays that of the regime while a run lasts, so the
    // run is judged against what came before it, not against bounds it has already moved.
    const std::int64_t tolerance = far_beyond(ref_low_, ref_high_);
    if (v > ref_high_ + tolerance) {
      ++run_above_;
      run_below_ = 0;
    } else if (v < ref_low_ - tolerance) {
      ++run_below_;
      run_above_ = 0;
    } else {
      run_above_ = run_below_ = 0;
    }
  }
  samples_.push_back(v);
  if (run_above_ >= regime_run || run_below_ >= regime_run) {
    // The work changed (a longer or shorter kernel): forget the old regime, keep the new samples.
    // Its bounds are remembered, if it had settled (half a window of its own samples): work that
    // alternates between lengths goes back to it. Not a passing one: after 50 ms work, the first
    // 200 us waits are found by scouts, their samples a few ms, and that regime lasted a few
    // waits. And not only the last: 200 us work with its jitter can restart the model (0.33 ms,
    // then 0.2), and the last one alone then hid the 50 ms regime before them.
    if (static_cast<int>(samples_.size()) - regime_run >= window / 2) {
      std::copy_backward(previous_.begin(), previous_.end() - 1, previous_.end());
      previous_.front() = {ref_low_, ref_high_};
    }
    samples_.keep_newest(regime_run);
    run_above_ = run_below_ = 0;
  }
  robust_bounds(samples_, low_, high_, shortest_);
  if (run_above_ == 0 && run_below_ == 0) {
    ref_low_ = low_;
    ref_high_ = high_;
  }
}

bool service_time_model::run_above(nanoseconds& low, nanoseconds& high) const noexcept {
  if (run_above_ == 0) return false;
  std::int64_t lo = samples_.at(samples_.size() - 1), hi = lo;  // the newest run_above_ samples
  for (int i = 2; i <= run_above_; ++i) {
    const std::int64_t v = samples_.at(samples_.size() - static_cast<std::size_t>(i));
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  low = nanoseconds(lo);
  high = nanoseconds(hi);
  return true;
}

bool service_time_model::longer_previous_regime(int i, nanoseconds& low,
                                                nanoseconds& high) const noexcept {
  const auto [lo, hi] = previous_[static_cast<std::size_t>(i)];
  if (hi <= high_ + far_beyond(low_, high_)) return false;  // none, or not clearly longer
  low = nanoseconds(lo);
  high = nanoseconds(hi);
  return true;
}

// ------------------------------------------------------------------------------------------------
// sleep_overshoot

std::size_t sleep_overshoot::class_of(nanoseconds sleep) noexcept {
  using std::chrono::microseconds;
  if (sleep < microseconds(100)) return 0;
  if (sleep < microseconds(1000)) return 1;
  if (sleep < microseconds(10000)) return 2;
  return 3;
}

void sleep_overshoot::add(nanoseconds asked, nanoseconds overshoot) noexcept {
  classes_[class_of(asked)].add(overshoot.count());  // clamped to >= 0
}

nanoseconds sleep_overshoot::margin(nanoseconds sleep) const noexcept {
  return std::max(floor, std::min(nanoseconds(classes_[class_of(sleep)].high()), sleep / 2));
}

// ------------------------------------------------------------------------------------------------
// budgeted_poll_period

nanoseconds budgeted_poll_period(nanoseconds poll_period, nanoseconds look_cost,
                                 double budget) noexcept {
  if (budget <= 0.0 || look_cost.count() <= 0) return poll_period;
  // A look every P costs look_cost / P of a core: P >= look_cost / budget. Capped at a second,
  // far beyond any look's cost at a sane budget, so the conversion cannot overflow.
  const double wanted = std::min(static_cast<double>(look_cost.count()) / budget, 1e9);
  return std::max(poll_period, nanoseconds(static_cast<std::int64_t>(wanted)));
}

// ------------------------------------------------------------------------------------------------
// predict

namespace {

/// Work whose samples lie in [low, high] is steady (see is_steady).
bool is_steady_range(const idle_settings& settings, nanoseconds low, nanoseconds high) noexcept {
  return high - low <=
         std::max(std::chrono::duration_cast<nanoseconds>(settings.spin_fraction * high),
                  2 * settings.poll_period);
}

/// When the window of work with samples in [low, high] opens, from its start, if its earliest
/// end is `earliest` (see window_of).
nanoseconds open_offset(const idle_settings& settings, nanoseconds low, nanoseconds high,
                        nanoseconds earliest) noexcept {
  return earliest - (high - low) / 4 - settings.prespin;
}

}  // namespace

bool is_steady(const idle_settings& settings, const service_time_model& model) noexcept {
  return is_steady_range(settings, model.low(), model.high());
}

nanoseconds window_open_offset(const idle_settings& settings,
                               const service_time_model& model) noexcept {
  const nanoseconds earliest = (is_steady(settings, model) ? model.low() : model.shortest());
  return open_offset(settings, model.low(), model.high(), earliest);
}

namespace {

/// Nothing learned yet: spin briefly (short work is found at once), then naps of a quarter of the
/// age: lateness at most ~25 % of the wait, at a logarithmic number of wake-ups.
stream_outlook learning(const idle_settings& settings, idle_time start, idle_time now) noexcept {
  stream_outlook o;
  o.where = stream_outlook::phase::learning;
  const nanoseconds age = std::max(nanoseconds(0), now - start);
  if (age < settings.spin_window) {
    o.next_look = now;
  } else {
    o.next_look =
        now + std::clamp<nanoseconds>(age / 4, std::chrono::microseconds(10), settings.max_sleep);
  }
  return o;
}

/// The window of work with samples in [low, high] whose earliest end is `earliest` (window_of).
stream_outlook window_for(const idle_settings& settings, nanoseconds low, nanoseconds high,
                          nanoseconds earliest, idle_time start,
                          const sleep_overshoot& overshoot) noexcept {
  stream_outlook o;
  o.window_open = start + open_offset(settings, low, high, earliest);
  const nanoseconds margin = overshoot.margin(std::max(nanoseconds(0), o.window_open - start));
  o.window_close = start + high + std::max(margin, (high - low) / 2);
  o.steady = is_steady_range(settings, low, high);
  return o;
}

/// The window of a ready model: when a looker must be awake, when it closes, steady or not.
stream_outlook window_of(const idle_settings& settings, const service_time_model& model,
                         idle_time start, const sleep_overshoot& overshoot) noexcept {
  // Steady work is spun through; irregular work is polled. What decides is the spread of the
  // work itself, not the window's width: the margin and prespin are spun in either case (they
  // cover the timer, not the work), and counting them made steady work on a machine with late
  // timers look irregular (polled every poll_period: tens of us late).
  // The earliest the work is expected to end, a quarter of the spread before the shortest seen
  // lately; the reactor must be awake `prespin` before that, and a sleep of that length ends up
  // to `margin` late. The margin is that of a sleep from the start (about the sleep the reactor
  // takes for it), so one wait's window does not move as time passes. Steady work: its second
  // shortest (one short outlier would make every window spin longer). Irregular work: its
  // shortest, as polling early costs little: its second shortest says little about how short it
  // can be (uniform 100 us-5 ms: over 1 ms for about a fifth of the waits, and the work shorter
  // than the window's opening was found when it opened: 1-stream p99 376 us on the H100).
  const nanoseconds earliest = is_steady(settings, model) ? model.low() : model.shortest();
  return window_for(settings, model.low(), model.high(), earliest, start, overshoot);
}

/// Whether a sleep towards a window `left` away is cut final_sleep short of it, to be slept
/// again on its own (sleep_until).
bool cut_short(const idle_settings& settings, nanoseconds left) noexcept {
  return settings.final_sleep > nanoseconds(0) && left > settings.final_sleep;
}

/// When to wake for a window that opens after `now`; idle_time::max() when it is too near to
/// sleep for.
idle_time sleep_until(const idle_settings& settings, const stream_outlook& o, idle_time start,
                      idle_time now, const sleep_overshoot& overshoot) noexcept {
  // Sleep until the window opens, early by the margin of a sleep of the time left: a long sleep
  // ends with a wide margin (the large overshoots of long sleeps), and if it ended early, the
  // rest is slept again with the narrower margin of a shorter sleep, instead of spun.
  const nanoseconds left = o.window_open - now;
  if (left <= nanoseconds(0)) return idle_time::max();
  idle_time open = std::max(start, o.window_open - overshoot.margin(left));
  // A long sleep's rare late wake-ups (milliseconds on some hosts) are kept away from the
  // window: the last final_sleep is slept again on its own.
  if (cut_short(settings, left)) open = std::min(open, o.window_open - settings.final_sleep);
  // A first sleep is worth it from min_nap on; a second one only when it is long enough to save
  // more than the wake-up it costs (min_resleep).
  const nanoseconds worth = now - start < min_resleep ? min_nap : min_resleep;
  return open - now >= worth ? open : idle_time::max();
}

/// A wait past its window (`o`, missed) whose model knows longer work, with samples in [low,
/// high]: that work's window, computed as a model's, is slept towards and spun through (looked
/// at every window_poll_period if irregular), as the wait's own window would be; the missed
/// phase's naps go on around it, and grow from that window's close once it has passed. Why: work
/// that alternates between lengths (a Python stream, 20 kernels of 5 ms then 20 of 200 us, on an
/// H200) had its first long waits after each rise found by those naps, 600-850 us over the phase's
/// median, until the model restarted from three.
void look_at_longer_work(const idle_settings& settings, nanoseconds low, nanoseconds high,
                         idle_time start, idle_time now, const sleep_overshoot& overshoot,
                         stream_outlook& o) noexcept {
  const stream_outlook w = window_for(settings, low, high, low, start, overshoot);
  const idle_time open = w.window_open, close = w.window_close;
  if (now > close) {
    // Past it too: the naps grow from this window's close, the latest end expected, not from
    // the wait's own (a 20 ms wait past a 200 us window would nap 10 ms at a time by then).
    o.next_look = std::min(
        o.next_look,
        now + std::clamp<nanoseconds>((now - close) / 2, settings.poll_period, settings.max_sleep));
  } else if (now < open) {
    o.next_look = std::min(o.next_look, std::max(now, open - overshoot.margin(open - now)));
  } else {
    o.next_look = w.steady ? now : std::min(o.next_look, now + settings.window_poll_period);
  }
}

}  // namespace

stream_outlook predict(const idle_settings& settings, const service_time_model& model,
                       idle_time start, idle_time now, const sleep_overshoot& overshoot) noexcept {
  using phase = stream_outlook::phase;
  if (!model.ready()) return learning(settings, start, now);
  stream_outlook o = window_of(settings, model, start, overshoot);
  if (const idle_time wake = sleep_until(settings, o, start, now, overshoot);
      wake != idle_time::max()) {
    o.where = phase::before_window;
    o.next_look = wake;
    o.last_sleep = !cut_short(settings, o.window_open - now);
  } else if (now <= o.window_close && o.steady) {
    o.where = phase::window_spin;
    o.next_look = now;
  } else if (now <= o.window_close) {
    o.where = phase::window_poll;
    o.next_look = now + settings.window_poll_period;
  } else {
    // Missed: the work outlasted everything seen lately. Back off with the time since the miss,
    // and look at the window of a longer regime the model knows.
    o.where = phase::missed;
    o.next_look = now + std::clamp<nanoseconds>((now - o.window_close) / 2, settings.poll_period,
                                                settings.max_sleep);
    nanoseconds low{}, high{};
    if (model.run_above(low, high))
      look_at_longer_work(settings, low, high, start, now, overshoot, o);
    for (int i = 0; i < service_time_model::remembered; ++i) {
      if (model.longer_previous_regime(i, low, high))
        look_at_longer_work(settings, low, high, start, now, overshoot, o);
    }
  }
  return o;
}

idle_time next_scout(idle_time start, idle_time horizon, idle_time now) noexcept {
  const nanoseconds span = horizon - start;
  if (span < scout_min_span) return idle_time::max();
  const nanoseconds grid = std::max<nanoseconds>(std::chrono::microseconds(100), span / 32);
  for (const int divisor : {8, 2}) {
    const idle_time on_grid = tick_grid::at_or_after(start + span / divisor, grid);
    if (on_grid > now && on_grid < horizon) return on_grid;
  }
  return idle_time::max();
}

// ------------------------------------------------------------------------------------------------
// ladder

ladder::action ladder::next(const reactor_options& o, idle_time now, nanoseconds& nap) noexcept {
  const nanoseconds quiet = now - last_progress_;
  if (quiet < o.spin_window) return action::spin;
  if (quiet < o.spin_window + o.yield_window) return action::yield;
  nap = step_;
  step_ = std::min<nanoseconds>(step_ * 2, o.max_sleep);
  return action::nap;
}

}  // namespace evr::detail
