// The hand-over between a host (an io_context's thread that looks for its own waits: the last
// hop) and the reactor thread, which naps on the host's promise to look and takes its waits over
// when the host breaks it (docs/architecture.md, "The last hop", "Under load"). What must hold
// whatever the timing: a host busy in a long handler, a host whose thread left run(), and a host
// whose context is destroyed all leave their waits to the reactor, each wait completes exactly
// once on its executor, and the host takes over again once it looks.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "support/asio.hpp"
#include "support/helpers.hpp"

using namespace std::chrono_literals;
using evr::test::quick_options;
using evr::test::run_until;
using evr::test::wait_until;

namespace {

evr::reactor_options predictive() {
  auto opts = quick_options(evr::strategy::fence);
  opts.idle = evr::idle_mode::predictive;
  opts.fault_probe_interval = 50ms;
  return opts;
}

constexpr evr::sim::options threaded{.devices = 1, .mode = evr::sim::run_mode::threaded};

/// A stream whose jobs are launched one after another from the io_context's thread, each by the
/// previous job's handler (a server's coroutine): until `jobs` are done, the host's model of the
/// stream is learned and its windows covered.
struct lane {
  lane(evr::sim::device& sim, evr::gpu_waiter& waiter, std::chrono::nanoseconds job)
      : sim(sim), waiter(waiter), stream(sim, 0), job(job) {}

  void run_jobs(int n) {
    left = n;
    next();
  }
  void next() {
    sim.launch_kernel(stream.native(), job);
    waiter.async_wait(stream, [this](evr::asio_error_code ec) {
      (ec ? failed : done).fetch_add(1);
      if (--left > 0) next();
    });
  }

