// reactor/src/stream_sweep.hpp — how far each stream got, by the strategy's markers
// (strategy_traits): event queries with bisection (poll; event markers among fence words), fence
// words, host-function counters, the words of device-signalled waits; the fault probe; the loose
// waits' events.
//
// Owns nothing but its references: what it finds it retires through the wait registry (in stream
// order; a fault fails the stream or the device), which streams it looks at it asks the idle
// governor, and what it saw it reports to it. Its driver calls go through the device scope.
//
// Threads: under the pass lock. sweep() is the reactor thread's (probes and faults stay there);
// look_at() is also a host's pass's, without probes.
#pragma once

#include <chrono>
#include <cstddef>

#include <evr/device/backend.hpp>
#include <evr/reactor/options.hpp>

#include "counters.hpp"
#include "device_scope.hpp"
#include "idle_governor.hpp"
#include "strategy_traits.hpp"
#include "stream_state.hpp"
#include "wait_registry.hpp"

namespace evr::detail {

class stream_sweep {
 public:
  using clock = std::chrono::steady_clock;

  stream_sweep(device::backend& backend, const reactor_options& options,
               const strategy_traits& traits, wait_registry& registry, idle_governor& idle,
               device_scope& devices, reactor_counters& counters) noexcept
      : backend_(backend),
        options_(options),
        traits_(traits),
        registry_(registry),
        idle_(idle),
        devices_(devices),
        counters_(counters) {}

  /// Every active stream the idle governor wants looked at, then the loose waits. True when
  /// something retired or failed.
  bool sweep(clock::time_point now);
  /// Looks at `st` once (its strategy's markers, then a due fault probe when `may_probe`) and
  /// reports it to the idle governor. True when something retired or failed.
  bool look_at(stream_state& st, clock::time_point now, bool may_probe);
  /// Streams left without waits leave the active list.
  void drop_idle_streams();
  /// A host function ran on an active stream since it was looked at (a host_func marker, or a
  /// doorbell): seq_cst, the reactor's last look before it sleeps (wakeup.hpp).
  bool signalled() const noexcept;

 private:
  /// Takes `st`'s rung doorbell (a one-shot wake-up); true when it had rung.
  static bool take_doorbell(stream_state& st) noexcept;
  bool look_at_events(stream_state& st, std::size_t run);
  std::size_t done_in_run(stream_state& st, std::size_t run);
  bool look_at_fences(stream_state& st);
  bool retire_covered(stream_state& st, std::uint64_t word);
  /// Retires the `count` oldest entries, which the stream is past; true when there were any.
  bool retire_passed(stream_state& st, std::size_t count);
  /// Retires the device-signalled waits at the front whose signals came; true when any did.
  bool retire_signalled(stream_state& st);
  bool probe(stream_state& st, clock::time_point now);
  std::error_code query_loose(wait_op* op);

  device::backend& backend_;
  const reactor_options& options_;
  const strategy_traits& traits_;
  wait_registry& registry_;
  idle_governor& idle_;
  device_scope& devices_;
  reactor_counters& counters_;
};

}  // namespace evr::detail
