// The GPUs a server process serves on: the backend (CUDA, or the simulated device when there is
// no GPU or --device sim says so) and which of its devices (--devices, all by default); the
// settings CUDA needs before it starts; and per device the lanes, with the /mlp weights on a GPU,
// warmed up before the first request. One reactor watches every device (instance.hpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "cli.hpp"
#include "lanes.hpp"
#include "mlp.hpp"

/// The backend and the devices used.
struct gpus {
  bool cuda = false;
  std::unique_ptr<evr::sim::device> sim;  // when !cuda
  evr::device::backend* backend = nullptr;
  std::vector<int> devices;  ///< the indices used, in the order given
  std::string label;         ///< "cuda" or "sim"
  std::string description;   ///< what the device line says
};

/// The backend cfg.device asks for and the devices cfg.devices names (all when empty). Throws
/// std::runtime_error naming the problem (no GPU with --device cuda, an index out of range).
gpus choose_gpus(const settings& cfg);

/// What must be set before CUDA creates a device's context: the scheduling flag of the blocking
/// modes that spin (sync_kind::spin, and --compare's pool), on every device used. Nothing on the
/// simulated device.
void prepare_cuda(const settings& cfg, const gpus& g);

/// Every device's lanes (and on a GPU its copy of the /mlp weights), created and warmed up.
class server_lanes {
 public:
  /// cfg.streams lanes per device (0: as many as the GPU runs /busy kernels at once; 64 on the
  /// simulated device). Warms every lane up (warm_up below). Throws std::runtime_error.
  server_lanes(const settings& cfg, gpus& g, const mlp::model& model);
  ~server_lanes();
  server_lanes(const server_lanes&) = delete;
  server_lanes& operator=(const server_lanes&) = delete;

  /// by_device()[i]: the lanes of g.devices[i].
  const std::vector<std::vector<lane*>>& by_device() const noexcept { return by_device_; }
  std::size_t total() const noexcept;
  /// One line for the log: how many, and where the count came from.
  const std::string& description() const noexcept { return description_; }

 private:
  struct cuda_state;  // the /mlp weights per device (a GPU build only)
  std::unique_ptr<cuda_state> cuda_;
  std::vector<std::unique_ptr<lane>> owned_;  // destroyed before the weights they use
  std::vector<std::vector<lane*>> by_device_;
  std::string description_;
};
