// reactor/src/idle_policy.hpp — when the reactor thread looks at the GPU again, and how it waits
// meanwhile. Pure logic on times: no device, no reactor, no threads (tests drive it with synthetic
// durations: tests/idle_policy_test.cpp).
//
// The predictive policy (reactor_options::idle = idle_mode::predictive, the default) is hybrid
// polling, as the Linux block layer does for fast storage: learn, per stream, how long the GPU
// takes to reach a wait ("service time"), sleep until shortly before the earliest predicted end
// among the pending streams, then poll (fence words: a memory read) until it arrives.
//
//   service start  = max(the wait's submission, the stream's previous completion): back-to-back
//                    work starts when the previous work ends, an isolated request when it is sent.
//   service time   = completion - start, where completion is estimated as the midpoint between
//                    the last sweep that saw the wait pending and the sweep that saw it done (the
//                    two are a few hundred ns apart while the reactor polls).
//   model          = the last `service_time_model::window` samples of the stream; `low` and
//                    `high` are their second smallest and second largest (one outlier on either
//                    side moves neither), and three samples in a row well outside [low, high] on
//                    the same side mean the work changed: the model restarts from those three.
//   margin         = how late this machine's timed sleeps of that length end (learned:
//                    sleep_overshoot), so the reactor is awake and polling when the earliest
//                    completion can arrive; plus `prespin`, so that it has run for a while when it
//                    does (a core that just woke runs its first microseconds slower).
//   window         = [start + low - spread/4 - prespin - margin, start + high + max(margin,
//                    spread/2)], spread = high - low: the model's bounds come from a handful of
//                    samples, and the true shortest work is a little shorter than any seen.
//                    Irregular work (see window_poll): from its shortest sample instead of
//                    `low` (polling early is cheap; its second shortest says little).
//
// Per stream, from now and the model (stream_outlook):
//   learning        fewer than `min_samples` samples: spin `spin_window` after the start, then
//                   naps that grow with the wait's age (a quarter of it), up to `max_sleep`.
//   before_window   steady work whose window opens more than min_nap from now: nothing can
//                   finish before; sleep until it opens, early by the margin of a sleep of the
//                   time left (a long sleep that ended early is followed by a shorter one with a
//                   narrower margin, not by spinning). With `final_sleep` set, a sleep longer
//                   than it is cut so that the last final_sleep before the window is slept on
//                   its own. Steady work whose window opens scout_min_span or more after its start
//                   is also looked at on the way (next_scout): work that got much shorter.
//   window_spin     the work is steady (spread at most `spin_fraction` of high, or two poll
//                   periods): busy-poll through the window. Cost: the width of the window on a
//                   miss; margin + prespin + spread/4 + (actual - low) on a hit.
//   window_poll     the work is irregular: look at it on the reactor's poll tick, every
//                   `poll_period`, through the window (which opens a quarter of the spread before
//                   its shortest sample, often its start); every stream in such a window is looked
//                   at by the same sweep, and no other sweep looks at it. More streams on the
//                   tick than `poll_looks_per_second` allows space the ticks further apart; with
//                   `poll_budget` set, so that their sweeps take at most that share of a core
//                   (budgeted_poll_period).
//   missed          past the window: the prediction failed (the work got longer): naps that grow
//                   with the time since the miss, up to `max_sleep`; the adaptive strategy arms a
//                   host-function doorbell so the driver wakes the reactor. When the model knows
//                   longer work (the run of samples since the work got longer, the regime before
//                   the model's last restart), the windows of that work are also slept towards
//                   and spun through (polled, if irregular); past one, the naps grow from its
//                   close.
// The reactor sweeps again at once if any stream wants spinning, else sleeps until the earliest
// look any stream wants (and never past a fault probe). A submission that could finish before
// that wakes it (wakeup.hpp); so does a doorbell.
//
// Thread safety: none; every object here belongs to the reactor thread.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <utility>

#include <evr/reactor/detail/ring.hpp>
#include <evr/reactor/options.hpp>

namespace evr::detail {

using idle_clock = std::chrono::steady_clock;
using idle_time = idle_clock::time_point;
using std::chrono::nanoseconds;

/// Below this a nap costs more than it saves (a futex wait and wake: a few us of CPU): spin.
inline constexpr nanoseconds min_nap = std::chrono::microseconds(5);
/// A wait's second and later sleeps before its window must be at least this long: shorter ones
/// cost a wake-up (and its overshoot) for a few us of spinning saved.
inline constexpr nanoseconds min_resleep = std::chrono::microseconds(20);

/// Recent service times of one stream, and robust bounds of them.
class service_time_model {
 public:
  static constexpr int window = 16;      ///< samples kept
  static constexpr int min_samples = 3;  ///< samples before the model predicts
  /// Samples in a row well outside [low, high] (by half its width, at least high/16 and 1 us)
  /// that mean the work changed; the model then keeps only those (still `ready()`).
  static constexpr int regime_run = 3;

