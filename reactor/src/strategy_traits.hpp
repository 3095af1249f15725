// reactor/src/strategy_traits.hpp — what each evr::strategy means for the reactor's code paths,
// computed once per reactor (no `options.strategy ==` branches scattered through the reactor).
// The idle mode is resolved the same way, with these, in idle_traits (idle_governor.hpp).
#pragma once

#include <evr/reactor/options.hpp>

namespace evr::detail {

struct strategy_traits {
  /// A 64-bit fence write per wait (cuStreamWriteValue64), read by the sweep; past
  /// max_pending_fences on a device, a pooled event record instead. fence, adaptive.
  bool fence_markers = false;
  /// A pooled event record per wait, queried by the sweep (oldest / newest / bisection). poll.
  bool event_markers = false;
  /// A host function per wait that counts and wakes the reactor, so the reactor sleeps until one
  /// runs (or a probe is due), whatever the idle mode. host_func.
  bool host_func_markers = false;
  /// Old waits that the idle policy cannot predict arm a host-function doorbell. adaptive.
  bool doorbells = false;
  /// A faulted stream never writes its fence nor runs its host functions, so a slow stream
  /// query (fault_probe_interval) is the only way to learn of a fault. Everything but poll.
  bool fault_probes = false;

  static constexpr strategy_traits of(strategy s) noexcept {
    strategy_traits t;
    switch (s) {
      case strategy::poll: t.event_markers = true; break;
      case strategy::fence:
        t.fence_markers = true;
        t.fault_probes = true;
        break;
      case strategy::host_func:
        t.host_func_markers = true;
        t.fault_probes = true;
        break;
      case strategy::adaptive:
        t.fence_markers = true;
        t.fault_probes = true;
        t.doorbells = true;
        break;
    }
    return t;
  }
};

}  // namespace evr::detail
