// evr/reactor/detail/window_duty.hpp — how much of the time the windows of steady work that a
// poller watches are open: what spinning through them costs it. Not public: the reactor's idle
// policy and the poll hosts (poll_host.hpp) share it.
//
// Why: one stream's window is short (its work's spread plus margins) and spinning through it
// finds the completion at the floor for a small share of a core. Many streams' windows overlap
// (64 streams of 5 ms +-5 % work: one is open nearly all the time), and spinning through their
// union takes the whole thread. When that share is over `dense_permille`, and several windows are
// open at once, a poller looks on a short tick instead: a self-timed wake-up costs a few us and
// lands a few us late, against tens of us for the wake-up of a thread that sleeps until woken.
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