  /// Adds one observed service time (negative values count as 0).
  void add(nanoseconds sample) noexcept;
  int samples() const noexcept { return static_cast<int>(samples_.size()); }
  bool ready() const noexcept { return samples() >= min_samples; }
  /// Second smallest / second largest of the kept samples (smallest / largest below 8 samples).
  /// Meaningful when samples() > 0.
  nanoseconds low() const noexcept { return nanoseconds(low_); }
  nanoseconds high() const noexcept { return nanoseconds(high_); }
  /// The smallest kept sample (irregular work's window opens from it).
  nanoseconds shortest() const noexcept { return nanoseconds(shortest_); }
  /// Where the work may have gone when a wait outlives the model's window (each: its smallest and
  /// largest samples; false when there is none). The run of samples far above the model (the
  /// work just got longer; fewer than regime_run so far):
  bool run_above(nanoseconds& low, nanoseconds& high) const noexcept;
  /// ... and the settled regimes (half a window of samples each) the model last restarted from,
  /// the `i`-th most recent (i < remembered), if it was longer (work that alternates between
  /// lengths: a long phase after short ones).
  bool longer_previous_regime(int i, nanoseconds& low, nanoseconds& high) const noexcept;
  static constexpr int remembered = 3;  ///< settled regimes kept

 private:
  ring<std::int64_t, window> samples_;
  std::int64_t low_ = 0, high_ = 0, shortest_ = 0;
  std::int64_t ref_low_ = 0, ref_high_ = 0;  // the bounds before the current run began
  /// Bounds of the settled regimes before the last restarts, most recent first ({0, 0}: none).
  std::array<std::pair<std::int64_t, std::int64_t>, remembered> previous_{};
  int run_above_ = 0, run_below_ = 0;  // consecutive samples well beyond / below the reference
};

/// How much later than asked the reactor's timed sleeps end (timer slack, scheduling, and the
/// time an idle core takes to wake, which grows with how long it slept). Kept per class of sleep
/// length; a class's margin is the largest of its last `window` overshoots (about the 97th
/// percentile), never below `floor` nor above half the sleep it is for.
class sleep_overshoot {
 public:
  static constexpr int window = 32;
  static constexpr int classes = 4;  ///< sleeps < 100 us, < 1 ms, < 10 ms, longer
  static constexpr nanoseconds initial = std::chrono::microseconds(20);  ///< before any sample
  static constexpr nanoseconds floor = std::chrono::microseconds(2);

  /// A sleep of `asked` ended `overshoot` late.
  void add(nanoseconds asked, nanoseconds overshoot) noexcept;
  /// How much earlier than a deadline a sleep of about `sleep` must be asked to end.
  nanoseconds margin(nanoseconds sleep) const noexcept;

 private:
  using overshoots = recent_max<window>;
  static std::size_t class_of(nanoseconds sleep) noexcept;
  std::array<overshoots, classes> classes_{overshoots(initial.count()), overshoots(initial.count()),
                                           overshoots(initial.count()),
                                           overshoots(initial.count())};
};

/// The predictive policy's view of one stream's oldest pending wait.
struct stream_outlook {
  enum class phase : unsigned char { learning, before_window, window_spin, window_poll, missed };
  phase where = phase::learning;
  /// When the reactor should look at the stream again; <= now means "keep polling" (spin).
  idle_time next_look{};
  /// Once the model is ready (every phase but learning): when a looker must be awake and polling
  /// (the earliest expected end less prespin, without the reactor's sleep margin: a host applies
  /// its own), and when the window closes.
  idle_time window_open{}, window_close{};
  /// Once the model is ready: the work is steady (spun through) rather than irregular (polled).
  bool steady = false;
  /// before_window: this sleep is the last before the window (it ends at the window's margin),
  /// not one cut final_sleep short of it.
  bool last_sleep = false;
  /// The prediction is not helping (learning, missed): a doorbell may be armed once the wait is
  /// old enough (adaptive strategy).
  bool unpredicted() const noexcept { return where == phase::learning || where == phase::missed; }
};

/// Scouts (next_scout): a wait whose work is not expected done for at least this long after its
/// start is also looked at before then.
inline constexpr nanoseconds scout_min_span = std::chrono::milliseconds(2);

/// The tunables of reactor_options the policy reads (copied once).
struct idle_settings {
  nanoseconds spin_window{};
  nanoseconds max_sleep{};
  nanoseconds poll_period{};
  double spin_fraction = 0.25;
  nanoseconds prespin{};
  nanoseconds final_sleep{};
  double poll_budget = 0.0;
  /// How often a wide window is looked at: poll_period (from()), stretched by the reactor when
  /// its looks cost more than poll_budget allows (budgeted_poll_period); never below poll_period.
  /// Only the spacing of the looks changes: whether work is steady enough to spin for is still
  /// judged against poll_period.
  nanoseconds window_poll_period{};

