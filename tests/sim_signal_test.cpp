// Device-signalled waits (evr/pool/signal_pool.hpp, wait_target(stream, signal_ticket)): the
// user's kernel signals a slot, evr adds nothing to the stream, and the reactor (or an io_context
// thread near the predicted end) finds the signal with a memory read. What must hold: each wait
// completes exactly once, in stream order with the stream's other waits; a kernel that never
// signals fails its wait with errc::not_signalled once the stream is idle; a fault fails it with
// the device's error; cancellation, owner cancel and a context destroyed mid-window behave as for
// any wait; a slot is not reused while a signal it was armed for can still land.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <system_error>
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

constexpr evr::sim::options manual{.devices = 1, .mode = evr::sim::run_mode::manual};
constexpr evr::sim::options threaded{.devices = 1, .mode = evr::sim::run_mode::threaded};
constexpr evr::strategy signal_strategies[] = {evr::strategy::fence, evr::strategy::adaptive};

/// A simulated kernel that signals `slot` when it ends (what evr::signal does on the GPU).
std::error_code launch_signalling(evr::sim::device& sim, const evr::stream& st,
                                  const evr::signal_slot& slot,
                                  std::chrono::nanoseconds duration = {}) {
  return sim.launch_kernel(st.native(), duration, [ref = slot.ref()] { evr::sim::signal(ref); });
}

/// Runs the manual device's queued operations until `done()` (20 s at most): for outcomes that
/// need the stream idle (a signal that never came, a fault), where the reactor may have queued a
/// doorbell host function (adaptive, an old wait) after the test last ran the device; on a GPU
/// it would run by itself.
bool run_device_until(evr::sim::device& sim, const std::function<bool()>& done) {
  return wait_until([&] {
    sim.run_until_blocked();
    return done();
  });
}

/// Outcomes of on_complete callbacks, in the order they ran (on the reactor thread). The callbacks
/// share the record's state, so that it outlives a reactor declared before it: when a REQUIRE
/// fails, the test's locals go in reverse order, and the reactor's destructor then completes the
/// waits still pending, with errors, on its own thread (into a freed vector, before this was so).
struct outcomes {
  struct record {
    std::mutex mutex;
    std::vector<std::pair<int, std::error_code>> seen;
  };
  std::shared_ptr<record> state = std::make_shared<record>();
  std::vector<std::pair<int, std::error_code>>& seen = state->seen;  // read once count() is final

  auto callback(int id) {
    return [state = state, id](std::error_code ec) {
      std::lock_guard<std::mutex> lock(state->mutex);
      state->seen.emplace_back(id, ec);
    };
  }
  std::size_t count() {
    std::lock_guard<std::mutex> lock(state->mutex);
    return state->seen.size();
  }
};

}  // namespace

TEST_CASE("signal: a wait completes when the kernel signals; evr puts nothing on the stream") {
  for (evr::strategy s : signal_strategies) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(manual);
    evr::reactor r(sim, quick_options(s));
    evr::stream st(sim, 0);
    evr::signal_slot slot = r.pools().signals(0).acquire();
    REQUIRE(slot);
    CHECK(slot.device() == 0);
    outcomes out;
    const auto c0 = sim.counters();
    constexpr int n = 50;
    for (int i = 0; i < n; ++i) {
      const evr::signal_ticket t = slot.arm();
      REQUIRE(launch_signalling(sim, st, slot) == std::error_code{});
      REQUIRE_FALSE(evr::on_complete(r, evr::wait_target(st, t), out.callback(i)));
    }
    const auto c1 = sim.counters();
    CHECK(c1.fence_writes_enqueued == c0.fence_writes_enqueued);  // no marker of evr's
    CHECK(c1.event_records == c0.event_records);
    REQUIRE(wait_until([&] { return r.metrics().submitted == n; }));
    CHECK(out.count() == 0);  // nothing signalled yet
    // Half the kernels, one operation at a time: adaptive may have put a doorbell host function
    // (an operation that signals nothing) among them for a wait that got old on a loaded machine.
    const std::uint64_t before = slot.signalled();
    for (int k = 0; k < 2 * n && slot.signalled() - before < n / 2; ++k) sim.step(st.native(), 1);
    REQUIRE(slot.signalled() - before == n / 2);
    REQUIRE(wait_until([&] { return out.count() == n / 2; }));
    sim.run_until_blocked();
    REQUIRE(wait_until([&] { return out.count() == n; }));
    for (int i = 0; i < n; ++i) {
      CHECK(out.seen[static_cast<std::size_t>(i)].first == i);  // stream order
      CHECK_FALSE(out.seen[static_cast<std::size_t>(i)].second);
    }
    CHECK(slot.signalled() == slot.armed());
    const auto m = r.metrics();
    CHECK(m.completed == static_cast<std::uint64_t>(n));
    CHECK(m.event_queries == 0);
    // No host function as a marker either. adaptive may arm a doorbell (a host function that
    // wakes the reactor) for a wait that got old while this loop submitted, on a loaded machine:
    // every host function launched meanwhile must be one of the doorbells counted.
    CAPTURE(m.doorbells);
    CHECK(c1.host_funcs_launched - c0.host_funcs_launched <= m.doorbells);
    if (s == evr::strategy::fence) CHECK(c1.host_funcs_launched == c0.host_funcs_launched);
  }
}

