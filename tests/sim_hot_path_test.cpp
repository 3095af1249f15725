// What one in-flight wait costs (docs/architecture.md, "Where a wait's bytes and time go"): the
// sizes of its pieces, bounded so that a regression shows, and the heap in use per pending wait
// on the simulated device (printed with MESSAGE; the table in the docs comes from here).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <string>
#include <system_error>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "support/asio.hpp"
#include "support/helpers.hpp"
#include "timeline.hpp"

using namespace std::chrono_literals;
using evr::test::quick_options;
using evr::test::wait_until;

namespace {

/// A handler of one pointer (the goal counts the wait's bytes, not the handler's captures).
struct one_pointer_callback {
  std::atomic<int>* done;
  void operator()(std::error_code) const { done->fetch_add(1, std::memory_order_relaxed); }
};
struct one_pointer_handler {
  int* done;
  void operator()(evr::asio_error_code) const { ++*done; }
};

/// Bytes of heap in use (malloc's view: what the process asked for plus malloc's own headers).
/// 0 where glibc's mallinfo2 is not available.
std::size_t heap_in_use() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  const struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;  // small chunks, and the large ones malloc maps by themselves
#else
  return 0;
#endif
}

}  // namespace

TEST_CASE("hot path: sizes of a wait's pieces") {
  using callback = evr::detail::callback_op<one_pointer_callback>;
  using shared_callback = evr::detail::shared_callback_op<one_pointer_callback>;
  using asio_any = evr::detail::asio_wait_op<one_pointer_handler, asio::any_io_executor>;
  using asio_io = evr::detail::asio_wait_op<one_pointer_handler, asio::io_context::executor_type>;
  MESSAGE("sizeof wait_op " << sizeof(evr::detail::wait_op) << ", callback_op " << sizeof(callback)
                            << ", shared_callback_op (wait_handle) " << sizeof(shared_callback)
                            << ", asio_wait_op (any_io_executor) " << sizeof(asio_any)
                            << ", asio_wait_op (io_context executor) " << sizeof(asio_io)
                            << ", timeline_entry " << sizeof(evr::detail::timeline_entry));
  if constexpr (sizeof(void*) == 8) {  // the layout docs/architecture.md describes
    // 96: the 80 of docs/architecture.md's table, the poll host of the last hop and the count
    // a device-signalled wait waits for.
    CHECK(sizeof(evr::detail::wait_op) <= 96);
    CHECK(sizeof(callback) <= 104);
    // 32: seq, marker, wait and the wait's host (the timeline keeps its front's host beside its
    // indices, so the reactor's sweep reads neither the entry nor the wait to learn it).
    CHECK(sizeof(evr::detail::timeline_entry) <= 32);
    // The posted function lives in the wait's own bytes that the reactor is done with (no buffer
    // of its own): the wait_op, the handler, two tracked executors and the reactor.
    // A handler without an executor of its own tracks work on the I/O executor only.
    CHECK(sizeof(asio_io) <= 120);
  }
}

TEST_CASE("hot path: heap in use per in-flight wait (poll, simulated device)") {
  if (heap_in_use() == 0) return;  // no mallinfo2
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
  constexpr int streams = 16, n = 20000;
  std::vector<evr::stream> ss;
  for (int i = 0; i < streams; ++i) ss.emplace_back(sim, 0);

  // The simulated device's own share: an event, and a record queued on a stream (streams of
  // their own: a stream's queue keeps its capacity, which the rounds below would reuse).
  std::vector<evr::stream> other;
  for (int i = 0; i < streams; ++i) other.emplace_back(sim, 0);
  std::size_t event_bytes = 0, record_bytes = 0;
  {
    std::vector<evr::device::native_event> evs(n);
    const std::size_t h0 = heap_in_use();
    for (int i = 0; i < n; ++i)
      REQUIRE_FALSE(sim.create_event(0, evr::device::event_flags::none, evs[i]));
    const std::size_t h1 = heap_in_use();
    for (int i = 0; i < n; ++i)
      REQUIRE_FALSE(sim.record_event(evs[i], other[i % streams].native()));
    event_bytes = h1 - h0;
    record_bytes = heap_in_use() - h1;
    sim.run_until_blocked();
    for (auto e : evs) sim.destroy_event(e);
  }

  std::atomic<int> done{0};  // before the reactor: its destructor completes pending waits
  evr::reactor r(sim, quick_options(evr::strategy::poll));
  auto round = [&](int k) {
    const std::size_t h0 = heap_in_use();
    for (int i = 0; i < n; ++i)
      REQUIRE_FALSE(evr::on_complete(r, ss[i % streams], one_pointer_callback{&done}));
    REQUIRE(wait_until([&] { return r.metrics().submitted == static_cast<std::uint64_t>(k * n); }));
    const std::size_t h1 = heap_in_use();
    sim.run_until_blocked();
    REQUIRE(wait_until([&] { return done.load() == k * n; }, 30s));
    return static_cast<double>(h1 - h0) / n;
  };
  // First round: the pool grows its events and the timelines their rings. Second: both are
  // grown; what is left is the operation itself (and the device's queued record).
  const double cold = round(1);
  const double warm = round(2);
  MESSAGE("heap in use per in-flight wait (on_complete, poll, "
          << n << " waits on " << streams << " streams): first round " << cold
          << " bytes, second round " << warm << " bytes; of which the simulated device's: event "
          << static_cast<double>(event_bytes) / n << " bytes (first round only), queued record "
          << static_cast<double>(record_bytes) / n << " bytes");
}
