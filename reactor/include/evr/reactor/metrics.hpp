// evr/reactor/metrics.hpp — a snapshot of what a reactor did.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>

namespace evr {

/// Power-of-two latency buckets: bucket i counts samples in [2^i, 2^(i+1)) nanoseconds
/// (bucket 0 also holds 0 and 1 ns).
struct latency_histogram {
  static constexpr int buckets = 40;            ///< up to 2^40 ns (about 18 minutes)
  std::array<std::uint64_t, buckets> counts{};  ///< samples per bucket
  std::uint64_t total() const noexcept;         ///< the number of samples
  /// Upper bound (ns) of the bucket holding quantile q in [0,1]; 0 when empty.
  std::uint64_t quantile_upper_ns(double q) const noexcept;
};

/// Counters are cumulative since the reactor started. Read with reactor::metrics(); each field is
/// read atomically but the snapshot as a whole is not (fields may be a few operations apart).
struct reactor_metrics {
  std::uint64_t submitted = 0;  ///< waits accepted by the reactor thread
  std::uint64_t completed = 0;  ///< waits completed with success
  std::uint64_t cancelled = 0;  ///< waits completed with operation_aborted (cancel or shutdown)
  std::uint64_t failed = 0;     ///< waits completed with a device error
  std::uint64_t rejected = 0;   ///< waits refused at submission (stopped reactor, bad input)
  /// waits handed back unrun because their execution context shut down (reactor_service)
  std::uint64_t detached = 0;
  std::uint64_t in_flight = 0;       ///< submitted - (completed + cancelled + failed + detached)
  std::uint64_t sweeps = 0;          ///< passes over the pending streams
  std::uint64_t event_queries = 0;   ///< event queries (driver calls), on any thread
  std::uint64_t stream_queries = 0;  ///< fault probes
  std::uint64_t doorbells = 0;       ///< host-function doorbells armed (adaptive)
  std::uint64_t parks = 0;           ///< times the thread slept (timed or indefinite)
  std::uint64_t wakeups = 0;         ///< times a submission or host function woke a sleeping thread
  std::uint64_t streams = 0;         ///< distinct streams known
  std::uint64_t device_faults = 0;   ///< sticky faults seen (each device counted once)
  /// idle_mode::predictive: times a stream's oldest wait outlived the window its model predicted
  /// (the work got longer, or is irregular beyond what was seen); each counts once.
  std::uint64_t prediction_misses = 0;
  /// idle_mode::predictive: looks at a stream of long steady work before its window (scouts,
  /// which find work that suddenly got much shorter). A scout is best effort: a reactor napping
  /// for other streams makes it at its next wake-up.
  std::uint64_t scout_looks = 0;
  std::uint64_t scout_finds = 0;  ///< scouts that found their stream's work done
  /// Time the reactor spent in the passes that delivered at least one completion, from before
  /// their sweep to after their delivery: its own work of finding, retiring and handing over
  /// completions, without the polling and sleeping between them (cpu_time() counts those too).
  /// busy_time / completions is the reactor's cost per completion under load.
  std::chrono::nanoseconds busy_time{0};
  /// Passes run on the threads that completions are delivered to, near a predicted completion
  /// (delivery::post to an io_context: the last hop). The reactor thread sleeps through such
  /// windows.
  std::uint64_t host_passes = 0;
  /// The completions those passes found.
  std::uint64_t host_completions = 0;
  /// Those passes that delivered what they had found before looking at all their due streams,
  /// leaving the rest to the next pass (reactor_options::host_pass_deliver_after).
  std::uint64_t host_passes_cut = 0;
  /// Those passes that took submitted waits into the reactor's timelines (waits submitted on a
  /// host's thread are taken by its next look, without waking the reactor thread).
  std::uint64_t host_intakes = 0;
  /// The part of event_queries those passes made (the rest are the reactor thread's): who pays
  /// for the driver queries of event markers.
  std::uint64_t host_event_queries = 0;
  /// Times the reactor thread, wanting a pass, found a host's pass running past a short spin
  /// and waited on the lock until that pass ended: mostly asleep in the kernel, and then the
  /// host's end of pass wakes it (a system call on the host's thread); a pass that ends during
  /// the last tries is counted too.
  std::uint64_t pass_lock_sleeps = 0;
  /// Time from the sweep that saw a wait done to its handler being posted / run inline.
  latency_histogram detect_to_deliver;
  /// Time from submission to the handler being posted / run inline (includes GPU time).
  latency_histogram submit_to_deliver;
  /// How late the reactor's timed sleeps ended (woken by the clock, not by a submission or a
  /// doorbell): the host's share of a late completion while the reactor slept.
  latency_histogram nap_overshoot;
  /// How long each fault probe (a stream query: a driver call) took.
  latency_histogram fault_probe_time;
};

}  // namespace evr
