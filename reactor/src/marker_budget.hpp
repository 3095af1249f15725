// reactor/src/marker_budget.hpp — fence / adaptive: which marker a new wait gets, a fence write or
// a pooled event record (reactor_options::max_pending_fences and max_fence_streams say why), from
// per-device counts that submitters raise and the registry lowers when markers retire.
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
  /// are queued on its device (the next enqueue would block in the driver), or more of the
  /// device's streams are busy (markers pending, this one included) than it has hardware queues.
  bool wants_event(const stream_state& st) const noexcept {
    const std::int64_t busy = busy_streams_[st.device].load(std::memory_order_relaxed) +
                              (st.pending_markers.load(std::memory_order_relaxed) == 0 ? 1 : 0);
    return pending_fences_[st.device].load(std::memory_order_relaxed) >= max_pending_fences_ ||
           busy > stream_limit_;
  }
  /// A marker of `st` was enqueued (a fence write when `fence`, else an event record).
  void enqueued(stream_state& st, bool fence) noexcept {
    if (fence) pending_fences_[st.device].fetch_add(1, std::memory_order_relaxed);
    if (st.pending_markers.fetch_add(1, std::memory_order_relaxed) == 0)
      busy_streams_[st.device].fetch_add(1, std::memory_order_relaxed);
  }
  /// `count` markers of `st` retired, `fences` of them fence writes. A stream counts as busy
  /// while its pending_markers is non-zero: whoever moves it from 0 to 1 adds, whoever moves it
  /// from `count` to 0 subtracts.
  void retired(stream_state& st, std::int64_t count, std::int64_t fences) noexcept {
    if (fences > 0) pending_fences_[st.device].fetch_sub(fences, std::memory_order_relaxed);
    if (st.pending_markers.fetch_sub(count, std::memory_order_relaxed) == count)
      busy_streams_[st.device].fetch_sub(1, std::memory_order_relaxed);
  }

 private:
  std::array<std::atomic<std::int64_t>, pool_set::max_devices> pending_fences_{};
  std::array<std::atomic<std::int64_t>, pool_set::max_devices> busy_streams_{};
  std::int64_t max_pending_fences_;
  std::int64_t stream_limit_ = 0;
};

}  // namespace evr::detail
