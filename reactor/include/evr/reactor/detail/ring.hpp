// evr/reactor/detail/ring.hpp — the ring buffer of the reactor's timelines (growing) and of the
// last few samples of a measurement (fixed: the oldest is dropped), and the largest of such
// samples. Not public: the reactor (reactor/src/timeline.hpp, idle_policy.hpp) and the poll hosts
// (callbacks/.../io_context_host.hpp) use it.
//
// Thread safety: none (one owner's state).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace evr::detail {

/// Elements in insertion order, indexed from the oldest. `Capacity` 0: grows by doubling from 16
/// and never shrinks (no allocation in steady state). Otherwise a fixed power of two held in place
/// (no allocation at all), and a push onto a full ring drops the oldest element.
template <typename T, std::size_t Capacity = 0>
class ring {
  static_assert((Capacity & (Capacity - 1)) == 0, "the capacity is 0 (growing) or a power of two");

 public:
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  T& at(std::size_t i) noexcept { return buffer_[(head_ + i) & (buffer_.size() - 1)]; }
  const T& at(std::size_t i) const noexcept { return buffer_[(head_ + i) & (buffer_.size() - 1)]; }
  T& front() noexcept { return at(0); }
  const T& front() const noexcept { return at(0); }
  void pop_front() noexcept {
    head_ = (head_ + 1) & (buffer_.size() - 1);
    --size_;
  }
  /// Appends `v` (the newest): a full growing ring doubles first, a full fixed one drops its
  /// oldest.
  void push_back(const T& v) {
    if (size_ == buffer_.size()) {
      if constexpr (Capacity == 0) {
        grow();
      } else {
        pop_front();
      }
    }
    at(size_) = v;
    ++size_;
  }
  /// Removes element `i` (< size()), keeping the order of the others: O(size() - i).
  void erase(std::size_t i) noexcept {
    for (; i + 1 < size_; ++i) at(i) = at(i + 1);
    --size_;
  }
  /// Drops the oldest elements until at most `n` are left.
  void keep_newest(std::size_t n) noexcept {
    while (size_ > n) pop_front();
  }

 private:
  void grow() {
    std::vector<T> bigger(buffer_.empty() ? 16 : buffer_.size() * 2);
    for (std::size_t i = 0; i < size_; ++i) bigger[i] = at(i);
    buffer_ = std::move(bigger);
    head_ = 0;
  }
  std::conditional_t<Capacity == 0, std::vector<T>, std::array<T, Capacity>> buffer_{};
  std::size_t head_ = 0;
  std::size_t size_ = 0;
};

/// The largest of the last N samples, each clamped to [lo, hi] (`initial` before the first): how
/// late timers and wake-ups have been lately (about the 97th percentile for N = 32); and the
/// smallest (`lo` before the first): how late they always are.
template <std::size_t N>
class recent_max {
 public:
  explicit recent_max(std::int64_t initial, std::int64_t lo = 0,
                      std::int64_t hi = std::numeric_limits<std::int64_t>::max()) noexcept
      : high_(initial), low_(lo), lo_(lo), hi_(hi) {}
  void add(std::int64_t sample) noexcept {
    samples_.push_back(std::clamp(sample, lo_, hi_));
    high_ = low_ = samples_.front();
    for (std::size_t i = 1; i < samples_.size(); ++i) {
      high_ = std::max(high_, samples_.at(i));
      low_ = std::min(low_, samples_.at(i));
    }
  }
  std::int64_t high() const noexcept { return high_; }
  std::int64_t low() const noexcept { return low_; }

 private:
  ring<std::int64_t, N> samples_;
  std::int64_t high_, low_, lo_, hi_;
};

}  // namespace evr::detail
