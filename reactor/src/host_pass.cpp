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
  p_.devices.begin_borrowed();
  const std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now();
  bump(p_.counters.host_passes);
  bool replan = false;
  for (stream_state* st : p_.registry.active()) {
    if (!p_.idle.host_looks(*st, host, now) || p_.registry.device_fault(st->device)) continue;
    p_.sweep.look_at(*st, now, /*may_probe=*/false);  // probes and faults stay the reactor's
    replan = replan || p_.idle.handed_back(*st, host);
  }
  p_.sweep.drop_idle_streams();
  p_.idle.plan_for_host(host, now, out);
  if (!p_.batch.empty()) deliver(now);
  // A stream whose next wait is no longer this host's would otherwise wait for the reactor's
  // safety look (a window's close and more): the reactor plans it now.
  if (replan) p_.wake->wake_urgent();
  p_.devices.end_borrowed();
  // Published inside the pass, so that a plan the reactor makes next sees it: a window the host
  // will not look at in time is told to it (idle_governor::plan_hosted).
  const std::int64_t margin = host.timer_margin_ns.load(std::memory_order_relaxed);
  host.looks_at_ns.store(out.spin                               ? now.time_since_epoch().count()
                         : out.next_look_ns == poll_host::never ? poll_host::never
                                                                : out.next_look_ns - margin,
                         std::memory_order_relaxed);
  out.what = poll_result::outcome::swept;
  p_.lock.end();
  return out;
}

void host_pass::deliver(std::chrono::steady_clock::time_point now) {
  // Posted completions only: a pass on a host's thread runs no user code. A batch with an inline
  // completion (a later wait of one of the host's streams, say) is the reactor thread's.
  if (!p_.batch.posted_only()) {
    p_.wake->wake_urgent();
    return;
  }
  bump(p_.counters.host_completions, p_.batch.size());
  p_.batch.deliver(now);
  p_.registry.release_markers();
}

}  // namespace evr::detail