TEST_CASE("signal: mixed with the stream's other waits, every wait retires in stream order") {
  for (evr::strategy s : signal_strategies) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(manual);
    auto opts = quick_options(s);
    opts.max_fence_streams = 1;  // a second stream below makes the plain waits record events
    evr::reactor r(sim, opts);
    evr::stream other(sim, 0);
    evr::stream st(sim, 0);
    evr::signal_slot slot = r.pools().signals(0).acquire();
    outcomes out;
    REQUIRE_FALSE(evr::on_complete(r, other, out.callback(-1)));
    constexpr int n = 60;
    for (int i = 0; i < n; ++i) {
      if (i % 3 == 0) {
        const evr::signal_ticket t = slot.arm();
        REQUIRE(launch_signalling(sim, st, slot) == std::error_code{});
        REQUIRE_FALSE(evr::on_complete(r, evr::wait_target(st, t), out.callback(i)));
      } else {
        REQUIRE(sim.launch_kernel(st.native()) == std::error_code{});
        REQUIRE_FALSE(evr::on_complete(r, st, out.callback(i)));
      }
    }
    for (int k = 0; k < n; k += 7) {
      sim.step(st.native(), 7);
      std::this_thread::yield();
    }
    sim.run_until_blocked();
    REQUIRE(wait_until([&] { return out.count() == n + 1; }));
    int last = -1;
    for (auto& [id, ec] : out.seen) {
      CHECK_FALSE(ec);
      if (id < 0) continue;
      CHECK(id > last);
      last = id;
    }
  }
}

TEST_CASE("signal: refused where it cannot be served, with an error that names why") {
  evr::sim::device sim(manual);
  evr::stream st(sim, 0);
  for (evr::strategy s : {evr::strategy::poll, evr::strategy::host_func}) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::reactor r(sim, quick_options(s));
    evr::signal_slot slot = r.pools().signals(0).acquire();
    const std::error_code ec =
        evr::on_complete(r, evr::wait_target(st, slot.arm()), [](std::error_code) {});
    CHECK(ec == evr::errc::unsupported);
  }
  evr::reactor r(sim, quick_options(evr::strategy::adaptive));
  CHECK(evr::on_complete(r, evr::wait_target(st, evr::signal_ticket{}), [](std::error_code) {}) ==
        evr::errc::empty_handle);
  CHECK(evr::on_complete(r, evr::wait_target(evr::stream{}, evr::signal_ticket{}),
                         [](std::error_code) {}) == evr::errc::empty_handle);
  CHECK(r.pools().signals(0).stats().slots == 0);  // nothing acquired from this reactor's pool
  const std::error_code no_device = evr::test::thrown([&] { r.pools().signals(5); });
  CHECK(no_device == evr::errc::no_device);
}

TEST_CASE("signal: a kernel that never signals fails its wait with not_signalled; the rest go on") {
  for (evr::strategy s : signal_strategies) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(manual);
    evr::reactor r(sim, quick_options(s));  // fault probe every 2 ms
    evr::stream st(sim, 0);
    evr::signal_slot slot = r.pools().signals(0).acquire();
    outcomes out;
    // Alone on its stream: the fault probe finds the stream idle and the signal missing.
    REQUIRE(sim.launch_kernel(st.native()) == std::error_code{});  // returns without signalling
    REQUIRE_FALSE(evr::on_complete(r, evr::wait_target(st, slot.arm()), out.callback(0)));
    REQUIRE(run_device_until(sim, [&] { return out.count() == 1; }));
    // Followed by a plain wait: its marker lands behind the kernel, so the stream is past it.
    REQUIRE(sim.launch_kernel(st.native()) == std::error_code{});
    REQUIRE_FALSE(evr::on_complete(r, evr::wait_target(st, slot.arm()), out.callback(1)));
    REQUIRE_FALSE(evr::on_complete(r, st, out.callback(2)));
    REQUIRE(run_device_until(sim, [&] { return out.count() == 3; }));
    for (int i = 0; i < 2; ++i) {
      CHECK(out.seen[static_cast<std::size_t>(i)].first == i);
      CHECK(out.seen[static_cast<std::size_t>(i)].second == evr::errc::not_signalled);
    }
    CHECK(evr::test::contains(out.seen[0].second.message(), "evr::signal"));
    CHECK_FALSE(out.seen[2].second);
    CHECK(r.metrics().failed == 2);
  }
}

