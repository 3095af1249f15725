// tests/support/predictive.hpp — what the predictive policy's tests on the simulator share
// (sim_predictive_test.cpp, sim_changing_work_test.cpp): one kernel waited for at a time, a
// property checked over up to three attempts, and a predictive fence reactor's options.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <system_error>

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "support/helpers.hpp"

namespace evr::test {

/// Launches a kernel of `d` on `st` and waits for it through `r` (inline callback); returns when
/// the wait completed. The count is shared with the callback: should a REQUIRE fail, the reactor's
/// destructor completes the wait after this frame is gone.
inline void run_one(evr::sim::device& sim, evr::reactor& r, evr::stream& st,
                    std::chrono::nanoseconds d) {
  using namespace std::chrono_literals;
  auto done = std::make_shared<std::atomic<int>>(0);
  sim.launch_kernel(st.native(), d);
  REQUIRE_FALSE(evr::on_complete(r, st, [done](std::error_code ec) { *done += ec ? 100 : 1; }));
  REQUIRE(wait_until([&] { return done->load() != 0; }, 10s));
  REQUIRE(done->load() == 1);
}

/// Runs `attempt` (which measures once and says whether the property held) up to three times,
/// for properties that compare counts of looks over wall-clock time: a loaded machine (a
/// sanitizer build beside other tests) can starve the reactor or disturb a stream's model in one
/// attempt; a reactor that does not have the property fails all three.
inline bool holds_in_one_of_three(const std::function<bool()>& attempt) {
  for (int i = 1; i <= 3; ++i) {
    if (attempt()) return true;
    MESSAGE("attempt " << i << " of 3 did not show the property (a loaded machine?)");
  }
  return false;
}

/// The predictive policy with fence markers, and no fault probe to wake the reactor.
inline evr::reactor_options predictive_fence() {
  using namespace std::chrono_literals;
  auto opts = quick_options(evr::strategy::fence);
  opts.idle = evr::idle_mode::predictive;
  opts.fault_probe_interval = 10s;  // no probe may wake the reactor in these tests
  return opts;
}

}  // namespace evr::test
