// reactor/src/reactor_submit.cpp — the submitting threads' side of the reactor: find (or create)
// the stream's state, put a marker on the stream, push the operation onto the lock-free
// submission stack and wake the reactor when it must be; cancellation requests and faults that
// submitters meet. Everything here runs on any thread.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>

#include "reactor_core.hpp"

namespace evr::detail {
namespace {

constexpr std::uintptr_t per_thread_stream = 0x2;  // cudaStreamPerThread
constexpr std::uintptr_t legacy_stream = 0x1;      // cudaStreamLegacy

bool is_legacy_default(device::native_stream s) {
  return s == nullptr || reinterpret_cast<std::uintptr_t>(s) == legacy_stream;
}

}  // namespace

std::error_code reactor_core::find_stream(const wait_target& target, stream_state*& out) noexcept {
  const int key_device = [&] {
    if (!is_legacy_default(target.native_)) return -1;
    int d = 0;
    return backend_.current_device(d) ? 0 : d;
  }();
  if (stream_state* s = streams_.find(target.native_, key_device)) {
    out = s;
    return {};
  }
  // First wait on this stream: build its state here, on the submitting thread.
  auto fresh = std::make_unique<stream_state>();
  fresh->native = target.native_;
  fresh->key_device = key_device;
  fresh->wake = wake_;
  if (key_device >= 0) {
    fresh->device = key_device;
  } else if (auto ec = backend_.stream_device(target.native_, fresh->device)) {
    return ec;
  }
  if (fresh->device < 0 || fresh->device >= max_devices) return make_error_code(errc::no_device);
  if (traits_.fence_markers) {
    if (auto ec = fences_.allocate(fresh->device, fresh->fence_host, fresh->fence_device))
      return ec;
  }
  stream_state* in_table = streams_.insert(fresh.get());
  if (in_table == nullptr) return make_error_code(errc::stream_table_full);
  if (in_table == fresh.get()) fresh.release();
  // else another thread inserted the same stream first; ours is dropped (its fence word stays
  // allocated and unused: at most one word per such race).
  out = in_table;
  return {};
}

std::error_code reactor_core::put_marker(stream_state& st, wait_op& op) noexcept {
  // The marker of strategy::poll is a pooled event: take it before the lock (taking may create a
  // batch of events on this thread).
  event_pool* pool = nullptr;
  device::native_event ev = nullptr;
  const bool fences = traits_.fence_markers;
  // Record an event instead of a fence write (reactor_options::max_pending_fences,
  // max_fence_streams): when too many fence markers are queued on this device (the enqueue would
  // block in the driver), or when more streams of the device are busy (markers pending, this one
  // included) than it has hardware queues. A fence write holds the hardware queue it is in until
  // the work before it on its stream is done; with more busy streams than queues, streams share
  // queues, and one stream's fence would hold up the unrelated work of the others (measured on
  // the H100 with 64 streams of irregular work: milliseconds at p99 with fences, tens of us with
  // events).
  bool overflow = false;
  if (fences) {
    const std::int64_t busy = busy_streams_[st.device].load(std::memory_order_relaxed) +
                              (st.pending_markers.load(std::memory_order_relaxed) == 0 ? 1 : 0);
    overflow = pending_fences_[st.device].load(std::memory_order_relaxed) >=
                   static_cast<std::int64_t>(options_.max_pending_fences) ||
               busy > fence_stream_limit_;
  }
  if (traits_.event_markers || overflow) {
    std::error_code ec;
    pool = pools_.get(st.device, event_class::plain, ec);
    if (ec) return ec;
    if (st.marker_pool.load(std::memory_order_relaxed) == nullptr)
      st.marker_pool.store(pool, std::memory_order_relaxed);
    ev = pool->acquire_native(ec);
    if (ec) return ec;
  }
  std::error_code ec;
  st.lock_markers();
  const std::uint64_t seq = ++st.next_seq_;
  if (ev != nullptr) {
    ec = backend_.record_event(ev, st.native);  // poll, or a fence overflow
    if (!ec && fences) marker_enqueued(st, false);
  } else if (fences) {
    ec = backend_.write_fence(st.native, st.fence_device, seq);
    if (!ec) marker_enqueued(st, true);
  } else {  // host_func
    st.host_funcs_outstanding.fetch_add(1, std::memory_order_relaxed);
    ec = backend_.launch_host_func(st.native, &reactor_core::host_func_done, &st);
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

std::error_code reactor_core::submit(wait_op* op, const wait_target& target,
                                     host_window* window) noexcept {
  auto refuse = [this](std::error_code ec) {
    m_.rejected.fetch_add(1, std::memory_order_relaxed);
    return ec;
  };
  if (op == nullptr) return refuse(make_error_code(errc::invalid_argument));
  if (stopping_.load(std::memory_order_acquire))
    return refuse(make_error_code(errc::reactor_stopped));
  if (target.backend_ == nullptr) return refuse(make_error_code(errc::empty_handle));
  if (target.backend_ != &backend_) return refuse(make_error_code(errc::backend_mismatch));
  if (backend_.in_host_func()) return refuse(make_error_code(errc::called_from_host_func));
  op->state_.store(wait_op::pending, std::memory_order_relaxed);
  op->phase_ = wait_op::phase::queued;
  op->submitted_at_ = clock::now();
  op->stream_ = nullptr;
  op->event_ = nullptr;

  if (target.what_ == wait_target::kind::event) {
    if (target.never_recorded_) return refuse(make_error_code(errc::event_never_recorded));
    if (target.native_ == nullptr) return refuse(make_error_code(errc::empty_handle));
    int device = target.device_;
    if (device < 0 && backend_.current_device(device)) device = 0;
    if (device >= max_devices) return refuse(make_error_code(errc::no_device));
    op->event_ = target.native_;
    op->device_ = static_cast<std::int16_t>(device);
  } else {
    if (reinterpret_cast<std::uintptr_t>(target.native_) == per_thread_stream) {
      return refuse(make_error_code(errc::per_thread_default_stream));
    }
    stream_state* st = nullptr;
    std::error_code ec = find_stream(target, st);
    if (!ec) ec = put_marker(*st, *op);
    if (ec) {
      if (is_sticky(ec)) {
        // The device is dead: fail its pending waits too. Where the stream's device is unknown
        // (its very first wait), the calling thread's current device is the best guess: a sticky
        // error is reported by the calls made in that device's context.
        int device = st != nullptr ? st->device : -1;
        if (device < 0 && backend_.current_device(device)) device = -1;
        if (device < 0 && device_count_ == 1) device = 0;  // the only one it can be
        report_fault(device, ec);
      }
      return refuse(ec);
    }
  }

  using stack = intrusive_stack<wait_op, &wait_op::next_>;
  // Read before the push: from then on the reactor may complete and free `op` at any moment.
  stream_state* const st = op->stream_;
  const std::uint64_t seq = op->seq_;
  if (window != nullptr) {
    // A host arms its timer from this (poll_host.hpp): the wait's work starts now when nothing
    // of its stream is pending before it; otherwise the reactor tells the host once it knows.
    // Only for a fence-word marker (reactor_core::host_of says why).
    const std::int64_t open = st != nullptr && op->event_ == nullptr
                                  ? st->published_open_ns.load(std::memory_order_relaxed)
                                  : 0;
    if (open > 0 && seq == st->published_completed_seq.load(std::memory_order_relaxed) + 1)
      window->open_ns = op->submitted_at_.time_since_epoch().count() + open;
  }
  const stack::push_result pushed = submissions_.push(op);
  if (pushed != stack::push_result::closed) {
    // A parked reactor is woken by the push that makes the stack non-empty. A napping one only
    // when this wait could be done before it looks again: a wait queued behind pending waits of
    // its stream cannot finish before them, and the stream's model says how soon its work can
    // end (wakeup.hpp). Only the predictive policy plans its naps; under the ladder a napping
    // reactor picks the wait up when its nap ends, and host_func's host function wakes it.
    wake_->wake_for_submission(pushed == stack::push_result::pushed_to_empty, [&] {
      if (options_.idle != idle_mode::predictive || traits_.woken_by_host_funcs)
        return std::numeric_limits<std::int64_t>::max();
      const std::int64_t now = clock::now().time_since_epoch().count();
      if (st == nullptr) return now;  // a user's event: nothing is known of it
      if (seq > st->published_completed_seq.load(std::memory_order_relaxed) + 1)
        return std::numeric_limits<std::int64_t>::max();  // behind pending waits of its stream
      return now + st->published_low_ns.load(std::memory_order_relaxed);
    });
    return {};
  }
  // The reactor closed between our check and the push. The marker is on the stream: its event
  // must not be reused before the GPU passes it, so destroy it (CUDA defers the free).
  if (st != nullptr && op->event_ != nullptr)
    st->marker_pool.load(std::memory_order_relaxed)->discard_native(op->event_);
  return refuse(make_error_code(errc::reactor_stopped));
}

void reactor_core::report_fault(int device, std::error_code ec) noexcept {
  if (device < 0 || device >= max_devices) return;
  int expected = 0;
  reported_fault_[device].compare_exchange_strong(expected, ec.value(), std::memory_order_relaxed);
  fault_reported_.store(true, std::memory_order_seq_cst);  // seq_cst: part of the wake handshake
  wake_->wake_urgent();
}

bool reactor_core::take_reported_faults() {
  if (!fault_reported_.load(std::memory_order_relaxed) ||
      !fault_reported_.exchange(false, std::memory_order_acq_rel))
    return false;
  bool any = false;
  for (int d = 0; d < max_devices; ++d) {
    const int v = reported_fault_[d].load(std::memory_order_relaxed);
    if (v != 0 && !device_fault_[d]) {
      fail_device(d, make_cuda_error(v));
      any = true;
    }
  }
  return any;
}

void reactor_core::host_func_done(void* state) noexcept {
  auto* st = static_cast<stream_state*>(state);
  // Copied first: once host_funcs_outstanding drops, a reactor being destroyed may delete `st`.
  std::shared_ptr<wakeup> wake = st->wake;
  // release: the GPU's progress up to this host function is published with the count.
  st->host_done.fetch_add(1, std::memory_order_release);
  st->host_funcs_outstanding.fetch_sub(1, std::memory_order_release);  // last touch of `st`
  wake->wake_urgent();
}

void reactor_core::doorbell_rang(void* state) noexcept {
  auto* st = static_cast<stream_state*>(state);
  std::shared_ptr<wakeup> wake = st->wake;                   // as in host_func_done
  st->doorbell_rang.store(true, std::memory_order_seq_cst);  // seq_cst: part of the wake handshake
  st->host_funcs_outstanding.fetch_sub(1, std::memory_order_release);  // last touch of `st`
  wake->wake_urgent();
}

bool reactor_core::request_cancel(wait_op* op) noexcept {
  std::uint8_t expected = wait_op::pending;
  // acq_rel: exactly one of {this CAS, the reactor's exchange to done} wins.
  return op->state_.compare_exchange_strong(expected, wait_op::cancel_requested,
                                            std::memory_order_acq_rel, std::memory_order_acquire);
  // false: already completed or already being cancelled: cancelling twice is harmless.
}

void reactor_core::push_cancel(wait_op* op) noexcept {
  // The caller won request_cancel: the reactor will not free `op` until it has seen this request.
  if (cancels_.push(op) ==
      intrusive_stack<wait_op, &wait_op::cancel_next_>::push_result::pushed_to_empty)
    wake_->wake_urgent();
}

bool reactor_core::cancel(wait_op* op) noexcept {
  if (!request_cancel(op)) return false;
  push_cancel(op);
  return true;
}

void reactor_core::cancel_owner(std::uintptr_t owner) noexcept {
  try {
    std::lock_guard<std::mutex> lock(owner_cancel_mutex_);
    owner_cancels_.push_back(owner);
  } catch (...) {
    return;  // out of memory: nothing was cancelled, every wait still completes normally
  }
  owner_cancel_pending_.store(true, std::memory_order_seq_cst);
  wake_->wake_urgent();
}

}  // namespace evr::detail
