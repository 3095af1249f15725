// python/src/sim_binding.hpp — the simulated device for Python (evr.sim: Device, Stream, Event),
// bound as evr._evr.SimDevice, SimStream and SimEvent by bind_sim. GIL held.
#pragma once

#include <cstdint>
#include <memory>

#include <pybind11/pybind11.h>

#include <evr/device/event.hpp>
#include <evr/device/stream.hpp>
#include <evr/sim/device.hpp>

namespace evr_py {

/// A simulated device; shared by its streams, events and the reactors that run on it.
struct sim_device {
  explicit sim_device(int devices, evr::sim::run_mode mode)
      : dev(std::make_shared<evr::sim::device>(evr::sim::options{devices, mode})) {}
  std::shared_ptr<evr::sim::device> dev;
};

struct sim_stream {
  std::shared_ptr<evr::sim::device> dev;  // outlives the stream (declared first)
  evr::stream s;
  std::uintptr_t handle() const { return reinterpret_cast<std::uintptr_t>(s.native()); }
};

struct sim_event {
  std::shared_ptr<evr::sim::device> dev;
  evr::event e;
};

/// Adds SimDevice, SimStream, SimEvent and their device checks (_same_device, ...) to `m`.
void bind_sim(pybind11::module_& m);

}  // namespace evr_py
