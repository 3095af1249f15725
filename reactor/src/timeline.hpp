// reactor/src/timeline.hpp — one stream's pending waits in marker order (under the pass lock).
//
// A growing ring (ring.hpp): it never shrinks, so a steady state allocates nothing. Entries are
// values: a cancelled wait leaves a "ghost" entry (op == nullptr) behind that still holds its
// marker event until the GPU is past it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

#include <evr/device/backend.hpp>
#include <evr/reactor/detail/ring.hpp>
#include <evr/reactor/detail/wait_op.hpp>

namespace evr::detail {

/// 32 bytes: the pool an event goes back to is its stream's (stream_state::marker_pool).
struct timeline_entry {
  std::uint64_t seq = 0;
  device::native_event event = nullptr;  // pooled marker (poll, fence overflow), else nullptr
  wait_op* op = nullptr;                 // nullptr: cancelled, kept only for its marker
  poll_host* host = nullptr;             // op->host_, copied by timeline::insert (front_host)

  /// A device-signalled wait: no marker on the stream, its own word says when it is done. Never
  /// a ghost (a cancelled one leaves the timeline: it has no marker to keep).
  bool is_signal() const noexcept { return op != nullptr && op->signalled_; }
  /// The fence write this entry put on the stream (fence strategies), if any.
  bool is_fence() const noexcept { return event == nullptr && !is_signal(); }
};

/// Whether the signal a device-signalled wait waits for has come (acquire: what the kernel
/// wrote before it is visible).
inline bool signal_arrived(const wait_op& op) noexcept {
  return std::atomic_ref<const std::uint64_t>(*op.signal_word()).load(std::memory_order_acquire) >=
         op.signal_value_;
}

class timeline {
 public:
  std::size_t size() const noexcept { return entries_.size(); }
  bool empty() const noexcept { return entries_.empty(); }
  const timeline_entry& at(std::size_t i) const noexcept { return entries_.at(i); }
  const timeline_entry& front() const noexcept { return entries_.front(); }
  /// The host of the oldest entry's wait (nullptr: none, a ghost, or a wait without one). Kept
  /// beside the ring's indices: the reactor's sweep asks it of every covered stream, and reading
  /// it from the entry and the operation cost two cache lines that the io threads had written
  /// (docs/notebook.md, "The reactor's top frame on two io threads").
  poll_host* front_host() const noexcept { return front_host_; }
  void pop_front() noexcept {
    entries_.pop_front();
    refresh_front_host();
  }
  /// Removes entry `i` (a cancelled device-signalled wait), keeping the order of the others.
  void erase(std::size_t i) noexcept {
    entries_.erase(i);
    if (i == 0) refresh_front_host();
  }
  /// Entry `i`'s wait was cancelled: the entry stays only for its marker.
  void make_ghost(std::size_t i) noexcept {
    entries_.at(i).op = nullptr;
    entries_.at(i).host = nullptr;
    if (i == 0) front_host_ = nullptr;
  }
  /// Inserts keeping seq order. Waits of one stream usually arrive in order (O(1)); two threads
  /// submitting to one stream can swap neighbours, which the short walk from the back fixes.
  /// The entry's host is its wait's (the caller's `e.host` is ignored).
  void insert(timeline_entry e) {
    e.host = e.op != nullptr ? e.op->host_ : nullptr;
    entries_.push_back(e);
    std::size_t i = entries_.size() - 1;
    for (; i > 0 && at(i - 1).seq > e.seq; --i) std::swap(entries_.at(i - 1), entries_.at(i));
    if (i == 0) front_host_ = e.host;
  }
  /// Index of the entry with `seq`, or size() if none (binary search: entries are sorted).
  std::size_t find(std::uint64_t seq) const noexcept {
    std::size_t lo = 0, hi = size();
    while (lo < hi) {
      std::size_t mid = (lo + hi) / 2;
      if (at(mid).seq < seq)
        lo = mid + 1;
      else
        hi = mid;
    }
    return (lo < size() && at(lo).seq == seq) ? lo : size();
  }

 private:
  void refresh_front_host() noexcept { front_host_ = empty() ? nullptr : front().host; }

  ring<timeline_entry> entries_;
  poll_host* front_host_ = nullptr;  // = front().host, or nullptr when empty
};

}  // namespace evr::detail
