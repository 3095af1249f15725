// reactor/src/timeline.hpp — one stream's pending waits in marker order (reactor thread only).
//
// A ring buffer that grows by doubling and never shrinks, so a steady state allocates nothing.
// Entries are values: a cancelled wait leaves a "ghost" entry (op == nullptr) behind that still
// holds its marker event until the GPU is past it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <evr/device/backend.hpp>

namespace evr::detail {

class wait_op;

/// 24 bytes: the pool an event goes back to is its stream's (stream_state::marker_pool).
struct timeline_entry {
  std::uint64_t seq = 0;
  device::native_event event = nullptr;  // pooled marker (poll, fence overflow), else nullptr
  wait_op* op = nullptr;                 // nullptr: cancelled, kept only for its marker
};

class timeline {
 public:
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  timeline_entry& at(std::size_t i) noexcept { return buffer_[(head_ + i) & (buffer_.size() - 1)]; }
  const timeline_entry& at(std::size_t i) const noexcept {
    return buffer_[(head_ + i) & (buffer_.size() - 1)];
  }
  timeline_entry& front() noexcept { return at(0); }
  const timeline_entry& front() const noexcept { return at(0); }
  timeline_entry& back() noexcept { return at(size_ - 1); }
  void pop_front() noexcept {
    head_ = (head_ + 1) & (buffer_.size() - 1);
    --size_;
  }

  /// Inserts keeping seq order. Waits of one stream usually arrive in order (O(1)); two threads
  /// submitting to one stream can swap neighbours, which the short walk from the back fixes.
  void insert(const timeline_entry& e) {
    if (size_ == buffer_.size()) grow();
    std::size_t i = size_;
    while (i > 0 && at(i - 1).seq > e.seq) {
      at(i) = at(i - 1);
      --i;
    }
    at(i) = e;
    ++size_;
  }

  /// Index of the entry with `seq`, or size() if none (binary search: entries are sorted).
  std::size_t find(std::uint64_t seq) noexcept {
    std::size_t lo = 0, hi = size_;
    while (lo < hi) {
      std::size_t mid = (lo + hi) / 2;
      if (at(mid).seq < seq)
        lo = mid + 1;
      else
        hi = mid;
    }
    return (lo < size_ && at(lo).seq == seq) ? lo : size_;
  }

 private:
  void grow() {
    std::vector<timeline_entry> bigger(buffer_.empty() ? 16 : buffer_.size() * 2);
    for (std::size_t i = 0; i < size_; ++i) bigger[i] = at(i);
    buffer_ = std::move(bigger);
    head_ = 0;
  }
  std::vector<timeline_entry> buffer_;
  std::size_t head_ = 0;
  std::size_t size_ = 0;
};

}  // namespace evr::detail
