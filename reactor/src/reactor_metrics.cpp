// reactor/src/reactor_metrics.cpp — the reactor's counters and latency histograms as
// reactor_metrics, and the reactor thread's CPU clock.
#include <evr/reactor/metrics.hpp>

#include <utility>

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
  using counter = std::atomic<std::uint64_t> reactor_counters::*;
  using histogram = histogram_counts reactor_counters::*;
  static constexpr std::pair<counter, std::uint64_t reactor_metrics::*> counters[] = {
      {&reactor_counters::submitted, &reactor_metrics::submitted},
      {&reactor_counters::completed, &reactor_metrics::completed},
      {&reactor_counters::cancelled, &reactor_metrics::cancelled},
      {&reactor_counters::failed, &reactor_metrics::failed},
      {&reactor_counters::rejected, &reactor_metrics::rejected},
      {&reactor_counters::detached, &reactor_metrics::detached},
      {&reactor_counters::sweeps, &reactor_metrics::sweeps},
      // host_event_queries before event_queries: a host's pass between the two reads then leaves
      // the part no larger than the whole.
      {&reactor_counters::host_event_queries, &reactor_metrics::host_event_queries},
      {&reactor_counters::event_queries, &reactor_metrics::event_queries},
      {&reactor_counters::stream_queries, &reactor_metrics::stream_queries},
      {&reactor_counters::doorbells, &reactor_metrics::doorbells},
      {&reactor_counters::parks, &reactor_metrics::parks},
      {&reactor_counters::device_faults, &reactor_metrics::device_faults},
      {&reactor_counters::prediction_misses, &reactor_metrics::prediction_misses},
      {&reactor_counters::scout_looks, &reactor_metrics::scout_looks},
      {&reactor_counters::scout_finds, &reactor_metrics::scout_finds},
      {&reactor_counters::host_passes, &reactor_metrics::host_passes},
      {&reactor_counters::host_completions, &reactor_metrics::host_completions},
      {&reactor_counters::host_passes_cut, &reactor_metrics::host_passes_cut},
      {&reactor_counters::host_intakes, &reactor_metrics::host_intakes},
      {&reactor_counters::pass_lock_sleeps, &reactor_metrics::pass_lock_sleeps}};
  static constexpr std::pair<histogram, latency_histogram reactor_metrics::*> histograms[] = {
      {&reactor_counters::detect_to_deliver, &reactor_metrics::detect_to_deliver},
      {&reactor_counters::submit_to_deliver, &reactor_metrics::submit_to_deliver},
      {&reactor_counters::nap_overshoot, &reactor_metrics::nap_overshoot},
      {&reactor_counters::fault_probe_time, &reactor_metrics::fault_probe_time}};
  reactor_metrics r;
  for (const auto& [from, to] : counters) r.*to = (this->*from).load(std::memory_order_relaxed);
  for (const auto& [from, to] : histograms) {
    for (std::size_t i = 0; i < latency_histogram::buckets; ++i)
      (r.*to).counts[i] = (this->*from)[i].load(std::memory_order_relaxed);
  }
  const std::uint64_t finished = r.completed + r.cancelled + r.failed + r.detached;
  r.in_flight = r.submitted > finished ? r.submitted - finished : 0;
  r.busy_time =
      std::chrono::nanoseconds(static_cast<std::int64_t>(busy_ns.load(std::memory_order_relaxed)));
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
