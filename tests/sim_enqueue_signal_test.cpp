// signal_slot::enqueue_signal: evr's own signal behind work whose kernels cannot signal (a
// library's). What must hold: the wait completes only after the work before the signal, each wait
// once and in stream order, with nothing else of evr's on the stream; bad input is refused with
// an error that names it and enqueues nothing; a cancelled wait, a reactor stopped and an
// execution context destroyed (its io thread possibly inside a wait's polling window) end each
// wait once or drop its handler unrun, and the signals still land. (Graph capture itself needs
// the GPU: gpu_capture_test.cpp.)
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "support/asio.hpp"
#include "support/helpers.hpp"

using namespace std::chrono_literals;
using evr::test::quick_options;
using evr::test::wait_until;

namespace {
constexpr evr::sim::options manual{.devices = 2, .mode = evr::sim::run_mode::manual};

/// Library work (a kernel that knows nothing of evr) then evr's signal behind it; the ticket of
/// that signal.
evr::signal_ticket library_work_then_signal(evr::sim::device& sim, const evr::stream& st,
                                            evr::signal_slot& slot,
                                            std::chrono::nanoseconds duration = {}) {
  REQUIRE_FALSE(sim.launch_kernel(st.native(), duration));
  slot.enqueue_signal(st.native());
  return slot.arm();
}
}  // namespace

TEST_CASE("enqueue_signal: each wait completes after its work, once, in stream order") {
  for (evr::strategy s : {evr::strategy::fence, evr::strategy::adaptive}) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(manual);
    evr::reactor r(sim, quick_options(s));
    evr::stream st(sim, 0);
    evr::signal_slot slot = r.pools().signals(0).acquire();
    constexpr int n = 40;
    std::atomic<int> work_done{0};
    std::mutex mutex;
    std::vector<int> order;
    int early = 0;  // completions seen before their work had run (under `mutex`)
    const auto c0 = sim.counters();
    for (int i = 1; i <= n; ++i) {
      // Library work: two kernels that know nothing of the slot; the last one counts.
      REQUIRE_FALSE(sim.launch_kernel(st.native()));
      REQUIRE_FALSE(sim.launch_kernel(st.native(), {}, [&] { work_done.fetch_add(1); }));
      slot.enqueue_signal(st.native());
      const evr::signal_ticket t = slot.arm();
      REQUIRE_FALSE(evr::on_complete(r, evr::wait_target(st, t), [&, i](std::error_code ec) {
        std::lock_guard lock(mutex);
        if (ec || work_done.load() < i) ++early;
        order.push_back(i);
      }));
    }
    const auto c1 = sim.counters();
    CHECK(c1.fence_writes_enqueued == c0.fence_writes_enqueued);  // no marker of evr's
    CHECK(c1.event_records == c0.event_records);
    REQUIRE(wait_until([&] { return r.metrics().submitted == n; }));
    // One operation at a time: a completion may only follow its own signal kernel.
    for (int k = 0; k < 10 * n && slot.signalled() < static_cast<std::uint64_t>(n); ++k)
      sim.step(st.native(), 1);
    sim.run_until_blocked();
    REQUIRE(wait_until([&] {
      std::lock_guard lock(mutex);
      return order.size() == static_cast<std::size_t>(n);
    }));
    std::lock_guard lock(mutex);
    CHECK(early == 0);
    for (int i = 0; i < n; ++i) CHECK(order[static_cast<std::size_t>(i)] == i + 1);
    CHECK(slot.signalled() == static_cast<std::uint64_t>(n));
    CHECK(r.metrics().event_queries == 0);
  }
}

TEST_CASE("enqueue_signal: bad input is refused with an error that names it, nothing enqueued") {
  evr::sim::device sim(manual);
  evr::reactor r(sim, quick_options(evr::strategy::adaptive));
  evr::stream on_0(sim, 0), on_1(sim, 1);
  evr::signal_slot slot = r.pools().signals(0).acquire();
  std::error_code ec;
  slot.enqueue_signal(on_1.native(), ec);
  CHECK(ec == evr::errc::device_mismatch);
  evr::signal_slot empty;
  empty.enqueue_signal(on_0.native(), ec);
  CHECK(ec == evr::errc::empty_handle);
  CHECK(evr::test::thrown([&] { empty.enqueue_signal(on_0.native()); }) == evr::errc::empty_handle);
  int not_a_stream = 0;
  slot.enqueue_signal(&not_a_stream, ec);
  CHECK(ec);  // the backend's own error for a stream it does not know
  sim.run_until_blocked();
  CHECK(slot.signalled() == 0);  // a refused call enqueued nothing, on either device
  slot.enqueue_signal(on_0.native(), ec);
  CHECK_FALSE(ec);
  sim.run_until_blocked();
  CHECK(slot.signalled() == 1);
}