TEST_CASE("signal: a device fault fails a pending signal wait with the CUDA error") {
  for (evr::strategy s : signal_strategies) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(manual);
    evr::reactor r(sim, quick_options(s));
    evr::stream st(sim, 0);
    evr::signal_slot slot = r.pools().signals(0).acquire();
    outcomes out;
    REQUIRE(sim.launch_faulting_kernel(st.native()) == std::error_code{});
    const evr::signal_ticket t = slot.arm();
    REQUIRE(launch_signalling(sim, st, slot) == std::error_code{});  // never runs
    REQUIRE_FALSE(evr::on_complete(r, evr::wait_target(st, t), out.callback(0)));
    REQUIRE(run_device_until(sim, [&] { return out.count() == 1; }));
    CHECK(out.seen[0].second.category() == evr::cuda_category());
    CHECK(slot.signalled() == 0);
  }
}

TEST_CASE("signal: cancelled, owner-cancelled and aborted waits complete once; the rest go on") {
  for (evr::strategy s : signal_strategies) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(manual);
    evr::reactor r(sim, quick_options(s));
    evr::stream st(sim, 0);
    evr::signal_slot slot = r.pools().signals(0).acquire();
    asio::io_context io;
    outcomes out;
    std::atomic<int> waited_ok{0}, waited_aborted{0};
    evr::wait_handle h;
    {
      evr::gpu_waiter waiter(io.get_executor(), r);
      for (int i = 0; i < 30; ++i) {
        const evr::signal_ticket t = slot.arm();
        REQUIRE(launch_signalling(sim, st, slot) == std::error_code{});
        if (i == 10) {
          REQUIRE_FALSE(evr::on_complete(r, evr::wait_target(st, t), out.callback(i), h));
        } else if (i % 2 == 0) {
          waiter.async_wait(evr::wait_target(st, t), [&](evr::asio_error_code ec) {
            (ec == asio::error::operation_aborted ? waited_aborted : waited_ok).fetch_add(1);
          });
        } else {
          REQUIRE_FALSE(evr::on_complete(r, evr::wait_target(st, t), out.callback(i)));
        }
      }
      REQUIRE(wait_until([&] { return r.metrics().submitted == 30; }));
      CHECK(h.cancel());  // the middle wait leaves its stream's timeline
      waiter.cancel();    // and every wait of the waiter
      REQUIRE(run_until(io, [&] { return waited_aborted.load() == 14; }));
    }
    REQUIRE(wait_until([&] { return out.count() == 1; }));
    CHECK(out.seen[0].first == 10);
    CHECK(out.seen[0].second == evr::errc::operation_aborted);
    sim.run_until_blocked();  // every kernel signals, the cancelled waits' ones too
    REQUIRE(wait_until([&] { return out.count() == 16; }));  // the cancelled one, 15 signalled
    for (std::size_t k = 1; k < out.seen.size(); ++k) CHECK_FALSE(out.seen[k].second);
    CHECK(waited_ok.load() == 0);
    const auto m = r.metrics();
    CHECK(m.cancelled == 15);
    CHECK(m.completed == 15);
    CHECK(m.in_flight == 0);
  }
}

