// python/src/conversions.hpp — small conversions between the module's C++ and Python values,
// shared by the bindings (module.cpp, py_reactor.cpp, sim_binding.cpp, loop_sink.hpp). GIL held.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include <pybind11/pybind11.h>

namespace evr_py {

/// A histogram's counts as a Python list.
template <std::size_t N>
pybind11::list to_list(const std::array<std::uint64_t, N>& counts) {
  pybind11::list l;
  for (auto n : counts) l.append(n);
  return l;
}

/// A duration given in seconds (a Python float); ValueError naming `what` when it is negative,
/// not a number or absurdly long.
inline std::chrono::nanoseconds seconds_to_ns(double s, const char* what) {
  if (!(s >= 0.0) || s > 1e9) {
    throw pybind11::value_error(std::string(what) + ": expected a duration in seconds >= 0, got " +
                                std::to_string(s));
  }
  return std::chrono::nanoseconds(static_cast<std::int64_t>(s * 1e9));
}

}  // namespace evr_py
