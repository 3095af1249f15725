// reactor/src/reactor.cpp — evr::reactor (the facade over reactor_core), the detail:: entry points
// of the in-repo front ends, and the names and checks of the options. reactor_core.hpp lists the
// core's parts; docs/architecture.md has the design.
#include <evr/reactor/reactor.hpp>

#include <atomic>
#include <stdexcept>
#include <string>

#include "reactor_core.hpp"
#include "strategy_traits.hpp"

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
  non_negative(o.host_pass_deliver_after, "host_pass_deliver_after");
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

/// Whether waits of a reactor with `o` may get the fence kernel: kernel_fences, and a strategy
/// whose markers are fence words (poll and host_func never use them).
bool uses_fence_kernels(const reactor_options& o) {
  return o.kernel_fences && detail::strategy_traits::of(o.strategy).fence_markers;
}

/// Signal slots are waited on by the strategies whose sweep reads fence words.
bool serves_signal_slots(const reactor_options& o) {
  return detail::strategy_traits::of(o.strategy).fence_markers;
}

/// The device's first batch of signal slots, made now, and the signal kernel loaded (the batch
/// loads it on CUDA, but cannot report a failed load), so that taking a slot later neither
/// allocates nor loads. A backend without signal slots: nothing to make.
std::error_code make_first_signal_slots(device::backend& backend, pool_set& pools,
                                        int device) noexcept {
  std::error_code ec;
  signal_pool* signals = pools.signals(device, ec);
  if (signals != nullptr) signals->reserve(1, ec);
  if (ec == errc::unsupported) return {};
  if (!ec) ec = backend.load_signal_kernel(device);
  return ec;
}

/// With kernel_fences: loads the fence kernel on the devices the process already uses, here,
/// where the program chose to make a reactor, so that no wait ever loads it (a load waits for the
/// device's running kernels and holds up other threads' CUDA calls meanwhile). A device that
/// cannot run it (compute capability below 9.0) keeps recording events past the stream limit.
void load_fence_kernels_for_devices_in_use(device::backend& backend, const reactor_options& o) {
  if (!uses_fence_kernels(o) || backend.in_host_func())
    return;  // in one, the load would wait on it
  for (const int d : backend.devices_in_use()) (void)backend.load_fence_kernels(d);
}

}  // namespace

namespace detail {

bool cancel_wait(reactor_core* core, wait_op* op) noexcept {
  // The core is touched only after the CAS won, i.e. while `op` was pending and therefore while
  // the reactor thread (which holds a reference to the core) is still running.
  if (!control_inbox::request_cancel(op)) return false;
  core->push_cancel(op);
  return true;
}

std::vector<wait_op*> detach_group(reactor_core& core, std::uintptr_t group) {
  return core.detach_group(group);
}

poll_result poll_here(reactor_core& core, poll_host& host) noexcept { return core.poll_here(host); }

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
  load_fence_kernels_for_devices_in_use(backend, options);
  core_->start();
}

std::error_code reactor::prepare_device(int device) noexcept {
  device::backend& backend = core_->backend();
  int count = 0;
  if (auto ec = backend.device_count(count)) return ec;
  if (device < 0 || device >= count) return make_error_code(errc::no_device);
  const bool signals = serves_signal_slots(core_->options());
  const bool fence_kernels = uses_fence_kernels(core_->options());
  if (!signals && !fence_kernels) return {};
  // From a host function a load or an allocation would wait for the stream work that includes it.
  if (backend.in_host_func()) return make_error_code(errc::called_from_host_func);
  std::error_code ec;
  if (signals) ec = make_first_signal_slots(backend, core_->pools(), device);
  if (fence_kernels) {
    const std::error_code loaded = backend.load_fence_kernels(device);
    if (!ec) ec = loaded;
  }
  return ec;
}

reactor::~reactor() { core_->stop(/*destroying=*/true); }

std::error_code reactor::submit(detail::wait_op* op, const wait_target& target) noexcept {
  return core_->submit(op, target);
}
void reactor::cancel(detail::wait_op* op) noexcept { detail::cancel_wait(core_.get(), op); }
void reactor::cancel_owner(std::uintptr_t owner) noexcept { core_->cancel_owner(owner); }

std::uintptr_t reactor::new_owner_id() noexcept {
  // Relaxed: only uniqueness matters, which the read-modify-write gives in any order.
  static std::atomic<std::uintptr_t> last{0};
  return last.fetch_add(1, std::memory_order_relaxed) + 1;
}
void reactor::stop() noexcept { core_->stop(/*destroying=*/false); }
reactor_metrics reactor::metrics() const noexcept { return core_->metrics(); }
std::chrono::nanoseconds reactor::cpu_time() const noexcept { return core_->cpu_time(); }
const reactor_options& reactor::options() const noexcept { return core_->options(); }
device::backend& reactor::backend() const noexcept { return core_->backend(); }
pool_set& reactor::pools() noexcept { return core_->pools(); }
bool reactor::running_in_this_thread() const noexcept { return core_->on_reactor_thread(); }

}  // namespace evr
