// The last hop's timer (callbacks/include/evr/callbacks/detail/io_context_host.hpp): the host's
// wait on its timerfd holds no work once its waits are done, and the wait cancelled when the last
// one finished never leaves the host without a timer while new waits are pending.
#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <thread>

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "support/asio.hpp"
#include "support/helpers.hpp"
#include "support/last_hop.hpp"

using namespace std::chrono_literals;
using evr::test::closed_loop;
using evr::test::predictive;
using evr::test::run_until;
using evr::test::threaded;
using evr::test::wait_until;

TEST_CASE("last hop: run() returns once the hosted waits are done (the timer holds no work)") {
  evr::sim::device sim(threaded);
  evr::reactor r(sim, predictive());
  asio::io_context io(1);
  evr::gpu_waiter waiter(io.get_executor(), r);
  const int jobs = 12;
  closed_loop lane(sim, waiter, 2ms, jobs);
  lane.start();
  std::thread runner([&] { io.run(); });  // plain run(): returns when no work is left
  REQUIRE(wait_until([&] { return lane.done + lane.failed == jobs; }, 30s));
  // The last wait armed nothing more: run() must return promptly, not at a stale timer.
  const auto t0 = std::chrono::steady_clock::now();
  bool returned = wait_until([&] { return io.stopped(); }, 5s);
  if (!returned) io.stop();
  runner.join();
  CHECK(returned);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK(lane.done.load() == jobs);
}

TEST_CASE("last hop: a wait submitted before the cancelled timer's handler ran is still hosted") {
  // The last hosted wait finishing cancels the host's pending wait on its timerfd (disarm); the
  // aborted handler runs later. A wait submitted from a handler that runs before it arms the
  // timer again while the old wait still counts as pending. That wait must be looked at by the
  // host (host passes); before the fix the timerfd expired unread, and the host never looked
  // again until its waits ran out, leaving every completion to the reactor's safety look.
  evr::sim::device sim(threaded);
  asio::cancellation_signal signal;  // outlives the context (see the cancellation test above)
  evr::reactor r(sim, predictive());
  asio::io_context io(1);
  evr::gpu_waiter waiter(io.get_executor(), r);
  constexpr auto job = 3ms;
  // Two streams whose work is learned (a closed loop of eight jobs each), so that a wait on
  // either, with nothing of its stream before it, gets its window at submission.
  closed_loop a(sim, waiter, job, 8), b(sim, waiter, job, 8);
  a.start();
  b.start();
  REQUIRE(run_until(
      io, [&] { return a.settled() && b.settled() && a.launched == 8 && b.launched == 8; }, 60s));
  // Each round: a wait on stream a (the timer armed for its window), cancelled at once; from its
  // handler (the last hosted wait finished: the timer's wait was just cancelled) a wait on stream
  // b. A loaded machine may stall the thread past b's window and the reactor's grace, and then
  // the reactor finds it first: so several rounds, and the host must have looked in at least
  // one (before the fix: in none).
  const int rounds = 5;
  int finished = 0, b_ok = 0;
  std::uint64_t host_passes_for_b = 0;
  std::function<void()> round = [&] {
    sim.launch_kernel(a.stream.native(), job);
    waiter.async_wait(a.stream,
                      asio::bind_cancellation_slot(signal.slot(), [&](evr::asio_error_code) {
                        const std::uint64_t before = r.metrics().host_passes;
                        sim.launch_kernel(b.stream.native(), job);
                        waiter.async_wait(b.stream, [&, before](evr::asio_error_code ec) {
                          if (!ec) ++b_ok;
                          host_passes_for_b += r.metrics().host_passes - before;
                          if (++finished < rounds) round();
                        });
                      }));
    signal.emit(asio::cancellation_type::terminal);
  };
  round();
  REQUIRE(run_until(
      io, [&] { return finished == rounds; }, 60s));
  CHECK(b_ok == rounds);
  CHECK(host_passes_for_b > 0);
  REQUIRE(wait_until([&] { return r.metrics().in_flight == 0; }, 5s));
}
