// reactor/src/host_pass.hpp — the last hop: a pass of the reactor on a thread that completions
// are delivered to (detail::poll_here; poll_host.hpp has the two roles, docs/architecture.md
// "The last hop" the measurements).
//
// Owns nothing but its references. Under the pass lock (try_begin: never blocks), a host's pass
// takes the waits submitted since the last pass (intake: mostly the host's own, submitted on its
// thread, which then need no wake-up of the reactor thread), looks at the streams whose oldest
// wait is the host's and whose look is due (without fault probes: those stay the reactor
// thread's, as do faulted devices and cancels), lets the idle governor plan them and say when the
// host should look next, and delivers the batch when it is posted-only (it runs no user code;
// otherwise it wakes the reactor thread, whose batch it is). It wakes the reactor thread when one
// of its streams became the reactor's (a missed prediction, say). The thread's device and capture
// mode are the user's again when the pass ends (device_scope).
#pragma once

#include <memory>

#include <evr/reactor/detail/poll_host.hpp>

#include "control_inbox.hpp"
#include "counters.hpp"
#include "delivery_batch.hpp"
#include "device_scope.hpp"
#include "idle_governor.hpp"
#include "intake.hpp"
#include "pass_lock.hpp"
#include "stream_sweep.hpp"
#include "wait_registry.hpp"
#include "wakeup.hpp"

namespace evr::detail {

class host_pass {
 public:
  struct parts {
    pass_lock& lock;
    const control_inbox& inbox;
    intake& submissions;
    wait_registry& registry;
    stream_sweep& sweep;
    idle_governor& idle;
    delivery_batch& batch;
    device_scope& devices;
    reactor_counters& counters;
    std::shared_ptr<wakeup> wake;
  };
  explicit host_pass(parts p) : p_(std::move(p)) {}

  /// detail::poll_here: any thread but the reactor's.
  poll_result run(poll_host& host) noexcept;

 private:
  void deliver(std::chrono::steady_clock::time_point now, poll_result& out);
  parts p_;
};

}  // namespace evr::detail
