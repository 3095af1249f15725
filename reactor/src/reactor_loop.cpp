// reactor/src/reactor_loop.cpp — the reactor thread's loop: take inputs (cancellations, then
// submissions), sweep, deliver one batch, then idle. Also acceptance into the timelines,
// cancellation handling and batched delivery. Everything here runs on the reactor thread.
#include <algorithm>
#include <cstdio>

#if defined(__linux__)
#include <pthread.h>
#include <sys/prctl.h>
#include <time.h>
#endif

#include "reactor_core.hpp"

namespace evr::detail {

void reactor_core::run(std::shared_ptr<reactor_core> self) {
#if defined(__linux__)
  // A nap must end when asked, not 50 us later: Linux adds 50 us of timer slack to every sleep
  // of a normal thread by default. 1 ns is the least it takes (0 would mean "the default").
  (void)prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  // Named for top, perf and /proc (at most 15 characters).
  (void)pthread_setname_np(pthread_self(), "evr-reactor");
  clockid_t cid;
  if (pthread_getcpuclockid(pthread_self(), &cid) == 0) {
    cpu_clock_id_ = static_cast<std::uint64_t>(cid);
    cpu_clock_valid_.store(true, std::memory_order_release);
  }
#endif
  thread_id_.store(std::this_thread::get_id(), std::memory_order_release);
  backend_.prepare_polling_thread();  // relaxed capture mode: never invalidate a user's capture
  ladder_.progress(clock::now());
  for (;;) {
    enter_pass();  // given up only while the thread sleeps (nap_until, park)
    clock::time_point now = clock::now();
    if (!closed_ && stopping_.load(std::memory_order_acquire)) {
      // Refuse further submissions (the sentinel makes a racing push fail) and keep what came.
      for (wait_op* op = submissions_.close(); op != nullptr;) {
        wait_op* next = op->next_;
        accept(op, now);
        op = next;
      }
      closed_ = true;
      drain_deadline_ = now + options_.shutdown_drain;
    }
    const bool took_new = take_inputs(now);
    bool progress = take_reported_faults();  // retired or cancelled: what the idle policy counts
    // A fresh time for the sweep: waits taken above may have been submitted after `now`, and the
    // idle policy's samples compare the sweep's time with their submission.
    now = clock::now();
    if (!active_.empty() || !loose_.empty()) progress |= sweep(now);
    const bool delivering = !ready_.empty();
    progress |= delivering;
    deliver_batch(now);
    // The reactor's own work per completion (metrics().busy_time): the passes that delivered
    // something, from before their sweep to after their delivery. One clock read, only then.
    if (delivering) bump(m_.busy_ns, static_cast<std::uint64_t>((clock::now() - now).count()));
    if (closed_) {
      if (pending_ops_ == 0 && awaiting_cancel_ == 0 && active_.empty()) break;
      if (clock::now() >= drain_deadline_) {
        abort_everything();
        deliver_batch(clock::now());
        // Waits retired while their cancel request is in flight: the canceller pushes right
        // after its CAS, so this ends promptly.
        while (awaiting_cancel_ > 0) {
          take_inputs(clock::now());
          deliver_batch(clock::now());
          if (awaiting_cancel_ > 0) std::this_thread::yield();
        }
        break;
      }
    }
    idle(now, progress, took_new);
  }
  // Every wait has completed: later detach_group calls find nothing to detach.
  close_detach_requests();
  leave_pass();
  thread_id_.store(std::thread::id{}, std::memory_order_release);
  (void)self;  // dropping the last reference (self-stop case) frees the core on this thread
}

bool reactor_core::has_inputs() const noexcept {
  if (!submissions_.empty_or_closed() || !cancels_.empty_or_closed()) return true;
  if (owner_cancel_pending_.load(std::memory_order_seq_cst)) return true;
  if (detach_pending_.load(std::memory_order_seq_cst)) return true;
  if (fault_reported_.load(std::memory_order_seq_cst)) return true;
  if (stopping_.load(std::memory_order_seq_cst) && !closed_) return true;
  for (stream_state* st : active_)
    if (st->doorbell_rang.load(std::memory_order_seq_cst)) return true;
  if (traits_.host_func_markers) {
    for (stream_state* st : active_)
      if (st->host_done.load(std::memory_order_seq_cst) > st->completed_seq) return true;
  }
  return false;
}

bool reactor_core::take_inputs(clock::time_point now) {
  // Order matters: controls first, then submissions. A cancel is pushed after its wait was
  // submitted, so once we have seen the cancel, taking submissions afterwards includes the wait.
  wait_op* cancels = cancels_.take_all();
  std::vector<std::uintptr_t> owners;
  if (owner_cancel_pending_.load(std::memory_order_relaxed) &&
      owner_cancel_pending_.exchange(false, std::memory_order_acq_rel)) {
    std::lock_guard<std::mutex> lock(owner_cancel_mutex_);
    owners.swap(owner_cancels_);
  }
  bool any = accept_submissions(now);
  any = any || cancels != nullptr || !owners.empty();
  for (wait_op* op = cancels; op != nullptr;) {
    wait_op* next = op->cancel_next_;
    handle_cancel(op);
    op = next;
  }
  for (std::uintptr_t owner : owners) handle_owner_cancel(owner);
  // After cancellations: a group's waits whose cancel arrived above are in ready_ now, and
  // detach_collect takes them from there.
  take_detach_requests();
  return any;
}

bool reactor_core::accept_submissions(clock::time_point now) {
  wait_op* subs = closed_ ? nullptr : submissions_.take_all();
  for (wait_op* op = subs; op != nullptr;) {
    wait_op* next = op->next_;
    accept(op, now);
    op = next;
  }
  return subs != nullptr;
}

void reactor_core::accept(wait_op* op, clock::time_point now) {
  bump(m_.submitted);
  ++pending_ops_;
  op->phase_ = wait_op::phase::pending;
  if (op->device_ >= 0 && device_fault_[op->device_]) {
    // The device is dead: nothing will ever complete there. Its event is kept out of the pool
    // and destroyed with the reactor, off this thread (cudaEventDestroy may block).
    if (op->stream_ != nullptr && op->event_ != nullptr)
      abandoned_.emplace_back(op->stream_->marker_pool.load(std::memory_order_relaxed), op->event_);
    retire_op(op, device_fault_[op->device_]);
    return;
  }
  stream_state* st = op->stream_;
  if (st == nullptr) {
    if (loose_.empty()) loose_since_ = now;
    loose_.push_back(op);
    return;
  }
  st->entries.insert(timeline_entry{op->seq_, op->event_, op});
  st->plan_stale = true;
  if (!st->active) {
    st->active = true;
    st->waiting_since = now;
    st->last_probe = now;
    st->doorbell_armed = false;
    st->missed = false;
    // Its work cannot have finished before its marker was enqueued, during submission.
    st->last_look = op->submitted_at_;
    active_.push_back(st);
  }
}

void reactor_core::handle_cancel(wait_op* op) {
  switch (op->phase_) {
    case wait_op::phase::pending: {
      if (stream_state* st = op->stream_) {
        // Leave a ghost entry: the marker stays until the GPU is past it.
        std::size_t i = st->entries.find(op->seq_);
        if (i < st->entries.size()) st->entries.at(i).op = nullptr;
      } else {
        auto it = std::find(loose_.begin(), loose_.end(), op);
        if (it != loose_.end()) {
          *it = loose_.back();
          loose_.pop_back();
        }
      }
      op->state_.store(wait_op::done, std::memory_order_release);
      --pending_ops_;
      ready_.emplace_back(op, aborted_error());
      break;
    }
    case wait_op::phase::retired_awaiting_cancel:
      --awaiting_cancel_;
      if (detach_claims(op)) break;  // its context is shutting down: handed back, not delivered
      ready_.emplace_back(op, aborted_error());
      break;
    case wait_op::phase::queued:
      // Cannot happen: take_inputs accepts submissions before handling cancels, and a cancel is
      // only pushed for a submitted wait. Complete it anyway rather than lose it.
      std::fprintf(stderr, "evr: internal: cancel of a wait the reactor has not seen\n");
      ready_.emplace_back(op, aborted_error());
      break;
  }
}

template <class Take>
void reactor_core::take_pending_if(Take&& take) {
  for (stream_state* st : active_) {
    for (std::size_t i = 0; i < st->entries.size(); ++i) {
      timeline_entry& e = st->entries.at(i);
      if (e.op != nullptr && take(e.op)) e.op = nullptr;  // a ghost: the marker stays
    }
  }
  for (std::size_t i = 0; i < loose_.size();) {
    if (take(loose_[i])) {
      loose_[i] = loose_.back();
      loose_.pop_back();
    } else {
      ++i;
    }
  }
}

void reactor_core::handle_owner_cancel(std::uintptr_t owner) {
  take_pending_if([&](wait_op* op) {
    if (op->owner_ != owner) return false;
    retire_op(op, aborted_error());  // a per-operation cancel in flight delivers it instead
    return true;
  });
}

// --- detaching an execution context's waits ---------------------------------------------------

void reactor_core::take_detach_requests() {
  if (detach_pending_.load(std::memory_order_relaxed) &&
      detach_pending_.exchange(false, std::memory_order_acq_rel)) {
    std::vector<detach_request*> requests;
    {
      std::lock_guard<std::mutex> lock(detach_mutex_);
      requests.swap(detach_queue_);
    }
    // Waits submitted before a request was made may still be on the submission stack (pushed
    // after this pass took it): take them now, or they would escape the detach and later be
    // posted into the dead context. The request's mutex (release by the requester, acquire
    // above) orders its earlier submissions' pushes before this take.
    accept_submissions(clock::now());
    for (detach_request* req : requests) {
      detach_collect(*req);
      detaching_.push_back(req);
    }
  }
  // A wait retired while its cancel request is in flight sits in no list (only counted in
  // awaiting_cancel_) until the request arrives; it may belong to a detaching group. So answer
  // once no cancel is in flight: meanwhile handle_cancel hands such waits back (detach_claims).
  // Cancellers push right after their CAS, so this is prompt.
  if (!detaching_.empty() && awaiting_cancel_ == 0) {
    for (detach_request* req : detaching_) finish_detach(*req);
    detaching_.clear();
  }
}

void reactor_core::detach_collect(detach_request& req) {
  take_pending_if([&](wait_op* op) {
    if (op->group_ != req.group) return false;
    op->detached_ = true;
    // A wait whose canceller still holds it is handed back when its request arrives.
    if (settle(op)) req.detached.push_back(op);
    return true;
  });
  // Retired but not delivered yet (a batch is under way only when this runs from an inline
  // handler: entries are nulled, never erased, so deliver_batch's loop stays valid).
  for (auto& [op, ec] : ready_) {
    if (op != nullptr && op->group_ == req.group) {
      op->detached_ = true;
      req.detached.push_back(op);
      op = nullptr;
    }
  }
}

bool reactor_core::detach_claims(wait_op* op) {
  if (op->group_ == 0) return false;
  for (detach_request* req : detaching_) {
    if (req->group != op->group_) continue;
    op->detached_ = true;
    req->detached.push_back(op);
    return true;
  }
  return false;
}

void reactor_core::finish_detach(detach_request& req) noexcept {
  // Counted before the requester is answered: its thread sees in_flight without them.
  bump(m_.detached, req.detached.size());
  {
    std::lock_guard<std::mutex> lock(detach_mutex_);
    req.done = true;  // the requester may return (and free `req`) from here on
  }
  detach_cv_.notify_all();
}

void reactor_core::close_detach_requests() noexcept {
  // No wait is left: every queued or unanswered request has nothing (more) to detach.
  for (detach_request* req : detaching_) finish_detach(*req);
  detaching_.clear();
  {
    std::lock_guard<std::mutex> lock(detach_mutex_);
    detach_closed_ = true;
    for (detach_request* req : detach_queue_) req->done = true;
    detach_queue_.clear();
  }
  detach_cv_.notify_all();
}

std::vector<wait_op*> reactor_core::detach_here(std::uintptr_t group) {
  // On the reactor thread, inside an inline handler (the loop is below us): collect in place,
  // then take the cancel stack here until no cancel request is in flight; handle_cancel hands
  // this group's waits back (detach_claims) and treats the others as the loop would (appending
  // to ready_ is safe: deliver_batch indexes it).
  detach_request req;
  req.group = group;
  accept_submissions(clock::now());  // waits submitted from this handler, not yet taken
  detach_collect(req);
  detaching_.push_back(&req);
  while (awaiting_cancel_ > 0) {
    for (wait_op* op = cancels_.take_all(); op != nullptr;) {
      wait_op* next = op->cancel_next_;
      handle_cancel(op);
      op = next;
    }
    if (awaiting_cancel_ > 0) std::this_thread::yield();
  }
  detaching_.erase(std::find(detaching_.begin(), detaching_.end(), &req));
  bump(m_.detached, req.detached.size());
  return std::move(req.detached);
}

std::vector<wait_op*> reactor_core::detach_group(std::uintptr_t group) {
  if (on_reactor_thread()) return detach_here(group);
  detach_request req;
  req.group = group;
  {
    std::lock_guard<std::mutex> lock(detach_mutex_);
    if (detach_closed_) return {};  // the thread has ended: every wait has completed
    detach_queue_.push_back(&req);
  }
  detach_pending_.store(true, std::memory_order_seq_cst);  // seq_cst: the wake handshake
  wake_->wake_urgent();
  std::unique_lock<std::mutex> lock(detach_mutex_);
  detach_cv_.wait(lock, [&] { return req.done; });
  return std::move(req.detached);
}

namespace {
/// The reactor whose batch this thread is delivering, while it runs a posted completion (null
/// otherwise: outside deliver_batch, and while an inline completion runs user code).
thread_local reactor_core* delivering_core = nullptr;

/// Marks this thread as delivering `core`'s batch for the duration of one posted completion.
class delivering_scope {
 public:
  explicit delivering_scope(reactor_core* core) noexcept { delivering_core = core; }
  ~delivering_scope() { delivering_core = nullptr; }
  delivering_scope(const delivering_scope&) = delete;
  delivering_scope& operator=(const delivering_scope&) = delete;
};
}  // namespace

bool hold_until_batch_end(deferred_posts& d) noexcept {
  reactor_core* core = delivering_core;
  return core != nullptr && core->hold_posts(d);
}

bool reactor_core::hold_posts(deferred_posts& d) noexcept {
  for (std::size_t i = 0; i < held_posts_count_; ++i) {
    if (held_posts_[i] == &d) return true;
  }
  if (held_posts_count_ == held_posts_.size()) return false;
  held_posts_[held_posts_count_++] = &d;
  return true;
}

void reactor_core::flush_held_posts() noexcept {
  for (std::size_t i = 0; i < held_posts_count_; ++i) held_posts_[i]->flush();
  held_posts_count_ = 0;
}

void reactor_core::deliver_batch(clock::time_point detected) {
  if (ready_.empty()) {
    release_events();
    return;
  }
  // Inline handlers may call submit/cancel/stop: those only push onto the stacks. Destroying an
  // execution context there (detach_here) nulls entries and may append to ready_: the loop
  // indexes ready_ and re-reads its size, so it stays valid. clear() keeps the capacity (no
  // allocation in steady state).
  // Posted completions may be held back by their front end (deferred_posts.hpp) and posted
  // together: before an inline completion runs user code, and at the end of the batch.
  const clock::time_point now = clock::now();
  for (std::size_t i = 0; i < ready_.size(); ++i) {
    auto [op, ec] = ready_[i];
    if (op == nullptr) continue;  // detached from an inline handler (detach_here)
    // Delivered entries are nulled: an inline handler's detach_here scans ready_ and must not
    // touch operations already freed by their completion (this one included).
    ready_[i].first = nullptr;
    if (!ec) {
      bump(m_.completed);
    } else if (ec == aborted_error()) {
      bump(m_.cancelled);
    } else {
      bump(m_.failed);
    }
    add_sample(m_.detect_to_deliver, now - detected);
    add_sample(m_.submit_to_deliver, now - op->submitted_at_);
    if (op->how_ == delivery::inline_on_reactor) {
      flush_held_posts();
      op->complete(ec);  // frees op; runs the user's handler here
    } else {
      delivering_scope scope(this);
      op->complete(ec);  // frees op, or hands it to a post (held back or not)
    }
  }
  flush_held_posts();
  ready_.clear();
  release_events();
}

void reactor_core::release_events() {
  for (auto& [pool, ev] : to_release_) pool->release_native(ev);
  to_release_.clear();
}

}  // namespace evr::detail
