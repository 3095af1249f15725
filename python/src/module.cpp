// python/src/module.cpp — evr._evr: the reactor, the completion path and the simulated device for
// Python. The public Python API is python/evr/__init__.py; this module is its engine and is not
// meant to be used directly. The bound classes live in their own files: py_reactor.hpp (Reactor,
// WaitCanceller), py_signal.hpp (SignalSlot, SignalTicket), loop_sink.hpp (LoopSink),
// sim_binding.hpp (SimDevice, SimStream, SimEvent).
//
// Threads: every function here runs with the GIL held unless it says it releases it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include <evr/device/backend.hpp>
#include <evr/device/cuda_status.hpp>
#include <evr/device/error.hpp>

#include "completion_sink.hpp"
#include "conversions.hpp"
#include "loop_sink.hpp"
#include "py_reactor.hpp"
#include "py_signal.hpp"
#include "sim_binding.hpp"

namespace py = pybind11;

#ifndef EVR_PYTHON_VERSION
#error "EVR_PYTHON_VERSION (evr's version) is set by python/CMakeLists.txt"
#endif

PYBIND11_MODULE(_evr, m) {
  using namespace evr_py;
  m.doc() = "evr's engine (use the evr package, not this module)";
  // The C++ library's version (project(evr VERSION) of the top CMakeLists.txt, passed by
  // python/CMakeLists.txt): evr.__version__, and the wheel's version through setup.py.
  m.attr("__version__") = EVR_PYTHON_VERSION;

  m.def("_set_error_factory", [](py::object f) { set_error_factory(f.ptr()); });
  m.def("cuda_compiled_in", &evr::device::cuda_compiled_in,
        "True when this build has the CUDA backend.");
  m.def("cuda_device_available", &evr::device::cuda_device_available,
        "True when the CUDA backend is compiled in and a GPU is usable.",
        py::call_guard<py::gil_scoped_release>());
  m.def(
      "cuda_status",
      [] {
        evr::device::cuda_status s;
        {
          py::gil_scoped_release unlocked;  // the first CUDA call loads the driver
          s = evr::device::probe_cuda();
        }
        py::dict d;
        d["compiled_in"] = s.compiled_in;
        d["usable"] = s.usable;
        d["runtime_version"] = s.runtime_version;
        d["driver_version"] = s.driver_version;
        d["device_count"] = s.device_count;
        d["reason"] = s.reason;
        return d;
      },
      "What evr::device::probe_cuda() found: whether the CUDA backend can run here, and why not.");
  m.def("stop_resolver", &stop_resolver,
        "Stops the resolver thread after it has served what is pending (interpreter exit).");
  m.def("resolver_running", &resolver_running);
  m.def("error_message", [](const std::string& category, int value) {
    if (category == "cuda") return evr::make_cuda_error(value).message();
    return evr::make_error_code(static_cast<evr::errc>(value)).message();
  });
  {
    py::dict errc;
    errc["reactor_stopped"] = static_cast<int>(evr::errc::reactor_stopped);
    errc["backend_mismatch"] = static_cast<int>(evr::errc::backend_mismatch);
    errc["device_mismatch"] = static_cast<int>(evr::errc::device_mismatch);
    errc["event_never_recorded"] = static_cast<int>(evr::errc::event_never_recorded);
    errc["empty_handle"] = static_cast<int>(evr::errc::empty_handle);
    errc["per_thread_default_stream"] = static_cast<int>(evr::errc::per_thread_default_stream);
    errc["stream_table_full"] = static_cast<int>(evr::errc::stream_table_full);
    errc["invalid_argument"] = static_cast<int>(evr::errc::invalid_argument);
    errc["no_device"] = static_cast<int>(evr::errc::no_device);
    errc["unsupported"] = static_cast<int>(evr::errc::unsupported);
    errc["operation_aborted"] = static_cast<int>(evr::errc::operation_aborted);
    errc["not_signalled"] = static_cast<int>(evr::errc::not_signalled);
    m.attr("ERRC") = errc;
    m.attr("CUDA_CATEGORY") = evr::cuda_category().name();
    m.attr("EVR_CATEGORY") = evr::evr_category().name();
  }

  py::class_<wait_canceller>(m, "WaitCanceller")
      .def("__call__", &wait_canceller::operator())
      .def("cancel", &wait_canceller::cancel)
      .def_readonly("cancelled", &wait_canceller::cancelled);

  py::class_<loop_sink>(m, "LoopSink")
      .def(py::init<double>(), py::arg("max_spin"))
      .def_property_readonly("fd", &loop_sink::fd)
      .def_property_readonly("timer_fd", &loop_sink::timer_fd)
      .def("drain", &loop_sink::drain)
      .def("on_timer", &loop_sink::on_timer)
      .def("poll", &loop_sink::poll)
      .def(
          "predictable",
          [](const loop_sink& s, std::uintptr_t key) { return s.waker.predictable(key); },
          py::arg("key"))
      .def("window_closed", &loop_sink::window_closed, py::arg("window"), py::arg("hit"),
           py::arg("opened_ns"), py::arg("closed_ns"), py::arg("rearm"))
      .def("rearm_timer", &loop_sink::rearm_timer)
      .def("close", &loop_sink::close)
      .def("stats", &loop_sink::stats)
      .def_property(
          "max_spin", [](const loop_sink& s) { return s.waker.max_spin_ns() * 1e-9; },
          [](loop_sink& s, double v) {
            s.waker.set_max_spin_ns(seconds_to_ns(v, "evr: max_spin").count());
          })
      .def_property(
          "max_waits", [](const loop_sink& s) { return s.waker.max_waits(); },
          [](loop_sink& s, std::size_t n) { s.waker.set_max_waits(n); })
      .def_readonly("closed", &loop_sink::closed);

  py::class_<py_reactor>(m, "Reactor")
      .def(py::init<std::optional<std::string>, py::object, py::dict>(), py::arg("strategy"),
           py::arg("sim"), py::arg("options"))
      .def("wait_async",
           [](py_reactor& r, loop_sink& s, py::handle fut, int kind, std::uintptr_t h, int dev) {
             return r.wait_async(s.sink, s.waker, fut, r.target(kind, h, dev), h);
           })
      .def("wait_signal_async",
           [](py_reactor& r, loop_sink& s, py::handle fut, const py_signal_ticket& t) {
             return r.wait_async(s.sink, s.waker, fut, r.target(t), t.stream);
           })
      .def("wait_future", [](py_reactor& r, py::handle fut, int kind, std::uintptr_t h,
                             int dev) { r.wait_future(fut, r.target(kind, h, dev)); })
      .def("wait_signal_future", [](py_reactor& r, py::handle fut,
                                    const py_signal_ticket& t) { r.wait_future(fut, r.target(t)); })
      .def("release_after", [](py_reactor& r, py::handle obj, int kind, std::uintptr_t h,
                               int dev) { r.release_after(obj, r.target(kind, h, dev), kind, h); })
      .def("release_after_signal",
           [](py_reactor& r, py::handle obj, const py_signal_ticket& t) {
             r.release_after(obj, r.target(t), 0, t.stream);
           })
      .def(
          "signal_slot",
          [](py::object self, py::object owner, int device) {
            return self.cast<py_reactor&>().signal_slot(self, std::move(owner), device);
          },
          py::arg("owner"), py::arg("device"))
      .def("prepare_device", &py_reactor::prepare_device, py::arg("device"))
      .def("stop", &py_reactor::stop)
      .def("metrics", &py_reactor::metrics)
      .def_property_readonly("strategy", &py_reactor::strategy)
      .def_property_readonly("backend", &py_reactor::backend_name)
      .def("describe", &py_reactor::describe);

  bind_signals(m);  // SignalSlot, SignalTicket
  bind_sim(m);      // evr.sim
}
