// python/src/loop_waker.hpp — hybrid polling for asyncio: wake the awaiting coroutine just before
// its predicted completion and let it poll, instead of paying the loop's wake-up and resume.
//
// Why: a completion reaches a sleeping event loop through an eventfd; the loop's wake-up from
// epoll_wait and the resume of the awaiting task (set_result -> call_soon -> the next iteration
// -> the coroutine) cost, on the H100 host, 10-25 us after a wait of 0.2-5 ms even in plain
// asyncio: most of what `await evr.wait(s)` adds over a coroutine that polls the stream itself.
// The reactor already finds the GPU's completion within a few microseconds. So, per loop:
//   * a predictor per stream (the key is the target's handle) learns the time from submission to
//     completion (exponentially weighted mean and mean absolute deviation, as the reactor's idle
//     policy does);
//   * a wait whose stream is predictable (enough samples, a deviation small against the mean)
//     gets a wake-up time: the predicted end minus two deviations minus the lead (the measured
//     lateness of this loop's timer wake-ups, plus a margin);
//   * a timerfd (no timer slack, nanosecond resolution, unlike asyncio's millisecond timers),
//     watched by the loop like the eventfd, is armed for the earliest such time;
//   * when it fires, the earliest due wait's window opens (open_next): the coroutine awaiting it
//     (evr's future, python/evr/_loop.py) wakes and polls the completion queue between
//     `yield`s, as `while not s.query(): await asyncio.sleep(0)` does, so other tasks still run;
//     when its completion is there it returns at once, without another trip through the loop.
//     The window ends at the predicted end plus three deviations, at most `max_spin` after it
//     opened (window_closed).
// A wait with a wake-up time is probed (evr::wait_target::probed) when its marker is a fence word:
// the pollers read that word between their yields, and a wait whose word is written is resolved
// there (take_reached), without the reactor, which leaves the wait to this loop until the window
// ends (it sleeps instead of spinning beside the poller) and whose completion, later, only frees
// the node (completion::settled). Waits with event markers are found as before: the reactor
// spins for them and the poller drains its queue.
// One wait per stream is scheduled at a time (the first one pending; those queued behind it
// complete with it or later, and its poller drains whatever comes), and waits get windows only
// while the loop has fewer than max_waits (4) waits in flight, predicted or not: a loop with more
// is busy with their completions anyway, and the GPU, not the hop, bounds its rate. One
// window is open per loop at a time: the poller drains every completion it finds, so the waits due
// meanwhile are resolved by it; the timer stays disarmed until the window closes. A wait whose
// window passed falls back to the eventfd (never polled for twice), as do waits on unpredictable
// streams, waits that nobody awaits (gathered futures), and every wait while max_spin is 0.
//
// Thread safety: every member runs with the GIL held, which serializes them, on the loop's thread,
// except set_max_spin_ns(), set_max_waits() and stats(), which evr.set_loop_spin /
// evr.loop_stats may call from any thread (with the GIL held). The completion nodes' fields used
// here (submitted_ns, key, wake_at, wake_ticket, spin_until) are written and read on the loop's
// thread only; pushed_ns is written by the reactor thread before the push and read here after the
// drain's acquire. A node in the schedule has not been drained, so it is alive (only this loop's
// drain frees it, after on_drained).
#pragma once

#include <array>
#include <cstdint>
#include <set>
#include <unordered_map>
#include <vector>

#include "completion_sink.hpp"

namespace evr_py {

/// Monotonic clock in nanoseconds (CLOCK_MONOTONIC: the clock of the timerfd).
std::int64_t monotonic_ns() noexcept;

struct loop_stats {
  std::uint64_t completions = 0;  ///< completions drained on this loop
  std::uint64_t predicted = 0;    ///< waits that got a wake-up time
  std::uint64_t timer_fires = 0;  ///< the timerfd woke the loop
  std::uint64_t spins = 0;        ///< windows opened with a coroutine polling
  std::uint64_t spin_hits = 0;    ///< ... that ended with the wait's completion
  std::uint64_t spin_misses = 0;  ///< windows (or due waits) that passed without it (fell back)
  std::uint64_t not_polled = 0;   ///< due waits nobody awaited (a gathered future): eventfd
  std::int64_t spin_ns = 0;       ///< time spent in open windows
  std::uint64_t probe_hits = 0;   ///< waits resolved from their probe (before the reactor's push)
  /// ... of which the loop's first look since the wake-up time came late (taught nothing)
  std::uint64_t late_looks = 0;
  std::uint64_t model_restarts = 0;  ///< stream models started again (the work got shorter)
  /// log2 histogram of "pushed by the reactor -> drained by the loop" (bucket i: < 2^i ns).
  std::array<std::uint64_t, 40> hop_log2_ns{};
  std::int64_t lead_ns = 0;  ///< the current lead (timer lateness estimate + margin)
};

/// The stages of the last completion drained on this loop (CLOCK_MONOTONIC ns; 0 before the
/// first): where a single await's time went, for benches and diagnosis.
struct last_completion {
  std::int64_t submitted_ns = 0;  ///< evr.wait submitted it (loop thread)
  /// the reactor pushed it to this loop's queue (or a poll saw its fence word)
  std::int64_t pushed_ns = 0;
  std::int64_t drained_ns = 0;  ///< the loop took it from the queue
};

class loop_waker {
 public:
  /// Creates the timerfd (non-blocking, close-on-exec). Throws std::system_error on failure.
  loop_waker();
  ~loop_waker();
  loop_waker(const loop_waker&) = delete;
  loop_waker& operator=(const loop_waker&) = delete;

