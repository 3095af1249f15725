// reactor/src/reactor_metrics.cpp — the reactor's counters and latency histograms, and the
// reactor thread's CPU clock.
#include <algorithm>
#include <bit>

#if defined(__linux__)
#include <time.h>
#endif

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

reactor_metrics reactor_core::metrics() const noexcept {
  reactor_metrics r;
  auto get = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  r.submitted = get(m_.submitted);
  r.completed = get(m_.completed);
  r.cancelled = get(m_.cancelled);
  r.failed = get(m_.failed);
  r.rejected = get(m_.rejected);
  r.detached = get(m_.detached);
  const std::uint64_t finished = r.completed + r.cancelled + r.failed + r.detached;
  r.in_flight = r.submitted > finished ? r.submitted - finished : 0;
  r.sweeps = get(m_.sweeps);
  r.event_queries = get(m_.event_queries);
  r.stream_queries = get(m_.stream_queries);
  r.doorbells = get(m_.doorbells);
  r.parks = get(m_.parks);
  r.wakeups = wake_->wakeups();
  r.streams = streams_.size();
  r.device_faults = get(m_.device_faults);
  r.prediction_misses = get(m_.prediction_misses);
  r.busy_time = std::chrono::nanoseconds(static_cast<std::int64_t>(get(m_.busy_ns)));
  r.host_passes = get(m_.host_passes);
  r.host_completions = get(m_.host_completions);
  for (int i = 0; i < latency_histogram::buckets; ++i) {
    r.detect_to_deliver.counts[i] = get(m_.detect_to_deliver[i]);
    r.submit_to_deliver.counts[i] = get(m_.submit_to_deliver[i]);
    r.nap_overshoot.counts[i] = get(m_.nap_overshoot[i]);
    r.fault_probe_time.counts[i] = get(m_.fault_probe_time[i]);
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

}  // namespace detail
}  // namespace evr
