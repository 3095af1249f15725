// reactor/src/marker_budget.hpp — fence / adaptive: which marker a new wait gets, a fence write or
// a pooled event record (reactor_options::max_pending_fences and max_fence_streams say why), from
// per-device counts: fence writes pending (submitters raise it, the registry lowers it when they
// retire) and streams with waits (raised when a stream's state is made).
//
// Thread safety: any thread. Relaxed atomics: the counts are thresholds, not a synchronization.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>

#include <evr/device/backend.hpp>
#include <evr/pool/pool_set.hpp>
#include <evr/reactor/options.hpp>

#include "stream_state.hpp"

namespace evr::detail {

class marker_budget {
 public:
  marker_budget(device::backend& backend, const reactor_options& o) noexcept
      : max_pending_fences_(static_cast<std::int64_t>(o.max_pending_fences)) {
    // 0: the device's hardware queues (the backend knows; 0 there too means no limit).
    const std::size_t limit =
        o.max_fence_streams != 0 ? o.max_fence_streams : backend.hardware_queues();
    stream_limit_ = limit == 0 ? std::numeric_limits<std::int64_t>::max()
                               : static_cast<std::int64_t>(std::min<std::size_t>(
                                     limit, std::numeric_limits<std::int64_t>::max()));
  }

  /// Whether a new wait on `st` records an event instead of a fence write: too many fence writes
  /// are queued on its device (the next enqueue would block in the driver), or the device has
  /// more streams with waits than hardware queues. Not only the busy ones: the driver gives each
  /// stream its queue when the stream is made (round robin), so with more streams than queues
  /// two of them may share one whichever are busy, and a burst makes them busy together. H100,
  /// 16 streams in lockstep, 8 queues, when the first 8 busy streams took fences: every stream's
  /// work was held up behind another's (p99 374 us with 5 ms work, 1.5 ms with 20 ms; 16 and
  /// 106 us with 32 queues).
  bool wants_event(const stream_state& st) const noexcept {
    return pending_fences_[st.device].load(std::memory_order_relaxed) >= max_pending_fences_ ||
           known_streams_[st.device].load(std::memory_order_relaxed) > stream_limit_;
  }
  /// A stream of `device` got its first wait (its state was made).
  void stream_known(int device) noexcept {
    known_streams_[device].fetch_add(1, std::memory_order_relaxed);
  }
  /// A fence write was enqueued on `st`'s device.
  void fence_enqueued(const stream_state& st) noexcept {
    pending_fences_[st.device].fetch_add(1, std::memory_order_relaxed);
  }
  /// `fences` fence writes of `st`'s device retired.
  void fences_retired(const stream_state& st, std::int64_t fences) noexcept {
    if (fences > 0) pending_fences_[st.device].fetch_sub(fences, std::memory_order_relaxed);
  }

 private:
  std::array<std::atomic<std::int64_t>, pool_set::max_devices> pending_fences_{};
  std::array<std::atomic<std::int64_t>, pool_set::max_devices> known_streams_{};
  std::int64_t max_pending_fences_;
  std::int64_t stream_limit_ = 0;
};

}  // namespace evr::detail
