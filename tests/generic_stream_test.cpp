// evr::stream on the device under test (sim in evr_tests, CUDA in evr_gpu_tests), empty handles,
// and the backend calls that the handles and the reactor build on (host functions, fences). The
// events are in generic_event_test.cpp.
#include <doctest/doctest.h>

#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <evr/device/backend.hpp>
#include <evr/device/error.hpp>
#include <evr/device/event.hpp>
#include <evr/device/stream.hpp>

#include "support/device_under_test.hpp"
#include "support/forwarding_backend.hpp"
#include "support/handle_helpers.hpp"
#include "support/helpers.hpp"

namespace evr::test {

using namespace handles;

// --- streams ------------------------------------------------------------------------------------

TEST_CASE("stream: create, device, priority, query, synchronize") {
  MESSAGE("device under test: " << std::string(dut().name()) << " — " << be().describe());
  const int n = device_count();

  stream s(be(), 0);
  REQUIRE(s);
  CHECK(s.owns());
  CHECK(s.native() != nullptr);
  CHECK(s.id() == reinterpret_cast<std::uintptr_t>(s.native()));
  CHECK(s.device() == 0);
  CHECK(s.priority() == 0);
  CHECK(s.query());  // nothing enqueued yet
  s.synchronize();

  stream high(be(), 0, -1);  // -1 is a valid (higher) priority on every GPU since sm_35
  CHECK(high.priority() == -1);

  stream last(be(), n - 1);
  CHECK(last.device() == n - 1);

  // Pending work: query says so (both overloads), synchronize waits for it.
  auto g = dut().make_gate();
  g->launch(s.native());
  settle();
  CHECK_FALSE(s.query());
  std::error_code ec;
  CHECK(is_not_ready(s.query(ec)));
  CHECK(is_not_ready(ec));
  g->open();
  s.synchronize(ec);
  CHECK_FALSE(ec);
  CHECK(s.query());
  CHECK_FALSE(s.query(ec));
}

TEST_CASE("stream: creating one on a device that does not exist throws evr::error naming it") {
  const int n = device_count();
  std::string what;
  const auto ec = thrown([&] { stream s(be(), n); }, &what);
  CHECK(ec);
  CHECK(contains(what, "evr::stream(device " + std::to_string(n)));
}

TEST_CASE("stream: wrap does not own, release gives up ownership") {
  counting_backend cb(be());
  {
    stream owner(cb, 0);
    {
      stream w = stream::wrap(cb, owner.native());
      CHECK(w);
      CHECK_FALSE(w.owns());
      CHECK(w.native() == owner.native());
      CHECK(w.device() == 0);
    }
    CHECK(cb.streams_destroyed == 0);
    // The wrapped stream is still alive and usable.
    dut().launch_busy(owner.native(), 100);
    owner.synchronize();
    CHECK(owner.query());

    // Assigning over a wrapper destroys nothing that the wrapper did not own.
    stream w = stream::wrap(cb, owner.native());
    w = stream(cb, 0);
    CHECK(cb.streams_destroyed == 0);
    CHECK(w.owns());
    CHECK(w.native() != owner.native());

    // release(): the handle becomes empty and the stream survives it.
    auto released = w.release();
    CHECK_FALSE(w);
    CHECK(w.native() == nullptr);
    CHECK(cb.streams_destroyed == 0);
    dut().launch_busy(released, 100);
    CHECK_FALSE(cb.synchronize_stream(released));
    cb.destroy_stream(released);
    CHECK(cb.streams_destroyed == 1);
  }
  CHECK(cb.streams_created == 2);
  CHECK(cb.streams_destroyed == 2);  // owner, and the released one destroyed by hand
}

TEST_CASE("stream: move construction and assignment, into non-empty handles and onto itself") {
  counting_backend cb(be());
  {
    stream a(cb, 0);
    const auto na = a.native();
    stream b(std::move(a));
    CHECK_FALSE(a);
    CHECK(a.native() == nullptr);
    CHECK_FALSE(a.owns());
    CHECK(b.native() == na);
    CHECK(b.owns());
    CHECK(cb.streams_destroyed == 0);

    // Into a non-empty handle: the stream held before is destroyed (once), the moved one kept.
    stream c(cb, 0);
    const auto nc = c.native();
    c = std::move(b);
    CHECK(cb.streams_destroyed == 1);
    CHECK(cb.last_destroyed_stream == nc);
    CHECK(c.native() == na);
    CHECK(c.owns());
    CHECK_FALSE(b);
    dut().launch_busy(c.native(), 50);
    c.synchronize();

    // Onto itself: nothing happens.
    stream& alias = c;
    c = std::move(alias);
    CHECK(c);
    CHECK(c.native() == na);
    CHECK(c.owns());
    CHECK(cb.streams_destroyed == 1);
    c.synchronize();

    // An empty handle moved into a non-empty one empties it and destroys what it held.
    stream d(cb, 0);
    const auto nd = d.native();
    d = stream();
    CHECK_FALSE(d);
    CHECK(cb.streams_destroyed == 2);
    CHECK(cb.last_destroyed_stream == nd);
  }
  CHECK(cb.streams_created == 3);
  CHECK(cb.streams_destroyed == 3);
}

TEST_CASE("stream: wait_event and wait_stream order later work behind the other stream") {
  stream a(be(), 0), b(be(), 0);
  auto g = dut().make_gate();
  g->launch(a.native());

  SUBCASE("wait_stream") { b.wait_stream(a); }
  SUBCASE("wait_event") {
    event e(be());
    e.record(a);
    b.wait_event(e);
  }
  event after(be());
  after.record(b);
  settle();
  CHECK_FALSE(after.query());
  CHECK_FALSE(b.query());
  g->open();
  after.synchronize();
  CHECK(a.query());
  CHECK(b.query());

  // Waiting on oneself or on a never-recorded event holds nothing back.
  b.wait_stream(b);
  b.wait_event(event(be()));
  event again(be());
  again.record(b);
  again.synchronize();
  CHECK(again.query());
}

TEST_CASE("empty handles: every operation fails with errc::empty_handle") {
  stream s(be(), 0);
  stream es;
  event ee;
  event e(be());
  std::error_code ec;

  CHECK_FALSE(es);
  CHECK_FALSE(ee);
  CHECK(thrown([&] { (void)es.device(); }) == errc::empty_handle);
  CHECK(thrown([&] { (void)es.priority(); }) == errc::empty_handle);
  CHECK(thrown([&] { (void)es.query(); }) == errc::empty_handle);
  CHECK(es.query(ec) == errc::empty_handle);
  CHECK(thrown([&] { es.synchronize(); }) == errc::empty_handle);
  es.synchronize(ec);
  CHECK(ec == errc::empty_handle);
  CHECK(thrown([&] { es.wait_event(e); }) == errc::empty_handle);
  CHECK(thrown([&] { es.wait_stream(s); }) == errc::empty_handle);
  CHECK(thrown([&] { s.wait_stream(es); }) == errc::empty_handle);

  CHECK(thrown([&] { ee.record(s); }) == errc::empty_handle);
  ee.record(s, ec);
  CHECK(ec == errc::empty_handle);
  CHECK(thrown([&] { (void)ee.record_once(s); }) == errc::empty_handle);
  CHECK(thrown([&] { ee.block(s); }) == errc::empty_handle);
  CHECK(thrown([&] { (void)ee.query(); }) == errc::empty_handle);
  CHECK(ee.query(ec) == errc::empty_handle);
  CHECK(thrown([&] { ee.synchronize(); }) == errc::empty_handle);
  CHECK(thrown([&] { (void)ee.elapsed_time(e); }) == errc::empty_handle);
  CHECK(thrown([&] { (void)e.elapsed_time(ee); }) == errc::empty_handle);
  CHECK(thrown([&] { (void)ee.ipc_handle(); }) == errc::empty_handle);
  CHECK(thrown([&] { s.wait_event(ee); }) == errc::empty_handle);

  // A live event with an empty stream.
  CHECK(thrown([&] { e.record(es); }) == errc::empty_handle);
  CHECK(thrown([&] { e.block(es); }) == errc::empty_handle);
  CHECK_FALSE(e.created());

  // Moved-from handles are empty.
  stream moved(be(), 0);
  stream keeper(std::move(moved));
  CHECK(thrown([&] { (void)moved.query(); }) == errc::empty_handle);
  event emoved(be());
  event ekeeper(std::move(emoved));
  CHECK(thrown([&] { emoved.record(s); }) == errc::empty_handle);
}

// --- backend calls under the reactor
// --------------------------------------------------------------

namespace {
struct host_probe {
  device::backend* backend = nullptr;
  std::atomic<int> calls{0};
  std::atomic<bool> saw_in_host_func{false};
};
void probe_fn(void* p) {
  auto* probe = static_cast<host_probe*>(p);
  probe->saw_in_host_func.store(probe->backend->in_host_func(), std::memory_order_relaxed);
  probe->calls.fetch_add(1, std::memory_order_release);
}
}  // namespace

TEST_CASE("backend: a host function runs after earlier work, and knows it is in one") {
  stream s(be(), 0);
  auto g = dut().make_gate();
  g->launch(s.native());
  host_probe probe;
  probe.backend = &be();
  REQUIRE_FALSE(be().launch_host_func(s.native(), &probe_fn, &probe));
  settle();
  CHECK(probe.calls.load(std::memory_order_acquire) == 0);
  g->open();
  s.synchronize();
  CHECK(probe.calls.load(std::memory_order_acquire) == 1);
  CHECK(probe.saw_in_host_func.load());
  CHECK_FALSE(be().in_host_func());
}

TEST_CASE("backend: a fence write lands in its word once the work before it is done") {
  device::fence_block block;
  REQUIRE_FALSE(be().allocate_fence_block(0, 4, block));
  REQUIRE(block.host != nullptr);
  CHECK(block.words == 4);
  auto word = [&](std::size_t i) {
    return std::atomic_ref<std::uint64_t>(*block.host_word(i)).load();
  };
  for (std::size_t i = 0; i < 4; ++i) CHECK(word(i) == 0);

  stream s(be(), 0);
  auto g = dut().make_gate();
  g->launch(s.native());
  REQUIRE_FALSE(be().write_fence(s.native(), block.device_word(2), 42));
  settle();
  CHECK(word(2) == 0);
  g->open();
  s.synchronize();
  CHECK(word(2) == 42);
  CHECK(word(1) == 0);
  CHECK(word(3) == 0);

  // From a thread that never made a device call.
  std::error_code ec;
  std::thread([&] { ec = be().write_fence(s.native(), block.device_word(3), 7); }).join();
  CHECK_FALSE(ec);
  s.synchronize();
  CHECK(word(3) == 7);

  be().free_fence_block(block);
  CHECK(block.host == nullptr);
  CHECK(block.allocation == nullptr);

  device::fence_block none;
  CHECK(be().allocate_fence_block(0, 0, none) == errc::invalid_argument);
}

TEST_CASE("backend: current device, set and restored around creations") {
  const int n = device_count();
  REQUIRE_FALSE(be().set_current_device(0));
  stream s(be(), n - 1);  // creating on another device leaves the current one alone
  int current = -1;
  REQUIRE_FALSE(be().current_device(current));
  CHECK(current == 0);
  REQUIRE_FALSE(be().set_current_device(n - 1));
  REQUIRE_FALSE(be().current_device(current));
  CHECK(current == n - 1);
  CHECK(be().set_current_device(n));  // no such device
  REQUIRE_FALSE(be().set_current_device(0));
  be().prepare_polling_thread();  // must not disturb anything
  event e(be());
  e.record(s);
  e.synchronize();
}

}  // namespace evr::test
