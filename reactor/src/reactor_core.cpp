// reactor/src/reactor_core.cpp — the core's life cycle (construction, thread start, stop,
// destruction) and the reactor thread's loop: each pass takes the inputs (cancellations, then
// submissions, then context detaches), the faults submitters met, sweeps, delivers one batch and
// rests as the idle governor says.
#include "reactor_core.hpp"

#include <algorithm>
#include <cstdio>

#if defined(__linux__)
#include <pthread.h>
#include <sys/prctl.h>
#include <time.h>
#endif

namespace evr::detail {

reactor_core::reactor_core(device::backend& backend, reactor_options options)
    : backend_(backend),
      options_(options),
      traits_(strategy_traits::of(options.strategy)),
      pools_(backend,
             pool_options{.initial = 0, .batch = std::max<std::size_t>(1, options.pool_batch)}) {}

reactor_core::~reactor_core() {
  // The thread has ended (joined, or it is this thread finishing a self-stop).
  registry_.release_markers();  // normally empty: every pass releases what it retired
  // Events the GPU may never reach were kept out of the pools; destroy them now (CUDA frees a
  // recorded event once it completes).
  registry_.discard_abandoned();
  if (registry_.aborted_fences()) submitter_.keep_fence_words();
  // The submitter frees the stream states (or keeps them for the process), then the fence words.
}

void reactor_core::start() {
  thread_ = std::thread([self = shared_from_this()]() mutable { self->run(std::move(self)); });
  // The thread publishes its id itself; wait so that on_reactor_thread() is exact from now on.
  while (thread_id_.load(std::memory_order_acquire) == std::thread::id{}) std::this_thread::yield();
}

void reactor_core::stop(bool destroying) noexcept {
  inbox_.request_stop();
  if (on_reactor_thread()) {
    // From an inline handler: the thread cannot join itself, and must not wait for a stop() in
    // progress on another thread (that one is joining this thread). The flag is enough: the
    // loop drains and aborts as usual once the handler returns. When the reactor is being
    // destroyed from here, the thread is detached; it then drops its reference to this core,
    // which frees it. Otherwise a later stop() or the destructor joins it.
    if (destroying && thread_.joinable()) thread_.detach();
    return;
  }
  std::lock_guard<std::mutex> lock(stop_mutex_);  // one joiner at a time
  if (thread_.joinable()) thread_.join();
}

std::vector<wait_op*> reactor_core::detach_group(std::uintptr_t group) {
  if (!on_reactor_thread()) return detach_.request(group);
  // From one of this reactor's inline handlers: the loop is below us, so in place. Cancels taken
  // here are handled as the loop would (appending to the batch is safe: deliver() indexes it).
  return detach_.detach_here(
      group, [this] { take_submissions(clock::now()); },
      [this] { take_cancels(inbox_.take_cancels()); });
}

void reactor_core::run(std::shared_ptr<reactor_core> self) {
  become_reactor_thread();
  idle_.start(clock::now());
  for (;;) {
    enter_pass();  // given up while the thread sleeps (park, nap_until) and between passes
    if (!one_pass()) break;
    // Between passes too, not only in sleeps: a reactor that does not sleep (it spins, or its
    // naps end at once because an input is pending that its passes leave to a host) must not hold
    // the hosts off for good. A host's pass is then as if the reactor had slept for no time.
    pass_.leave();
  }
  detach_.close();  // every wait has completed: later detach_group calls find nothing to detach
  pass_.leave();
  thread_id_.store(std::thread::id{}, std::memory_order_release);
  (void)self;  // dropping the last reference (self-stop case) frees the core on this thread
}

void reactor_core::become_reactor_thread() noexcept {
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
}

bool reactor_core::one_pass() {
  clock::time_point now = clock::now();
  if (!closed_ && inbox_.stop_requested()) close_submissions(now);
  const bool took_new = take_inputs(now);
  bool progress = take_reported_faults();  // retired or cancelled: what the idle policy counts
  // A fresh time for the sweep: waits taken above may have been submitted after `now`, and the
  // idle policy's samples compare the sweep's time with their submission.
  now = clock::now();
  if (registry_.has_work()) progress |= sweep_.sweep(now);
  const bool delivering = !batch_.empty();
  progress |= delivering;
  deliver(now);
  // The reactor's own work per completion (metrics().busy_time): the passes that delivered
  // something, from before their sweep to after their delivery. One clock read, only then.
  if (delivering) bump(counters_.busy_ns, static_cast<std::uint64_t>((clock::now() - now).count()));
  if (closed_ && finish_closing()) return false;
  rest(now, progress, took_new);
  return true;
}

void reactor_core::close_submissions(clock::time_point now) {
  // Refuse further submissions (the sentinel makes a racing push fail) and keep what came.
  intake_.close(now);
  closed_ = true;
  drain_deadline_ = now + options_.shutdown_drain;
}

bool reactor_core::take_inputs(clock::time_point now) {
  // Order matters: controls first, then submissions. A cancel is pushed after its wait was
  // submitted, so once we have seen the cancel, taking submissions afterwards includes the wait.
  wait_op* cancels = inbox_.take_cancels();
  const std::vector<std::uintptr_t> owners = inbox_.take_owner_cancels();
  const bool any = take_submissions(now) || cancels != nullptr || !owners.empty();
  take_cancels(cancels);
  for (std::uintptr_t owner : owners) {
    registry_.remove_if([&](wait_op* op) {
      if (op->owner_ != owner) return false;
      registry_.retire(op, aborted_error());  // a per-operation cancel in flight delivers it
      return true;
    });
  }
  // After cancellations: a group's waits whose cancel arrived above are in the batch now, and
  // the coordinator takes them from there.
  detach_.take_requests([this] { take_submissions(clock::now()); });
  return any;
}

bool reactor_core::take_submissions(clock::time_point now) { return !closed_ && intake_.take(now); }

void reactor_core::take_cancels(wait_op* cancels) {
  control_inbox::cancel_stack::for_each(cancels, [this](wait_op* op) { settle_cancel(op); });
}

void reactor_core::settle_cancel(wait_op* op) {
  switch (op->phase_) {
    case wait_op::phase::pending: registry_.cancel(op); break;
    case wait_op::phase::retired_awaiting_cancel:
      registry_.cancel_arrived();
      if (detach_.claims(op)) break;  // its context is shutting down: handed back, not delivered
      batch_.add(op, aborted_error());
      break;
    case wait_op::phase::queued:
      // Cannot happen: take_inputs accepts submissions before handling cancels, and a cancel is
      // only pushed for a submitted wait. Complete it anyway rather than lose it.
      std::fprintf(stderr, "evr: internal: cancel of a wait the reactor has not seen\n");
      batch_.add(op, aborted_error());
      break;
  }
}

bool reactor_core::take_reported_faults() {
  return inbox_.take_reported_faults([this](int device, int value) {
    if (registry_.device_fault(device)) return false;
    registry_.fail_device(device, make_cuda_error(value));
    return true;
  });
}

void reactor_core::deliver(clock::time_point detected) {
  batch_.deliver(detected);
  registry_.release_markers();  // the GPU is past them, and their waits are delivered
}

bool reactor_core::finish_closing() {
  if (registry_.drained()) return true;
  if (clock::now() < drain_deadline_) return false;
  registry_.abort_everything();
  deliver(clock::now());
  // Waits retired while their cancel request is in flight: the canceller pushes right after its
  // CAS, so this ends promptly.
  while (registry_.awaiting_cancel() > 0) {
    take_inputs(clock::now());
    deliver(clock::now());
    if (registry_.awaiting_cancel() > 0) std::this_thread::yield();
  }
  return true;
}

void reactor_core::rest(clock::time_point now, bool progress, bool took_new) {
  const rest_step step = idle_.rest(now, progress, took_new, closed_);
  switch (step.what) {
    case rest_step::kind::go_on: return;
    case rest_step::kind::yield: std::this_thread::yield(); return;
    case rest_step::kind::park: park(); return;
    case rest_step::kind::nap: nap_until(step.until, step.learn_overshoot); return;
  }
}

void reactor_core::enter_pass() noexcept {
  if (pass_.enter()) bump(counters_.pass_lock_sleeps);  // held now: the counter is ours
}

void reactor_core::park() {
  bump(counters_.parks);
  // Zero wake-ups until a submission; hosts may run passes meanwhile.
  wake_->park([this] { return has_inputs(); }, [this] { pass_.leave(); });
  enter_pass();
  idle_.woke_from_park(clock::now());
}

void reactor_core::nap_until(clock::time_point until, bool learn_overshoot) {
  bump(counters_.parks);
  const clock::time_point asked_at = clock::now();
  const bool timed_out = wake_->nap_until(
      until, [this] { return has_inputs(); }, [this] { pass_.leave(); });
  const clock::time_point woke = clock::now();  // before a host's pass may delay it
  enter_pass();
  // Only a nap that ran its course says how late this machine's timers fire.
  if (!timed_out) return;
  add_sample(counters_.nap_overshoot, woke - until);
  if (learn_overshoot) idle_.nap_timed_out(until - asked_at, woke - until);
}

bool reactor_core::has_inputs() const noexcept {
  return submitter_.pending() || inbox_.pending(/*stop_counts=*/!closed_) || detach_.pending() ||
         sweep_.signalled();
}

}  // namespace evr::detail
