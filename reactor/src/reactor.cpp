// reactor/src/reactor.cpp — evr::reactor (the facade), the core's life cycle (construction,
// thread start, stop, destruction) and the names of the options.
//
// The core is split by what it does; each file says why each step is as it is:
//   reactor_submit.cpp  the submitting threads' side: stream lookup, markers, the stacks
//   reactor_loop.cpp    the reactor thread's loop: inputs, acceptance, cancellation, delivery
//   reactor_sweep.cpp   finding how far each stream got, retiring waits, faults
//   reactor_idle.cpp    how the thread waits between sweeps (idle_policy.hpp has the logic)
//   reactor_metrics.cpp counters and histograms
// docs/architecture.md has the design.
#include <evr/reactor/reactor.hpp>

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

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

std::optional<evr::strategy> strategy_from_string(std::string_view name) noexcept {
  for (strategy s : {strategy::poll, strategy::fence, strategy::host_func, strategy::adaptive})
    if (name == to_string(s)) return s;
  return std::nullopt;
}

const char* to_string(idle_mode m) noexcept {
  switch (m) {
    case idle_mode::predictive: return "predictive";
    case idle_mode::ladder: return "ladder";
    case idle_mode::spin: return "spin";
  }
  return "?";
}

std::optional<idle_mode> idle_mode_from_string(std::string_view name) noexcept {
  for (idle_mode m : {idle_mode::predictive, idle_mode::ladder, idle_mode::spin})
    if (name == to_string(m)) return m;
  return std::nullopt;
}

namespace {

/// Refuses options that cannot work, naming the option (std::invalid_argument).
const reactor_options& validated(const reactor_options& o) {
  auto refuse = [](const std::string& what) {
    throw std::invalid_argument("evr::reactor_options: " + what);
  };
  auto non_negative = [&](std::chrono::nanoseconds d, const char* name) {
    if (d.count() < 0)
      refuse(std::string(name) + " must be >= 0, not " + std::to_string(d.count()) + " ns");
  };
  non_negative(o.spin_window, "spin_window");
  non_negative(o.yield_window, "yield_window");
  non_negative(o.max_sleep, "max_sleep");
  non_negative(o.doorbell_after, "doorbell_after");
  non_negative(o.prespin, "prespin");
  non_negative(o.final_sleep, "final_sleep");
  non_negative(o.coalesce, "coalesce");
  non_negative(o.shutdown_drain, "shutdown_drain");
  if (o.poll_period.count() <= 0) refuse("poll_period must be > 0");
  if (o.fault_probe_interval.count() <= 0) refuse("fault_probe_interval must be > 0");
  if (!(o.spin_fraction >= 0.0 && o.spin_fraction <= 1.0))
    refuse("spin_fraction must be in [0, 1], not " + std::to_string(o.spin_fraction));
  if (!(o.poll_budget >= 0.0 && o.poll_budget <= 1.0))
    refuse("poll_budget must be in [0, 1], not " + std::to_string(o.poll_budget));
  if (!strategy_from_string(to_string(o.strategy))) refuse("strategy is not one of evr::strategy");
  if (!idle_mode_from_string(to_string(o.idle))) refuse("idle is not one of evr::idle_mode");
  if (o.max_streams == 0) refuse("max_streams must be >= 1");
  return o;
}

}  // namespace

namespace detail {

reactor_core::reactor_core(device::backend& backend, reactor_options options)
    : backend_(backend),
      options_(options),
      traits_(strategy_traits::of(options.strategy)),
      pools_(backend,
             pool_options{.initial = 0, .batch = std::max<std::size_t>(1, options.pool_batch)}),
      streams_(options.max_streams),
      fences_(backend),
      idle_settings_(idle_settings::from(options)) {
  if (backend_.device_count(device_count_)) device_count_ = 0;
  // 0: the device's hardware queues (the backend knows; 0 there too means no limit).
  const std::size_t limit =
      options_.max_fence_streams != 0 ? options_.max_fence_streams : backend_.hardware_queues();
  fence_stream_limit_ = limit == 0 ? std::numeric_limits<std::int64_t>::max()
                                   : static_cast<std::int64_t>(std::min<std::size_t>(
                                         limit, std::numeric_limits<std::int64_t>::max()));
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

bool cancel_wait(reactor_core* core, wait_op* op) noexcept {
  // The core is touched only after the CAS won, i.e. while `op` was pending and therefore while
  // the reactor thread (which holds a reference to the core) is still running.
  if (!reactor_core::request_cancel(op)) return false;
  core->push_cancel(op);
  return true;
}

std::vector<wait_op*> detach_group(reactor_core& core, std::uintptr_t group) {
  return core.detach_group(group);
}

std::error_code reactor_access::submit_hosted(reactor& r, wait_op* op, const wait_target& target,
                                              host_window& window) noexcept {
  return r.core_->submit(op, target, &window);
}

}  // namespace detail

// ------------------------------------------------------------------------------------------------
// evr::reactor

reactor::reactor() : reactor(device::cuda_backend()) {}

reactor::reactor(device::backend& backend, reactor_options options)
    : core_(std::make_shared<detail::reactor_core>(backend, validated(options))) {
  core_->start();
}

reactor::~reactor() { core_->stop(/*destroying=*/true); }

std::error_code reactor::submit(detail::wait_op* op, const wait_target& target) noexcept {
  return core_->submit(op, target);
}
void reactor::cancel(detail::wait_op* op) noexcept { core_->cancel(op); }
void reactor::cancel_owner(std::uintptr_t owner) noexcept { core_->cancel_owner(owner); }
void reactor::stop() noexcept { core_->stop(/*destroying=*/false); }
reactor_metrics reactor::metrics() const noexcept { return core_->metrics(); }
std::chrono::nanoseconds reactor::cpu_time() const noexcept { return core_->cpu_time(); }
const reactor_options& reactor::options() const noexcept { return core_->options_; }
device::backend& reactor::backend() const noexcept { return core_->backend_; }
pool_set& reactor::pools() noexcept { return core_->pools_; }
bool reactor::running_in_this_thread() const noexcept { return core_->on_reactor_thread(); }

}  // namespace evr
