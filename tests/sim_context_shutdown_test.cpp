// Destroying an execution context with gpu_waiter waits pending (issue 13 item 1), on the
// simulated device: reactor_service::shutdown detaches the context's waits, their handlers are
// destroyed without running (coroutine frames included), nothing is posted into the dead context
// afterwards, and the markers go back to the pool only once the GPU is past them. Meant to run
// under ASan (use after free, leaks) and TSan as well as in Release.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <system_error>
#include <thread>
#include <vector>

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "support/asio.hpp"
#include "support/helpers.hpp"

using namespace std::chrono_literals;
using evr::test::quick_options;
using evr::test::wait_until;

namespace {

/// Counts what became of a set of handlers: run, or destroyed without running. `token` is copied
/// into each handler; its use_count falls back to 1 once every handler is gone.
struct fate {
  std::atomic<int> ran{0};
  std::shared_ptr<int> token = std::make_shared<int>(0);
  long alive_handlers() const { return token.use_count() - 1; }
  auto handler() {
    return [this, t = token](evr::asio_error_code) { ++ran; };
  }
};

/// Marker events of the reactor's pools handed out and not yet back.
std::uint64_t markers_out(evr::reactor& r) { return r.pools().stats().in_use; }

}  // namespace

TEST_CASE(
    "context shutdown: io_context destroyed with waits pending; waiter destroyed before or after") {
  for (bool waiter_first : {true, false}) {
    CAPTURE(waiter_first);
    evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
    auto opts = quick_options(evr::strategy::poll);  // pooled event markers: countable
    evr::reactor r(sim, opts);
    evr::stream st(sim, 0);
    REQUIRE(sim.launch_kernel(st.native()) == std::error_code{});  // the GPU work, still running
    fate f;
    constexpr int n = 64;
    auto io = std::make_unique<asio::io_context>();
    auto waiter = std::make_unique<evr::gpu_waiter>(io->get_executor(), r);
    std::vector<asio::cancellation_signal> signals(n / 2);
    for (int i = 0; i < n; ++i) {
      if (i % 2 == 0) {
        waiter->async_wait(st, asio::bind_cancellation_slot(
                                   signals[static_cast<std::size_t>(i / 2)].slot(), f.handler()));
      } else {
        waiter->async_wait(st, f.handler());
      }
    }
    CHECK(f.alive_handlers() == n);
    CHECK(markers_out(r) == n);
    if (waiter_first) waiter.reset();  // cancels: the aborts race the context's destruction
    io.reset();                        // shutdown(): detached, handlers destroyed unrun
    CHECK(f.alive_handlers() == 0);
    CHECK(f.ran.load() == 0);
    // Every wait is accounted for: aborted by the waiter's cancel (posted, then destroyed with
    // the context) or detached; none still counts as in flight.
    const evr::reactor_metrics m = r.metrics();
    CHECK(m.in_flight == 0);
    CHECK(m.detached + m.cancelled == static_cast<std::uint64_t>(n));
    if (!waiter_first) CHECK(m.detached == static_cast<std::uint64_t>(n));
    // The signals outlive their waits: the slots were disconnected when the operations were
    // destroyed, so emitting reaches nothing (it used to call into the freed operations).
    for (asio::cancellation_signal& sig : signals) {
      CHECK_FALSE(sig.slot().has_handler());
      sig.emit(asio::cancellation_type::terminal);
    }
    waiter.reset();  // after its context: harmless
    // The GPU finishes later: nothing is posted anywhere, the markers come back once it is past.
    CHECK(markers_out(r) == n);  // the GPU is not past them yet: none went back early
    sim.run_until_blocked();
    REQUIRE(wait_until([&] { return markers_out(r) == 0; }));
    // The reactor goes on serving other contexts.
    asio::io_context other;
    evr::gpu_waiter w2(other.get_executor(), r);
    bool done = false, ok = false;
    w2.async_wait(st, [&](evr::asio_error_code ec) {
      ok = !ec;
      done = true;
    });
    sim.run_until_blocked();
    REQUIRE(evr::test::run_until(other, [&] { return done; }));
    CHECK(ok);
  }
}

