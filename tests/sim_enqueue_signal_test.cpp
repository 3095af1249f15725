// signal_slot::enqueue_signal: evr's own signal behind work whose kernels cannot signal (a
// library's). What must hold: the wait completes only after the work before the signal, each wait
// once and in stream order, with nothing else of evr's on the stream; bad input is refused with
// an error that names it and enqueues nothing. (Graph capture itself needs the GPU:
// gpu_capture_test.cpp.)
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <system_error>
#include <vector>

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "support/helpers.hpp"

using namespace std::chrono_literals;
using evr::test::quick_options;
using evr::test::wait_until;

namespace {
constexpr evr::sim::options manual{.devices = 2, .mode = evr::sim::run_mode::manual};
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
