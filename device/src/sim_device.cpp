// The simulated device (evr/device/sim.hpp).
//
// Model
// -----
// A sim::device simulates `options::devices` GPUs. Each simulated GPU ("device index") has a
// sticky fault slot and a fault countdown (inject_fault_after). Streams and events belong to one
// device index.
//   * A stream is a FIFO of operations (kernel, faulting kernel, event record, host function,
//     fence write, wait on an event record). Only the head may run, one at a time, so the
//     operations of a stream complete in issue order.
//   * record_event creates a new `record_state` and points the event at it; the record operation
//     marks it done (with a steady_clock timestamp) when it runs. An event is complete when it
//     was never recorded or its current record is done. Re-recording points the event at a new
//     record; a wait already enqueued keeps the record it captured (as cudaStreamWaitEvent does).
//   * A device faults when a faulting kernel reaches the head of its stream, when its fault
//     countdown reaches zero as an operation is about to start, or on inject_fault(). From then on
//     nothing of that device starts (the operation that faulted stays at its stream's head and
//     never completes), and every call on that device returns the fault. An operation already
//     running when the fault arrives (a kernel body, a host function) finishes.
//   * destroy_stream behaves like cudaStreamDestroy: it returns at once and the work already
//     enqueued still runs (threaded mode: the worker drains the queue, then ends and is joined
//     later; manual mode: run_until_blocked still runs it). The handle is invalid at once.
//   * Handles are pointers to objects registered in this device; a handle that is not registered
//     (destroyed, from another backend) is reported as cuda invalid resource handle (400). The
//     default streams are not modelled: nullptr (legacy default stream) and cudaStreamLegacy (1)
//     give errc::invalid_argument, cudaStreamPerThread (2) gives errc::per_thread_default_stream.
//   * Misuse is reported with evr::errc, device behaviour with the cudaError_t values CUDA uses.
//
// Modes
// -----
//   * threaded: each stream has a worker thread that runs the head whenever it can, sleeping for a
//     kernel's duration (spinning below 50 us, where a timed condvar wait would oversleep).
//   * manual: nothing runs by itself; step()/run_until_blocked() and synchronize_* run operations
//     on the calling thread. synchronize_stream/synchronize_event run the one stream concerned
//     forward on the caller; when that stream cannot advance (stalled, or waiting on an event of
//     a stream nobody steps) and no other thread is running an operation of this sim::device, they
//     return std::errc::resource_deadlock_would_occur instead of hanging. step() and
//     run_until_blocked() do nothing in threaded mode (return 0).
//
// Locking
// -------
// One mutex (impl::mutex_) guards all state of a sim::device: streams, events, records, faults,
// fence-block registry. A simulator has no throughput to win from finer locks, and one lock makes
// every rule above hold atomically (e.g. a fence write checks the fault and lands in the same
// critical section, so no write lands after a fault). The lock is never held while a kernel
// sleeps, a kernel body runs or a host function runs, so those may call back into the device.
// Two kinds of condition variable, both used with mutex_:
//   * stream_state::cv — wakes that stream's worker: new work, resume, retire, stop.
//   * impl::progress_  — notified (all) whenever an operation completes, a fault is set or a
//     stream is resumed/stopped. Waited on by synchronize_*, wait_idle and by workers whose head
//     is a wait on another stream's record (so such waits sleep, never spin).
// Counters are relaxed atomics (statistics only, read without the lock). Fence words are written
// with release stores through std::atomic_ref: the reactor reads them with acquire loads, without
// the lock.
#include <evr/device/sim.hpp>

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace evr::sim {
namespace {

using evr::device::event_flags;
using evr::device::fence_block;
using evr::device::ipc_event_handle;
using evr::device::native_event;
using evr::device::native_stream;
using sim_clock = std::chrono::steady_clock;

// Stream priorities are clamped to the range an H100 reports (cudaDeviceGetStreamPriorityRange).
constexpr int least_priority = 0;
constexpr int greatest_priority = -5;
// Kernel durations below this are spun (a timed condvar wait oversleeps by ~50 us on Linux).
constexpr std::chrono::nanoseconds spin_below{50'000};
// The bytes that mark an IPC handle made by this simulator.
constexpr char ipc_magic[8] = {'e', 'v', 'r', 's', 'i', 'm', 'v', '1'};
constexpr unsigned all_event_flags = 7;

// The backend whose host function the calling thread is running (nullptr: none). Per backend
// object, so that in_host_func() of another sim::device is false.
thread_local const void* tl_host_func_owner = nullptr;
// cudaSetDevice is per host thread; one slot shared by all sim::device objects.
thread_local int tl_current_device = 0;

// Distinguishes sim::device objects in IPC handles.
std::atomic<std::uint64_t> next_instance_id{1};

std::error_code not_ready() { return make_cuda_error(cuda_value::not_ready); }
std::error_code bad_handle() { return make_cuda_error(cuda_value::invalid_resource_handle); }
std::error_code default_fault() { return make_cuda_error(cuda_value::illegal_address); }
std::error_code would_deadlock() {
  return std::make_error_code(std::errc::resource_deadlock_would_occur);
}

struct stream_state;

// What one record_event captured. Shared by the event (until re-recorded or destroyed), the
// record operation that completes it, and the waits enqueued on it.
struct record_state {
  int device = 0;
  std::uint64_t seq = 0;  // 1-based position of the record operation on its stream
  std::weak_ptr<stream_state> stream;
  bool done = false;
  sim_clock::time_point done_at{};
};

// The state an event handle watches. An exported event and the events imported from its handle
// share one core, so a record on either is seen by all.
struct event_core {
  int device = 0;
  std::shared_ptr<record_state> record;  // nullptr: never recorded
  std::uint64_t ipc_token = 0;           // 0: never exported
};

struct event_state {
  int device = 0;
  event_flags flags = event_flags::none;
  bool imported = false;
  std::shared_ptr<event_core> core;
};

enum class op_kind { kernel, faulting_kernel, record, host_func, fence, wait };

struct operation {
  op_kind kind = op_kind::kernel;
  std::chrono::nanoseconds duration{};   // kernel
  std::function<void()> body;            // kernel
  std::error_code fault;                 // faulting_kernel
  std::shared_ptr<record_state> record;  // record (completes it), wait (waits for it)
  void (*fn)(void*) = nullptr;           // host_func
  void* arg = nullptr;                   // host_func
  std::uint64_t* word = nullptr;         // fence
  std::uint64_t value = 0;               // fence
};

struct stream_state : std::enable_shared_from_this<stream_state> {
  std::uint64_t id = 0;  // creation order: run_until_blocked visits streams in this order
  int device = 0;
  int priority = 0;
  std::deque<operation> queue;  // not started yet; the head is next
  std::uint64_t enqueued = 0;   // operations ever enqueued
  std::uint64_t completed = 0;  // operations completed
  bool busy = false;            // an operation was popped and is running (lock released)
  bool stalled = false;
  bool retired = false;        // destroy_stream was called: drain, then end
  bool stop = false;           // the sim::device is being destroyed: drop everything
  bool exited = false;         // threaded: the worker returned (join will not block)
  std::condition_variable cv;  // wakes the worker (threaded mode)
  std::thread worker;
};

struct device_slot {
  std::error_code fault;        // sticky; {} while healthy
  std::uint64_t countdown = 0;  // inject_fault_after: operations left (0: off)
  std::error_code countdown_fault;
};

// Sets tl_host_func_owner for the duration of a host function (restoring the previous owner, so
// a host function that steps another sim::device stays correct).
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

}  // namespace

struct device::impl {
  explicit impl(options o)
      : opts(o),
        instance_id(next_instance_id.fetch_add(1, std::memory_order_relaxed)),
        devices(static_cast<std::size_t>(std::max(o.devices, 0))) {}

  const options opts;
  const std::uint64_t instance_id;

  mutable std::mutex mutex;
  std::condition_variable progress;  // see the file comment
  std::vector<device_slot> devices;
  std::unordered_map<const void*, std::shared_ptr<stream_state>> streams;
  std::vector<std::shared_ptr<stream_state>> retired;  // destroyed, still draining
  std::unordered_map<const void*, std::unique_ptr<event_state>> events;
  std::unordered_map<std::uint64_t, std::shared_ptr<event_core>> exported;  // ipc token → core
  std::map<std::uintptr_t, std::size_t> fence_blocks;  // live blocks: base address → bytes
  std::uint64_t next_stream_id = 1;
  std::uint64_t next_ipc_token = 1;

  // Statistics, relaxed: nothing is ordered by them.
  struct {
    std::atomic<std::uint64_t> event_queries{0};
    std::atomic<std::uint64_t> stream_queries{0};
    std::atomic<std::uint64_t> event_records{0};
    std::atomic<std::uint64_t> host_funcs_launched{0};
    std::atomic<std::uint64_t> host_funcs_run{0};
    std::atomic<std::uint64_t> fence_writes_enqueued{0};
    std::atomic<std::uint64_t> fence_writes_landed{0};
    std::atomic<std::uint64_t> events_created{0};
    std::atomic<std::uint64_t> events_destroyed{0};
  } count;

  static void bump(std::atomic<std::uint64_t>& c) { c.fetch_add(1, std::memory_order_relaxed); }
  bool threaded() const { return opts.mode == run_mode::threaded; }

  // --- lookups (mutex held) ------------------------------------------------------------------
  std::error_code check_device(int index) const {
    if (index < 0 || static_cast<std::size_t>(index) >= devices.size()) {
      return make_error_code(errc::no_device);
    }
    return {};
  }

  std::error_code find_stream(native_stream handle, stream_state*& out) const {
    if (handle == nullptr || handle == reinterpret_cast<native_stream>(1)) {
      return make_error_code(errc::invalid_argument);  // the legacy default stream: not modelled
    }
    if (handle == reinterpret_cast<native_stream>(2)) {
      return make_error_code(errc::per_thread_default_stream);
    }
    auto it = streams.find(handle);
    if (it == streams.end()) return bad_handle();
    out = it->second.get();
    return {};
  }

  std::error_code find_event(native_event handle, event_state*& out) const {
    if (handle == nullptr) return make_error_code(errc::invalid_argument);
    auto it = events.find(handle);
    if (it == events.end()) return bad_handle();
    out = it->second.get();
    return {};
  }

  const std::error_code& fault_of(int index) const {
    return devices[static_cast<std::size_t>(index)].fault;
  }

  void set_fault(int index, std::error_code fault) {
    device_slot& d = devices[static_cast<std::size_t>(index)];
    if (d.fault) return;  // the first fault sticks
    d.fault = fault ? fault : default_fault();
    d.countdown = 0;
    progress.notify_all();
  }

  // A live fence block holds the 8 bytes at `address`.
  bool fence_address_valid(std::uintptr_t address) const {
    if (address % alignof(std::uint64_t) != 0) return false;
    auto it = fence_blocks.upper_bound(address);
    if (it == fence_blocks.begin()) return false;
    --it;
    return address >= it->first && address + sizeof(std::uint64_t) <= it->first + it->second;
  }

  // Wakes the worker of `s` and everyone waiting for progress.
  void kick(stream_state& s) {
    s.cv.notify_all();
    progress.notify_all();
  }

  void push(stream_state& s, operation op) {
    s.queue.push_back(std::move(op));
    ++s.enqueued;
    s.cv.notify_one();
  }

  // Enqueues `op` on `handle` unless the handle is bad or its device faulted.
  std::error_code launch(native_stream handle, operation op) {
    std::lock_guard lock(mutex);
    stream_state* s = nullptr;
    if (auto ec = find_stream(handle, s)) return ec;
    if (const auto& ec = fault_of(s->device)) return ec;
    push(*s, std::move(op));
    return {};
  }

  // --- running operations --------------------------------------------------------------------
  // True when the head of `s` may start now (mutex held).
  bool can_start(const stream_state& s) const {
    if (s.stop || s.busy || s.stalled || s.queue.empty() || fault_of(s.device)) return false;
    const operation& head = s.queue.front();
    return head.kind != op_kind::wait || head.record->done;
  }

  // Runs the head operation of `s` on the calling thread; returns false when it could not start.
  // `lock` holds mutex on entry and on return; it is released while a kernel sleeps or a body or
  // host function runs (s.busy keeps anyone else from starting the next operation meanwhile).
  bool run_one(std::unique_lock<std::mutex>& lock, stream_state& s) {
    if (!can_start(s)) return false;
    device_slot& d = devices[static_cast<std::size_t>(s.device)];
    // The operation starts here. A fault that strikes now leaves it at the head, never completed.
    if (d.countdown > 0 && --d.countdown == 0) {
      set_fault(s.device, d.countdown_fault);
      return false;
    }
    if (s.queue.front().kind == op_kind::faulting_kernel) {
      set_fault(s.device, s.queue.front().fault);
      return false;
    }
    operation op = std::move(s.queue.front());
    s.queue.pop_front();
    s.busy = true;

    switch (op.kind) {
      case op_kind::kernel: run_kernel(lock, s, op); break;
      case op_kind::host_func: {
        lock.unlock();
        {
          host_func_scope scope(this);
          op.fn(op.arg);
        }
        bump(count.host_funcs_run);
        lock.lock();
        break;
      }
      case op_kind::fence:
        // Checked and stored under the lock: no write lands after a fault (checked by can_start
        // above, same critical section) or into a freed block.
        if (fence_address_valid(reinterpret_cast<std::uintptr_t>(op.word))) {
          std::atomic_ref<std::uint64_t>(*op.word).store(op.value, std::memory_order_release);
          bump(count.fence_writes_landed);
        }
        break;
      case op_kind::record:
        op.record->done = true;
        op.record->done_at = sim_clock::now();
        break;
      case op_kind::wait:
      case op_kind::faulting_kernel: break;
    }
    s.busy = false;
    ++s.completed;
    progress.notify_all();
    return true;
  }

  void run_kernel(std::unique_lock<std::mutex>& lock, stream_state& s, operation& op) {
    if (threaded() && op.duration > std::chrono::nanoseconds::zero()) {
      if (op.duration >= spin_below) {
        s.cv.wait_for(lock, op.duration, [&] { return s.stop; });  // stop cuts the sleep short
      } else {
        lock.unlock();
        const auto until = sim_clock::now() + op.duration;
        while (sim_clock::now() < until) {
        }
        lock.lock();
      }
    }
    if (op.body && !s.stop) {
      std::function<void()> body = std::move(op.body);
      lock.unlock();
      run_body(body);
      body = nullptr;  // destroy captures unlocked: their destructors may call the device
      lock.lock();
    }
  }

  // Threaded mode: the loop of a stream's worker thread.
  void worker_main(stream_state& s) {
    char name[16];
    std::snprintf(name, sizeof name, "evr-sim-s%llu", static_cast<unsigned long long>(s.id));
    pthread_setname_np(pthread_self(), name);

    std::unique_lock lock(mutex);
    while (!s.stop) {
      if (run_one(lock, s)) continue;
      if (s.retired && s.queue.empty()) break;  // destroyed and drained
      // A head waiting on a record needs to hear about completions on other streams.
      const bool waits_on_record = !s.queue.empty() && s.queue.front().kind == op_kind::wait;
      if (waits_on_record) {
        progress.wait(lock);
      } else {
        s.cv.wait(lock);
      }
    }
    s.exited = true;
  }

  // True when some operation of this sim::device is running on some thread (mutex held).
  bool any_busy() const {
    for (const auto& [handle, s] : streams) {
      if (s->busy) return true;
    }
    for (const auto& s : retired) {
      if (s->busy) return true;
    }
    return false;
  }

  // Nothing is running and (threaded) nothing can start: only a test action can change anything.
  bool quiescent() const {
    auto idle = [&](const stream_state& s) { return !s.busy && !(threaded() && can_start(s)); };
    for (const auto& [handle, s] : streams) {
      if (!idle(*s)) return false;
    }
    for (const auto& s : retired) {
      if (!idle(*s)) return false;
    }
    return true;
  }

  // Joins the workers of destroyed streams that have drained (threaded) or drops drained
  // destroyed streams (manual). Never joins a worker that is still running.
  void reap() {
    std::vector<std::shared_ptr<stream_state>> done;
    {
      std::lock_guard lock(mutex);
      auto finished = [&](const std::shared_ptr<stream_state>& s) {
        return threaded() ? s->exited : (s->queue.empty() && !s->busy);
      };
      for (auto& s : retired) {
        if (finished(s)) done.push_back(s);
      }
      std::erase_if(retired, finished);
    }
    for (auto& s : done) {
      if (s->worker.joinable()) s->worker.join();
    }
  }

  // Manual mode: a synchronize that cannot run its stream forward waits only if another thread is
  // running an operation (it may unblock us); otherwise nothing ever will.
  bool manual_wait_or_give_up(std::unique_lock<std::mutex>& lock) {
    if (!any_busy()) return false;
    progress.wait(lock);
    return true;
  }
};

// ---------------------------------------------------------------------------------------------
device::device(options opts) : impl_(std::make_unique<impl>(opts)) {}

device::~device() {
  // Stop every worker (pending work is dropped; a running body or host function finishes).
  std::vector<std::shared_ptr<stream_state>> all;
  {
    std::lock_guard lock(impl_->mutex);
    for (auto& [handle, s] : impl_->streams) all.push_back(s);
    for (auto& s : impl_->retired) all.push_back(s);
    for (auto& s : all) {
      s->stop = true;
      s->cv.notify_all();
    }
    impl_->progress.notify_all();
  }
  for (auto& s : all) {
    if (s->worker.joinable()) s->worker.join();
  }
}

// --- test controls ---------------------------------------------------------------------------
std::error_code device::launch_kernel(native_stream stream, std::chrono::nanoseconds duration,
                                      std::function<void()> body) {
  operation op;
  op.kind = op_kind::kernel;
  op.duration = std::max(duration, std::chrono::nanoseconds::zero());
  op.body = std::move(body);
  return impl_->launch(stream, std::move(op));
}

std::error_code device::launch_faulting_kernel(native_stream stream, std::error_code fault) {
  operation op;
  op.kind = op_kind::faulting_kernel;
  op.fault = fault ? fault : default_fault();
  return impl_->launch(stream, std::move(op));
}

void device::inject_fault(int device_index, std::error_code fault) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->check_device(device_index)) return;
  impl_->set_fault(device_index, fault);
}

