#include "gpus.hpp"

#include <cstdio>
#include <stdexcept>

#include "busy_math.hpp"

#if defined(EVR_ASYNC_SERVER_HAVE_KERNELS)
#include <cuda_runtime.h>
#endif

namespace {

/// The devices cfg.devices names, checked against the `count` there are; all of them when empty.
std::vector<int> pick_devices(const std::vector<int>& wanted, int count, const char* what) {
  std::vector<int> picked;
  for (int d = 0; wanted.empty() && d < count; ++d) picked.push_back(d);
  for (int d : wanted) {
    if (d >= count)
      throw std::runtime_error("--devices names device " + std::to_string(d) + ", but there " +
                               (count == 1 ? "is 1 " : "are " + std::to_string(count) + " ") +
                               what);
    picked.push_back(d);
  }
  return picked;
}

/// Gets every lane ready before the first request: allocates the buffers requests will need
/// (cudaMalloc and cudaFree synchronize the whole device, so they must stay off the request path),
/// runs each kind of work once (the first use of a kernel or a cuBLAS handle loads code and
/// workspace) and creates the lane's events: its own (the poll mode records it) and the
/// blocking-sync one (the blocking modes' --sync blocking-sync). The first lane of each device
/// has its answers checked against the CPU. Throws std::runtime_error if the device refuses or
/// answers wrongly.
void warm_up(const std::vector<std::vector<lane*>>& by_device, const mlp::model& model,
             std::size_t max_rows, bool cuda) {
  const mlp::shape& d = model.dims();
  const std::size_t in = static_cast<std::size_t>(d.in);
  const std::uint32_t seed = 12345;
  for (const auto& lanes : by_device) {
    for (std::size_t i = 0; i < lanes.size(); ++i) {
      lane& l = *lanes[i];
      l.reserve(std::size_t{1} << 16);
      l.reserve_rows(max_rows);
      // A full batch once per GPU (cuBLAS picks other kernels for other sizes); one row
      // everywhere else (the simulator computes each row on the CPU: keep it short).
      const std::size_t rows = cuda && i == 0 ? max_rows : 1;
      for (std::size_t r = 0; r < rows; ++r)
        mlp::input_row(seed + static_cast<std::uint32_t>(r), d.in, l.mlp_input() + r * in);
      l.enqueue_mlp(rows);
      l.enqueue_busy({1, seed});
      evr::device::native_event ignored = nullptr;
      if (std::error_code ec = l.record_done_event(ignored))
        throw std::runtime_error("warm-up: recording a lane's event failed: " + ec.message());
    }
  }
  std::vector<float> want(static_cast<std::size_t>(d.out));
  for (const auto& lanes : by_device) {
    for (lane* l : lanes)
      for (sync_kind how : {sync_kind::spin, sync_kind::blocking_sync})
        if (std::error_code ec = l->wait_blocking(how))
          throw std::runtime_error("warm-up: waiting for the device failed: " + ec.message());
    model.forward(lanes[0]->mlp_input(), want.data());
    if (auto wrong = mlp::compare_row(lanes[0]->mlp_output(), want.data(), d.out))
      throw std::runtime_error("warm-up: the device's /mlp answer is wrong: " + *wrong);
    if (lanes[0]->busy_result() != busy_math::reference(seed))
      throw std::runtime_error("warm-up: the device's /busy answer is wrong");
  }
}

}  // namespace

gpus choose_gpus(const settings& cfg) {
  gpus g;
#if defined(EVR_ASYNC_SERVER_HAVE_KERNELS)
  if (cfg.device != "sim") g.cuda = evr::device::cuda_device_available();
#endif
  if (cfg.device == "cuda" && !g.cuda) {
#if defined(EVR_ASYNC_SERVER_HAVE_KERNELS)
    throw std::runtime_error("--device cuda, but no usable CUDA device");
#else
    throw std::runtime_error(
        "--device cuda, but no usable CUDA device (built without CUDA kernels)");
#endif
  }
  int count = 0;
  if (g.cuda) {
    g.backend = &evr::device::cuda_backend();
    g.label = "cuda";
    g.description = g.backend->describe();
    if (std::error_code ec = g.backend->device_count(count))
      throw std::runtime_error("counting the GPUs failed: " + ec.message());
  } else {
    g.sim = std::make_unique<evr::sim::device>(
        evr::sim::options{.devices = cfg.sim_devices, .mode = evr::sim::run_mode::threaded});
    g.backend = g.sim.get();
    g.label = "sim";
    g.description = std::string("SIMULATED (no GPU ") +
                    (cfg.device == "sim" ? "requested" : "found") + ") — " + g.sim->describe();
    count = cfg.sim_devices;
  }
  g.devices = pick_devices(cfg.devices, count, g.cuda ? "GPUs" : "simulated GPUs");
  return g;
}