  int fd() const noexcept { return fd_; }
  std::int64_t max_spin_ns() const noexcept { return max_spin_ns_; }
  /// 0 disables the polling (and the timer): every completion then comes through the eventfd.
  void set_max_spin_ns(std::int64_t ns) noexcept;
  /// Waits of this loop that may have a wake-up time at once (evr.set_loop_spin's max_waits).
  std::size_t max_waits() const noexcept { return max_waits_; }
  void set_max_waits(std::size_t n) noexcept { max_waits_ = n; }

  /// Whether a wait on `key` submitted now would get a wake-up time (evr.wait makes its polling
  /// future only for those; the others are plain asyncio futures, at no extra cost).
  bool predictable(std::uintptr_t key) const noexcept;
  /// A wait on `key` was submitted (its node not yet pushed: call before the reactor can run it).
  /// Returns its wake-up time (CLOCK_MONOTONIC ns), 0 when it gets none (as predictable() said).
  /// Every submitted wait counts as in flight until on_drained (or on_refused).
  std::int64_t on_submit(completion* c, std::uintptr_t key) noexcept;
  /// The reactor refused the wait submitted with on_submit: it is not in flight.
  void on_refused(const completion* c) noexcept;
  /// The wait submitted with on_submit got a probe (c->probe): its pollers read it.
  void on_probed(completion* c);
  /// Waits in flight with a probe.
  bool probing() const noexcept { return !probed_.empty(); }
  /// A probed wait in flight whose probe says done (not yet pushed by the reactor), taken out of
  /// flight as on_drained does; its stream's model (and the reactor's) learns the midpoint between
  /// this look and the last one that found it short when the two are close, else this look's
  /// time as a bound, and nothing from a first look that came late (lesson_of). nullptr when there
  /// is none; every probed wait found short notes `now` (the clock read before the looks). The
  /// caller settles the one returned (settle_from_probe).
  completion* take_reached(std::int64_t now) noexcept;
  /// Waits submitted on this loop and not yet drained.
  std::size_t in_flight() const noexcept { return in_flight_; }
  /// Every node of a drained batch, before it is resolved and freed.
  void on_drained(const completion* c, std::int64_t now) noexcept;
  /// The timerfd is readable: consumes it and learns how late it fired. The caller drains, then
  /// calls open_next.
  void on_timer_fired() noexcept;
  /// When no window is open and the earliest scheduled wait is due: takes it out of the schedule,
  /// opens its window and returns its node, with the window's end in `until` (at most max_spin
  /// from now) and its number in `window`. The caller hands both to the wait's coroutine, which
  /// calls window_closed once the window ends (the caller does at once when nobody polls).
  /// Otherwise nullptr (and the timer is rearmed).
  completion* open_next(std::int64_t now, std::int64_t& until, std::uint64_t& window) noexcept;
  /// Window `window` ended at `now`: `polled` (a coroutine polled in it), `hit` (its wait
  /// completed meanwhile), `opened_ns` (when the polling began). Ignored unless it is the open
  /// one (clear() forgot it, say). `rearm`: rearm the timer for the next due wait now (a system
  /// call); else the caller calls rearm() soon.
  void window_closed(std::uint64_t window, bool polled, bool hit, std::int64_t opened_ns,
                     std::int64_t now, bool rearm_now = true) noexcept;
  bool window_open() const noexcept { return open_window_ != 0; }
  /// The loop closed: forget every schedule entry (the nodes go elsewhere) and disarm.
  void clear() noexcept;

  const loop_stats& stats() const noexcept { return stats_; }
  const last_completion& last() const noexcept { return last_; }
  std::size_t models() const noexcept { return models_.size(); }  ///< at most 4096

