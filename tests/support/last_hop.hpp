// tests/support/last_hop.hpp — what the last hop's tests share (sim_last_hop_test.cpp,
// sim_last_hop_timer_test.cpp): a predictive reactor's options, the threaded simulated device and
// a closed loop of jobs on one stream, each launched by the previous one's handler.
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "support/asio.hpp"
#include "support/helpers.hpp"

namespace evr::test {

inline evr::reactor_options predictive(evr::strategy s = evr::strategy::fence) {
  auto opts = quick_options(s);
  opts.idle = evr::idle_mode::predictive;
  opts.fault_probe_interval = std::chrono::milliseconds(50);
  return opts;
}

inline constexpr evr::sim::options threaded{.devices = 1, .mode = evr::sim::run_mode::threaded};

/// A stream running jobs one after another, each launched by the previous one's handler on the
/// io_context's thread (as a server's coroutine does): a closed loop, the case the last hop is for.
struct closed_loop {
  closed_loop(evr::sim::device& sim, evr::gpu_waiter& waiter, std::chrono::nanoseconds job,
              int jobs)
      : sim(sim), waiter(waiter), stream(sim, 0), job(job), left(jobs) {}

  void start() { next(); }
  void next() {
    sim.launch_kernel(stream.native(), job);
    ++launched;
    waiter.async_wait(stream, [this](evr::asio_error_code ec) {
      (ec ? failed : done).fetch_add(1);
      if (std::this_thread::get_id() != runner) wrong_thread.fetch_add(1);
      if (--left > 0 && !stopping) next();
    });
  }
  /// Whether every launched job has been answered (the loop stops after `stopping` is set).
  bool settled() const { return done + failed == launched; }

  evr::sim::device& sim;
  evr::gpu_waiter& waiter;
  evr::stream stream;
  std::chrono::nanoseconds job;
  int left;
  std::atomic<int> launched{0}, done{0}, failed{0}, wrong_thread{0};
  std::atomic<bool> stopping{false};  // set from the context's thread: launch no more
  std::thread::id runner = std::this_thread::get_id();  // the thread that runs the context
};

}  // namespace evr::test