void device::inject_fault_after(int device_index, std::uint64_t operations, std::error_code fault) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->check_device(device_index)) return;
  if (operations == 0) {
    impl_->set_fault(device_index, fault);
    return;
  }
  device_slot& d = impl_->devices[static_cast<std::size_t>(device_index)];
  if (d.fault) return;
  d.countdown = operations;
  d.countdown_fault = fault ? fault : default_fault();
}

std::error_code device::fault(int device_index) const {
  std::lock_guard lock(impl_->mutex);
  if (auto ec = impl_->check_device(device_index)) return ec;
  return impl_->fault_of(device_index);
}

void device::stall(native_stream stream) {
  std::lock_guard lock(impl_->mutex);
  stream_state* s = nullptr;
  if (impl_->find_stream(stream, s)) return;
  s->stalled = true;
}

void device::resume(native_stream stream) {
  std::lock_guard lock(impl_->mutex);
  stream_state* s = nullptr;
  if (impl_->find_stream(stream, s)) return;
  s->stalled = false;
  impl_->kick(*s);
}

std::size_t device::step(native_stream stream, std::size_t n) {
  if (impl_->threaded()) return 0;
  std::unique_lock lock(impl_->mutex);
  stream_state* s = nullptr;
  if (impl_->find_stream(stream, s)) return 0;
  std::shared_ptr<stream_state> keep = s->shared_from_this();  // survives a destroy meanwhile
  std::size_t ran = 0;
  while (ran < n && impl_->run_one(lock, *s)) ++ran;
  return ran;
}

