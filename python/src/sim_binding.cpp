// python/src/sim_binding.cpp — see sim_binding.hpp.
#include "sim_binding.hpp"

#include <cstddef>
#include <string>
#include <system_error>

#include <evr/device/error.hpp>

#include "conversions.hpp"
#include "errors.hpp"

namespace py = pybind11;

namespace evr_py {
namespace {

std::error_code cuda_code(int value) {
  return value == 0 ? std::error_code{} : evr::make_cuda_error(value);
}

}  // namespace

void bind_sim(py::module_& m) {
  py::class_<sim_device>(m, "SimDevice")
      .def(py::init([](int devices, const std::string& mode) {
             if (devices < 1) throw py::value_error("evr.sim.Device: devices must be >= 1");
             evr::sim::run_mode rm;
             if (mode == "threaded") {
               rm = evr::sim::run_mode::threaded;
             } else if (mode == "manual") {
               rm = evr::sim::run_mode::manual;
             } else {
               throw py::value_error("evr.sim.Device: mode must be 'threaded' or 'manual', got '" +
                                     mode + "'");
             }
             return std::make_unique<sim_device>(devices, rm);
           }),
           py::arg("devices"), py::arg("mode"))
      .def("launch_kernel",
           [](sim_device& d, sim_stream& s, double seconds) {
             std::error_code ec =
                 d.dev->launch_kernel(s.s.native(), seconds_to_ns(seconds, "launch_kernel"));
             if (ec) raise(ec);
           })
      .def("launch_faulting_kernel",
           [](sim_device& d, sim_stream& s, int code) {
             std::error_code ec = d.dev->launch_faulting_kernel(s.s.native(), cuda_code(code));
             if (ec) raise(ec);
           })
      .def("inject_fault", [](sim_device& d, int device,
                              int code) { d.dev->inject_fault(device, cuda_code(code)); })
      .def("inject_fault_after",
           [](sim_device& d, int device, std::uint64_t ops, int code) {
             d.dev->inject_fault_after(device, ops, cuda_code(code));
           })
      .def("fault",
           [](sim_device& d, int device) -> int {
             std::error_code ec = d.dev->fault(device);
             return ec ? ec.value() : 0;
           })
      .def("stall", [](sim_device& d, sim_stream& s) { d.dev->stall(s.s.native()); })
      .def("resume", [](sim_device& d, sim_stream& s) { d.dev->resume(s.s.native()); })
      .def("step",
           [](sim_device& d, sim_stream& s, std::size_t n) { return d.dev->step(s.s.native(), n); })
      .def(
          "run_until_blocked", [](sim_device& d) { return d.dev->run_until_blocked(); },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "wait_idle", [](sim_device& d) { d.dev->wait_idle(); },
          py::call_guard<py::gil_scoped_release>())
      .def("describe", [](sim_device& d) { return d.dev->describe(); })
      .def("counters", [](sim_device& d) {
        evr::sim::call_counters c = d.dev->counters();
        py::dict out;
        out["event_queries"] = c.event_queries;
        out["stream_queries"] = c.stream_queries;
        out["event_records"] = c.event_records;
        out["host_funcs_launched"] = c.host_funcs_launched;
        out["host_funcs_run"] = c.host_funcs_run;
        out["fence_writes_enqueued"] = c.fence_writes_enqueued;
        out["fence_writes_landed"] = c.fence_writes_landed;
        out["events_created"] = c.events_created;
        out["events_destroyed"] = c.events_destroyed;
        return out;
      });

  py::class_<sim_stream>(m, "SimStream")
      .def(py::init([](sim_device& d, int device, int priority) {
             auto s = std::make_unique<sim_stream>();
             s->dev = d.dev;
             try {
               s->s = evr::stream(*d.dev, device, priority);
             } catch (const evr::error& e) {
               raise(e.code());
             }
             return s;
           }),
           py::arg("device"), py::arg("index"), py::arg("priority"))
      .def_property_readonly("handle", &sim_stream::handle)
      .def("query",
           [](sim_stream& s) {
             std::error_code ec;
             s.s.query(ec);
             return done_or_raise(ec);
           })
      .def("synchronize", [](sim_stream& s) {
        std::error_code ec;
        {
          py::gil_scoped_release nogil;
          s.s.synchronize(ec);
        }
        if (ec) raise(ec);
      });

  py::class_<sim_event>(m, "SimEvent")
      .def(py::init([](sim_device& d) {
             auto e = std::make_unique<sim_event>();
             e->dev = d.dev;
             e->e = evr::event(*d.dev);
             return e;
           }),
           py::arg("device"))
      .def_property_readonly(
          "handle", [](sim_event& e) { return reinterpret_cast<std::uintptr_t>(e.e.native()); })
      .def_property_readonly("recorded", [](sim_event& e) { return e.e.recorded(); })
      .def_property_readonly("device_index", [](sim_event& e) { return e.e.device().value_or(-1); })
      .def("record",
           [](sim_event& e, sim_stream& s) {
             std::error_code ec;
             e.e.record(s.s, ec);
             if (ec) raise(ec);
           })
      .def("query",
           [](sim_event& e) {
             std::error_code ec;
             e.e.query(ec);
             return done_or_raise(ec);
           })
      .def("synchronize", [](sim_event& e) {
        std::error_code ec;
        {
          py::gil_scoped_release nogil;
          ec = e.dev->synchronize_event(e.e.native());
        }
        if (ec) raise(ec);
      });

  m.def("_same_device", [](const sim_device& a, const sim_device& b) { return a.dev == b.dev; });
  m.def("_stream_device_is",
        [](const sim_stream& s, const sim_device& d) { return s.dev == d.dev; });
  m.def("_event_device_is", [](const sim_event& e, const sim_device& d) { return e.dev == d.dev; });
}

}  // namespace evr_py
