// reactor/src/reactor_hosts.cpp — the last hop: threads that completions are delivered to lend
// themselves to the reactor near a predicted completion (poll_host.hpp has the two roles,
// docs/architecture.md "The last hop" the measurements). What is here: a host's own pass
// (poll_here) and its device scope, and the part of a stream's plan that a host covers.
#include <algorithm>

#include "reactor_core.hpp"

namespace evr::detail {
namespace {

using std::chrono::nanoseconds;

std::int64_t ns_of(std::chrono::steady_clock::time_point t) noexcept {
  return t.time_since_epoch().count();
}

}  // namespace

poll_host* reactor_core::host_of(const stream_state& st) noexcept {
  if (st.entries.empty()) return nullptr;
  // Only a fence-word marker: a host's look at it is a memory read. An event marker (more busy
  // streams than hardware queues, say 64) costs a driver query per look, and a host that looked
  // through 64 streams' windows was later and costlier than the reactor (H100: p50 47-68 us and
  // 70-90 % of a core, against 32-38 us for a plain post): the reactor finds those and posts.
  const timeline_entry& e = st.entries.front();
  return e.op != nullptr && e.event == nullptr ? e.op->host_ : nullptr;
}

poll_result reactor_core::poll_here(poll_host& host) noexcept {
  poll_result out;
  if (stopping_.load(std::memory_order_acquire)) {
    out.what = poll_result::outcome::stopped;
    return out;
  }
  if (!try_begin_pass()) return out;  // busy: the reactor thread or another host is in a pass
  borrowed_ = true;
  const clock::time_point now = clock::now();
  bump(m_.host_passes);
  sweep_for_host(host, now, out);
  if (!ready_.empty()) {
    // Posted completions only: a pass on a host's thread runs no user code. A batch with an inline
    // completion (a later wait of one of the host's streams, say) is the reactor thread's.
    const bool posted_only = std::none_of(ready_.begin(), ready_.end(), [](const auto& r) {
      return r.first != nullptr && r.first->how_ == delivery::inline_on_reactor;
    });
    if (posted_only) {
      out.delivered = static_cast<std::uint32_t>(ready_.size());
      bump(m_.host_completions, ready_.size());
      deliver_batch(now);
    } else {
      wake_->wake_urgent();
    }
  }
  end_borrowed_thread();
  borrowed_ = false;
  // Published inside the pass, so that a plan the reactor makes next sees it: a window the host
  // will not look at in time is told to it (plan_hosted).
  const std::int64_t margin = host.timer_margin_ns.load(std::memory_order_relaxed);
  host.looks_at_ns.store(out.spin                               ? ns_of(now)
                         : out.next_look_ns == poll_host::never ? poll_host::never
                                                                : out.next_look_ns - margin,
                         std::memory_order_relaxed);
  out.what = poll_result::outcome::swept;
  end_pass();
  return out;
}

void reactor_core::sweep_for_host(poll_host& host, clock::time_point now, poll_result& out) {
  for (stream_state* st : active_) {
    if (host_of(*st) != &host || now < st->host_look || device_fault_[st->device]) continue;
    look_at(*st, now, /*may_probe=*/false);  // probes and faults stay the reactor thread's
  }
  drop_idle_streams();
  for (stream_state* st : active_) {
    if (host_of(*st) != &host) continue;
    if (st->plan_stale || st->plan_wake <= now || st->host_look <= now) plan_stream(*st, now);
    if (st->host_look == clock::time_point::max()) continue;
    if (st->host_spin && st->host_look <= now) {
      out.spin = true;
      ++out.spinning_streams;
    } else {
      out.next_look_ns = std::min(out.next_look_ns, ns_of(std::max(st->host_look, now)));
    }
  }
}

bool reactor_core::plan_hosted(stream_state& st, poll_host& host, const stream_outlook& o,
                               clock::time_point now, clock::time_point& reactor_wake) {
  using phase = stream_outlook::phase;
  st.host_look = clock::time_point::max();
  st.host_spin = false;
  if (o.unpredicted()) return false;  // learning or missed: the reactor's own policy (doorbells)
  const std::uint64_t seq = st.entries.front().seq;
  // The reactor looks itself this long after the window closed: a safety net for a host that is
  // late, busy in a handler, or gone quiet (it then finds the wait and posts it as usual). Not
  // sooner: the reactor wakes for it once per hosted wait (a host finds it long before), and with
  // 200 us work 100 us after the window cost about 3 % of a core in wake-ups (H100).
  const nanoseconds grace =
      std::max<nanoseconds>(std::chrono::milliseconds(1), 2 * idle_settings_.poll_period);
  if (host.host_role() == poll_host::role::woken) {
    // The reactor finds the completion as usual; the host's thread must be awake when it does.
    if (st.host_told_seq != seq) {
      const clock::time_point wake_at =
          o.window_open - nanoseconds(host.lead_ns.load(std::memory_order_relaxed));
      if (now >= wake_at) {
        st.host_told_seq = seq;
        host.wake_until(ns_of(o.window_close + grace));
      } else {
        reactor_wake = wake_at;
      }
    }
    return false;
  }
  // role polls: the host looks through the window, the reactor only after it.
  switch (o.where) {
    case phase::before_window:
      st.host_look = o.window_open;
      st.host_spin = o.steady;
      break;
    case phase::window_spin:
      st.host_look = now;
      st.host_spin = true;
      break;
    default:  // window_poll: irregular work, looked at on the host's own tick
      st.host_look = o.next_look;
      break;
  }
  const clock::time_point safety = o.window_close + grace;
  skip_until(st, safety);
  st.on_poll_tick = false;
  st.plan_spin = false;
  st.plan_wake = safety;
  if (st.host_told_seq != seq) {
    st.host_told_seq = seq;
    const std::int64_t first = ns_of(st.host_look);
    if (host.looks_at_ns.load(std::memory_order_relaxed) > first) host.look_by(first);
  }
  return true;
}

std::error_code reactor_core::select_device(int device) noexcept {
  if (device < 0) return {};
  if (!borrowed_) {
    if (device == current_device_) return {};
    if (auto ec = backend_.set_current_device(device)) return ec;
    current_device_ = device;
    return {};
  }
  // A host's pass: the thread is the user's. The first driver call of the pass switches it to the
  // relaxed capture mode (as the reactor thread is) and notes its device; the pass's end puts
  // both back (end_borrowed_thread). Passes that only read fence words change nothing.
  if (device == borrowed_device_) return {};
  if (!borrowed_changed_) {
    borrowed_changed_ = true;
    borrowed_capture_mode_ = backend_.begin_borrowed_polling();
    int own = -1;
    if (backend_.current_device(own)) own = -1;
    borrowed_saved_device_ = borrowed_device_ = own;
    if (device == own) return {};
  }
  if (auto ec = backend_.set_current_device(device)) return ec;
  borrowed_device_ = device;
  return {};
}

void reactor_core::end_borrowed_thread() noexcept {
  if (borrowed_changed_) {
    if (borrowed_saved_device_ >= 0 && borrowed_device_ != borrowed_saved_device_)
      (void)backend_.set_current_device(borrowed_saved_device_);
    backend_.end_borrowed_polling(borrowed_capture_mode_);
  }
  borrowed_changed_ = false;
  borrowed_device_ = borrowed_saved_device_ = -1;
}

poll_result poll_here(reactor_core& core, poll_host& host) noexcept { return core.poll_here(host); }

}  // namespace evr::detail