std::size_t device::run_until_blocked() {
  if (impl_->threaded()) return 0;
  std::size_t total = 0;
  {
    std::unique_lock lock(impl_->mutex);
    for (;;) {
      // A snapshot: run_one releases the lock, and others may create or destroy streams.
      std::vector<std::shared_ptr<stream_state>> all;
      for (auto& [handle, s] : impl_->streams) all.push_back(s);
      for (auto& s : impl_->retired) all.push_back(s);
      std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a->id < b->id; });
      std::size_t round = 0;
      for (auto& s : all) {
        while (impl_->run_one(lock, *s)) ++round;
      }
      if (round == 0) break;
      total += round;
    }
  }
  impl_->reap();
  return total;
}

std::size_t device::pending_operations(native_stream stream) const {
  std::lock_guard lock(impl_->mutex);
  stream_state* s = nullptr;
  if (impl_->find_stream(stream, s)) return 0;
  return s->queue.size();
}

void device::wait_idle() {
  std::unique_lock lock(impl_->mutex);
  impl_->progress.wait(lock, [&] { return impl_->quiescent(); });
}

call_counters device::counters() const {
  auto& c = impl_->count;
  constexpr auto r = std::memory_order_relaxed;
  return call_counters{
      .event_queries = c.event_queries.load(r),
      .stream_queries = c.stream_queries.load(r),
      .event_records = c.event_records.load(r),
      .host_funcs_launched = c.host_funcs_launched.load(r),
      .host_funcs_run = c.host_funcs_run.load(r),
      .fence_writes_enqueued = c.fence_writes_enqueued.load(r),
      .fence_writes_landed = c.fence_writes_landed.load(r),
      .events_created = c.events_created.load(r),
      .events_destroyed = c.events_destroyed.load(r),
  };
}

