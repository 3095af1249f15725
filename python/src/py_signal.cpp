// python/src/py_signal.cpp — see py_signal.hpp.
#include "py_signal.hpp"

#include <string>
#include <system_error>

#include <evr/device/error.hpp>

#include "errors.hpp"
#include "py_reactor.hpp"

namespace py = pybind11;

namespace evr_py {
namespace {

py_signal_slot& held(py_signal_slot& s) {
  if (!s.slot) raise(evr::make_error_code(evr::errc::empty_handle));  // released
  return s;
}

/// A ticket's stream must be of the slot's device: the reactor watches that stream for the
/// signal's work, and one of another device would end the wait as never signalled. (A stream
/// being captured does not name its device; its launches go to the current one, which
/// enqueue_signal checks.)
void check_device(py_signal_slot& s, evr::device::native_stream stream) {
  evr::device::backend& be = s.engine.cast<py_reactor&>().backend();
  if (be.stream_is_capturing(stream)) return;
  int device = -1;
  if (std::error_code ec = be.stream_device(stream, device)) raise(ec);
  if (device != s.slot.device()) raise(evr::make_error_code(evr::errc::device_mismatch));
}

}  // namespace

void bind_signals(py::module_& m) {
  py::class_<py_signal_ticket>(m, "SignalTicket")
      .def_property_readonly("stream", [](const py_signal_ticket& t) { return t.stream; })
      .def_property_readonly("value", [](const py_signal_ticket& t) { return t.ticket.value; })
      .def_property_readonly("slot", [](const py_signal_ticket& t) { return t.slot; })
      .def_property_readonly(
          "reactor",
          [](const py_signal_ticket& t) { return t.slot.cast<const py_signal_slot&>().owner; })
      .def("__repr__", [](const py_signal_ticket& t) {
        return "<evr.SignalTicket signal " + std::to_string(t.ticket.value) + " on stream " +
               std::to_string(t.stream) + ">";
      });

  py::class_<py_signal_slot>(m, "SignalSlot")
      .def_property_readonly("device", [](const py_signal_slot& s) { return s.slot.device(); })
      .def_property_readonly("held", [](const py_signal_slot& s) { return bool(s.slot); })
      .def_property_readonly("armed", [](const py_signal_slot& s) { return s.slot.armed(); })
      .def_property_readonly(
          "signalled", [](const py_signal_slot& s) { return s.slot ? s.slot.signalled() : 0; })
      .def("enqueue_signal",
           [](py_signal_slot& s, std::uintptr_t stream) {
             std::error_code ec;
             held(s).slot.enqueue_signal(reinterpret_cast<void*>(stream), ec);
             if (ec) raise(ec);
           })
      .def("arm",
           [](py::object self, std::uintptr_t stream) {
             py_signal_slot& s = held(self.cast<py_signal_slot&>());
             check_device(s, reinterpret_cast<void*>(stream));
             return py_signal_ticket{stream, s.slot.arm(), self};
           })
      .def("release", [](py_signal_slot& s) { s.slot.release(); });
}

}  // namespace evr_py
