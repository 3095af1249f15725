// Device-signalled waits on the device under test (the simulated device in evr_tests, the GPU in
// evr_gpu_tests): kernels that signal a slot, of one block and of many (evr::signal_from_last_block
// counts the blocks and resets itself between launches), waits on them through each front end,
// a kernel that never signals, and evr's own signal kernel behind kernels that do not. On the GPU
// this is the real thing: mapped host words written by the kernel, device counters, the reactor's
// memory reads.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <system_error>
#include <vector>

#include <evr/evr.hpp>

#include "support/asio.hpp"
#include "support/device_under_test.hpp"
#include "support/helpers.hpp"

using evr::test::dut;
using evr::test::quick_options;
using evr::test::run_until;
using evr::test::wait_until;

TEST_CASE("signal (device): kernels of one and of many blocks signal their slot, every wait once") {
  evr::device::backend& be = dut().backend();
  for (evr::strategy s : {evr::strategy::fence, evr::strategy::adaptive}) {
    CAPTURE(std::string(evr::to_string(s)));
    std::atomic<int> ok{0}, bad{0};  // before the reactor: its destructor completes pending waits
    evr::reactor r(be, quick_options(s));
    evr::stream st(be, 0);
    evr::signal_slot slot = r.pools().signals(0).acquire();
    asio::io_context io;
    evr::gpu_waiter waiter(io.get_executor(), r);
    int posted_ok = 0;
    constexpr int n = 60;
    for (int i = 0; i < n; ++i) {
      const evr::signal_ticket t = slot.arm();
      dut().launch_signal(st.native(), slot.ref(), 20, i % 3 == 0 ? 1u : 48u);
      if (i % 2 == 0) {
        REQUIRE_FALSE(evr::on_complete(r, evr::wait_target(st, t),
                                       [&](std::error_code ec) { (ec ? bad : ok).fetch_add(1); }));
      } else {
        waiter.async_wait(evr::wait_target(st, t), [&](evr::asio_error_code ec) {
          if (!ec) ++posted_ok;
        });
      }
    }
    REQUIRE(run_until(io, [&] { return ok + bad == n / 2 && posted_ok == n / 2; }));
    CHECK(bad.load() == 0);
    CHECK(slot.signalled() == slot.armed());
    const auto m = r.metrics();
    CHECK(m.completed == static_cast<std::uint64_t>(n));
    CHECK(m.failed == 0);
  }
}

TEST_CASE("signal (device): a kernel that returns without signalling fails its wait") {
  evr::device::backend& be = dut().backend();
  // Before the reactor: its destructor completes a pending wait into these.
  std::atomic<int> calls{0};
  std::error_code seen;
  evr::reactor r(be, quick_options(evr::strategy::adaptive));
  evr::stream st(be, 0);
  evr::signal_slot slot = r.pools().signals(0).acquire();
  dut().launch_busy(st.native(), 50);  // never signals
  REQUIRE_FALSE(evr::on_complete(r, evr::wait_target(st, slot.arm()), [&](std::error_code ec) {
    seen = ec;
    calls.fetch_add(1);
  }));
  REQUIRE(wait_until([&] { return calls.load() == 1; }));
  CHECK(seen == evr::errc::not_signalled);
  // The slot expects one more signal than it got: given back, it is not reused.
  slot.release();
  CHECK(r.pools().signals(0).stats().waiting == 1);
}

TEST_CASE("signal (device): enqueue_signal behind kernels that do not signal, outside a graph") {
  // evr's own signal kernel (on the GPU: PTX the driver compiles, launched through the driver).
  evr::device::backend& be = dut().backend();
  std::atomic<int> ok{0}, bad{0};  // before the reactor: its destructor completes pending waits
  evr::reactor r(be, quick_options(evr::strategy::adaptive));
  evr::stream st(be, 0);
  evr::signal_slot slot = r.pools().signals(0).acquire();
  constexpr int n = 30;
  for (int i = 0; i < n; ++i) {
    dut().launch_busy(st.native(), 20);
    slot.enqueue_signal(st.native());
    REQUIRE_FALSE(evr::on_complete(r, evr::wait_target(st, slot.arm()),
                                   [&](std::error_code ec) { (ec ? bad : ok).fetch_add(1); }));
  }
  REQUIRE(wait_until([&] { return ok + bad == n; }));
  CHECK(bad.load() == 0);
  CHECK(slot.signalled() == static_cast<std::uint64_t>(n));
  CHECK(r.metrics().event_queries == 0);
}