void device::reset_counters() {
  auto& c = impl_->count;
  for (auto* a : {&c.event_queries, &c.stream_queries, &c.event_records, &c.host_funcs_launched,
                  &c.host_funcs_run, &c.fence_writes_enqueued, &c.fence_writes_landed,
                  &c.events_created, &c.events_destroyed}) {
    a->store(0, std::memory_order_relaxed);
  }
}

run_mode device::mode() const noexcept { return impl_->opts.mode; }

// --- backend: identity -------------------------------------------------------------------------
std::string_view device::name() const noexcept { return "sim"; }
bool device::is_simulated() const noexcept { return true; }

std::string device::describe() const {
  return "simulated device x" + std::to_string(impl_->devices.size()) +
         (impl_->threaded() ? " (threaded)" : " (manual)");
}

std::error_code device::device_count(int& count) noexcept {
  count = static_cast<int>(impl_->devices.size());
  if (count == 0) return make_cuda_error(cuda_value::no_device);
  return {};
}

// --- backend: events ---------------------------------------------------------------------------
std::error_code device::create_event(int device, event_flags flags, native_event& out) noexcept {
  out = nullptr;
  if ((static_cast<unsigned>(flags) & ~all_event_flags) != 0) {
    return make_error_code(errc::invalid_argument);
  }
  if (has_flag(flags, event_flags::interprocess) && has_flag(flags, event_flags::timing)) {
    return make_error_code(errc::interprocess_requires_no_timing);
  }
  std::lock_guard lock(impl_->mutex);
  if (auto ec = impl_->check_device(device)) return ec;
  if (const auto& ec = impl_->fault_of(device)) return ec;
  auto e = std::make_unique<event_state>();
  e->device = device;
  e->flags = flags;
  e->core = std::make_shared<event_core>();
  e->core->device = device;
  out = e.get();
  impl_->events.emplace(out, std::move(e));
  impl::bump(impl_->count.events_created);
  return {};
}

