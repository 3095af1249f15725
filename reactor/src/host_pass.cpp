// reactor/src/host_pass.cpp — see host_pass.hpp.
#include "host_pass.hpp"

#include <chrono>

namespace evr::detail {

poll_result host_pass::run(poll_host& host) noexcept {
  poll_result out;
  if (p_.inbox.stop_requested()) {
    out.what = poll_result::outcome::stopped;
    return out;
  }
  if (!p_.lock.try_begin()) return out;  // busy: the reactor thread or another host is in a pass
  const std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now();
  // Looking now: the reactor's safety look at the host's streams moves on from this
  // (idle_governor::covered_until), also when the host was late before.
  host.looks_at_ns.store(now.time_since_epoch().count(), std::memory_order_relaxed);
  p_.devices.begin_borrowed();
  bump(p_.counters.host_passes);
  // Not once stopping: the reactor thread closes the stack (checked inside the lock, which the
  // reactor holds when it closes).
  if (!p_.inbox.stop_requested() && p_.submissions.take(now)) bump(p_.counters.host_intakes);
  // The streams whose look is due (the host's schedule: not every active stream), looked at and
  // planned again; each is scheduled anew on the host as it is planned.
  const auto current = [&](const host_schedule::entry& e) { return p_.idle.scheduled(e, host); };
  host.due.clear();
  host.schedule.take_due(now.time_since_epoch().count(), current, host.due);
  bool replan = false;
  const std::uint64_t queries_before = p_.counters.event_queries.load(std::memory_order_relaxed);
  for (stream_state* st : host.due) {
    if (p_.registry.device_fault(st->device)) continue;  // the reactor fails its waits
    if (now >= st->plan.host_look) {
      p_.sweep.look_at(*st, now, /*may_probe=*/false);  // probes and faults stay the reactor's
      replan = replan || p_.idle.handed_back(*st, host);
    }
    replan = p_.idle.plan_for_host(*st, host, now, out) || replan;
  }
  bump(p_.counters.host_event_queries,
       p_.counters.event_queries.load(std::memory_order_relaxed) - queries_before);
  p_.sweep.drop_idle_streams();
  if (!out.spin) out.next_look_ns = host.schedule.next_ns(current);
  if (!p_.batch.empty()) deliver(now, out);
  // A stream whose next wait is no longer this host's, or that this pass planned as the
  // reactor's (learning, a missed prediction), would otherwise wait for the reactor's own look
  // (it naps on the hosts' promises): the reactor plans it now.
  if (replan) p_.wake->wake_urgent();
  p_.devices.end_borrowed();
  // Published inside the pass, so that a plan the reactor makes next sees it: a window the host
  // will not look at in time is told to it (idle_governor::plan_hosted), and the reactor naps
  // until the host's promise (this) has passed by its grace.
  const std::int64_t margin = host.timer_margin_ns.load(std::memory_order_relaxed);
  host.looks_at_ns.store(out.spin                               ? now.time_since_epoch().count()
                         : out.next_look_ns == poll_host::never ? poll_host::never
                                                                : out.next_look_ns - margin,
                         std::memory_order_relaxed);
  out.what = poll_result::outcome::swept;
  out.at_ns = now.time_since_epoch().count();
  p_.lock.end();
  return out;
}

void host_pass::deliver(std::chrono::steady_clock::time_point now, poll_result& out) {
  // Posted completions only: a pass on a host's thread runs no user code. A batch with an inline
  // completion (a later wait of one of the host's streams, say) is the reactor thread's.
  if (!p_.batch.posted_only()) {
    p_.wake->wake_urgent();
    return;
  }
  out.delivered = static_cast<std::uint32_t>(p_.batch.size());
  bump(p_.counters.host_completions, p_.batch.size());
  p_.batch.deliver(now);
  p_.registry.release_markers();
}

}  // namespace evr::detail
