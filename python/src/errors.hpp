// python/src/errors.hpp — raising an evr error code as the Python exception evr._errors makes for
// it (CudaError, ReactorStopped, ...). GIL held.
#pragma once

#include <system_error>

#include <pybind11/pybind11.h>

#include <evr/device/error.hpp>

#include "completion_sink.hpp"

namespace evr_py {

/// Raises the Python exception for `ec` (a refused wait, a failed simulated-device call).
[[noreturn]] inline void raise(const std::error_code& ec) {
  set_python_error(ec);
  throw pybind11::error_already_set();
}

/// A query's answer: true when done, false when not ready; raises any other error.
inline bool done_or_raise(const std::error_code& ec) {
  if (!ec) return true;
  if (evr::is_not_ready(ec)) return false;
  raise(ec);
}

}  // namespace evr_py