void device::destroy_event(native_event event) noexcept {
  std::lock_guard lock(impl_->mutex);
  auto it = impl_->events.find(event);
  if (it == impl_->events.end()) return;
  const event_state& e = *it->second;
  // The exporter's death ends its handle: later imports fail (imports already made keep working;
  // on CUDA using them is undefined).
  if (!e.imported && e.core->ipc_token != 0) impl_->exported.erase(e.core->ipc_token);
  impl_->events.erase(it);
  impl::bump(impl_->count.events_destroyed);
}

std::error_code device::record_event(native_event event, native_stream stream) noexcept {
  impl::bump(impl_->count.event_records);
  std::lock_guard lock(impl_->mutex);
  event_state* e = nullptr;
  stream_state* s = nullptr;
  if (auto ec = impl_->find_event(event, e)) return ec;
  if (auto ec = impl_->find_stream(stream, s)) return ec;
  if (e->device != s->device) return make_error_code(errc::device_mismatch);
  if (const auto& ec = impl_->fault_of(s->device)) return ec;
  auto record = std::make_shared<record_state>();
  record->device = s->device;
  record->seq = s->enqueued + 1;
  record->stream = s->weak_from_this();
  e->core->record = record;  // re-recording overwrites; enqueued waits keep the old record
  operation op;
  op.kind = op_kind::record;
  op.record = std::move(record);
  impl_->push(*s, std::move(op));
  return {};
}

