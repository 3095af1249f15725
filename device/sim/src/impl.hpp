// sim::device::impl — everything one simulated device owns: its options, one fault state per
// simulated GPU, the handle tables, the call counters and the scheduler. The member functions of
// sim::device are spread over device.cpp (construction, identity), controls.cpp (what tests
// drive: kernels, faults, stalls, stepping, counters) and backend.cpp (evr::device::backend).
//
// Thread safety: see each part. `opts`, `instance_id` and the number of GPUs never change.
// Lifetime: members are destroyed in reverse order; the device's destructor first stops and joins
// every worker (scheduler::stop_all), so nothing runs while the rest goes away.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <system_error>

#include <evr/sim/device.hpp>

#include "counters.hpp"
#include "model.hpp"
#include "registry.hpp"
#include "scheduler.hpp"

namespace evr::sim {

struct device::impl {
  explicit impl(options o)
      : opts(o),
        instance_id(next_instance_id().fetch_add(1, std::memory_order_relaxed)),
        gpus(static_cast<std::size_t>(std::max(o.devices, 0))),
        faults(std::make_unique<detail::fault_state[]>(gpus)),
        fence_kernel_ready(std::make_unique<std::atomic<bool>[]>(gpus)),
        sched(o.mode, faults.get(), reg, count) {}

  const options opts;
  const std::uint64_t instance_id;  ///< distinguishes sim::device objects in IPC handles
  const std::size_t gpus;
  const std::unique_ptr<detail::fault_state[]> faults;
  /// Per device: load_fence_kernels was called (options::fence_kernels_after_load).
  const std::unique_ptr<std::atomic<bool>[]> fence_kernel_ready;
  detail::registry reg;
  detail::counters count;
  detail::scheduler sched;

  bool threaded() const noexcept { return opts.mode == run_mode::threaded; }

  /// A query's modelled cost (options::query_cost): spins, as a driver call costs the caller's
  /// CPU, not a sleep.
  void spend_query_cost() const noexcept {
    if (opts.query_cost.count() == 0) return;
    const auto until = std::chrono::steady_clock::now() + opts.query_cost;
    while (std::chrono::steady_clock::now() < until) {
    }
  }

  std::error_code check_device(int index) const noexcept {
    if (index < 0 || static_cast<std::size_t>(index) >= gpus) {
      return make_error_code(errc::no_device);
    }
    return {};
  }
  /// The sticky fault of a valid device index, or {}.
  std::error_code fault_of(int index) const noexcept {
    return faults[static_cast<std::size_t>(index)].get();
  }
  /// What both fence calls enqueue on `s`: `value` written to the fence word at `device_address`
  /// once the work before it is done (backend.cpp).
  std::error_code enqueue_fence(const std::shared_ptr<detail::stream_state>& s,
                                std::uint64_t device_address, std::uint64_t value);
  /// Faults `index` now (the first fault sticks) and runs the fault barrier.
  void fault_now(int index, std::error_code f) {
    faults[static_cast<std::size_t>(index)].set(f);
    sched.after_fault(index);
  }

 private:
  static std::atomic<std::uint64_t>& next_instance_id() noexcept {
    static std::atomic<std::uint64_t> next{1};
    return next;
  }
};

}  // namespace evr::sim
