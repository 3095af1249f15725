// reactor/src/marker_budget.hpp — fence / adaptive: which marker a new wait gets, a fence write, a
// fence word written by evr's fence kernel, or a pooled event record
// (reactor_options::max_pending_fences, max_fence_streams and kernel_fences say why), from
// per-device counts: fences pending (submitters raise it, the registry lowers it when they retire)
// and streams with waits (raised when a stream's state is made).
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

/// The marker a new wait of a fence strategy gets.
enum class fence_marker { write, kernel, event };

class marker_budget {
 public:
  marker_budget(device::backend& backend, const reactor_options& o) noexcept
      : backend_(backend),
        max_pending_fences_(static_cast<std::int64_t>(o.max_pending_fences)),
        kernel_fences_(o.kernel_fences) {
    // 0: the device's hardware queues (the backend knows; 0 there too means no limit).
    const std::size_t limit =
        o.max_fence_streams != 0 ? o.max_fence_streams : backend.hardware_queues();
    stream_limit_ = limit == 0 ? std::numeric_limits<std::int64_t>::max()
                               : static_cast<std::int64_t>(std::min<std::size_t>(
                                     limit, std::numeric_limits<std::int64_t>::max()));
  }

  /// The marker for a new wait on `st`:
  ///  * an event when too many fences are queued on its device (the next enqueue would block in
  ///    the driver);
  ///  * past the stream limit, when the device has more streams with waits than hardware queues,
  ///    the fence kernel where it is loaded (kernel_fences: the reactor's constructor and
  ///    reactor::prepare_device load it; a wait never does), else an event. Not only the
  ///    busy streams count: the driver gives each stream its queue when the stream is made (round
  ///    robin), so with more streams than queues two of them may share one whichever are busy,
  ///    and a burst makes them busy together. H100, 16 streams in lockstep, 8 queues, when the
  ///    first 8 busy streams took fence writes: every stream's work was held up behind another's
  ///    (p99 374 us with 5 ms work, 1.5 ms with 20 ms; 16 and 106 us with 32 queues);
  ///  * else a fence write.
  fence_marker choose(const stream_state& st) const noexcept {
    if (pending_fences_[st.device].load(std::memory_order_relaxed) >= max_pending_fences_)
      return fence_marker::event;
    if (known_streams_[st.device].load(std::memory_order_relaxed) <= stream_limit_)
      return fence_marker::write;
    if (!kernel_fences_) return fence_marker::event;
    return backend_.fence_kernels(st.device) ? fence_marker::kernel : fence_marker::event;
  }
  /// A stream of `device` got its first wait (its state was made).
  void stream_known(int device) noexcept {
    known_streams_[device].fetch_add(1, std::memory_order_relaxed);
  }
  /// A fence (a write or the fence kernel) was enqueued on `st`'s device.
  void fence_enqueued(const stream_state& st) noexcept {
    pending_fences_[st.device].fetch_add(1, std::memory_order_relaxed);
  }
  /// `fences` fences of `st`'s device retired.
  void fences_retired(const stream_state& st, std::int64_t fences) noexcept {
    if (fences > 0) pending_fences_[st.device].fetch_sub(fences, std::memory_order_relaxed);
  }

 private:
  std::array<std::atomic<std::int64_t>, pool_set::max_devices> pending_fences_{};
  std::array<std::atomic<std::int64_t>, pool_set::max_devices> known_streams_{};
  device::backend& backend_;
  std::int64_t max_pending_fences_;
  bool kernel_fences_;
  std::int64_t stream_limit_ = 0;
};

}  // namespace evr::detail