std::error_code device::query_event(native_event event) noexcept {
  impl::bump(impl_->count.event_queries);
  std::lock_guard lock(impl_->mutex);
  event_state* e = nullptr;
  if (auto ec = impl_->find_event(event, e)) return ec;
  if (const auto& ec = impl_->fault_of(e->device)) return ec;
  const auto& record = e->core->record;
  return (!record || record->done) ? std::error_code{} : not_ready();
}

std::error_code device::synchronize_event(native_event event) noexcept {
  std::unique_lock lock(impl_->mutex);
  event_state* e = nullptr;
  if (auto ec = impl_->find_event(event, e)) return ec;
  if (tl_host_func_owner == impl_.get()) return make_error_code(errc::called_from_host_func);
  const int dev = e->device;
  // Waits for the record current now; a re-record meanwhile does not move the goal.
  const std::shared_ptr<record_state> record = e->core->record;
  for (;;) {
    if (const auto& ec = impl_->fault_of(dev)) return ec;
    if (!record || record->done) return {};
    if (impl_->threaded()) {
      impl_->progress.wait(lock);
      continue;
    }
    if (auto s = record->stream.lock(); s && impl_->run_one(lock, *s)) continue;
    if (!impl_->manual_wait_or_give_up(lock)) return would_deadlock();
  }
}

std::error_code device::elapsed_ms(native_event start, native_event end, float& ms) noexcept {
  ms = 0.0f;
  std::lock_guard lock(impl_->mutex);
  event_state* a = nullptr;
  event_state* b = nullptr;
  if (auto ec = impl_->find_event(start, a)) return ec;
  if (auto ec = impl_->find_event(end, b)) return ec;
  if (const auto& ec = impl_->fault_of(a->device)) return ec;
  if (const auto& ec = impl_->fault_of(b->device)) return ec;
  if (!has_flag(a->flags, event_flags::timing) || !has_flag(b->flags, event_flags::timing)) {
    return make_error_code(errc::timing_disabled);
  }
  if (a->device != b->device) return make_error_code(errc::device_mismatch);
  const auto& ra = a->core->record;
  const auto& rb = b->core->record;
  if (!ra || !rb) return make_error_code(errc::event_never_recorded);
  if (!ra->done || !rb->done) return not_ready();
  ms = std::chrono::duration<float, std::milli>(rb->done_at - ra->done_at).count();
  return {};
}

