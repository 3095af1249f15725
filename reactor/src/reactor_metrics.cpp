// reactor/src/reactor_metrics.cpp — the reactor's counters and latency histograms as
// reactor_metrics, and the reactor thread's CPU clock.
#include <evr/reactor/metrics.hpp>

#if defined(__linux__)
#include <time.h>
#endif

#include "counters.hpp"
#include "reactor_core.hpp"

namespace evr {

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

reactor_metrics reactor_counters::snapshot() const noexcept {
  reactor_metrics r;
  auto get = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  r.submitted = get(submitted);
  r.completed = get(completed);
  r.cancelled = get(cancelled);
  r.failed = get(failed);
  r.rejected = get(rejected);
  r.detached = get(detached);
  const std::uint64_t finished = r.completed + r.cancelled + r.failed + r.detached;
  r.in_flight = r.submitted > finished ? r.submitted - finished : 0;
  r.sweeps = get(sweeps);
  r.event_queries = get(event_queries);
  r.stream_queries = get(stream_queries);
  r.doorbells = get(doorbells);
  r.parks = get(parks);
  r.device_faults = get(device_faults);
  r.prediction_misses = get(prediction_misses);
  r.busy_time = std::chrono::nanoseconds(static_cast<std::int64_t>(get(busy_ns)));
  r.host_passes = get(host_passes);
  r.host_completions = get(host_completions);
  for (int i = 0; i < latency_histogram::buckets; ++i) {
    const auto b = static_cast<std::size_t>(i);
    r.detect_to_deliver.counts[b] = get(detect_to_deliver[b]);
    r.submit_to_deliver.counts[b] = get(submit_to_deliver[b]);
    r.nap_overshoot.counts[b] = get(nap_overshoot[b]);
    r.fault_probe_time.counts[b] = get(fault_probe_time[b]);
  }
  return r;
}

reactor_metrics reactor_core::metrics() const noexcept {
  reactor_metrics r = counters_.snapshot();
  r.wakeups = wake_->wakeups();
  r.streams = submitter_.stream_count();
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

}  // namespace detail
}  // namespace evr
