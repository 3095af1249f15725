// evr/reactor/detail/window_duty.hpp — how much of the time the windows of steady work that a
// poller watches are open: what spinning through them costs it. Not public: the poll hosts
// (poll_host.hpp, callbacks/.../io_context_host.hpp) use it.
//
// Why: one stream's window is short (its work's spread plus margins) and spinning through it
// finds the completion at the floor for a small share of a core. Several streams' windows overlap
// and spinning through their union takes much of the thread. When that share is over
// `dense_permille`, and several windows are open at once, a host looks on a short tick instead:
// a self-timed wake-up costs a few us and lands a few us late, against tens of us for the wake-up
// of a thread that sleeps until woken. (The same rule in the reactor's own idle policy, tried on
// 64 streams of event markers, cut its CPU little, 89 -> 76 % at 20 ms, and cost its p50 4 us:
// there each look is a driver query, and a tick's sweep of the open windows costs most of the
// tick. Not kept: docs/benchmarks.md, "The last hop".)
//
// Thread safety: none (one poller's own state).
#pragma once

#include <cstdint>

namespace evr::detail {

class window_duty {
 public:
  static constexpr std::int64_t period_ns = 2'000'000;  ///< measured over this long
  static constexpr std::int64_t dense_permille = 300;   ///< dense beyond this share
  /// The tick of a dense poller: a look this often through overlapping windows.
  static constexpr std::int64_t tick_ns = 20'000;

  /// A look at `now` (steady clock ns) found a window open (it would spin) or not.
  void account(bool wants_spin, std::int64_t now) noexcept {
    if (wants_spin && last_open_ != 0) open_ns_ += now - last_open_;
    last_open_ = wants_spin ? now : 0;
    if (period_start_ == 0) period_start_ = now;
    if (now - period_start_ >= period_ns) {
      dense_ = open_ns_ * 1000 > (now - period_start_) * dense_permille;
      open_ns_ = 0;
      period_start_ = now;
    }
  }
  /// Over the last full period, windows were open more than dense_permille of the time.
  bool dense() const noexcept { return dense_; }

 private:
  std::int64_t period_start_ = 0, open_ns_ = 0, last_open_ = 0;
  bool dense_ = false;
};

}  // namespace evr::detail