// Handle layout: magic (8 bytes), sim::device instance id (8), token (8), pid (4), zeros.
std::error_code device::export_event(native_event event, ipc_event_handle& out) noexcept {
  out = {};
  std::lock_guard lock(impl_->mutex);
  event_state* e = nullptr;
  if (auto ec = impl_->find_event(event, e)) return ec;
  if (const auto& ec = impl_->fault_of(e->device)) return ec;
  // What cudaIpcGetEventHandle reports for an event made without cudaEventInterprocess.
  if (!has_flag(e->flags, event_flags::interprocess)) return bad_handle();
  if (e->core->ipc_token == 0) {
    e->core->ipc_token = impl_->next_ipc_token++;
    impl_->exported.emplace(e->core->ipc_token, e->core);
  }
  const std::uint64_t token = e->core->ipc_token;
  const std::int32_t pid = static_cast<std::int32_t>(::getpid());
  std::memcpy(out.bytes, ipc_magic, 8);
  std::memcpy(out.bytes + 8, &impl_->instance_id, 8);
  std::memcpy(out.bytes + 16, &token, 8);
  std::memcpy(out.bytes + 24, &pid, 4);
  return {};
}

std::error_code device::import_event(const ipc_event_handle& handle, native_event& out) noexcept {
  out = nullptr;
  std::uint64_t instance = 0;
  std::uint64_t token = 0;
  std::memcpy(&instance, handle.bytes + 8, 8);
  std::memcpy(&token, handle.bytes + 16, 8);
  if (std::memcmp(handle.bytes, ipc_magic, 8) != 0 || instance != impl_->instance_id) {
    return make_error_code(errc::invalid_ipc_handle);
  }
  std::lock_guard lock(impl_->mutex);
  auto it = impl_->exported.find(token);
  if (it == impl_->exported.end()) return make_error_code(errc::invalid_ipc_handle);
  const std::shared_ptr<event_core>& core = it->second;
  if (const auto& ec = impl_->fault_of(core->device)) return ec;
  auto e = std::make_unique<event_state>();
  e->device = core->device;
  e->flags = event_flags::interprocess;  // an imported event behaves as non-timing
  e->imported = true;
  e->core = core;
  out = e.get();
  impl_->events.emplace(out, std::move(e));
  impl::bump(impl_->count.events_created);
  return {};
}

// --- backend: streams --------------------------------------------------------------------------
std::error_code device::create_stream(int device, int priority, native_stream& out) noexcept {
  out = nullptr;
  impl_->reap();
  std::lock_guard lock(impl_->mutex);
  if (auto ec = impl_->check_device(device)) return ec;
  if (const auto& ec = impl_->fault_of(device)) return ec;
  auto s = std::make_shared<stream_state>();
  s->id = impl_->next_stream_id++;
  s->device = device;
  s->priority = std::clamp(priority, greatest_priority, least_priority);
  if (impl_->threaded()) {
    try {
      // The worker starts by taking the mutex, held here: it sees the stream fully set up.
      s->worker = std::thread([this, raw = s.get()] { impl_->worker_main(*raw); });
    } catch (const std::system_error& e) {
      return e.code();
    }
  }
  out = s.get();
  impl_->streams.emplace(out, std::move(s));
  return {};
}

void device::destroy_stream(native_stream stream) noexcept {
  {
    std::lock_guard lock(impl_->mutex);
    auto it = impl_->streams.find(stream);
    if (it == impl_->streams.end()) return;
    std::shared_ptr<stream_state> s = std::move(it->second);
    impl_->streams.erase(it);
    // Enqueued work still runs (cudaStreamDestroy does not wait and does not cancel).
    s->retired = true;
    impl_->kick(*s);
    impl_->retired.push_back(std::move(s));
  }
  impl_->reap();
}

std::error_code device::stream_device(native_stream stream, int& device) noexcept {
  std::lock_guard lock(impl_->mutex);
  stream_state* s = nullptr;
  if (auto ec = impl_->find_stream(stream, s)) return ec;
  device = s->device;
  return {};
}

std::error_code device::stream_priority(native_stream stream, int& priority) noexcept {
  std::lock_guard lock(impl_->mutex);
  stream_state* s = nullptr;
  if (auto ec = impl_->find_stream(stream, s)) return ec;
  priority = s->priority;
  return {};
}

std::error_code device::query_stream(native_stream stream) noexcept {
  impl::bump(impl_->count.stream_queries);
  std::lock_guard lock(impl_->mutex);
  stream_state* s = nullptr;
  if (auto ec = impl_->find_stream(stream, s)) return ec;
  if (const auto& ec = impl_->fault_of(s->device)) return ec;
  return (s->queue.empty() && !s->busy) ? std::error_code{} : not_ready();
}

