// reactor/src/intake.hpp — submitted waits into the registry: the submission stack taken, each
// wait put in its stream's timeline (or the loose waits), the idle governor told.
//
// Two callers: the reactor thread's loop, and a host's pass (host_pass.hpp), so that a host that
// is looking anyway takes the waits submitted on its thread without waking the reactor thread
// (docs/architecture.md, "The last hop": under load). Cancels stay the reactor thread's: a cancel
// wakes it anyway, and a cancel is settled only after its wait was taken (whoever took it).
//
// Threads: under the pass lock; never once the reactor closed the stack (close() is the reactor's,
// after a stop request, and a host's pass checks for one inside the lock).
#pragma once

#include <chrono>

#include <evr/reactor/detail/wait_op.hpp>

#include "idle_governor.hpp"
#include "submitter.hpp"
#include "wait_registry.hpp"

namespace evr::detail {

class intake {
 public:
  using clock = std::chrono::steady_clock;

  intake(submitter& subs, wait_registry& registry, idle_governor& idle) noexcept
      : submitter_(subs), registry_(registry), idle_(idle) {}

  /// Takes every submitted wait (oldest first); true when there was one.
  bool take(clock::time_point now) {
    wait_op* subs = submitter_.take_all();
    submitter::stack::for_each(subs, [&](wait_op* op) { accept(op, now); });
    return subs != nullptr;
  }
  /// (reactor, stopping) Takes what was submitted and refuses every later submission.
  void close(clock::time_point now) {
    submitter::stack::for_each(submitter_.close(), [&](wait_op* op) { accept(op, now); });
  }

 private:
  void accept(wait_op* op, clock::time_point now) {
    const wait_registry::accepted a = registry_.accept(op, now);
    if (a.stream != nullptr) idle_.new_wait(*a.stream, *op, now, a.activated);
  }

  submitter& submitter_;
  wait_registry& registry_;
  idle_governor& idle_;
};

}  // namespace evr::detail