  evr::sim::device& sim;
  evr::gpu_waiter& waiter;
  evr::stream stream;
  std::chrono::nanoseconds job;
  int left = 0;
  std::atomic<int> done{0}, failed{0};
};

/// Runs `io` on this thread until the lane has done `n` more jobs.
void learn(asio::io_context& io, lane& l, int n) {
  const int want = l.done + l.failed + n;
  l.run_jobs(n);
  REQUIRE(run_until(
      io, [&] { return l.done + l.failed == want; }, 30s));
  REQUIRE(l.failed.load() == 0);
}

/// Runs jobs on the lane (in fours, up to 400) until the context's host has delivered one more
/// completion than before: the host covers the stream's windows from then on. How many jobs the
/// model needs to learn the stream depends on the machine's load: the reactor may find the
/// first ones itself. True when the host delivered one.
bool learn_until_hosted(asio::io_context& io, lane& l, evr::reactor& r) {
  const std::uint64_t before = r.metrics().host_completions;
  for (int jobs = 0; jobs < 400; jobs += 4) {
    learn(io, l, 4);
    if (r.metrics().host_completions > before) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("handover: a host busy in a 50 ms handler: the reactor finds its wait meanwhile") {
  evr::sim::device sim(threaded);
  evr::reactor r(sim, predictive());
  asio::io_context io(1);
  evr::gpu_waiter waiter(io.get_executor(), r);
  lane l(sim, waiter, 2ms);
  REQUIRE(learn_until_hosted(io, l, r));  // the host covers the stream's windows from here on

  // On the context's thread: a hosted wait, then a handler that keeps the thread 50 ms (and until
  // the wait was delivered): the host cannot look, so the reactor must, once the host's promise
  // has passed by its grace.
  std::atomic<int> ran{0};
  std::uint64_t completed_before = 0, host_before = 0, host_during = 0;
  bool delivered_while_busy = false;
  std::chrono::nanoseconds found_after{0};
  asio::post(io, [&] {
    const evr::reactor_metrics m0 = r.metrics();
    completed_before = m0.completed;
    host_before = m0.host_completions;
    sim.launch_kernel(l.stream.native(), 2ms);
    waiter.async_wait(l.stream, [&](evr::asio_error_code ec) {
      CHECK_FALSE(ec);
      ran.fetch_add(1);
    });
    const auto t0 = std::chrono::steady_clock::now();
    delivered_while_busy =
        wait_until([&] { return r.metrics().completed > completed_before; }, 30s);
    found_after = std::chrono::steady_clock::now() - t0;
    host_during = r.metrics().host_completions;
    while (std::chrono::steady_clock::now() - t0 < 50ms) std::this_thread::yield();
  });
  REQUIRE(run_until(
      io, [&] { return ran.load() == 1; }, 30s));
  MESSAGE("the reactor delivered the busy host's wait "
          << std::chrono::duration<double, std::micro>(found_after).count()
          << " us after its submission (a 2 ms job; the bound: the host's promised look, which "
             "is at the window's opening, plus the grace of 1 ms)");
  CHECK(delivered_while_busy);
  CHECK(host_during == host_before);  // the reactor found it, not the host
  // Exactly once: nothing more arrives.
  run_until(
      io, [] { return false; }, 20ms);
  CHECK(ran.load() == 1);

  // The host looks again: it covers the next jobs.
  CHECK(learn_until_hosted(io, l, r));
}

TEST_CASE(
    "handover: the host's thread leaves run(): the reactor finds the wait, the handler runs "
    "once the context runs again") {
  evr::sim::device sim(threaded);
  evr::reactor r(sim, predictive());
  asio::io_context io(1);
  evr::gpu_waiter waiter(io.get_executor(), r);
  lane l(sim, waiter, 2ms);
  learn(io, l, 8);

  std::atomic<int> ran{0};
  std::uint64_t completed_before = 0;
  asio::post(io, [&] {
    completed_before = r.metrics().completed;
    sim.launch_kernel(l.stream.native(), 2ms);
    waiter.async_wait(l.stream, [&](evr::asio_error_code ec) {
      CHECK_FALSE(ec);
      ran.fetch_add(1);
    });
    io.stop();  // run() returns: nobody runs the context, its host looks no more
  });
  io.restart();
  io.run();
  REQUIRE(io.stopped());
  // Found and posted by the reactor while no thread runs the context.
  CHECK(wait_until([&] { return r.metrics().completed > completed_before; }, 30s));
  CHECK(ran.load() == 0);
  REQUIRE(run_until(
      io, [&] { return ran.load() == 1; }, 30s));
  run_until(
      io, [] { return false; }, 20ms);
  CHECK(ran.load() == 1);
  CHECK(wait_until([&] { return r.metrics().in_flight == 0; }, 5s));
}

TEST_CASE("handover: contexts destroyed while the reactor naps on their hosts' promises") {
  // Eight lanes per context, all hosted: the reactor naps on the host's promise rather than on
  // the streams' windows. Each context is destroyed mid-flight: its waits are detached (nothing
  // runs, nothing leaks: ASan), and the reactor serves the next context's hosts.
  evr::sim::device sim(threaded);
  evr::reactor r(sim, predictive());
  for (int round = 0; round < 3; ++round) {
    auto io = std::make_unique<asio::io_context>(1);
    evr::gpu_waiter waiter(io->get_executor(), r);
    std::vector<std::unique_ptr<lane>> lanes;
    for (int i = 0; i < 8; ++i) lanes.push_back(std::make_unique<lane>(sim, waiter, 3ms));
    for (auto& l : lanes) l->run_jobs(1000);
    REQUIRE(run_until(
        *io,
        [&] {
          for (auto& l : lanes)
            if (l->done.load() < 5) return false;
          return true;
        },
        30s));
    run_until(
        *io, [] { return false; }, std::chrono::milliseconds(1 + round));
    io.reset();  // destroys the context with eight hosted waits pending
    for (auto& l : lanes) CHECK(l->failed.load() == 0);
  }
  REQUIRE(wait_until([&] { return r.metrics().in_flight == 0; }, 10s));
  CHECK(r.metrics().detached > 0);
  asio::io_context io2(1);
  evr::gpu_waiter waiter2(io2.get_executor(), r);
  lane l2(sim, waiter2, 1ms);
  learn(io2, l2, 10);
  CHECK(l2.done.load() == 10);
}

TEST_CASE("handover: waits submitted on a host's thread are taken by its own looks") {
  // Sixteen lanes in closed loops on one io_context: the waits their handlers submit are taken
  // into the reactor's timelines by the host's passes (host_intakes), and every one completes
  // exactly once, whoever found it.
  evr::sim::device sim(threaded);
  evr::reactor r(sim, predictive());
  asio::io_context io(1);
  evr::gpu_waiter waiter(io.get_executor(), r);
  std::vector<std::unique_ptr<lane>> lanes;
  for (int i = 0; i < 16; ++i) lanes.push_back(std::make_unique<lane>(sim, waiter, 2ms));
  const int jobs = evr::test::sanitized() ? 15 : 40;
  for (auto& l : lanes) l->run_jobs(jobs);
  REQUIRE(run_until(
      io,
      [&] {
        for (auto& l : lanes)
          if (l->done + l->failed < jobs) return false;
        return true;
      },
      60s));
  run_until(
      io, [] { return false; }, 20ms);
  for (auto& l : lanes) {
    CHECK(l->done.load() == jobs);
    CHECK(l->failed.load() == 0);
  }
  const evr::reactor_metrics m = r.metrics();
  CAPTURE(m.host_intakes);
  CAPTURE(m.host_completions);
  CAPTURE(m.wakeups);
  CHECK(m.completed == 16u * jobs);
  CHECK(m.host_intakes > 0);
  CHECK(m.host_completions > 0);
}

TEST_CASE(
    "handover: a doorbell that rings while the host covers its stream wakes the reactor once, and "
    "the host goes on finding its waits") {
  // The reactor arms a doorbell on a hosted stream when it looks there itself (the host late,
  // and the wait older than doorbell_after), behind the work then queued. When the doorbell rang
  // while the host covered the stream again, the reactor's sweeps left the stream to the host,
  // the rung doorbell stayed set, and the reactor's naps all returned at once: it never slept,
  // so it never gave up the pass lock, the host's passes never ran (each one re-promised a look,
  // which kept the stream covered), and the stream's waits hung (issue 43: evr-bench idle, the
  // ladder, 16 streams in lockstep, posted). Here: K1 (30 ms), W1, K1b (8 ms), the doorbell
  // armed while the host is away, then K2 (a learned 20 ms), W2; the doorbell rings as K1b ends,
  // before W2's window, with the host covering it.
  for (evr::idle_mode mode : {evr::idle_mode::ladder, evr::idle_mode::predictive}) {
    CAPTURE(std::string(evr::to_string(mode)));
    evr::sim::device sim(threaded);
    auto opts = quick_options(evr::strategy::adaptive);
    opts.idle = mode;
    opts.doorbell_after = 1ms;
    opts.fault_probe_interval = 1s;
    evr::reactor r(sim, opts);
    asio::io_context io(1);
    evr::gpu_waiter waiter(io.get_executor(), r);
    lane l(sim, waiter, 20ms);
    REQUIRE(learn_until_hosted(io, l, r));

    // The host away (nobody runs the context): the reactor looks at W1 itself, past the host's
    // promise and its grace, and arms a doorbell behind K1b.
    std::atomic<int> w1{0}, w2{0};
    const std::uint64_t doorbells = r.metrics().doorbells;
    sim.launch_kernel(l.stream.native(), 30ms);
    waiter.async_wait(l.stream, [&](evr::asio_error_code ec) { w1 = ec ? -1 : 1; });
    sim.launch_kernel(l.stream.native(), 8ms);
    if (!wait_until([&] { return r.metrics().doorbells > doorbells; }, 10s)) {
      MESSAGE("no doorbell was armed (a loaded machine): the case did not arise");
      continue;
    }
    sim.launch_kernel(l.stream.native(), 20ms);
    waiter.async_wait(l.stream, [&](evr::asio_error_code ec) { w2 = ec ? -1 : 1; });
    // The host back: both waits complete, each once.
    REQUIRE(run_until(
        io, [&] { return w1.load() != 0 && w2.load() != 0; }, 10s));
    CHECK(w1.load() == 1);
    CHECK(w2.load() == 1);
    // The host still finds the lane's waits.
    CHECK(learn_until_hosted(io, l, r));
  }
}
