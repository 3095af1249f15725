// reactor/src/counters.hpp — the reactor's statistics: cumulative counters and latency histograms,
// bumped by the parts as they work, read by reactor::metrics() from any thread (snapshot()).
//
// Relaxed atomics: statistics, read racily. Every counter but `rejected` (submitters) is written
// under the pass lock only (the reactor thread, or a host's pass), with bump(): a plain add and a
// relaxed store, no locked read-modify-write on the hot path.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>

#include <evr/reactor/metrics.hpp>

namespace evr::detail {

using histogram_counts = std::array<std::atomic<std::uint64_t>, latency_histogram::buckets>;

struct reactor_counters {
  std::atomic<std::uint64_t> submitted{0}, completed{0}, cancelled{0}, failed{0}, rejected{0},
      sweeps{0}, event_queries{0}, stream_queries{0}, doorbells{0}, parks{0}, device_faults{0},
      prediction_misses{0}, detached{0}, busy_ns{0}, host_passes{0}, host_completions{0},
      host_intakes{0}, host_event_queries{0}, host_passes_cut{0}, scout_looks{0}, scout_finds{0},
      pass_lock_sleeps{0};
  histogram_counts detect_to_deliver{}, submit_to_deliver{}, nap_overshoot{}, fault_probe_time{};

  /// Any thread: the counters now (`wakeups` and `streams` are not counted here: the caller's).
  reactor_metrics snapshot() const noexcept;
};

/// Adds `n` to a counter that only the holder of the pass lock writes: a plain add published
/// with a relaxed store, readable from any thread with a relaxed load. Not for shared counters.
inline void bump(std::atomic<std::uint64_t>& c, std::uint64_t n = 1) noexcept {
  c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

/// Adds one sample to a latency histogram written only under the pass lock (bump).
inline void add_sample(histogram_counts& h, std::chrono::nanoseconds d) noexcept {
  const auto ns = static_cast<std::uint64_t>(std::max<std::int64_t>(d.count(), 1));
  const int bucket = std::min<int>(latency_histogram::buckets - 1, std::bit_width(ns) - 1);
  bump(h[static_cast<std::size_t>(bucket)]);
}

}  // namespace evr::detail
