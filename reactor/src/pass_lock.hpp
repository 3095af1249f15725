// reactor/src/pass_lock.hpp — who may run a pass of the reactor now.
//
// Everything a pass touches (the wait registry, the streams' reactor side, the delivery batch, the
// idle policy's plans, the device scope) belongs to whoever holds this lock: the reactor thread,
// or a host's pass (host_pass.hpp) on a thread that completions are delivered to. The reactor
// thread holds it through each pass of its loop, inline handlers included (a poll_here from one
// finds it taken: busy), and gives it up right before it blocks in a sleep (wakeup.hpp's
// `blocking` callback) and after each pass, so a host's pass runs while the reactor thread sleeps
// or between its passes. (Given up only in sleeps, a reactor that did not sleep held the hosts
// off for good: issue 43's hangs.)
//
// Memory order: exchange (acquire) to take it, store (release) to give it up: a pass sees every
// field the previous one wrote, whichever thread ran it.
#pragma once

#include <atomic>

namespace evr::detail {

class pass_lock {
 public:
  /// Any thread: takes the lock if it is free; never blocks.
  bool try_begin() noexcept {
    return !in_pass_.load(std::memory_order_relaxed) &&
           !in_pass_.exchange(true, std::memory_order_acquire);
  }
  void end() noexcept { in_pass_.store(false, std::memory_order_release); }

  /// (reactor thread) Takes the lock unless it holds it; a host's pass is a sweep of its
  /// streams, microseconds, so it spins.
  void enter() noexcept {
    if (!held_) {
      while (!try_begin()) {
      }
    }
    held_ = true;
  }
  /// (reactor thread) Gives the lock up before the thread blocks, and after each pass.
  void leave() noexcept {
    if (held_) end();
    held_ = false;
  }

 private:
  std::atomic<bool> in_pass_{false};
  bool held_ = false;  // (reactor thread) it holds the lock now
};

}  // namespace evr::detail