TEST_CASE("enqueue_signal: a cancelled wait and a reactor stopped end each wait once") {
  for (evr::strategy s : {evr::strategy::fence, evr::strategy::adaptive}) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(manual);
    evr::stream st(sim, 0);
    evr::reactor r(sim, quick_options(s));
    evr::signal_slot slot = r.pools().signals(0).acquire();
    std::mutex mutex;
    std::vector<std::pair<int, std::error_code>> seen;  // (wait, outcome), under `mutex`
    auto record = [&](int id) {
      return [&, id](std::error_code ec) {
        std::lock_guard lock(mutex);
        seen.emplace_back(id, ec);
      };
    };
    auto count = [&] {
      std::lock_guard lock(mutex);
      return seen.size();
    };
    evr::wait_handle h;
    for (int i = 0; i < 6; ++i) {
      const evr::signal_ticket t = library_work_then_signal(sim, st, slot);
      if (i == 2) {
        REQUIRE_FALSE(evr::on_complete(r, evr::wait_target(st, t), record(i), h));
      } else {
        REQUIRE_FALSE(evr::on_complete(r, evr::wait_target(st, t), record(i)));
      }
    }
    REQUIRE(wait_until([&] { return r.metrics().submitted == 6; }));
    CHECK(h.cancel());
    REQUIRE(wait_until([&] { return count() == 1; }));
    // One operation at a time until three signals landed: the cancelled third's work runs too,
    // unwatched.
    for (int k = 0; k < 100 && slot.signalled() < 3; ++k) sim.step(st.native(), 1);
    REQUIRE(slot.signalled() == 3);
    REQUIRE(wait_until([&] { return count() == 3; }));
    r.stop();  // the last three signals have not come: aborted, once each
    REQUIRE(count() == 6);
    sim.run_until_blocked();  // the rest of the work and its signals land after all
    CHECK(slot.signalled() == 6);
    std::lock_guard lock(mutex);
    CHECK(seen[0].first == 2);
    CHECK(seen[0].second == evr::errc::operation_aborted);
    CHECK(seen[1].first == 0);
    CHECK(seen[2].first == 1);
    CHECK_FALSE(seen[1].second);
    CHECK_FALSE(seen[2].second);
    for (std::size_t k = 3; k < 6; ++k) CHECK(seen[k].second == evr::errc::operation_aborted);
    CHECK(seen.size() == 6);  // nothing more after the stop, the signals' landing included
  }
}

TEST_CASE("enqueue_signal: contexts destroyed while their waits complete or are polled") {
  // Threaded device: the work ends while the context's thread runs (and polls its waits' windows
  // once their stream's length is learned) and while the context is being destroyed. Each
  // handler runs once or is destroyed unrun; nothing is posted into a dead context (ASan).
  const int rounds = evr::test::sanitized() ? 20 : 80;
  for (evr::strategy s : {evr::strategy::fence, evr::strategy::adaptive}) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim;  // threaded: the work runs by itself
    evr::reactor r(sim, quick_options(s));
    std::vector<evr::stream> streams;
    for (int i = 0; i < 4; ++i) streams.emplace_back(sim, 0);
    std::vector<evr::signal_slot> slots;
    for (int i = 0; i < 4; ++i) slots.push_back(r.pools().signals(0).acquire());
    std::uint64_t enqueued = 0;
    std::size_t ran_in_all = 0;
    for (int round = 0; round < rounds; ++round) {
      std::atomic<int> ran{0};
      auto token = std::make_shared<int>(0);  // one copy per live handler
      // The context runs here until `target` handlers ran (none to all of them, by round), then it
      // goes with the rest pending: some in a polling window of this thread, once earlier rounds
      // taught the streams' length.
      const int target = round % 17;
      {
        asio::io_context io;
        evr::gpu_waiter waiter(io.get_executor(), r);
        for (int i = 0; i < 16; ++i) {
          const std::size_t k = static_cast<std::size_t>(i % 4);
          const evr::signal_ticket t =
              library_work_then_signal(sim, streams[k], slots[k], std::chrono::microseconds(400));
          ++enqueued;
          waiter.async_wait(evr::wait_target(streams[k], t),
                            [&ran, token](evr::asio_error_code) { ran.fetch_add(1); });
        }
        {
          auto work = asio::make_work_guard(io);  // run_for returns at once on an idle context else
          const auto give_up = std::chrono::steady_clock::now() + 20s;
          while (ran.load() < target && std::chrono::steady_clock::now() < give_up)
            io.run_for(200us);
        }
        if (round % 3 == 0) waiter.cancel();
      }  // the waiter, then the context: whatever is pending is detached
      CHECK(token.use_count() == 1);  // every handler ran or was destroyed
      CHECK(ran.load() >= target);
      CHECK(ran.load() <= 16);
      ran_in_all += static_cast<std::size_t>(ran.load());
    }
    sim.wait_idle();
    std::uint64_t signalled = 0;
    for (const evr::signal_slot& slot : slots) signalled += slot.signalled();
    CHECK(signalled == enqueued);  // every signal landed, watched or not
    REQUIRE(wait_until([&] { return r.metrics().in_flight == 0; }));
    CHECK(r.metrics().host_passes > 0);  // the contexts' threads looked for their waits themselves
    MESSAGE(std::string(evr::to_string(s))
            << ": " << ran_in_all << " handlers ran, the rest dropped");
  }
}
