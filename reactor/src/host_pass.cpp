// reactor/src/host_pass.cpp — see host_pass.hpp.
#include "host_pass.hpp"

#include <chrono>
#include <cstddef>
#include <vector>

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
  const bool replan = look_at_due(host, now, out);
  p_.sweep.drop_idle_streams();
  if (!out.spin) next_look(host, now, out);
  if (!p_.batch.empty()) deliver(now, out);
  // A stream whose next wait is no longer this host's, or that this pass planned as the
  // reactor's (learning, a missed prediction), would otherwise wait for the reactor's own look
  // (it naps on the hosts' promises): the reactor plans it now.
  if (replan) p_.wake->wake_urgent();
  p_.devices.end_borrowed();
  // Published inside the pass, so that a plan the reactor makes next sees it: a window the host
  // will not look at in time is told to it (idle_governor::plan_hosted), and the reactor naps
  // until the host's promise (this) has passed by its grace.
  const std::int64_t margin =
      out.next_is_tick ? 0 : host.timer_margin_ns.load(std::memory_order_relaxed);
  host.looks_at_ns.store(out.spin                               ? now.time_since_epoch().count()
                         : out.next_look_ns == poll_host::never ? poll_host::never
                                                                : out.next_look_ns - margin,
                         std::memory_order_relaxed);
  out.what = poll_result::outcome::swept;
  out.at_ns = now.time_since_epoch().count();
  p_.lock.end();
  return out;
}

void host_pass::next_look(poll_host& host, std::chrono::steady_clock::time_point now,
                          poll_result& out) {
  if (!host.due.empty()) {  // a cut pass's looks left: again right after the handlers
    out.next_look_ns = now.time_since_epoch().count();
    return;
  }
  const auto current = [&](const host_schedule::entry& e) { return p_.idle.scheduled(e, host); };
  if (const host_schedule::entry* e = host.schedule.next(current)) {
    out.next_look_ns = e->look_ns;
    out.next_is_tick = p_.idle.next_look_is_tick(host, *e);
  }
}

bool host_pass::look_at_due(poll_host& host, std::chrono::steady_clock::time_point now,
                            poll_result& out) {
  // The streams whose look is due (the host's schedule: not every active stream), looked at and
  // planned again; each is scheduled anew on the host as it is planned. First the looks the last
  // pass left, unless planned since (by the reactor thread). What the pass finds runs only after
  // it (the batch is delivered at its end): a pass that has found something and run
  // host_pass_deliver_after stops, and the looks it did not make are the next pass's.
  const auto current = [&](const host_schedule::entry& e) { return p_.idle.scheduled(e, host); };
  std::erase_if(host.due, [&](const host_schedule::entry& e) { return !current(e); });
  // The looks due a little later are made now (poll_host::look_ahead_ns says why).
  const std::chrono::steady_clock::time_point due_by =
      now + std::chrono::nanoseconds(poll_host::look_ahead_ns);
  host.schedule.take_due(due_by.time_since_epoch().count(), current, host.due);
  const pass_start start{p_.batch.size(),
                         p_.counters.event_queries.load(std::memory_order_relaxed)};
  const std::chrono::steady_clock::time_point deliver_at = now + p_.options.host_pass_deliver_after;
  bool replan = false;
  std::size_t looked = 0;
  for (; looked < host.due.size() && !time_to_deliver(host, start, deliver_at); ++looked) {
    stream_state* st = host.due[looked].stream;
    if (p_.registry.device_fault(st->device)) continue;  // the reactor fails its waits
    if (due_by >= st->plan.host_look) {
      p_.sweep.look_at(*st, now, /*may_probe=*/false);  // probes and faults stay the reactor's
      replan = replan || p_.idle.handed_back(*st, host);
    }
    replan = p_.idle.plan_for_host(*st, host, now, out) || replan;
  }
  host.due.erase(host.due.begin(), host.due.begin() + static_cast<std::ptrdiff_t>(looked));
  if (!host.due.empty()) bump(p_.counters.host_passes_cut);
  bump(p_.counters.host_event_queries,
       p_.counters.event_queries.load(std::memory_order_relaxed) - start.queries);
  return replan;
}

bool host_pass::time_to_deliver(const poll_host& host, const pass_start& start,
                                std::chrono::steady_clock::time_point deliver_at) const noexcept {
  return p_.batch.size() > start.found && may_cut(host, start) &&
         std::chrono::steady_clock::now() >= deliver_at;
}

bool host_pass::may_cut(const poll_host& host, const pass_start& start) const noexcept {
  // Only a pass that made driver queries (event markers): a look at a fence word or a signal is
  // a memory read, and such passes are cheaper whole than a pass that stops and starts again
  // (measured on an H200: 64 lockstep streams of signals found later when cut). And only on a
  // thread whose polls do not wait behind other handlers: on a saturated io thread the
  // completions found would queue behind those handlers anyway, while the looks left would wait
  // as long (a server's io thread then looked at its streams too seldom, and the reactor looked
  // in its place).
  return p_.counters.event_queries.load(std::memory_order_relaxed) > start.queries &&
         host.queue_delay_ns.load(std::memory_order_relaxed) < saturated_queue_delay_ns;
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