void prepare_cuda(const settings& cfg, const gpus& g) {
#if defined(EVR_ASYNC_SERVER_HAVE_KERNELS)
  if (!g.cuda) return;
  // A blocking server that spins: say so, rather than leave it to cudaDeviceScheduleAuto's
  // heuristic (sync_kind::automatic does leave it). blocking-sync needs no device flag: its
  // events are created with cudaEventBlockingSync. The flag is per device.
  const bool spin_pool = (blocks_a_thread(cfg.mode) && cfg.sync == sync_kind::spin) || cfg.compare;
  if (!spin_pool) return;
  for (int d : g.devices) {
    cudaError_t e = cudaSetDevice(d);
    if (e == cudaSuccess) e = cudaSetDeviceFlags(cudaDeviceScheduleSpin);
    if (e != cudaSuccess) {
      std::fprintf(stderr, "evr-async-server: warning: cudaSetDeviceFlags(spin) on device %d: %s\n",
                   d, cudaGetErrorString(e));
      cudaGetLastError();
    }
  }
#else
  (void)cfg;
  (void)g;
#endif
}

#if defined(EVR_ASYNC_SERVER_HAVE_KERNELS)
struct server_lanes::cuda_state {
  std::vector<std::unique_ptr<cuda_mlp_weights>> weights;  // per device used
};
#else
struct server_lanes::cuda_state {};
#endif

server_lanes::server_lanes(const settings& cfg, gpus& g, const mlp::model& model)
    : cuda_(std::make_unique<cuda_state>()) {
  std::string note = "--streams";
  std::vector<int> per_device(g.devices.size(), cfg.streams);
  if (cfg.streams == 0) {
    note = "default on the simulated device";
    for (int& n : per_device) n = 64;
#if defined(EVR_ASYNC_SERVER_HAVE_KERNELS)
    // As many as the GPU runs /busy kernels at once: fewer would leave it idle under load, more
    // only queue behind the ones running.
    for (std::size_t i = 0; g.cuda && i < g.devices.size(); ++i) {
      char detail[160] = "";
      if (const int n = server_kernels::busy_concurrency(g.devices[i], detail, sizeof detail);
          n > 0) {
        per_device[i] = n;
        note = std::string("from the GPU: ") + detail;
      } else {
        note = "a GPU could not be queried: default";
      }
    }
#endif
  }
  for (std::size_t i = 0; i < g.devices.size(); ++i) {
    by_device_.emplace_back();
#if defined(EVR_ASYNC_SERVER_HAVE_KERNELS)
    if (g.cuda) cuda_->weights.push_back(std::make_unique<cuda_mlp_weights>(model, g.devices[i]));
#endif
    for (int n = 0; n < per_device[i]; ++n) {
#if defined(EVR_ASYNC_SERVER_HAVE_KERNELS)
      if (g.cuda) {
        owned_.push_back(make_cuda_lane(*cuda_->weights.back(), {cfg.mlp_graphs, cfg.busy_graph}));
        by_device_.back().push_back(owned_.back().get());
        continue;
      }
#endif
      owned_.push_back(make_sim_lane(*g.sim, g.devices[i], model));
      by_device_.back().push_back(owned_.back().get());
    }
  }
  std::string counts;
  for (std::size_t i = 0; i < g.devices.size(); ++i) {
    if (i != 0) counts += ", ";
    counts += std::to_string(per_device[i]) + " on device " + std::to_string(g.devices[i]);
  }
  description_ = std::to_string(total()) + " (" + counts + "; " + note + ")";
  warm_up(by_device_, model, cfg.mlp_max_batch, g.cuda);
}

server_lanes::~server_lanes() = default;

std::size_t server_lanes::total() const noexcept { return owned_.size(); }
