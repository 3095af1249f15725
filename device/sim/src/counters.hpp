// The call counters of a simulated device (sim::call_counters, read with device::counters()).
//
// Thread safety: relaxed atomics, bumped from any thread; statistics only, nothing is ordered by
// them. Each sits on its own cache line: they are bumped by different parties (submitting
// threads, the reactor's queries, the workers), which would otherwise fight over one line.
#pragma once

#include <atomic>
#include <cstdint>

#include <evr/sim/device.hpp>

namespace evr::sim::detail {

struct alignas(64) counter {
  std::atomic<std::uint64_t> value{0};
  void bump() noexcept { value.fetch_add(1, std::memory_order_relaxed); }
  std::uint64_t get() const noexcept { return value.load(std::memory_order_relaxed); }
  void reset() noexcept { value.store(0, std::memory_order_relaxed); }
};

struct counters {
  counter event_queries, stream_queries, event_records, host_funcs_launched, host_funcs_run,
      fence_writes_enqueued, fence_kernels_enqueued, fence_kernel_loads, fence_writes_landed,
      events_created, events_destroyed;

  call_counters read() const noexcept {
    return call_counters{
        .event_queries = event_queries.get(),
        .stream_queries = stream_queries.get(),
        .event_records = event_records.get(),
        .host_funcs_launched = host_funcs_launched.get(),
        .host_funcs_run = host_funcs_run.get(),
        .fence_writes_enqueued = fence_writes_enqueued.get(),
        .fence_kernels_enqueued = fence_kernels_enqueued.get(),
        .fence_kernel_loads = fence_kernel_loads.get(),
        .fence_writes_landed = fence_writes_landed.get(),
        .events_created = events_created.get(),
        .events_destroyed = events_destroyed.get(),
    };
  }
  void reset() noexcept {
    for (counter* c :
         {&event_queries, &stream_queries, &event_records, &host_funcs_launched, &host_funcs_run,
          &fence_writes_enqueued, &fence_kernels_enqueued, &fence_kernel_loads,
          &fence_writes_landed, &events_created, &events_destroyed}) {
      c->reset();
    }
  }
};

}  // namespace evr::sim::detail
