// reactor/src/host_pass.hpp — the last hop: a pass of the reactor on a thread that completions
// are delivered to (detail::poll_here; poll_host.hpp has the two roles, docs/architecture.md
// "The last hop" the measurements).
//
// Owns nothing but its references. Under the pass lock (try_begin: never blocks), a host's pass
// takes the waits submitted since the last pass (intake: mostly the host's own, submitted on its
// thread, which then need no wake-up of the reactor thread), looks at the streams whose oldest
// wait is the host's and whose look is due (without fault probes: those stay the reactor
// thread's, as do faulted devices and cancels), lets the idle governor plan them and say when the
// host should look next (a pass that found something and ran host_pass_deliver_after leaves the
// rest of its due looks to the next), and delivers the batch when it is posted-only (it runs no
// user code; otherwise it wakes the reactor thread, whose batch it is). It wakes the reactor thread
// when one of its streams became the reactor's (a missed prediction, say). The thread's device and
// capture mode are the user's again when the pass ends (device_scope).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

#include <evr/reactor/detail/poll_host.hpp>
#include <evr/reactor/options.hpp>

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
    const reactor_options& options;
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
  /// A host whose polls lately waited this long behind other handlers (poll_host::queue_delay_ns)
  /// is saturated: its passes are not cut (may_cut).
  static constexpr std::int64_t saturated_queue_delay_ns = 50'000;
  /// The batch's size and the event queries counted when the pass began.
  struct pass_start {
    std::size_t found;
    std::uint64_t queries;
  };
  /// Looks at the host's due streams and plans them again (a cut pass leaves the rest in
  /// host.due); true when one of them must be planned by the reactor thread.
  bool look_at_due(poll_host& host, std::chrono::steady_clock::time_point now, poll_result& out);
  /// When the host should look next (out.next_look_ns, out.next_is_tick): now when a cut pass
  /// left looks, else its schedule's earliest.
  void next_look(poll_host& host, std::chrono::steady_clock::time_point now, poll_result& out);
  /// Whether the pass should stop before its next due look and deliver what it has found: it has
  /// found a completion, may be cut and has run until `deliver_at`.
  bool time_to_deliver(const poll_host& host, const pass_start& start,
                       std::chrono::steady_clock::time_point deliver_at) const noexcept;
  /// Whether the pass may stop before its other due looks
  /// (reactor_options::host_pass_deliver_after).
  bool may_cut(const poll_host& host, const pass_start& start) const noexcept;
  void deliver(std::chrono::steady_clock::time_point now, poll_result& out);
  parts p_;
};

}  // namespace evr::detail