TEST_CASE("context shutdown: an io_context stopped and never run again, then destroyed") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
  evr::reactor r(sim, quick_options(evr::strategy::poll));
  evr::stream done_st(sim, 0), busy_st(sim, 0);
  REQUIRE(sim.launch_kernel(busy_st.native()) == std::error_code{});
  fate completed, pending;
  auto io = std::make_unique<asio::io_context>();
  evr::gpu_waiter waiter(io->get_executor(), r);
  io->stop();
  for (int i = 0; i < 16; ++i) waiter.async_wait(done_st, completed.handler());
  for (int i = 0; i < 16; ++i) waiter.async_wait(busy_st, pending.handler());
  sim.step(done_st.native(), 16);  // these complete: posted into the stopped context
  REQUIRE(wait_until([&] { return r.metrics().completed == 16; }));
  io.reset();
  CHECK(completed.alive_handlers() == 0);
  CHECK(pending.alive_handlers() == 0);
  CHECK(completed.ran.load() + pending.ran.load() == 0);
  sim.run_until_blocked();
  REQUIRE(wait_until([&] { return markers_out(r) == 0; }));
}

TEST_CASE("context shutdown: coroutines suspended in co_await async_wait are destroyed cleanly") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
  evr::reactor r(sim, quick_options(evr::strategy::fence));
  evr::stream st(sim, 0);
  REQUIRE(sim.launch_kernel(st.native()) == std::error_code{});
  auto token = std::make_shared<int>(0);
  std::atomic<int> resumed{0}, started{0};
  {
    asio::io_context io;
    evr::gpu_waiter waiter(io.get_executor(), r);
    for (int i = 0; i < 32; ++i) {
      asio::co_spawn(
          io,
          [&, t = token]() -> asio::awaitable<void> {
            auto keep = t;  // in the frame: freed only when the frame is
            ++started;
            co_await waiter.async_wait(st, asio::use_awaitable);
            ++resumed;
          },
          asio::detached);
    }
    io.poll();  // every coroutine suspended in the wait
    CHECK(started.load() == 32);
    CHECK(token.use_count() > 1);
  }  // the waiter (declared last) dies first and cancels; the context dies before the aborts ran
  CHECK(token.use_count() == 1);  // every frame destroyed (ASan's leak check agrees)
  CHECK(resumed.load() == 0);
  sim.run_until_blocked();
}

TEST_CASE("context shutdown: coroutines, the waiter outliving its context") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
  evr::reactor r(sim, quick_options(evr::strategy::adaptive));
  evr::stream st(sim, 0);
  REQUIRE(sim.launch_kernel(st.native()) == std::error_code{});
  auto token = std::make_shared<int>(0);
  std::atomic<int> resumed{0};
  // A pointer, not a std::optional: GCC 12 under TSan took the optional's destructor for a read
  // of an uninitialised waiter (-Wmaybe-uninitialized, a false positive).
  std::unique_ptr<evr::gpu_waiter> waiter;
  {
    asio::io_context io;
    waiter = std::make_unique<evr::gpu_waiter>(io.get_executor(), r);
    for (int i = 0; i < 32; ++i) {
      asio::co_spawn(
          io,
          [&, t = token]() -> asio::awaitable<void> {
            auto keep = t;
            co_await waiter->async_wait(st, asio::use_awaitable);
            ++resumed;
          },
          asio::detached);
    }
    io.poll();
  }
  CHECK(token.use_count() == 1);
  CHECK(resumed.load() == 0);
  sim.run_until_blocked();
  waiter.reset();
}

