// python/src/loop_waker.hpp — hybrid polling on an asyncio loop's thread: wake it just before a
// predicted completion and let it poll its completion queue, instead of paying a cold wake-up.
//
// Why: a completion reaches a sleeping event loop through an eventfd, and the loop thread's
// wake-up from epoll_wait costs what the host's scheduler takes (on the H100 host 15-20 us at the
// median, more in the tail): most of what `await evr.wait(s)` adds over a thread that spins on
// the stream. The reactor already finds the GPU's completion within a few microseconds; what is
// left is this hop. So, per loop:
//   * a predictor per stream (the key is the target's handle) learns the time from submission to
//     completion (exponentially weighted mean and mean absolute deviation, as the reactor's idle
//     policy does);
//   * a wait whose stream is predictable (enough samples, a deviation small against the mean)
//     gets a wake-up time: the predicted end minus two deviations minus the lead (the measured
//     lateness of this loop's timer wake-ups, plus a margin);
//   * a timerfd (no timer slack, nanosecond resolution, unlike asyncio's millisecond timers),
//     watched by the loop like the eventfd, is armed for the earliest such time;
//   * when it fires and the loop has nothing else ready, the loop thread polls its completion
//     queue (GIL released) until a completion arrives or the window of the earliest due wait has
//     passed (its predicted end plus three deviations, at most `max_spin`), then drains.
// A wait whose prediction missed falls back to the eventfd (its entry is dropped, never re-armed),
// and so do waits on unpredictable streams and every wait while max_spin is 0. The spin blocks the
// loop for at most max_spin, and only when nothing else was ready to run.
//
// Thread safety: every member runs with the GIL held, which serializes them: on the loop's thread,
// except set_max_spin_ns() and stats(), which evr.set_loop_spin / evr.loop_stats may call from
// any thread. on_timer() releases the GIL while it polls and touches only the sink and its locals
// meanwhile. The completion nodes' fields used here (submitted_ns, key, wake_at, wake_ticket,
// spin_until) are written and read on the loop's thread only; pushed_ns is written by the
// reactor thread before the push and read here after the drain's acquire.
#pragma once

#include <array>
#include <cstdint>
#include <set>
#include <unordered_map>

#include "completion_sink.hpp"

namespace evr_py {

/// Monotonic clock in nanoseconds (CLOCK_MONOTONIC: the clock of the timerfd).
std::int64_t monotonic_ns() noexcept;

struct loop_stats {
  std::uint64_t completions = 0;   ///< completions drained on this loop
  std::uint64_t predicted = 0;     ///< waits that got a wake-up time
  std::uint64_t timer_fires = 0;   ///< the timerfd woke the loop
  std::uint64_t spins = 0;         ///< ... and the loop polled (it was idle)
  std::uint64_t spin_hits = 0;     ///< a completion was there when it fired or came while polling
  std::uint64_t spin_misses = 0;   ///< waits whose window passed while polling (fell back)
  std::uint64_t skipped_busy = 0;  ///< due waits not polled for: the loop had other work
  std::int64_t spin_ns = 0;        ///< time spent polling
  /// log2 histogram of "pushed by the reactor -> drained by the loop" (bucket i: < 2^i ns).
  std::array<std::uint64_t, 40> hop_log2_ns{};
  std::int64_t lead_ns = 0;  ///< the current lead (timer lateness estimate + margin)
};

/// The stages of the last completion drained on this loop (CLOCK_MONOTONIC ns; 0 before the
/// first): where a single await's time went, for benches and diagnosis.
struct last_completion {
  std::int64_t submitted_ns = 0;  ///< evr.wait submitted it (loop thread)
  std::int64_t pushed_ns = 0;     ///< the reactor pushed it to this loop's queue
  std::int64_t drained_ns = 0;    ///< the loop took it from the queue
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

  /// A wait on `key` was submitted (its node not yet pushed: call before the reactor can run it).
  void on_submit(completion* c, std::uintptr_t key) noexcept;
  /// Every node of a drained batch, before it is resolved and freed.
  void on_drained(const completion* c, std::int64_t now) noexcept;
  /// The timerfd is readable. `loop_idle`: nothing else is ready to run on the loop. Polls `sink`
  /// (GIL released) when a wait is due and the loop is idle; the caller drains afterwards.
  void on_timer(const completion_sink& sink, bool loop_idle) noexcept;
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
  };
  /// A scheduled wait, ordered by wake-up time (the ticket makes equal times distinct). The node
  /// keeps the same three values, so the drain can erase its entry without a lookup table.
  struct slot {
    std::int64_t wake_at;
    std::uint64_t ticket;
    std::int64_t spin_until;  ///< the end of the wait's window (predicted end + 3 dev + margin)
    bool operator<(const slot& o) const noexcept {
      return wake_at != o.wake_at ? wake_at < o.wake_at : ticket < o.ticket;
    }
  };

 public:
  /// After a drain (and after a refused submission): drops the entries whose window has passed
  /// (their waits fall back to the eventfd) and arms the timerfd for the earliest one left.
  void rearm(std::int64_t now) noexcept;
  /// A submission was refused: forget its entry.
  void forget(const completion* c) noexcept;

 private:
  void arm() noexcept;  ///< the timerfd for the earliest entry (or disarmed when none)

  int fd_ = -1;
  std::int64_t max_spin_ns_;
  std::int64_t armed_for_ = 0;  ///< the time the timerfd is armed for (0: disarmed)
  std::uint64_t next_ticket_ = 1;
  std::set<slot> schedule_;
  std::unordered_map<std::uintptr_t, model> models_;
  double late_mean_ns_ = 10'000;  ///< this loop's timer wake-ups: mean lateness
  double late_dev_ns_ = 5'000;    ///< ... and its mean absolute deviation
  loop_stats stats_;
  last_completion last_;
};

}  // namespace evr_py
