// The scheduler of a simulated device (scheduler.hpp).
#include "scheduler.hpp"

#include <pthread.h>

#include <cstdio>
#include <thread>
#include <utility>
#include <vector>

namespace evr::sim::detail {
namespace {

// The scheduler whose host function the calling thread is running (nullptr: none). Per device,
// so that in_host_func() of another sim::device is false.
thread_local const void* tl_host_func_owner = nullptr;

// Sets tl_host_func_owner for the duration of a host function (restoring the previous owner, so
// that a host function that steps another sim::device stays correct).
class host_func_scope {
 public:
  explicit host_func_scope(const void* owner) : saved_(tl_host_func_owner) {
    tl_host_func_owner = owner;
  }
  ~host_func_scope() { tl_host_func_owner = saved_; }
  host_func_scope(const host_func_scope&) = delete;
  host_func_scope& operator=(const host_func_scope&) = delete;

 private:
  const void* saved_;
};

// A kernel body that throws ends the process, as an exception escaping a thread would.
void run_body(const std::function<void()>& body) noexcept { body(); }

// The head of `s` waits on a record that is not done yet (s.mutex held).
bool head_waits_on_record(const stream_state& s) noexcept {
  if (s.queue.empty()) return false;
  const operation& head = s.queue.front();
  return head.kind == op_kind::wait && !head.record->is_done();
}

// The head of `s` may block the thread that runs it (a kernel that sleeps or has a body, a host
// function): progress made so far is announced before it starts (s.mutex held).
bool head_may_block(const stream_state& s) noexcept {
  if (s.queue.empty()) return false;
  const operation& head = s.queue.front();
  return head.kind == op_kind::host_func ||
         (head.kind == op_kind::kernel && (head.value != 0 || head.extra != nullptr));
}

}  // namespace

bool scheduler::in_host_func(const void* owner) noexcept { return tl_host_func_owner == owner; }

// --- construction --------------------------------------------------------------------------------
scheduler::scheduler(run_mode mode, fault_state* faults, registry& reg, counters& count)
    : mode_(mode), faults_(faults), registry_(reg), count_(count) {
  if (threaded()) runner_ = std::thread([this] { runner_main(); });
}

scheduler::~scheduler() { stop_runner(); }

// --- enqueueing ----------------------------------------------------------------------------------
std::error_code scheduler::enqueue(const std::shared_ptr<stream_state>& s, operation op) {
  if (const std::error_code f = fault_of(*s).get()) return f;
  bool to_runner = false;
  {
    std::lock_guard lock(s->mutex);
    to_runner = push_locked(*s, std::move(op));
  }
  if (to_runner) hand_to_runner(s);
  return {};
}

bool scheduler::push_locked(stream_state& s, operation&& op) {
  const bool was_empty = s.queue.empty();
  s.queue.push_back(std::move(op));
  // An idle worker sleeps because its queue was empty or its head cannot start (stalled,
  // faulted): only an operation that becomes a head that can run is worth the runner's time. A
  // wait on a record not done yet is one too: the runner wakes the worker, which must go and
  // listen for other streams' progress.
  if (s.idle && was_empty && !s.on_runner &&
      (can_start(s) || s.queue.front().kind == op_kind::wait)) {
    s.on_runner = true;
    return true;
  }
  return false;
}

void scheduler::hand_to_runner(std::shared_ptr<stream_state> s) {
  bool wake_runner = false;
  {
    std::lock_guard lock(runner_mutex_);
    ready_.push_back(std::move(s));
    has_ready_.store(true, std::memory_order_release);
    wake_runner = std::exchange(runner_idle_, false);
  }
  if (wake_runner) runner_cv_.notify_one();
}

// --- running -------------------------------------------------------------------------------------
bool scheduler::can_start(const stream_state& s) const noexcept {
  if (s.stop || s.busy || s.stalled || s.queue.empty() || fault_of(s).is_faulted()) return false;
  const operation& head = s.queue.front();
  return head.kind != op_kind::wait || head.record->is_done();
}

scheduler::outcome scheduler::run_one(std::unique_lock<std::mutex>& lock, stream_state& s) {
  if (!can_start(s)) return outcome::blocked;
  // The operation starts here. A fault that strikes now leaves it at the head, never completed.
  switch (fault_of(s).on_start()) {
    case fault_state::start::go: break;
    case fault_state::start::faulted: return outcome::blocked;
    case fault_state::start::faults_now: return outcome::faulted;
  }
  if (s.queue.front().kind == op_kind::faulting_kernel) {
    fault_of(s).set(s.queue.front().extra->fault);
    return outcome::faulted;
  }
  operation op = s.queue.pop_front();
  s.busy = true;

  switch (op.kind) {
    case op_kind::kernel: run_kernel(lock, s, op); break;
    case op_kind::host_func: {
      lock.unlock();
      {
        host_func_scope scope(owner());
        op.fn(op.target);
      }
      count_.host_funcs_run.bump();
      lock.lock();
      break;
    }
    case op_kind::fence:
      // Still in the critical section of the fault check above (see after_fault); a block freed
      // meanwhile takes no write.
      if (op.block->land(static_cast<std::uint64_t*>(op.target), op.value)) {
        count_.fence_writes_landed.bump();
      }
      break;
    case op_kind::record:
      op.record->complete();
      records_completed_.fetch_add(1, std::memory_order_release);
      break;
    case op_kind::wait:
    case op_kind::faulting_kernel: break;
  }
  s.busy = false;
  return outcome::ran;
}

void scheduler::run_kernel(std::unique_lock<std::mutex>& lock, stream_state& s, operation& op) {
  const std::chrono::nanoseconds duration = op.duration();
  if (threaded() && duration > std::chrono::nanoseconds::zero()) {
    if (duration >= spin_below) {
      s.cv.wait_for(lock, duration, [&] { return s.stop; });  // stop cuts the sleep short
    } else {
      lock.unlock();
      const auto until = sim_clock::now() + duration;
      while (sim_clock::now() < until) {
      }
      lock.lock();
    }
  }
  if (op.extra && op.extra->body && !s.stop) {
    std::function<void()> body = std::move(op.extra->body);
    lock.unlock();
    run_body(body);
    body = nullptr;  // destroy captures unlocked: their destructors may call the device
    lock.lock();
  }
}

void scheduler::after_fault(int device) {
  for (const std::shared_ptr<stream_state>& s : registry_.snapshot()) {
    if (s->device != device) continue;
    // Whoever is between its fault check and the operation's effect (a fence landing) finishes
    // before we take the lock; whoever comes after sees the fault.
    std::lock_guard barrier(s->mutex);
  }
  progress_.notify();
}

// --- threaded mode -------------------------------------------------------------------------------
void scheduler::start_worker(stream_state& s) {
  s.worker = std::thread([this, &s] { worker_main(s); });
}

void scheduler::worker_main(stream_state& s) {
  char name[16];
  std::snprintf(name, sizeof name, "evr-sim-s%llu", static_cast<unsigned long long>(s.id));
  pthread_setname_np(pthread_self(), name);

  std::unique_lock lock(s.mutex);
  std::size_t unannounced = 0;  // operations completed since progress waiters were last told
  auto announce = [&] {
    unannounced = 0;
    if (!progress_.has_waiters()) return;  // the common case: keep the lock
    lock.unlock();
    progress_.notify();
    lock.lock();
  };
  while (!s.stop) {
    if (unannounced != 0 && (unannounced >= announce_every || head_may_block(s))) {
      announce();
      continue;
    }
    const outcome o = run_one(lock, s);
    if (o == outcome::ran) {
      ++unannounced;
      continue;
    }
    if (o == outcome::faulted) {
      unannounced = 0;
      lock.unlock();
      after_fault(s.device);  // notifies
      lock.lock();
      continue;
    }
    // Nothing can start. Tell the waiters what ran, then look again: things may have moved.
    if (unannounced != 0) {
      announce();
      continue;
    }
    if (s.retired && s.queue.empty()) break;  // destroyed and drained
    if (head_waits_on_record(s)) {
      // Completions on other streams are announced to progress waiters, not to this stream.
      lock.unlock();
      progress_.wait([&] {
        std::lock_guard l(s.mutex);
        return s.stop || !head_waits_on_record(s);
      });
      lock.lock();
      continue;
    }
    s.idle = true;  // the runner wakes us when our head needs us; resume(), destroy and stop too
    s.cv.wait(lock);
    s.idle = false;
  }
  s.exited = true;
  lock.unlock();
  progress_.notify();  // wait_idle, and a reap waiting for the exit
}

void scheduler::stop_all() {
  const std::vector<std::shared_ptr<stream_state>> all = registry_.snapshot();
  for (const auto& s : all) {
    {
      std::lock_guard lock(s->mutex);
      s->stop = true;
    }
    s->cv.notify_all();
  }
  progress_.notify();
  stop_runner();
  for (const auto& s : all) {
    if (s->worker.joinable()) s->worker.join();
  }
}

// --- the runner ----------------------------------------------------------------------------------
void scheduler::runner_main() {
  pthread_setname_np(pthread_self(), "evr-sim-runner");
  std::vector<std::shared_ptr<stream_state>> batch;
  std::unique_lock lock(runner_mutex_);
  while (!runner_stop_) {
    if (ready_.empty()) {
      // Poll a little before sleeping: a burst of enqueues then finds the runner awake and makes
      // no system call. yield() leaves the core to the enqueuing threads meanwhile.
      lock.unlock();
      const auto until = sim_clock::now() + runner_spin;
      while (!has_ready_.load(std::memory_order_acquire) && sim_clock::now() < until) {
        std::this_thread::yield();
      }
      lock.lock();
      if (ready_.empty() && !runner_stop_) {
        runner_idle_ = true;  // hand_to_runner() wakes us
        runner_cv_.wait(lock, [&] { return !ready_.empty() || runner_stop_; });
        runner_idle_ = false;
      }
      continue;
    }
    batch.swap(ready_);
    has_ready_.store(false, std::memory_order_relaxed);
    lock.unlock();
    bool ran = false;
    for (const std::shared_ptr<stream_state>& s : batch) ran |= serve(*s);
    batch.clear();  // may drop the last reference to a destroyed stream: no lock held
    if (ran) progress_.notify();
    lock.lock();
  }
}

bool scheduler::serve(stream_state& s) {
  bool ran = false;
  bool wake_worker = false;
  {
    std::unique_lock lock(s.mutex);
    s.on_runner = false;
    while (!head_may_block(s)) {
      const outcome o = run_one(lock, s);
      if (o == outcome::ran) {
        ran = true;
        continue;
      }
      if (o == outcome::faulted) {
        lock.unlock();
        after_fault(s.device);
        lock.lock();
      }
      break;
    }
    // What is left needs the worker: a head that may block, or a wait on another stream's record
    // (the worker listens for it). An awake worker finds it by itself.
    if (s.idle && (can_start(s) || head_waits_on_record(s))) {
      s.idle = false;
      wake_worker = true;
    }
  }
  if (wake_worker) s.cv.notify_one();
  return ran;
}

void scheduler::stop_runner() {
  {
    std::lock_guard lock(runner_mutex_);
    runner_stop_ = true;
  }
  runner_cv_.notify_all();
  if (runner_.joinable()) runner_.join();
  ready_.clear();
}

void scheduler::reap() {
  const bool threads = threaded();
  auto done = registry_.reap([threads](const stream_state& s) {
    return threads ? s.exited : (s.queue.empty() && !s.busy);
  });
  for (const auto& s : done) {
    if (s->worker.joinable()) s->worker.join();
  }
}

// --- manual mode ---------------------------------------------------------------------------------
std::size_t scheduler::step(stream_state& s, std::size_t n) {
  std::size_t ran = 0;
  outcome o = outcome::blocked;
  {
    std::unique_lock lock(s.mutex);
    while (ran < n && (o = run_one(lock, s)) == outcome::ran) ++ran;
  }
  if (o == outcome::faulted) {
    after_fault(s.device);
  } else if (ran != 0) {
    progress_.notify();
  }
  return ran;
}

std::size_t scheduler::run_until_blocked() {
  std::size_t total = 0;
  for (;;) {
    // A snapshot: run_one releases the lock, and others may create or destroy streams.
    std::size_t round = 0;
    for (const std::shared_ptr<stream_state>& s : registry_.snapshot(/*by_id=*/true)) {
      std::unique_lock lock(s->mutex);
      for (;;) {
        const outcome o = run_one(lock, *s);
        if (o == outcome::ran) {
          ++round;
          continue;
        }
        if (o == outcome::faulted) {
          lock.unlock();
          after_fault(s->device);
        }
        break;
      }
    }
    if (round == 0) break;
    total += round;
    progress_.notify();
  }
  return total;
}

// --- quiescence ----------------------------------------------------------------------------------
bool scheduler::any_busy() const {
  for (const std::shared_ptr<stream_state>& s : registry_.snapshot()) {
    std::lock_guard lock(s->mutex);
    if (s->busy) return true;
  }
  return false;
}

bool scheduler::quiescent() const {
  const bool threads = threaded();
  // A stream seen blocked on a record may be unblocked by a record that completes before its own
  // stream is seen: then the counter moved, and the walk is taken again. Whoever completed the
  // record notifies progress waiters afterwards, so returning false is never a lost wake-up.
  for (;;) {
    const std::uint64_t before = records_completed_.load(std::memory_order_acquire);
    for (const std::shared_ptr<stream_state>& s : registry_.snapshot()) {
      std::lock_guard lock(s->mutex);
      if (s->busy || (threads && can_start(*s))) return false;
    }
    if (records_completed_.load(std::memory_order_acquire) == before) return true;
  }
}

}  // namespace evr::sim::detail
