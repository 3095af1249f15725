#include "lane_set.hpp"

#include <stdexcept>

lane_set::lane_set(const std::vector<std::vector<lane*>>& by_device) {
  if (by_device.empty()) throw std::invalid_argument("lane_set: no device");
  for (const auto& lanes : by_device) {
    if (lanes.empty()) throw std::invalid_argument("lane_set: a device without lanes");
    pools_.push_back(std::make_unique<lane_pool>(lanes));
  }
}

lane_pool::lease lane_set::try_acquire(std::size_t preferred) noexcept {
  const std::size_t n = pools_.size();
  for (std::size_t i = 0; i < n; ++i)
    if (lane_pool::lease l = pools_[(preferred + i) % n]->try_acquire()) return l;
  return {};
}

std::size_t lane_set::size() const noexcept {
  std::size_t n = 0;
  for (const auto& p : pools_) n += p->size();
  return n;
}

std::size_t lane_set::leased() const noexcept {
  std::size_t n = 0;
  for (const auto& p : pools_) n += p->leased();
  return n;
}