TEST_CASE("context shutdown: on the reactor thread (an inline handler destroys the context)") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
  std::atomic<bool> destroyed{false};  // before the reactor: its destructor may run the handler
  evr::reactor r(sim, quick_options(evr::strategy::poll));
  evr::stream trigger(sim, 0), busy(sim, 0);
  REQUIRE(sim.launch_kernel(busy.native()) == std::error_code{});
  fate f;
  auto io = std::make_unique<asio::io_context>();
  auto waiter = std::make_unique<evr::gpu_waiter>(io->get_executor(), r);
  for (int i = 0; i < 16; ++i) waiter->async_wait(busy, f.handler());
  // The handler owns the waiter and the context (it may run in the reactor's destructor).
  REQUIRE_FALSE(evr::on_complete(
      r, trigger,
      [&destroyed, waiter = std::move(waiter), io = std::move(io)](std::error_code) mutable {
        waiter.reset();
        io.reset();  // shutdown() on the reactor thread: detached directly
        destroyed = true;
      }));
  sim.step(trigger.native());
  REQUIRE(wait_until([&] { return destroyed.load(); }));
  CHECK(f.alive_handlers() == 0);
  CHECK(f.ran.load() == 0);
  sim.run_until_blocked();
  REQUIRE(wait_until([&] { return markers_out(r) == 0; }));
}

TEST_CASE("context shutdown: the reactor stopped or destroyed before the context") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
  evr::stream st(sim, 0);
  REQUIRE(sim.launch_kernel(st.native()) == std::error_code{});
  auto opts = quick_options(evr::strategy::poll);
  opts.shutdown_drain = 1ms;
  for (bool destroy : {false, true}) {
    CAPTURE(destroy);
    auto r = std::make_unique<evr::reactor>(sim, opts);
    fate f;
    {
      asio::io_context io;
      auto waiter = std::make_unique<evr::gpu_waiter>(io.get_executor(), *r);
      for (int i = 0; i < 8; ++i) waiter->async_wait(st, f.handler());
      if (destroy) {
        waiter.reset();  // a waiter must not outlive its reactor
        r.reset();       // aborted waits posted into io; the service's weak reference expires
      } else {
        r->stop();  // aborted waits posted into io; the reactor's thread has ended
      }
    }  // io's shutdown finds nothing to detach; the posted handlers are destroyed unrun
    CHECK(f.alive_handlers() == 0);
    CHECK(f.ran.load() == 0);
  }
  sim.run_until_blocked();
}

TEST_CASE("context shutdown: contexts destroyed while the GPU completes their waits") {
  // Threaded device: completions race the shutdown. Each handler runs once or is destroyed
  // unrun, never both, never posted into a dead context (ASan), for every strategy.
  const int rounds = evr::test::sanitized() ? 30 : 150;
  for (evr::strategy s : evr::test::all_strategies) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim;
    evr::reactor r(sim, quick_options(s));
    std::vector<evr::stream> streams;
    for (int i = 0; i < 4; ++i) streams.emplace_back(sim, 0);
    std::size_t ran = 0;
    for (int round = 0; round < rounds; ++round) {
      fate f;
      {
        asio::io_context io;
        evr::gpu_waiter waiter(io.get_executor(), r);
        // Half the handlers on a strand of the context: posted to the strand, which queues them
        // in its own operations that the shutdown may find.
        auto strand = asio::make_strand(io);
        std::thread runner([&] {
          auto work = asio::make_work_guard(io);
          io.run_for(std::chrono::microseconds(50 * (round % 8)));
        });
        for (int i = 0; i < 32; ++i) {
          evr::stream& st = streams[static_cast<std::size_t>(i % 4)];
          if (i % 4 == 0) (void)sim.launch_kernel(st.native(), std::chrono::microseconds(i));
          if (i % 2 == 0) {
            waiter.async_wait(st, f.handler());
          } else {
            waiter.async_wait(st, asio::bind_executor(strand, f.handler()));
          }
        }
        runner.join();
        if (round % 2 == 0) waiter.cancel();
      }  // waiter, then the context: whatever is pending is detached
      CHECK(f.alive_handlers() == 0);
      CHECK(f.ran.load() <= 32);
      ran += static_cast<std::size_t>(f.ran.load());
    }
    sim.wait_idle();
    REQUIRE(wait_until([&] { return markers_out(r) == 0; }));
    MESSAGE(std::string(evr::to_string(s)) << ": " << ran << " handlers ran, the rest destroyed");
  }
}
