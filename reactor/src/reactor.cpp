// reactor/src/reactor.cpp — submit → timeline → sweep → deliver. See reactor.hpp and
// docs/architecture.md for the design; comments here say why each step is as it is.
#include <evr/reactor/reactor.hpp>

#include <algorithm>
#include <bit>
#include <cstdio>

#if defined(__linux__)
#include <pthread.h>
#include <sys/prctl.h>
#include <time.h>
#endif

#include <asio/error.hpp>

#include "reactor_core.hpp"

namespace evr {

const char* to_string(strategy s) noexcept {
  switch (s) {
    case strategy::poll: return "poll";
    case strategy::fence: return "fence";
    case strategy::host_func: return "host_func";
    case strategy::adaptive: return "adaptive";
  }
  return "?";
}

std::uint64_t latency_histogram::total() const noexcept {
  std::uint64_t t = 0;
  for (auto c : counts) t += c;
  return t;
}

std::uint64_t latency_histogram::quantile_upper_ns(double q) const noexcept {
  const std::uint64_t n = total();
  if (n == 0) return 0;
  const auto rank = static_cast<std::uint64_t>(q * static_cast<double>(n - 1)) + 1;
  std::uint64_t seen = 0;
  for (int i = 0; i < buckets; ++i) {
    seen += counts[i];
    if (seen >= rank) return std::uint64_t{2} << i;
  }
  return std::uint64_t{1} << buckets;
}

namespace detail {
namespace {

constexpr std::uintptr_t per_thread_stream = 0x2;  // cudaStreamPerThread
constexpr std::uintptr_t legacy_stream = 0x1;      // cudaStreamLegacy

bool is_legacy_default(device::native_stream s) {
  return s == nullptr || reinterpret_cast<std::uintptr_t>(s) == legacy_stream;
}

void add_sample(std::array<std::atomic<std::uint64_t>, latency_histogram::buckets>& h,
                std::chrono::nanoseconds d) {
  const auto ns = static_cast<std::uint64_t>(std::max<std::int64_t>(d.count(), 1));
  const int bucket = std::min<int>(latency_histogram::buckets - 1, std::bit_width(ns) - 1);
  h[bucket].fetch_add(1, std::memory_order_relaxed);
}

std::uint64_t load_fence(const std::uint64_t* word) {
  // acquire: pairs with the device's write; what the GPU wrote before the fence is visible.
  return std::atomic_ref<std::uint64_t>(*const_cast<std::uint64_t*>(word))
      .load(std::memory_order_acquire);
}

}  // namespace

reactor_core::reactor_core(device::backend& backend, reactor_options options)
    : backend_(backend),
      options_(options),
      pools_(backend,
             pool_options{.initial = 0, .batch = std::max<std::size_t>(1, options.pool_batch)}),
      streams_(options.max_streams),
      fences_(backend) {
  if (backend_.device_count(device_count_)) device_count_ = 0;
  ready_.reserve(256);
  to_release_.reserve(256);
  active_.reserve(64);
}

reactor_core::~reactor_core() {
  release_events();  // normally empty: every pass releases what it retired
  // The thread has ended (joined, or it is this thread finishing a self-stop). Events the GPU
  // may never reach were kept out of the pools; destroy them now (CUDA frees a recorded event
  // once it completes).
  for (auto& [pool, ev] : abandoned_) pool->discard_native(ev);
  if (aborted_fences_) fences_.leak_on_destruction();
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

void reactor_core::start() {
  thread_ = std::thread([self = shared_from_this()]() mutable { self->run(std::move(self)); });
  // The thread publishes its id itself; wait so that on_reactor_thread() is exact from now on.
  while (thread_id_.load(std::memory_order_acquire) == std::thread::id{}) std::this_thread::yield();
}

// ------------------------------------------------------------------------------------------------
// submit side (any thread)

std::error_code reactor_core::find_stream(const wait_target& target, stream_state*& out) noexcept {
  const int key_device = [&] {
    if (!is_legacy_default(target.native)) return -1;
    int d = 0;
    return backend_.current_device(d) ? 0 : d;
  }();
  if (stream_state* s = streams_.find(target.native, key_device)) {
    out = s;
    return {};
  }
  // First wait on this stream: build its state here, on the submitting thread.
  auto fresh = std::make_unique<stream_state>();
  fresh->native = target.native;
  fresh->key_device = key_device;
  fresh->wake = wake_;
  if (key_device >= 0) {
    fresh->device = key_device;
  } else if (auto ec = backend_.stream_device(target.native, fresh->device)) {
    return ec;
  }
  if (fresh->device < 0 || fresh->device >= max_devices) return make_error_code(errc::no_device);
  if (options_.strategy == strategy::fence || options_.strategy == strategy::adaptive) {
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
  const bool fences =
      options_.strategy == strategy::fence || options_.strategy == strategy::adaptive;
  // Too many fence markers queued on this device: record an event instead (see
  // reactor_options::max_pending_fences); the enqueue would otherwise block in the driver.
  const bool overflow = fences && pending_fences_[st.device].load(std::memory_order_relaxed) >=
                                      static_cast<std::int64_t>(options_.max_pending_fences);
  if (options_.strategy == strategy::poll || overflow) {
    std::error_code ec;
    pool = pools_.get(st.device, event_class::plain, ec);
    if (ec) return ec;
    ev = pool->acquire_native(ec);
    if (ec) return ec;
  }
  std::error_code ec;
  st.lock_markers();
  const std::uint64_t seq = ++st.next_seq_;
  switch (options_.strategy) {
    case strategy::poll: ec = backend_.record_event(ev, st.native); break;
    case strategy::fence:
    case strategy::adaptive:
      if (ev != nullptr) {
        ec = backend_.record_event(ev, st.native);
      } else {
        ec = backend_.write_fence(st.native, st.fence_device, seq);
        if (!ec) pending_fences_[st.device].fetch_add(1, std::memory_order_relaxed);
      }
      break;
    case strategy::host_func:
      st.host_funcs_outstanding.fetch_add(1, std::memory_order_relaxed);
      ec = backend_.launch_host_func(st.native, &reactor_core::host_func_done, &st);
      if (ec) st.host_funcs_outstanding.fetch_sub(1, std::memory_order_relaxed);
      break;
  }
  if (ec) --st.next_seq_;  // no marker went on the stream: keep sequence numbers contiguous
  st.unlock_markers();
  if (ec) {
    if (pool != nullptr) pool->release_native(ev);  // never recorded: safe to reuse
    return ec;
  }
  op.seq_ = seq;
  op.event_ = ev;
  op.event_pool_ = pool;
  op.device_ = st.device;
  op.stream_ = &st;
  return {};
}

std::error_code reactor_core::submit(wait_op* op, const wait_target& target) noexcept {
  auto refuse = [this](std::error_code ec) {
    m_.rejected.fetch_add(1, std::memory_order_relaxed);
    return ec;
  };
  if (op == nullptr) return refuse(make_error_code(errc::invalid_argument));
  if (stopping_.load(std::memory_order_acquire))
    return refuse(make_error_code(errc::reactor_stopped));
  if (target.backend == nullptr) return refuse(make_error_code(errc::empty_handle));
  if (target.backend != &backend_) return refuse(make_error_code(errc::backend_mismatch));
  if (backend_.in_host_func()) return refuse(make_error_code(errc::called_from_host_func));
  op->state_.store(wait_op::pending, std::memory_order_relaxed);
  op->phase_ = wait_op::phase::queued;
  op->submitted_at_ = clock::now();
  op->stream_ = nullptr;
  op->event_pool_ = nullptr;

  if (target.what == wait_target::kind::event) {
    if (target.never_recorded) return refuse(make_error_code(errc::event_never_recorded));
    if (target.native == nullptr) return refuse(make_error_code(errc::empty_handle));
    op->event_ = target.native;
    op->device_ = target.device;
    if (op->device_ < 0 && backend_.current_device(op->device_)) op->device_ = 0;
    if (op->device_ >= max_devices) return refuse(make_error_code(errc::no_device));
  } else {
    if (reinterpret_cast<std::uintptr_t>(target.native) == per_thread_stream) {
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

  switch (submissions_.push(op)) {
    case intrusive_stack<wait_op, &wait_op::next_>::push_result::pushed_to_empty:
      // Only the push that makes the stack non-empty pays for a wake-up, and only of a parked
      // reactor (a napping one picks the wait up when its nap ends).
      wake_->wake_for_submission();
      return {};
    case intrusive_stack<wait_op, &wait_op::next_>::push_result::pushed: return {};
    case intrusive_stack<wait_op, &wait_op::next_>::push_result::closed: break;
  }
  // The reactor closed between our check and the push. The marker is on the stream: its event
  // must not be reused before the GPU passes it, so destroy it (CUDA defers the free).
  if (op->event_pool_ != nullptr) op->event_pool_->discard_native(op->event_);
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

void reactor_core::cancel(wait_op* op) noexcept {
  std::uint32_t expected = wait_op::pending;
  // acq_rel: exactly one of {this CAS, the reactor's exchange to done} wins.
  if (!op->state_.compare_exchange_strong(expected, wait_op::cancel_requested,
                                          std::memory_order_acq_rel, std::memory_order_acquire)) {
    return;  // already completed or already being cancelled: cancelling twice is harmless
  }
  // From here the reactor will not free `op` until it has seen this request.
  if (cancels_.push(op) ==
      intrusive_stack<wait_op, &wait_op::cancel_next_>::push_result::pushed_to_empty)
    wake_->wake_urgent();
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

void reactor_core::stop(bool destroying) noexcept {
  stopping_.store(true, std::memory_order_seq_cst);
  wake_->wake_urgent();
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

reactor_metrics reactor_core::metrics() const noexcept {
  reactor_metrics r;
  auto get = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  r.submitted = get(m_.submitted);
  r.completed = get(m_.completed);
  r.cancelled = get(m_.cancelled);
  r.failed = get(m_.failed);
  r.rejected = get(m_.rejected);
  const std::uint64_t finished = r.completed + r.cancelled + r.failed;
  r.in_flight = r.submitted > finished ? r.submitted - finished : 0;
  r.sweeps = get(m_.sweeps);
  r.event_queries = get(m_.event_queries);
  r.stream_queries = get(m_.stream_queries);
  r.doorbells = get(m_.doorbells);
  r.parks = get(m_.parks);
  r.wakeups = wake_->wakeups();
  r.streams = streams_.size();
  r.device_faults = get(m_.device_faults);
  for (int i = 0; i < latency_histogram::buckets; ++i) {
    r.detect_to_deliver.counts[i] = get(m_.detect_to_deliver[i]);
    r.submit_to_deliver.counts[i] = get(m_.submit_to_deliver[i]);
  }
  return r;
}

std::chrono::nanoseconds reactor_core::cpu_time() const noexcept {
#if defined(__linux__)
  // Only while the thread lives: a thread CPU clock id is invalid once the thread has ended.
  if (cpu_clock_valid_.load(std::memory_order_acquire) &&
      thread_id_.load(std::memory_order_acquire) != std::thread::id{}) {
    timespec ts{};
    if (clock_gettime(static_cast<clockid_t>(cpu_clock_id_), &ts) == 0)
      return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
  }
#endif
  return std::chrono::nanoseconds(0);
}

// ------------------------------------------------------------------------------------------------
// reactor thread

void reactor_core::run(std::shared_ptr<reactor_core> self) {
#if defined(__linux__)
  // Naps of 10 us must not turn into 60 us: Linux adds 50 us of timer slack to every sleep of a
  // normal thread by default.
  (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
  clockid_t cid;
  if (pthread_getcpuclockid(pthread_self(), &cid) == 0) {
    cpu_clock_id_ = static_cast<std::uint64_t>(cid);
    cpu_clock_valid_.store(true, std::memory_order_release);
  }
#endif
  thread_id_.store(std::this_thread::get_id(), std::memory_order_release);
  backend_.prepare_polling_thread();  // relaxed capture mode: never invalidate a user's capture
  last_progress_ = clock::now();
  for (;;) {
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
    bool progress = take_reported_faults();  // retired or cancelled: what resets the idle ladder
    if (!active_.empty() || !loose_.empty()) progress |= sweep(now);
    progress |= !ready_.empty();
    deliver_batch(now);
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
  thread_id_.store(std::thread::id{}, std::memory_order_release);
  (void)self;  // dropping the last reference (self-stop case) frees the core on this thread
}

bool reactor_core::has_inputs() const noexcept {
  if (!submissions_.empty_or_closed() || !cancels_.empty_or_closed()) return true;
  if (owner_cancel_pending_.load(std::memory_order_seq_cst)) return true;
  if (fault_reported_.load(std::memory_order_seq_cst)) return true;
  if (stopping_.load(std::memory_order_seq_cst) && !closed_) return true;
  for (stream_state* st : active_)
    if (st->doorbell_rang.load(std::memory_order_seq_cst)) return true;
  if (options_.strategy == strategy::host_func) {
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
  wait_op* subs = closed_ ? nullptr : submissions_.take_all();
  bool any = cancels != nullptr || !owners.empty() || subs != nullptr;
  for (wait_op* op = subs; op != nullptr;) {
    wait_op* next = op->next_;
    accept(op, now);
    op = next;
  }
  for (wait_op* op = cancels; op != nullptr;) {
    wait_op* next = op->cancel_next_;
    handle_cancel(op);
    op = next;
  }
  for (std::uintptr_t owner : owners) handle_owner_cancel(owner);
  return any;
}

void reactor_core::accept(wait_op* op, clock::time_point now) {
  m_.submitted.fetch_add(1, std::memory_order_relaxed);
  ++pending_ops_;
  op->phase_ = wait_op::phase::pending;
  if (op->device_ >= 0 && device_fault_[op->device_]) {
    // The device is dead: nothing will ever complete there. Its event is kept out of the pool
    // and destroyed with the reactor, off this thread (cudaEventDestroy may block).
    if (op->stream_ != nullptr && op->event_pool_ != nullptr)
      abandoned_.emplace_back(op->event_pool_, op->event_);
    op->event_pool_ = nullptr;
    retire_op(op, device_fault_[op->device_]);
    return;
  }
  stream_state* st = op->stream_;
  if (st == nullptr) {
    loose_.push_back(op);
    return;
  }
  st->entries.insert(timeline_entry{op->seq_, op->event_, op->event_pool_, op});
  if (!st->active) {
    st->active = true;
    st->waiting_since = now;
    st->last_probe = now;
    st->doorbell_armed = false;
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
      ready_.emplace_back(op, asio::error::operation_aborted);
      break;
    }
    case wait_op::phase::retired_awaiting_cancel:
      --awaiting_cancel_;
      ready_.emplace_back(op, asio::error::operation_aborted);
      break;
    case wait_op::phase::queued:
      // Cannot happen: take_inputs accepts submissions before handling cancels, and a cancel is
      // only pushed for a submitted wait. Complete it anyway rather than lose it.
      std::fprintf(stderr, "evr: internal: cancel of a wait the reactor has not seen\n");
      ready_.emplace_back(op, asio::error::operation_aborted);
      break;
  }
}

void reactor_core::handle_owner_cancel(std::uintptr_t owner) {
  auto abort_if_owned = [&](wait_op* op) {
    if (op == nullptr || op->owner_ != owner) return false;
    std::uint32_t prev = op->state_.exchange(wait_op::done, std::memory_order_acq_rel);
    if (prev == wait_op::cancel_requested) {
      // A per-operation cancel is in flight and will deliver; wait for it.
      op->phase_ = wait_op::phase::retired_awaiting_cancel;
      ++awaiting_cancel_;
    } else {
      ready_.emplace_back(op, asio::error::operation_aborted);
    }
    --pending_ops_;
    return true;
  };
  for (stream_state* st : active_) {
    for (std::size_t i = 0; i < st->entries.size(); ++i) {
      timeline_entry& e = st->entries.at(i);
      if (abort_if_owned(e.op)) e.op = nullptr;  // ghost: the marker stays
    }
  }
  for (std::size_t i = 0; i < loose_.size();) {
    if (abort_if_owned(loose_[i])) {
      loose_[i] = loose_.back();
      loose_.pop_back();
    } else {
      ++i;
    }
  }
}

std::error_code reactor_core::select_device(int device) noexcept {
  if (device == current_device_ || device < 0) return {};
  if (auto ec = backend_.set_current_device(device)) return ec;
  current_device_ = device;
  return {};
}

void reactor_core::retire_op(wait_op* op, std::error_code ec) {
  // acq_rel: the winner of pending→{done, cancel_requested} decides the outcome exactly once.
  std::uint32_t prev = op->state_.exchange(wait_op::done, std::memory_order_acq_rel);
  --pending_ops_;
  if (prev == wait_op::cancel_requested) {
    op->phase_ = wait_op::phase::retired_awaiting_cancel;  // its cancel request delivers it
    ++awaiting_cancel_;
    return;
  }
  ready_.emplace_back(op, ec);
}

void reactor_core::retire_front(stream_state& st, std::error_code ec) {
  timeline_entry e = st.entries.front();
  st.entries.pop_front();
  if (e.event == nullptr && st.fence_host != nullptr)
    pending_fences_[st.device].fetch_sub(1, std::memory_order_relaxed);
  st.completed_seq = std::max(st.completed_seq, e.seq);
  if (e.pool != nullptr) {
    if (!ec) {
      // The GPU is past it: back to the pool, after this sweep's completions are delivered
      // (returning it is not on the latency path).
      to_release_.emplace_back(e.pool, e.event);
    } else {
      // Failed: never reuse it; destroyed with the reactor, off this thread.
      abandoned_.emplace_back(e.pool, e.event);
    }
  }
  if (e.op != nullptr) retire_op(e.op, ec);
}

bool reactor_core::sweep_poll(stream_state& st) {
  // Oldest first: a pending stream costs one cheap query (~0.17 us on the H100).
  auto query = [&](std::size_t i) {
    m_.event_queries.fetch_add(1, std::memory_order_relaxed);
    return backend_.query_event(st.entries.at(i).event);
  };
  std::error_code ec = query(0);
  if (is_not_ready(ec)) return false;
  if (ec) {
    if (is_sticky(ec)) {
      fail_device(st.device, ec);
    } else {
      retire_front(st, ec);  // this event alone is broken (e.g. destroyed handle)
    }
    return true;
  }
  // The oldest is done. If the newest is done too, everything is (events of one stream complete
  // in record order, and seq order is record order): one more query retires the whole timeline.
  std::size_t n = st.entries.size();
  std::size_t done_through = 0;  // index of the newest entry known done
  if (n > 1) {
    std::error_code last = query(n - 1);
    if (!last) {
      done_through = n - 1;
    } else if (!is_not_ready(last)) {
      done_through = 0;  // handled on the next sweep, from the front, one at a time
    } else {
      // Bisect between a done entry (lo) and a pending one (hi).
      std::size_t lo = 0, hi = n - 1;
      while (hi - lo > 1) {
        std::size_t mid = lo + (hi - lo) / 2;
        std::error_code m = query(mid);
        if (!m) {
          lo = mid;
        } else if (is_not_ready(m)) {
          hi = mid;
        } else {
          break;  // an error: retire what is known done; the next sweep meets the error first
        }
      }
      done_through = lo;
    }
  }
  for (std::size_t i = 0; i <= done_through; ++i) retire_front(st, {});
  return true;
}

bool reactor_core::sweep_word(stream_state& st, std::uint64_t word) {
  bool progress = false;
  while (!st.entries.empty() && st.entries.front().seq <= word) {
    retire_front(st, {});
    progress = true;
  }
  return progress;
}

bool reactor_core::sweep_event_front(stream_state& st) {
  // Overflow markers are events among fence entries: the word cannot vouch for an event entry at
  // the front until a later fence lands, so query it (one at a time: this is the rare path).
  bool progress = false;
  while (!st.entries.empty() && st.entries.front().event != nullptr) {
    m_.event_queries.fetch_add(1, std::memory_order_relaxed);
    std::error_code ec = backend_.query_event(st.entries.front().event);
    if (is_not_ready(ec)) break;
    if (ec && is_sticky(ec)) {
      fail_device(st.device, ec);
      return true;
    }
    retire_front(st, ec);
    progress = true;
  }
  return progress;
}

bool reactor_core::probe(stream_state& st, clock::time_point now) {
  if (now - st.last_probe < options_.fault_probe_interval) return false;
  st.last_probe = now;
  m_.stream_queries.fetch_add(1, std::memory_order_relaxed);
  std::error_code ec = backend_.query_stream(st.native);
  if (is_not_ready(ec)) return false;
  if (ec) {
    if (is_sticky(ec))
      fail_device(st.device, ec);
    else
      fail_stream(st, ec);
    return true;
  }
  // The stream is idle: every marker enqueued before this query has executed, which includes
  // every entry (the reactor accepted each after its marker was enqueued). A word that still lags
  // would mean a lost write; complete the waits rather than hang them.
  bool progress = !st.entries.empty();
  while (!st.entries.empty()) retire_front(st, {});
  return progress;
}

void reactor_core::arm_doorbell(stream_state& st) {
  if (backend_.stream_is_capturing(st.native)) return;  // never add work to a user's capture
  st.host_funcs_outstanding.fetch_add(1, std::memory_order_relaxed);
  st.doorbell_rang.store(false, std::memory_order_relaxed);
  std::error_code ec = backend_.launch_host_func(st.native, &reactor_core::doorbell_rang, &st);
  if (ec) {
    st.host_funcs_outstanding.fetch_sub(1, std::memory_order_relaxed);
    if (is_sticky(ec)) fail_device(st.device, ec);
    st.doorbell_armed = true;  // do not retry every sweep; the fault probe covers this stream
    return;
  }
  st.doorbell_armed = true;
  m_.doorbells.fetch_add(1, std::memory_order_relaxed);
}

bool reactor_core::sweep_loose() {
  bool progress = false;
  std::size_t budget = std::min(options_.loose_query_budget, loose_.size());
  for (std::size_t n = 0; n < budget && !loose_.empty(); ++n) {
    if (loose_cursor_ >= loose_.size()) loose_cursor_ = 0;
    wait_op* op = loose_[loose_cursor_];
    if (auto ec = select_device(op->device_)) {
      loose_[loose_cursor_] = loose_.back();
      loose_.pop_back();
      retire_op(op, ec);
      progress = true;
      continue;
    }
    m_.event_queries.fetch_add(1, std::memory_order_relaxed);
    std::error_code ec = backend_.query_event(op->event_);
    if (is_not_ready(ec)) {
      ++loose_cursor_;
      continue;
    }
    progress = true;
    // Even a sticky error fails only this wait: the device a user's event belongs to is the one
    // the user named, which may be wrong; the device's own streams report their fault through
    // their own queries and probes.
    loose_[loose_cursor_] = loose_.back();
    loose_.pop_back();
    retire_op(op, ec);
  }
  return progress;
}

bool reactor_core::sweep(clock::time_point now) {
  m_.sweeps.fetch_add(1, std::memory_order_relaxed);
  bool progress = false;
  for (std::size_t i = 0; i < active_.size(); ++i) {
    stream_state& st = *active_[i];
    if (st.entries.empty()) continue;
    if (device_fault_[st.device]) {
      fail_stream(st, device_fault_[st.device]);
      progress = true;
      continue;
    }
    if (auto ec = select_device(st.device)) {
      fail_stream(st, ec);
      progress = true;
      continue;
    }
    bool moved = false;
    switch (options_.strategy) {
      case strategy::poll: moved = sweep_poll(st); break;
      case strategy::fence:
      case strategy::adaptive:
        moved = sweep_word(st, load_fence(st.fence_host));
        moved |= sweep_event_front(st);
        break;
      case strategy::host_func:
        moved = sweep_word(st, st.host_done.load(std::memory_order_acquire));
        break;
    }
    if (options_.strategy != strategy::poll && !moved) moved = probe(st, now);
    if (moved) {
      st.waiting_since = now;
      st.doorbell_armed = false;
      st.doorbell_rang.store(false, std::memory_order_relaxed);
    } else if (options_.strategy == strategy::adaptive && !st.doorbell_armed &&
               now - st.waiting_since >= options_.doorbell_after) {
      arm_doorbell(st);
    }
    progress |= moved;
  }
  // Drop streams with nothing left (swap-remove keeps this O(active)).
  for (std::size_t i = 0; i < active_.size();) {
    if (active_[i]->entries.empty()) {
      active_[i]->active = false;
      active_[i] = active_.back();
      active_.pop_back();
    } else {
      ++i;
    }
  }
  if (!loose_.empty()) progress |= sweep_loose();
  return progress;
}

void reactor_core::fail_stream(stream_state& st, std::error_code ec) {
  while (!st.entries.empty()) retire_front(st, ec);
}

void reactor_core::fail_device(int device, std::error_code ec) {
  if (device < 0 || device >= max_devices) return;
  if (!device_fault_[device]) m_.device_faults.fetch_add(1, std::memory_order_relaxed);
  device_fault_[device] = ec;
  for (stream_state* st : active_)
    if (st->device == device) fail_stream(*st, ec);
  for (std::size_t i = 0; i < loose_.size();) {
    if (loose_[i]->device_ == device) {
      wait_op* op = loose_[i];
      loose_[i] = loose_.back();
      loose_.pop_back();
      retire_op(op, ec);
    } else {
      ++i;
    }
  }
}

void reactor_core::abort_everything() {
  for (stream_state* st : active_) {
    while (!st->entries.empty()) {
      timeline_entry e = st->entries.front();
      st->entries.pop_front();
      // The GPU may not be past the marker: keep pooled events out of the pool for good.
      if (e.pool != nullptr) abandoned_.emplace_back(e.pool, e.event);
      if (e.event == nullptr && st->fence_host != nullptr) {
        aborted_fences_ = true;
        pending_fences_[st->device].fetch_sub(1, std::memory_order_relaxed);
      }
      if (e.op != nullptr) retire_op(e.op, asio::error::operation_aborted);
    }
    st->active = false;
  }
  active_.clear();
  for (wait_op* op : loose_) retire_op(op, asio::error::operation_aborted);
  loose_.clear();
}

void reactor_core::deliver_batch(clock::time_point detected) {
  if (ready_.empty()) {
    release_events();
    return;
  }
  // Inline handlers may call submit/cancel/stop: those only push onto the stacks, never onto
  // ready_, so the batch cannot change under this loop. clear() keeps the capacity (no
  // allocation in steady state).
  const clock::time_point now = clock::now();
  for (auto [op, ec] : ready_) {
    if (!ec) {
      m_.completed.fetch_add(1, std::memory_order_relaxed);
    } else if (ec == asio::error::operation_aborted) {
      m_.cancelled.fetch_add(1, std::memory_order_relaxed);
    } else {
      m_.failed.fetch_add(1, std::memory_order_relaxed);
    }
    add_sample(m_.detect_to_deliver, now - detected);
    add_sample(m_.submit_to_deliver, now - op->submitted_at_);
    op->complete(ec);  // frees op; may run a user handler (inline delivery)
  }
  ready_.clear();
  release_events();
}

void reactor_core::release_events() {
  for (auto& [pool, ev] : to_release_) pool->release_native(ev);
  to_release_.clear();
}

void reactor_core::idle(clock::time_point now, bool progress, bool took_new) {
  if (progress) {
    last_progress_ = now;
    sleep_step_ = std::chrono::microseconds(10);
    return;
  }
  // New waits while others pend: nap in short steps again, without going back to spinning (a
  // burst of submissions behind long GPU work must not keep the reactor busy).
  if (took_new) sleep_step_ = std::chrono::microseconds(10);
  auto has_work = [this] { return has_inputs(); };
  const bool nothing_pending = active_.empty() && loose_.empty() && pending_ops_ == 0;
  if (nothing_pending && !closed_) {
    m_.parks.fetch_add(1, std::memory_order_relaxed);
    wake_->sleep(wakeup::parked, {}, has_work);  // idle: zero wake-ups until a submission
    last_progress_ = clock::now();
    sleep_step_ = std::chrono::microseconds(10);
    return;
  }
  const auto quiet = now - last_progress_;
  if (options_.strategy != strategy::host_func) {
    if (quiet < options_.spin_window) return;  // busy-poll: lowest latency
    if (quiet < options_.spin_window + options_.yield_window) {
      std::this_thread::yield();
      return;
    }
  }
  std::chrono::nanoseconds nap = sleep_step_;
  bool all_doorbells =
      options_.strategy == strategy::adaptive && !active_.empty() && loose_.empty();
  if (all_doorbells)
    for (stream_state* st : active_) all_doorbells = all_doorbells && st->doorbell_armed;
  if (options_.strategy == strategy::host_func || all_doorbells) {
    nap = options_.fault_probe_interval;  // a host function wakes us; the timer is the probe
  } else {
    sleep_step_ = std::min<std::chrono::nanoseconds>(sleep_step_ * 2, options_.max_sleep);
  }
  if (closed_) nap = std::min<std::chrono::nanoseconds>(nap, std::chrono::milliseconds(1));
  m_.parks.fetch_add(1, std::memory_order_relaxed);
  wake_->sleep(wakeup::napping, nap, has_work);
}

}  // namespace detail

// ------------------------------------------------------------------------------------------------
// evr::reactor

reactor::reactor() : reactor(device::cuda_backend()) {}

reactor::reactor(device::backend& backend, reactor_options options)
    : core_(std::make_shared<detail::reactor_core>(backend, options)) {
  core_->start();
}

reactor::~reactor() { core_->stop(/*destroying=*/true); }

std::error_code reactor::submit(wait_op* op, const wait_target& target) noexcept {
  return core_->submit(op, target);
}
void reactor::cancel(wait_op* op) noexcept { core_->cancel(op); }
void reactor::cancel_owner(std::uintptr_t owner) noexcept { core_->cancel_owner(owner); }
void reactor::stop() noexcept { core_->stop(/*destroying=*/false); }
reactor_metrics reactor::metrics() const noexcept { return core_->metrics(); }
std::chrono::nanoseconds reactor::cpu_time() const noexcept { return core_->cpu_time(); }
const reactor_options& reactor::options() const noexcept { return core_->options_; }
device::backend& reactor::backend() const noexcept { return core_->backend_; }
pool_set& reactor::pools() noexcept { return core_->pools_; }
bool reactor::running_in_this_thread() const noexcept { return core_->on_reactor_thread(); }

}  // namespace evr
