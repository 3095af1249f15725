// reactor/src/wait_registry.cpp — see wait_registry.hpp.
#include "wait_registry.hpp"

#include <algorithm>

#include <evr/pool/event_pool.hpp>

namespace evr::detail {

wait_registry::wait_registry(const strategy_traits& traits, delivery_batch& batch,
                             marker_budget& markers, reactor_counters& counters)
    : traits_(traits), batch_(batch), markers_(markers), counters_(counters) {
  to_release_.reserve(256);
  active_.reserve(64);
}

wait_registry::accepted wait_registry::accept(wait_op* op, clock::time_point now) {
  bump(counters_.submitted);
  ++pending_ops_;
  op->phase_ = wait_op::phase::pending;
  if (op->device_ >= 0 && device_fault_[op->device_]) {
    // The device is dead: nothing will ever complete there. Its event is kept out of the pool
    // and destroyed with the reactor, off this thread (cudaEventDestroy may block).
    if (op->stream_ != nullptr && op->marker_event() != nullptr)
      abandoned_.emplace_back(op->stream_->marker_pool.load(std::memory_order_relaxed), op->event_);
    retire(op, device_fault_[op->device_]);
    return {};
  }
  stream_state* st = op->stream_;
  if (st == nullptr) {
    if (loose_.empty()) loose_since_ = now;
    loose_.push_back(op);
    return {};
  }
  st->entries.insert(timeline_entry{op->seq_, op->marker_event(), op});
  if (st->active) return {st, false};
  st->active = true;
  st->last_probe = now;
  active_.push_back(st);
  return {st, true};
}

void wait_registry::cancel(wait_op* op) {
  if (stream_state* st = op->stream_) {
    // Leave a ghost entry: the marker stays until the GPU is past it. A device-signalled wait
    // has no marker: it leaves.
    std::size_t i = st->entries.find(op->seq_);
    if (i < st->entries.size()) forget_entry(*st, i);
  } else {
    auto it = std::find(loose_.begin(), loose_.end(), op);
    if (it != loose_.end()) take_loose(static_cast<std::size_t>(it - loose_.begin()));
  }
  op->state_.store(wait_op::done, std::memory_order_release);
  --pending_ops_;
  batch_.add(op, aborted_error());
}

bool wait_registry::settle(wait_op* op) noexcept {
  // acq_rel: the winner of pending→{done, cancel_requested} decides the outcome exactly once.
  std::uint8_t prev = op->state_.exchange(wait_op::done, std::memory_order_acq_rel);
  --pending_ops_;
  if (prev == wait_op::cancel_requested) {
    op->phase_ = wait_op::phase::retired_awaiting_cancel;  // its cancel request delivers it
    ++awaiting_cancel_;
    return false;
  }
  return true;
}

std::int64_t wait_registry::retire_front(stream_state& st, std::size_t count, std::error_code ec) {
  count = std::min(count, st.entries.size());
  if (count > 0) entries_left_ = true;
  std::int64_t fences = 0;
  for (std::size_t i = 0; i < count; ++i) {
    timeline_entry e = st.entries.front();
    st.entries.pop_front();
    if (e.is_fence()) ++fences;
    st.completed_seq = std::max(st.completed_seq, e.seq);
    if (e.op != nullptr && !ec) {
      st.retired_submit = e.op->submitted_at_;  // the newest retired wait: the plan learns it
      st.retired_in_sweep = true;
      st.retired_probed = e.op->probed_;
      st.retired_covered_until = probed_until(*e.op);
    }
    if (e.event != nullptr) {
      // Done: back to the pool after this batch is delivered (not on the latency path). Failed
      // or aborted: never reused; destroyed with the reactor, off this thread.
      (!ec ? to_release_ : abandoned_)
          .emplace_back(st.marker_pool.load(std::memory_order_relaxed), e.event);
    }
    if (e.op != nullptr) retire(e.op, ec);
  }
  // Counters shared with submitters move once per batch, not once per wait.
  if (traits_.fence_markers) markers_.fences_retired(st, static_cast<std::int64_t>(fences));
  st.published_completed_seq.store(st.completed_seq, std::memory_order_relaxed);
  return fences;
}

void wait_registry::fail_device(int device, std::error_code ec) {
  if (device < 0 || device >= pool_set::max_devices) return;
  if (!device_fault_[device]) bump(counters_.device_faults);
  device_fault_[device] = ec;
  for (stream_state* st : active_)
    if (st->device == device) fail_stream(*st, ec);
  remove_loose_if([&](wait_op* op) {
    if (op->device_ != device) return false;
    retire(op, ec);
    return true;
  });
}

void wait_registry::abort_everything() {
  for (stream_state* st : active_) {
    // The GPU may not be past the markers: events stay out of the pools, fence words are kept.
    const std::int64_t fences = retire_front(*st, st->entries.size(), aborted_error());
    if (traits_.fence_markers && fences > 0) aborted_fences_ = true;
    st->active = false;
  }
  active_.clear();
  remove_loose_if([&](wait_op* op) {
    retire(op, aborted_error());
    return true;
  });
}

void wait_registry::release_markers() {
  for (auto& [pool, ev] : to_release_) pool->release_native(ev);
  to_release_.clear();
}

void wait_registry::discard_abandoned() {
  for (auto& [pool, ev] : abandoned_) pool->discard_native(ev);
  abandoned_.clear();
}

}  // namespace evr::detail
