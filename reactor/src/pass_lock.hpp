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
// Hosts only try (try_begin); the reactor thread waits (enter). A host's pass is a sweep plus the
// handlers it delivers, so it may last longer than a spin should: the reactor spins a few
// microseconds, then waits on the lock word (std::atomic::wait: a short spin of its own, then a
// futex), and a host's end() wakes it only when it says it waits there (reactor_waits_), so a
// host pays no system call otherwise.
//
// Memory order: exchange (acquire) to take it, a seq_cst store (a release) to give it up: a pass
// sees every field the previous one wrote, whichever thread ran it. The sleep's handshake is
// seq_cst on both sides (the reactor: flag, then the lock word; end(): the lock word, then the
// flag), so either the reactor's last try sees the lock free or end() sees the flag and wakes it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace evr::detail {

class pass_lock {
 public:
  /// Any thread: takes the lock if it is free; never blocks.
  bool try_begin() noexcept {
    return in_pass_.load(std::memory_order_relaxed) == 0 &&
           in_pass_.exchange(1, std::memory_order_acquire) == 0;
  }
  /// The holder: gives the lock up, waking the reactor thread if it sleeps for it.
  void end() noexcept {
    in_pass_.store(0, std::memory_order_seq_cst);
    if (reactor_waits_.load(std::memory_order_seq_cst)) in_pass_.notify_one();
  }

  /// (reactor thread) Takes the lock unless it holds it: spins for a short host pass, then
  /// sleeps until the host's end(). Returns whether it slept (reactor_metrics::pass_lock_sleeps).
  bool enter() noexcept {
    bool slept = false;
    if (!held_ && !spin_for_it()) {
      sleep_for_it();
      slept = true;
    }
    held_ = true;
    return slept;
  }
  /// Any thread: the reactor thread sleeps in enter() (or is about to). For tests and
  /// diagnostics; a hint, stale as soon as it is read.
  bool reactor_sleeps() const noexcept { return reactor_waits_.load(std::memory_order_relaxed); }
  /// (reactor thread) Gives the lock up before the thread blocks, and after each pass.
  void leave() noexcept {
    if (held_) end();
    held_ = false;
  }

 private:
  // Most host passes are a sweep of a few streams; one that delivers handlers is longer.
  static constexpr std::chrono::nanoseconds spin_limit{4000};

  bool spin_for_it() noexcept {
    const auto give_up_at = std::chrono::steady_clock::now() + spin_limit;
    for (unsigned tries = 1;; ++tries) {
      if (try_begin()) return true;
      if (tries % 64 == 0 && std::chrono::steady_clock::now() >= give_up_at) return false;
    }
  }

  void sleep_for_it() noexcept {
    for (;;) {
      reactor_waits_.store(true, std::memory_order_seq_cst);
      if (in_pass_.load(std::memory_order_seq_cst) == 0 && try_begin()) break;
      in_pass_.wait(1, std::memory_order_seq_cst);
      if (try_begin()) break;
    }
    reactor_waits_.store(false, std::memory_order_relaxed);
  }

  std::atomic<std::uint32_t> in_pass_{0};   // 1 while someone holds the lock
  std::atomic<bool> reactor_waits_{false};  // the reactor thread sleeps (or is about to) in enter
  bool held_ = false;                       // (reactor thread) it holds the lock now
};

}  // namespace evr::detail