std::error_code device::synchronize_stream(native_stream stream) noexcept {
  std::unique_lock lock(impl_->mutex);
  stream_state* raw = nullptr;
  if (auto ec = impl_->find_stream(stream, raw)) return ec;
  if (tl_host_func_owner == impl_.get()) return make_error_code(errc::called_from_host_func);
  std::shared_ptr<stream_state> s = raw->shared_from_this();  // survives a destroy meanwhile
  for (;;) {
    if (const auto& ec = impl_->fault_of(s->device)) return ec;
    if (s->queue.empty() && !s->busy) return {};
    if (impl_->threaded()) {
      impl_->progress.wait(lock);
      continue;
    }
    if (impl_->run_one(lock, *s)) continue;
    if (!impl_->manual_wait_or_give_up(lock)) return would_deadlock();
  }
}

std::error_code device::stream_wait_event(native_stream stream, native_event event) noexcept {
  std::lock_guard lock(impl_->mutex);
  stream_state* s = nullptr;
  event_state* e = nullptr;
  if (auto ec = impl_->find_stream(stream, s)) return ec;
  if (auto ec = impl_->find_event(event, e)) return ec;
  if (const auto& ec = impl_->fault_of(s->device)) return ec;
  // Waiting on a never-recorded event is a no-op (CUDA); otherwise the wait captures the current
  // record, which a later re-record does not change. Cross-device waits are allowed, as in CUDA.
  if (!e->core->record) return {};
  operation op;
  op.kind = op_kind::wait;
  op.record = e->core->record;
  impl_->push(*s, std::move(op));
  return {};
}

std::error_code device::launch_host_func(native_stream stream, void (*fn)(void*),
                                         void* arg) noexcept {
  if (fn == nullptr) return make_error_code(errc::invalid_argument);
  operation op;
  op.kind = op_kind::host_func;
  op.fn = fn;
  op.arg = arg;
  auto ec = impl_->launch(stream, std::move(op));
  if (!ec) impl::bump(impl_->count.host_funcs_launched);
  return ec;
}

// --- backend: fences ---------------------------------------------------------------------------
std::error_code device::allocate_fence_block(int device, std::size_t words,
                                             fence_block& out) noexcept {
  out = {};
  constexpr std::size_t line = fence_block::stride_words * sizeof(std::uint64_t);  // 64 bytes
  if (words == 0 || words > SIZE_MAX / line) return make_error_code(errc::invalid_argument);
  std::lock_guard lock(impl_->mutex);
  if (auto ec = impl_->check_device(device)) return ec;
  if (const auto& ec = impl_->fault_of(device)) return ec;
  const std::size_t bytes = words * line;
  void* p = std::aligned_alloc(line, bytes);
  if (p == nullptr) return make_cuda_error(2);  // cudaErrorMemoryAllocation
  std::memset(p, 0, bytes);
  impl_->fence_blocks.emplace(reinterpret_cast<std::uintptr_t>(p), bytes);
  out.host = static_cast<std::uint64_t*>(p);
  out.device_address = reinterpret_cast<std::uintptr_t>(p);  // the sim maps host memory 1:1
  out.words = words;
  out.allocation = p;
  return {};
}

void device::free_fence_block(fence_block& block) noexcept {
  if (block.allocation == nullptr) return;
  {
    // Unregistered under the lock: a fence write still queued then never lands in freed memory.
    std::lock_guard lock(impl_->mutex);
    impl_->fence_blocks.erase(reinterpret_cast<std::uintptr_t>(block.allocation));
  }
  std::free(block.allocation);
  block = {};
}

std::error_code device::write_fence(native_stream stream, std::uint64_t device_address,
                                    std::uint64_t value) noexcept {
  std::lock_guard lock(impl_->mutex);
  stream_state* s = nullptr;
  if (auto ec = impl_->find_stream(stream, s)) return ec;
  if (const auto& ec = impl_->fault_of(s->device)) return ec;
  // Only words of a live fence block: a bad address is a bug to report, not memory to scribble.
  if (!impl_->fence_address_valid(static_cast<std::uintptr_t>(device_address))) {
    return make_error_code(errc::invalid_argument);
  }
  operation op;
  op.kind = op_kind::fence;
  op.word = reinterpret_cast<std::uint64_t*>(static_cast<std::uintptr_t>(device_address));
  op.value = value;
  impl_->push(*s, std::move(op));
  impl::bump(impl_->count.fence_writes_enqueued);
  return {};
}

// --- backend: threads --------------------------------------------------------------------------
std::error_code device::set_current_device(int device) noexcept {
  if (auto ec = impl_->check_device(device)) return ec;  // devices.size() is constant: no lock
  tl_current_device = device;
  return {};
}

std::error_code device::current_device(int& device) noexcept {
  device = tl_current_device;
  if (impl_->devices.empty()) return make_error_code(errc::no_device);
  return {};
}

void device::prepare_polling_thread() noexcept {}

bool device::in_host_func() const noexcept { return tl_host_func_owner == impl_.get(); }

}  // namespace evr::sim