TEST_CASE("signal: a slot given back before its signals landed is not handed out until they do") {
  evr::sim::device sim(manual);
  evr::reactor r(sim, quick_options(evr::strategy::adaptive));
  evr::stream st(sim, 0);
  evr::signal_pool& pool = r.pools().signals(0);
  const evr::signal_ref first_ref = [&] {
    evr::signal_slot slot = pool.acquire();
    (void)slot.arm();
    REQUIRE(launch_signalling(sim, st, slot) == std::error_code{});
    return slot.ref();
  }();  // given back with its signal still to come
  CHECK(pool.stats().waiting == 1);
  {
    evr::signal_slot other = pool.acquire();
    CHECK(other.ref().word != first_ref.word);  // not the one whose signal is still to land
    CHECK(pool.stats().in_use == 1);
  }
  sim.run_until_blocked();  // the late signal lands
  CHECK(pool.stats().waiting == 0);
  // Reused now, counting on from where it was: a wait on it needs a new signal.
  std::vector<evr::signal_slot> all;
  for (std::size_t i = 0; i < pool.stats().slots; ++i) all.push_back(pool.acquire());
  bool found = false;
  for (auto& slot : all) {
    if (slot.ref().word != first_ref.word) continue;
    found = true;
    CHECK(slot.signalled() == 1);
    CHECK(slot.armed() == 1);
    outcomes out;
    const evr::signal_ticket t = slot.arm();
    CHECK(t.value == 2);
    REQUIRE(launch_signalling(sim, st, slot) == std::error_code{});  // held: manual device
    REQUIRE_FALSE(evr::on_complete(r, evr::wait_target(st, t), out.callback(0)));
    std::this_thread::sleep_for(5ms);  // not a synchronisation: a wrong early completion shows
    CHECK(out.count() == 0);           // the old count (1) does not satisfy it
    sim.run_until_blocked();
    REQUIRE(wait_until([&] { return out.count() == 1; }));
    CHECK_FALSE(out.seen[0].second);
  }
  CHECK(found);
}

TEST_CASE(
    "signal: hosted on an io_context (delivery::post), exactly once, on the context's thread") {
  for (evr::strategy s : signal_strategies) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(threaded);
    auto opts = quick_options(s);
    opts.fault_probe_interval = 50ms;
    evr::reactor r(sim, opts);
    evr::stream st(sim, 0);
    evr::signal_slot slot = r.pools().signals(0).acquire();
    asio::io_context io(1);
    evr::gpu_waiter waiter(io.get_executor(), r);
    const auto runner = std::this_thread::get_id();
    constexpr int jobs = 40;
    std::atomic<int> done{0}, failed{0}, wrong_thread{0};
    std::function<void()> next = [&] {
      const evr::signal_ticket t = slot.arm();
      REQUIRE(launch_signalling(sim, st, slot, 2ms) == std::error_code{});
      waiter.async_wait(evr::wait_target(st, t), [&](evr::asio_error_code ec) {
        (ec ? failed : done).fetch_add(1);
        if (std::this_thread::get_id() != runner) wrong_thread.fetch_add(1);
        if (done + failed < jobs) next();
      });
    };
    next();
    REQUIRE(run_until(
        io, [&] { return done + failed == jobs; }, 30s));
    CHECK(done.load() == jobs);
    CHECK(wrong_thread.load() == 0);
    const auto m = r.metrics();
    CAPTURE(m.host_passes);
    CAPTURE(m.host_completions);
    CHECK(m.completed == static_cast<std::uint64_t>(jobs));
    CHECK(m.host_passes > 0);  // the context's thread looked for its waits itself
  }
}

TEST_CASE("signal: a context destroyed with signal waits pending, and a reactor stopped") {
  evr::sim::device sim(manual);
  evr::stream st(sim, 0);
  evr::reactor r(sim, quick_options(evr::strategy::adaptive));
  evr::signal_slot slot = r.pools().signals(0).acquire();
  std::atomic<int> ran{0};
  {
    asio::io_context io;
    evr::gpu_waiter waiter(io.get_executor(), r);
    for (int i = 0; i < 10; ++i) {
      const evr::signal_ticket t = slot.arm();
      REQUIRE(launch_signalling(sim, st, slot) == std::error_code{});
      waiter.async_wait(evr::wait_target(st, t), [&](evr::asio_error_code) { ran.fetch_add(1); });
    }
    REQUIRE(wait_until([&] { return r.metrics().submitted == 10; }));
  }  // the context goes: its waits are detached, their handlers never run
  CHECK(ran.load() == 0);
  REQUIRE(wait_until([&] { return r.metrics().in_flight == 0; }));
  outcomes out;
  const evr::signal_ticket t = slot.arm();
  REQUIRE(launch_signalling(sim, st, slot) == std::error_code{});
  REQUIRE_FALSE(evr::on_complete(r, evr::wait_target(st, t), out.callback(0)));
  r.stop();  // the GPU never got there: aborted
  REQUIRE(out.count() == 1);
  CHECK(out.seen[0].second == evr::errc::operation_aborted);
  sim.run_until_blocked();  // the kernels run and signal after all; nothing touches freed memory
  CHECK(slot.signalled() == 11);
}
