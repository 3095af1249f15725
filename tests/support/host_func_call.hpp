// tests/support/host_func_call.hpp — runs a call inside a host function of the simulated device
// and returns what it returned: for the refusals of calls that would wait for that very host
// function (a kernel load, an allocation).
#pragma once

#include <doctest/doctest.h>

#include <atomic>
#include <functional>
#include <system_error>

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "helpers.hpp"

namespace evr::test {

inline std::error_code call_in_host_func(evr::sim::device& sim, const evr::stream& st,
                                         std::function<std::error_code()> call) {
  struct state {
    std::function<std::error_code()> call;
    std::error_code seen;
    std::atomic<bool> ran{false};
  } s{std::move(call), {}, {}};
  REQUIRE_FALSE(sim.launch_host_func(
      st.native(),
      [](void* p) {
        auto* k = static_cast<state*>(p);
        k->seen = k->call();
        k->ran.store(true, std::memory_order_release);
      },
      &s));
  REQUIRE(wait_until([&] { return s.ran.load(std::memory_order_acquire); }));
  return s.seen;
}

}  // namespace evr::test
