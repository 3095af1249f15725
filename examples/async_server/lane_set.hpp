// The lanes of every GPU the server uses: one lane_pool per device. A request prefers a device
// (its connection's, assigned round-robin when it was accepted, so connections spread evenly
// over the GPUs) and takes a lane of another device when all of its own are taken; it waits
// for a lane of its own device only when every device is full. An /mlp batcher takes the lanes
// of its own device (batcher.hpp: one batcher per device).
//
// Thread safety: as lane_pool (try_acquire and the waits from any thread).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "lanes.hpp"

class lane_set {
 public:
  /// `by_device[d]`: the lanes of the d-th device used (not owned; they outlive the set). At
  /// least one device, each with at least one lane.
  explicit lane_set(const std::vector<std::vector<lane*>>& by_device);

  std::size_t devices() const noexcept { return pools_.size(); }
  /// The lanes of the d-th device used (d < devices()).
  lane_pool& pool(std::size_t d) noexcept { return *pools_[d]; }
  /// A free lane of device `preferred` (modulo devices()), else of the next device that has one;
  /// empty when every lane is taken (then wait for one of pool(preferred)). Lock-free.
  lane_pool::lease try_acquire(std::size_t preferred) noexcept;

  std::size_t size() const noexcept;    ///< lanes, all devices
  std::size_t leased() const noexcept;  ///< lanes leased now, all devices (a statistic)

 private:
  std::vector<std::unique_ptr<lane_pool>> pools_;
};
