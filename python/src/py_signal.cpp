// python/src/py_signal.cpp — see py_signal.hpp.
#include "py_signal.hpp"

#include <string>
#include <system_error>

#include <evr/device/error.hpp>

#include "errors.hpp"

namespace py = pybind11;

namespace evr_py {

void bind_signals(py::module_& m) {
  py::class_<py_signal_ticket>(m, "SignalTicket")
      .def_property_readonly("stream", [](const py_signal_ticket& t) { return t.stream; })
      .def_property_readonly("value", [](const py_signal_ticket& t) { return t.ticket.value; })
      .def_property_readonly(
          "reactor",
          [](const py_signal_ticket& t) { return t.slot.cast<const py_signal_slot&>().owner; })
      .def("__repr__", [](const py_signal_ticket& t) {
        return "<evr.SignalTicket signal " + std::to_string(t.ticket.value) + " on stream " +
               std::to_string(t.stream) + ">";
      });

  py::class_<py_signal_slot>(m, "SignalSlot")
      .def_property_readonly("device", [](const py_signal_slot& s) { return s.slot.device(); })
      .def_property_readonly("armed", [](const py_signal_slot& s) { return s.slot.armed(); })
      .def_property_readonly(
          "signalled", [](const py_signal_slot& s) { return s.slot ? s.slot.signalled() : 0; })
      .def("enqueue_signal",
           [](py_signal_slot& s, std::uintptr_t stream) {
             std::error_code ec;
             s.slot.enqueue_signal(reinterpret_cast<void*>(stream), ec);
             if (ec) raise(ec);
           })
      .def("arm",
           [](py::object self, std::uintptr_t stream) {
             // The reactor watches the ticket's stream for the signal's work: one of another
             // device would end the wait as never signalled, and an arm without its signal
             // would put every later ticket of the slot one signal ahead.
             py_signal_slot& s = self.cast<py_signal_slot&>();
             std::error_code ec;
             s.slot.check_stream(reinterpret_cast<void*>(stream), ec);
             if (ec) raise(ec);
             return py_signal_ticket{stream, s.slot.arm(), self};
           })
      .def("release", [](py_signal_slot& s) { s.slot.release(); });
}

}  // namespace evr_py
