// reactor/src/submitter.cpp — see submitter.hpp.
#include "submitter.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>

#include <evr/pool/event_pool.hpp>

namespace evr::detail {
namespace {

constexpr std::uintptr_t per_thread_stream = 0x2;  // cudaStreamPerThread
constexpr std::uintptr_t legacy_stream = 0x1;      // cudaStreamLegacy

bool is_legacy_default(device::native_stream s) {
  return s == nullptr || reinterpret_cast<std::uintptr_t>(s) == legacy_stream;
}

}  // namespace

submitter::submitter(parts p)
    : p_(std::move(p)), streams_(p_.options.max_streams), fences_(p_.backend) {
  if (p_.backend.device_count(device_count_)) device_count_ = 0;
}

submitter::~submitter() {
  streams_.for_each([](stream_state* st) {
    // A host function still queued would touch the state later (it may never run, after a
    // fault): keep the state for the rest of the process rather than free it under the driver.
    if (st->host_funcs_outstanding.load(std::memory_order_acquire) == 0) {
      delete st;
    } else {
      retain_for_process_lifetime(st);
    }
  });
}

std::error_code submitter::refuse(std::error_code ec) noexcept {
  p_.counters.rejected.fetch_add(1, std::memory_order_relaxed);
  return ec;
}

std::error_code submitter::submit(wait_op* op, const wait_target& target,
                                  host_window* window) noexcept {
  if (op == nullptr) return refuse(make_error_code(errc::invalid_argument));
  if (auto ec = prepare(*op, target)) return refuse(ec);
  return push(*op, window);
}

std::error_code submitter::prepare(wait_op& op, const wait_target& target) noexcept {
  if (p_.inbox.stop_requested()) return make_error_code(errc::reactor_stopped);
  if (target.backend_ == nullptr) return make_error_code(errc::empty_handle);
  if (target.backend_ != &p_.backend) return make_error_code(errc::backend_mismatch);
  if (p_.backend.in_host_func()) return make_error_code(errc::called_from_host_func);
  op.state_.store(wait_op::pending, std::memory_order_relaxed);
  op.phase_ = wait_op::phase::queued;
  op.submitted_at_ = std::chrono::steady_clock::now();
  op.stream_ = nullptr;
  op.event_ = nullptr;
  op.signalled_ = false;
  op.unhurried_ = target.unhurried_;
  op.probed_ = false;
  if (target.probe_ != nullptr) *target.probe_ = {};  // filled only for a word (give_probe)
  switch (target.what_) {
    case wait_target::kind::event: return prepare_event(op, target);
    case wait_target::kind::signal: return prepare_signal(op, target);
    case wait_target::kind::stream: break;
  }
  return prepare_stream(op, target);
}

std::error_code submitter::prepare_signal(wait_op& op, const wait_target& target) noexcept {
  // Signal entries are retired by their words, and by the fence word or the fault probe once the
  // stream is past them: the strategies with fence words and probes.
  if (!p_.traits.fence_markers) return make_error_code(errc::unsupported);
  if (target.signal_word_ == nullptr || target.signal_value_ == 0)
    return make_error_code(errc::empty_handle);
  if (reinterpret_cast<std::uintptr_t>(target.native_) == per_thread_stream)
    return make_error_code(errc::per_thread_default_stream);
  stream_state* st = nullptr;
  if (auto ec = find_stream(target, st)) return ec;
  // No operation on the stream: the kernel signals. The sequence number puts the wait in its
  // stream's order, behind every marker enqueued before it (the kernel was queued before the
  // wait started) and before every later one.
  st->lock_markers();
  const std::uint64_t seq = ++st->next_seq_;
  st->unlock_markers();
  op.seq_ = seq;
  op.device_ = static_cast<std::int16_t>(st->device);
  op.stream_ = st;
  op.signalled_ = true;
  op.event_ = const_cast<std::uint64_t*>(target.signal_word_);  // read only: wait_op::signal_word
  op.signal_value_ = target.signal_value_;
  if (target.probe_ != nullptr) give_probe(*st, op, target);
  return {};
}

std::error_code submitter::prepare_event(wait_op& op, const wait_target& target) noexcept {
  if (target.never_recorded_) return make_error_code(errc::event_never_recorded);
  if (target.native_ == nullptr) return make_error_code(errc::empty_handle);
  int device = target.device_;
  if (device < 0 && p_.backend.current_device(device)) device = 0;
  if (device >= pool_set::max_devices) return make_error_code(errc::no_device);
  op.event_ = target.native_;
  op.device_ = static_cast<std::int16_t>(device);
  return {};
}

std::error_code submitter::prepare_stream(wait_op& op, const wait_target& target) noexcept {
  if (reinterpret_cast<std::uintptr_t>(target.native_) == per_thread_stream)
    return make_error_code(errc::per_thread_default_stream);
  stream_state* st = nullptr;
  std::error_code ec = find_stream(target, st);
  if (!ec) ec = put_marker(*st, op);
  if (!ec && target.probe_ != nullptr) give_probe(*st, op, target);
  if (ec && is_sticky(ec)) {
    // The device is dead: fail its pending waits too. Where the stream's device is unknown (its
    // very first wait), the calling thread's current device is the best guess: a sticky error
    // is reported by the calls made in that device's context.
    int device = st != nullptr ? st->device : -1;
    if (device < 0 && p_.backend.current_device(device)) device = -1;
    if (device < 0 && device_count_ == 1) device = 0;  // the only one it can be
    p_.inbox.report_fault(device, ec);
  }
  return ec;
}

void submitter::give_probe(stream_state& st, wait_op& op, const wait_target& target) noexcept {
  // Only a word is a look the caller can make itself: an event is a driver query, a host
  // function has no word. A signal's word reaches its count when the kernel signals; the fence
  // write of `seq` completes this wait and every one before it.
  const std::int64_t until = target.probe_until_.time_since_epoch().count();
  if (op.signalled_) {
    *target.probe_ = wait_probe{op.signal_word(), op.signal_value_, &st.probe_seen_ns};
    st.signal_covered_until_ns.store(until, std::memory_order_relaxed);
  } else {
    if (!p_.traits.fence_markers || op.event_ != nullptr || st.fence_host == nullptr) return;
    *target.probe_ = wait_probe{st.fence_host, op.seq_, &st.probe_seen_ns};
    op.covered_until_ns_ = until;
  }
  op.probed_ = true;
}

std::error_code submitter::push(wait_op& op, host_window* window) noexcept {
  // Read before the push: from then on the reactor may complete and free `op` at any moment.
  stream_state* const st = op.stream_;
  const std::uint64_t seq = op.seq_;
  std::int64_t open = 0;
  if (window != nullptr) {
    // A host arms its timer from this (poll_host.hpp).
    open = p_.idle.window_open_ns(st, op);
    if (open != 0) window->open_ns = open;
  }
  // Covered: a polling host knows when the wait's window opens; its look then takes the wait and
  // finds it done, and the reactor is only its safety net.
  const poll_host* const host = op.host_;
  const bool covered = open != 0 && host != nullptr && host->host_role() == poll_host::role::polls;
  // Read before the push too: the host lives as long as a wait of its is pending.
  const std::int64_t hosted_deadline = covered ? p_.idle.hosted_deadline_ns(open, *host) : 0;
  // A probed wait's caller looks until its window closes: the reactor need not be woken before.
  const std::int64_t caller_until = probed_until(op).time_since_epoch().count();
  // The reactor's own look at the wait, whoever covers it: its first scout.
  const idle_governor::scout_basis scout_basis = idle_governor::scout_basis::of(op);
  const stack::push_result pushed = submissions_.push(&op);
  if (pushed != stack::push_result::closed) {
    // A parked reactor is woken by the push that makes the stack non-empty; a napping one only
    // when this wait could be done before it looks again (the idle governor's rule), or, for a
    // covered wait, when the reactor would look later than its host's safety net allows; and
    // when it would sleep through the wait's first scout.
    p_.wake->wake_for_submission(pushed == stack::push_result::pushed_to_empty, [&] {
      const std::int64_t scout = p_.idle.first_scout_ns(st, scout_basis);
      if (covered) return std::min(hosted_deadline, scout);
      return std::min(scout, std::max(caller_until, p_.idle.earliest_completion_ns(st, seq)));
    });
    return {};
  }
  // The reactor closed between our check and the push. The marker is on the stream: its event
  // must not be reused before the GPU passes it, so destroy it (CUDA defers the free).
  if (st != nullptr && op.marker_event() != nullptr)
    st->marker_pool.load(std::memory_order_relaxed)->discard_native(op.event_);
  return refuse(make_error_code(errc::reactor_stopped));
}

std::error_code submitter::find_stream(const wait_target& target, stream_state*& out) noexcept {
  const int key_device = [&] {
    if (!is_legacy_default(target.native_)) return -1;
    int d = 0;
    return p_.backend.current_device(d) ? 0 : d;
  }();
  if (stream_state* s = streams_.find(target.native_, key_device)) {
    out = s;
    return {};
  }
  // First wait on this stream: build its state here, on the submitting thread.
  auto fresh = std::make_unique<stream_state>();
  fresh->native = target.native_;
  fresh->key_device = key_device;
  fresh->wake = p_.wake;
  if (key_device >= 0) {
    fresh->device = key_device;
  } else if (auto ec = p_.backend.stream_device(target.native_, fresh->device)) {
    return ec;
  }
  if (fresh->device < 0 || fresh->device >= pool_set::max_devices)
    return make_error_code(errc::no_device);
  if (p_.traits.fence_markers) {
    if (auto ec = fences_.allocate(fresh->device, fresh->fence_host, fresh->fence_device))
      return ec;
  }
  stream_state* in_table = streams_.insert(fresh.get());
  if (in_table == nullptr) return make_error_code(errc::stream_table_full);
  if (in_table == fresh.get()) p_.markers.stream_known(fresh.release()->device);
  // else another thread inserted the same stream first; ours is dropped (its fence word stays
  // allocated and unused: at most one word per such race).
  out = in_table;
  return {};
}

std::error_code submitter::take_event(stream_state& st, event_pool*& pool,
                                      device::native_event& ev) noexcept {
  std::error_code ec;
  pool = p_.pools.get(st.device, event_class::plain, ec);
  if (ec) return ec;
  if (st.marker_pool.load(std::memory_order_relaxed) == nullptr)
    st.marker_pool.store(pool, std::memory_order_relaxed);
  ev = pool->acquire_native(ec);
  return ec;
}

std::error_code submitter::put_marker(stream_state& st, wait_op& op) noexcept {
  // An event marker (poll; fence strategies past their budget: marker_budget) is taken before the
  // lock: taking may create a batch of events on this thread.
  const bool fences = p_.traits.fence_markers;
  const fence_marker kind = fences ? p_.markers.choose(st) : fence_marker::event;
  event_pool* pool = nullptr;
  device::native_event ev = nullptr;
  if (p_.traits.event_markers || (fences && kind == fence_marker::event)) {
    if (auto ec = take_event(st, pool, ev)) return ec;
  }
  std::error_code ec;
  st.lock_markers();
  const std::uint64_t seq = ++st.next_seq_;
  if (ev != nullptr) {
    ec = p_.backend.record_event(ev, st.native);
  } else if (fences) {
    ec = kind == fence_marker::kernel
             ? p_.backend.write_fence_by_kernel(st.device, st.native, st.fence_device, seq)
             : p_.backend.write_fence(st.native, st.fence_device, seq);
    if (!ec) p_.markers.fence_enqueued(st);
  } else {  // host_func
    st.host_funcs_outstanding.fetch_add(1, std::memory_order_relaxed);
    ec = p_.backend.launch_host_func(st.native, &submitter::host_func_done, &st);
    if (ec) st.host_funcs_outstanding.fetch_sub(1, std::memory_order_relaxed);
  }
  if (ec) --st.next_seq_;  // no marker went on the stream: keep sequence numbers contiguous
  st.unlock_markers();
  if (ec) {
    if (pool != nullptr) pool->release_native(ev);  // never recorded: safe to reuse
    return ec;
  }
  op.seq_ = seq;
  op.event_ = ev;
  op.device_ = static_cast<std::int16_t>(st.device);  // < max_devices (find_stream checked)
  op.stream_ = &st;
  return {};
}

void submitter::host_func_done(void* state) noexcept {
  auto* st = static_cast<stream_state*>(state);
  // Copied first: once host_funcs_outstanding drops, a reactor being destroyed may delete `st`.
  std::shared_ptr<wakeup> wake = st->wake;
  // release: the GPU's progress up to this host function is published with the count.
  st->host_done.fetch_add(1, std::memory_order_release);
  st->host_funcs_outstanding.fetch_sub(1, std::memory_order_release);  // last touch of `st`
  wake->wake_urgent();
}

}  // namespace evr::detail