 private:
  struct model {
    double mean_ns = 0;
    double dev_ns = 0;
    std::uint32_t samples = 0;
    std::uint32_t bounds_in_a_row = 0;  ///< probed waits in a row that taught only a bound
    std::uint32_t late_in_a_row = 0;    ///< ... that were found by a late first look
    std::uint32_t longer_in_a_row = 0;  ///< predicted waits in a row done far past their window
    double first_bound_ns = 0;          ///< the first of those bounds (submission to the look)
    /// After a restart, until the model is trusted again: no sample longer than this (0: none).
    double relearn_cap_ns = 0;
    std::uint64_t scheduled_ticket = 0;  ///< this stream's wait in the schedule (0: none)
  };
  /// A scheduled wait, ordered by wake-up time (the ticket makes equal times distinct). The node
  /// keeps the same three values, so the drain can erase its entry without a lookup table.
  struct slot {
    std::int64_t wake_at;
    std::uint64_t ticket;
    std::int64_t spin_until;  ///< the end of the wait's window (predicted end + 3 dev + margin)
    completion* node;         ///< not part of the order
    bool operator<(const slot& o) const noexcept {
      return wake_at != o.wake_at ? wake_at < o.wake_at : ticket < o.ticket;
    }
  };

 public:
  /// After a drain (and after a refused submission): drops the entries whose window has passed
  /// (their waits fall back to the eventfd) and arms the timerfd for the earliest one left.
  void rearm(std::int64_t now) noexcept;

 private:
  /// Takes `c`'s entry out of the schedule, if it has one (drained, or refused), and out of the
  /// probed waits.
  void forget(const completion* c) noexcept;
  /// What a wait that left flight teaches its stream's model: the time its work ended (`exact`),
  /// a time it ended at or before, by how much unknown (`bound`), or nothing (a cancelled or
  /// failed wait). `done_ns` is also the last completion's push stage (last()).
  struct lesson {
    std::int64_t done_ns = 0;
    /// late: a bound from a first look that came late (left_flight counts those in a row).
    enum { exact, bound, late, nothing } kind = nothing;
  };
  /// What the probe of `c`, found done by a look at `now`, teaches (see take_reached).
  lesson lesson_of(const completion& c, std::int64_t now) noexcept;
  /// A wait of this loop left flight at `now` (drained, or seen done by its probe): stats, the
  /// stages of the last completion, and its stream's model learns `learnt` (two bounds in a row,
  /// a predicted wait done in less than half the predicted length, or two done far past their
  /// windows, start the model again).
  void left_flight(const completion* c, std::int64_t now, lesson learnt) noexcept;
  /// Starts `m` again; until it is trusted it learns no length longer than `bound` less a lead
  /// (0: no such cap).
  void restart(model& m, double bound) noexcept;
  /// Takes an entry out of the schedule: its node is unscheduled, its stream may schedule another.
  void drop(std::set<slot>::iterator it) noexcept;
  /// The timerfd for the earliest entry (disarmed when there is none or a window is open).
  void arm() noexcept;

  int fd_ = -1;
  std::int64_t max_spin_ns_;
  /// A wait gets a wake-up time only while fewer waits than this are in flight on the loop
  /// (submitted, not yet drained; those without a wake-up time count too). Why: a loop with many
  /// waits in flight (64 torch streams) opens a window for few of them (one is open at a time),
  /// its completions come often enough that it is seldom asleep, and a GPU shared by that many
  /// streams bounds the rate, not the loop's wake-up; its windows spun through time its other
  /// tasks needed (docs/python.md, "Latency against CPU").
  std::size_t max_waits_ = 4;
  std::size_t in_flight_ = 0;      ///< see in_flight()
  std::int64_t armed_for_ = 0;     ///< the time the timerfd is armed for (0: disarmed)
  std::int64_t armed_at_ = 0;      ///< when it was armed
  std::uint64_t open_window_ = 0;  ///< the open window's number (0: none open)
  std::uint64_t windows_ = 0;      ///< windows opened so far (the last number given)
  std::uint64_t next_ticket_ = 1;
  std::set<slot> schedule_;
  /// The waits in flight with a probe, at most a few (probed waits have windows: fewer than
  /// max_waits in flight); a node here is alive (not yet freed by this loop's drain).
  std::vector<completion*> probed_;
  std::unordered_map<std::uintptr_t, model> models_;
  double late_mean_ns_ = 10'000;  ///< this loop's timer wake-ups: mean lateness
  double late_dev_ns_ = 5'000;    ///< ... and its mean absolute deviation
  loop_stats stats_;
  last_completion last_;
};

}  // namespace evr_py