  static idle_settings from(const reactor_options& o) noexcept {
    return {o.spin_window, o.max_sleep,   o.poll_period, o.spin_fraction,
            o.prespin,     o.final_sleep, o.poll_budget, o.poll_period};
  }
};

/// How often irregular work's windows are looked at (the poll tick) when one tick's sweep takes
/// `look_cost`: every `poll_period`, or less often, so that the ticks take at most `budget` of a
/// core (reactor_options::poll_budget; 0: no limit).
nanoseconds budgeted_poll_period(nanoseconds poll_period, nanoseconds look_cost,
                                 double budget) noexcept;

/// The average time of the reactor's poll-tick sweeps (each looks at every stream whose
/// irregular work is in its window), an exponentially weighted mean with weight 1/8 for the
/// newest: what budgeted_poll_period needs. A sample counts at most twice the mean plus 2 us: a
/// sweep is timed on the wall clock, and one during which the thread was preempted for a
/// millisecond must not stretch the period tenfold; a real rise (64 streams became busy: 0.3 ->
/// 11 us) is followed within a few dozen ticks.
class look_cost {
 public:
  void add(nanoseconds sample) noexcept {
    const std::int64_t cap = 2 * mean_ + 2000;
    mean_ += (std::clamp<std::int64_t>(sample.count(), 0, cap) - mean_) / 8;
  }
  nanoseconds mean() const noexcept { return nanoseconds(mean_); }

 private:
  std::int64_t mean_ = 0;
};

/// Whether a stream's work is steady enough to spin through its window (its recent spread is at
/// most `spin_fraction` of its longest, or two poll periods); otherwise it is polled from its
/// start. Meaningful once model.ready().
bool is_steady(const idle_settings& settings, const service_time_model& model) noexcept;

/// Where the oldest wait of a stream stands, and when to look at it next. `start` is the wait's
/// service start (see the file comment); `overshoot` what this machine's sleeps have shown.
stream_outlook predict(const idle_settings& settings, const service_time_model& model,
                       idle_time start, idle_time now, const sleep_overshoot& overshoot) noexcept;

/// The next scout of a wait whose work started at `start` and is not expected done before
/// `horizon` (the opening of its window; a probed wait's: its caller's window's end), after `now`;
/// idle_time::max() when none is left, or when horizon - start < scout_min_span. Why: a stream of
/// steady work sleeps until its window, so work that suddenly got much shorter (a small batch
/// after large ones) was found only when the old window opened, up to the old length late. Two
/// scouts, at an eighth and half the way, find it by about four times its length (or an eighth of
/// the old one). Each is rounded up to a grid of a 32nd of the span (at least 100 us) on the
/// clock, so that streams started together share the wake-up.
idle_time next_scout(idle_time start, idle_time horizon, idle_time now) noexcept;

/// When a wait's window opens, measured from its service start: what predict() computes for
/// `window_open`, for a submitter that wants to know before the reactor has seen the wait (a
/// host arming its timer). Meaningful once model.ready().
nanoseconds window_open_offset(const idle_settings& settings,
                               const service_time_model& model) noexcept;

/// The older, non-predictive policy (idle_mode::ladder), kept for comparison: busy-poll
/// spin_window after the last progress, yield yield_window, then naps doubling from 10 us to
/// max_sleep. Every progress restarts it.
class ladder {
 public:
  enum class action : unsigned char { spin, yield, nap };
  void progress(idle_time now) noexcept {
    last_progress_ = now;
    step_ = first_step;
  }
  /// New waits while others pend: naps restart short, without going back to spinning.
  void new_waits() noexcept { step_ = first_step; }
  /// What to do now; for action::nap, `nap` is its length (and the next one doubles).
  action next(const reactor_options& o, idle_time now, nanoseconds& nap) noexcept;

 private:
  static constexpr nanoseconds first_step = std::chrono::microseconds(10);
  idle_time last_progress_{};
  nanoseconds step_ = first_step;
};

}  // namespace evr::detail
