// The Asio front end's contracts, on the simulated device, for the flavour this binary is built
// with (standalone Asio or Boost.Asio): what "aborted" looks like on each side, the reactor found
// through the execution context (reactor_service, use_reactor), the handler's associated
// allocator, and callbacks that throw on the reactor thread.
#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "support/asio.hpp"
#include "support/helpers.hpp"

using namespace std::chrono_literals;
using evr::test::quick_options;
using evr::test::run_until;
using evr::test::wait_until;

namespace {

// --- a handler whose associated allocator counts what it hands out ----------------------------

struct allocation_counts {
  std::atomic<int> allocations{0};
  std::atomic<int> deallocations{0};
  std::atomic<long> live_bytes{0};
};

template <typename T>
class counting_allocator {
 public:
  using value_type = T;
  explicit counting_allocator(allocation_counts& c) noexcept : counts_(&c) {}
  template <typename U>
  counting_allocator(const counting_allocator<U>& other) noexcept  // NOLINT: rebinding
      : counts_(other.counts_) {}
  T* allocate(std::size_t n) {
    counts_->allocations.fetch_add(1);
    counts_->live_bytes.fetch_add(static_cast<long>(n * sizeof(T)));
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    counts_->deallocations.fetch_add(1);
    counts_->live_bytes.fetch_sub(static_cast<long>(n * sizeof(T)));
    std::allocator<T>().deallocate(p, n);
  }
  template <typename U>
  bool operator==(const counting_allocator<U>& o) const noexcept {
    return counts_ == o.counts_;
  }
  template <typename U>
  bool operator!=(const counting_allocator<U>& o) const noexcept {
    return counts_ != o.counts_;
  }

 private:
  template <typename>
  friend class counting_allocator;
  allocation_counts* counts_;
};

/// What a tracked handler saw when it ran.
struct handler_record {
  std::atomic<int> calls{0};
  evr::asio_error_code ec;
  long live_bytes_at_call = -1;  // the allocator's outstanding bytes when the handler ran
};

/// A completion handler with an associated allocator (nested allocator_type + get_allocator, the
/// Asio convention) and, optionally, a cancellation slot.
struct tracked_handler {
  using allocator_type = counting_allocator<void>;
  using cancellation_slot_type = asio::cancellation_slot;

  allocation_counts* counts;
  handler_record* record;
  asio::cancellation_slot slot{};

  allocator_type get_allocator() const noexcept { return allocator_type(*counts); }
  cancellation_slot_type get_cancellation_slot() const noexcept { return slot; }
  void operator()(evr::asio_error_code ec) {
    record->ec = ec;
    record->live_bytes_at_call = counts->live_bytes.load();
    record->calls.fetch_add(1);
  }
};

// --- stderr, captured (for what evr reports about a throwing callback) --------------------------

class stderr_capture {
 public:
  stderr_capture() {
    std::fflush(stderr);
    file_ = std::tmpfile();
    REQUIRE(file_ != nullptr);
    saved_ = ::dup(STDERR_FILENO);
    REQUIRE(saved_ >= 0);
    REQUIRE(::dup2(::fileno(file_), STDERR_FILENO) >= 0);
  }
  ~stderr_capture() { restore(); }
  stderr_capture(const stderr_capture&) = delete;
  stderr_capture& operator=(const stderr_capture&) = delete;

  /// Restores stderr and returns everything written to it meanwhile.
  std::string text() {
    restore();
    std::string out;
    std::rewind(file_);
    char buf[512];
    while (std::size_t n = std::fread(buf, 1, sizeof buf, file_)) out.append(buf, n);
    return out;
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
    saved_ = -1;
  }
  std::FILE* file_ = nullptr;
  int saved_ = -1;
};

}  // namespace

// --- aborted: evr's value, the flavour's value --------------------------------------------------

TEST_CASE("errc::operation_aborted: evr's category, the portable condition operation_canceled") {
  const std::error_code ec = evr::errc::operation_aborted;
  CHECK(ec.category() == evr::evr_category());
  CHECK(ec == std::errc::operation_canceled);
  CHECK(ec != evr::errc::reactor_stopped);
  CHECK(evr::test::contains(ec.message(), "aborted"));
  // Other evr values stay their own condition.
  CHECK_FALSE(std::error_code(evr::errc::reactor_stopped) == std::errc::operation_canceled);
}

TEST_CASE("gpu_waiter hands its handlers the flavour's operation_aborted; on_complete evr's") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
  asio::io_context io;
  auto opts = quick_options(evr::strategy::poll);
  opts.shutdown_drain = 1ms;
  // Before the reactor: its destructor completes the pending on_complete wait into these.
  std::error_code plain;
  std::atomic<bool> plain_done{false};
  evr::reactor r(sim, opts);
  evr::gpu_waiter waiter(io.get_executor(), r);
  evr::stream st(sim, 0);  // manual mode: nothing on it runs until the test steps it

  // The completion signature's error type is the flavour's.
#if defined(EVR_ASIO_BOOST)
  static_assert(std::is_same_v<evr::asio_error_code, boost::system::error_code>);
#else
  static_assert(std::is_same_v<evr::asio_error_code, asio::error_code>);
#endif

  evr::asio_error_code cancelled, stopped;
  int calls = 0;
  waiter.async_wait(st, [&](evr::asio_error_code ec) {
    cancelled = ec;
    ++calls;
  });
  evr::gpu_waiter other(io.get_executor(), r);
  other.async_wait(st, [&](evr::asio_error_code ec) {
    stopped = ec;
    ++calls;
  });
  REQUIRE_FALSE(evr::on_complete(r, st, [&](std::error_code ec) {
    plain = ec;
    plain_done = true;
  }));
  waiter.cancel();  // cancelled
  REQUIRE(run_until(io, [&] { return calls == 1; }));
  r.stop();  // the other two: aborted by the shutdown
  REQUIRE(run_until(io, [&] { return calls == 2 && plain_done.load(); }));

  CHECK(cancelled == asio::error::operation_aborted);
  CHECK(stopped == asio::error::operation_aborted);
  CHECK(plain == evr::errc::operation_aborted);
  CHECK(plain == std::errc::operation_canceled);
  if (evr::test::asio_aborted_is_canceled_condition) {
    CHECK(cancelled == std::errc::operation_canceled);
    CHECK(stopped == std::errc::operation_canceled);
  } else {
    MESSAGE("standalone Asio " << EVR_ASIO_VERSION
                               << ": its operation_aborted does not map to "
                                  "std::errc::operation_canceled (Asio < 1.38)");
  }
  sim.run_until_blocked();
}

TEST_CASE("evr's own errors reach Asio handlers with their category (both flavours)") {
  evr::sim::device sim;
  asio::io_context io;
  evr::reactor r(sim, quick_options(evr::strategy::fence));
  evr::gpu_waiter waiter(io.get_executor(), r);
  evr::event never(sim);
  evr::asio_error_code got;
  bool done = false;
  waiter.async_wait(never, [&](evr::asio_error_code ec) {
    got = ec;
    done = true;
  });
  REQUIRE(run_until(io, [&] { return done; }));
  CHECK(got == evr::errc::event_never_recorded);
  CHECK(evr::test::contains(got.message(), "never recorded"));
  CHECK(std::error_code(got) == evr::errc::event_never_recorded);  // and back, unchanged
}

// --- the reactor found through the execution context ----------------------------------------

TEST_CASE("reactor_service: a waiter made from an executor or a context finds use_reactor's") {
  evr::sim::device sim;
  asio::io_context io;
  evr::reactor r(sim, quick_options(evr::strategy::adaptive));
  evr::use_reactor(io, r);

  evr::gpu_waiter from_executor(io.get_executor());
  evr::gpu_waiter from_context(io);
  CHECK(&from_executor.get_reactor() == &r);
  CHECK(&from_context.get_reactor() == &r);
  // The service is the context's: the same one through any of its executors.
  CHECK(&asio::use_service<evr::reactor_service>(io).get() == &r);

  evr::stream st(sim, 0);
  int ok = 0;
  from_executor.async_wait(st, [&](evr::asio_error_code ec) { ok += !ec; });
  from_context.async_wait(st, [&](evr::asio_error_code ec) { ok += !ec; });
  REQUIRE(run_until(io, [&] { return ok == 2; }));
  CHECK(r.metrics().completed == 2);

  // Attaching another reactor affects waiters made afterwards, not the existing ones.
  evr::reactor r2(sim, quick_options(evr::strategy::poll));
  evr::use_reactor(io, r2);
  evr::gpu_waiter later(io.get_executor());
  CHECK(&later.get_reactor() == &r2);
  CHECK(&from_executor.get_reactor() == &r);
}

TEST_CASE("reactor_service: with none attached and no CUDA, making a waiter throws evr::error") {
  if (evr::device::cuda_compiled_in()) {
    MESSAGE("skipped: CUDA is compiled in (the context would make a CUDA reactor)");
    return;
  }
  asio::io_context io;
  std::string what;
  const std::error_code ec =
      evr::test::thrown([&] { evr::gpu_waiter w(io.get_executor()); }, &what);
  CHECK(ec == evr::errc::unsupported);
  CHECK(evr::test::contains(what, "without CUDA"));
}

// --- the handler's associated allocator ---------------------------------------------------------

TEST_CASE(
    "allocator: each wait's operation comes from the handler's allocator, freed before it runs") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
  // Before the context and the reactor: a pending wait's operation (allocated from `counts`, its
  // slot `sig`'s) is freed, or its handler run into `rec`, as they are destroyed.
  allocation_counts counts;
  handler_record rec;
  asio::cancellation_signal sig;
  asio::io_context io;
  evr::reactor r(sim, quick_options(evr::strategy::poll));
  evr::gpu_waiter waiter(io.get_executor(), r);
  evr::stream st(sim, 0);

  SUBCASE("completion (posted)") {
    waiter.async_wait(st, tracked_handler{&counts, &rec});
    CHECK(counts.allocations.load() == 1);  // the operation, from the handler's allocator
    CHECK(counts.live_bytes.load() > 0);
    sim.run_until_blocked();  // the GPU passes the marker
    REQUIRE(run_until(io, [&] { return rec.calls.load() == 1; }));
    CHECK_FALSE(rec.ec);
    CHECK(rec.live_bytes_at_call == 0);  // given back before the upcall
  }
  SUBCASE("completion inline on the reactor thread") {
    waiter.set_delivery(evr::delivery::inline_on_reactor);
    waiter.async_wait(st, tracked_handler{&counts, &rec});
    CHECK(counts.allocations.load() == 1);
    sim.run_until_blocked();
    REQUIRE(wait_until([&] { return rec.calls.load() == 1; }));
    CHECK_FALSE(rec.ec);
    CHECK(rec.live_bytes_at_call == 0);
  }
  SUBCASE("per-operation cancellation") {
    waiter.async_wait(st, tracked_handler{&counts, &rec, sig.slot()});
    CHECK(counts.allocations.load() == 1);
    io.poll();
    sig.emit(asio::cancellation_type::terminal);
    REQUIRE(run_until(io, [&] { return rec.calls.load() == 1; }));
    CHECK(rec.ec == asio::error::operation_aborted);
    CHECK(rec.live_bytes_at_call == 0);
    sim.run_until_blocked();  // the GPU passes the cancelled wait's marker
  }
  SUBCASE("waiter.cancel()") {
    waiter.async_wait(st, tracked_handler{&counts, &rec});
    waiter.cancel();
    REQUIRE(run_until(io, [&] { return rec.calls.load() == 1; }));
    CHECK(rec.ec == asio::error::operation_aborted);
    CHECK(rec.live_bytes_at_call == 0);
    sim.run_until_blocked();
  }
  SUBCASE("refusal (an empty stream; a stopped reactor)") {
    handler_record empty, stopped;
    waiter.async_wait(evr::stream{}, tracked_handler{&counts, &empty});
    CHECK(counts.allocations.load() == 1);
    REQUIRE(run_until(io, [&] { return empty.calls.load() == 1; }));
    r.stop();
    waiter.async_wait(st, tracked_handler{&counts, &stopped});
    CHECK(counts.allocations.load() == 2);
    REQUIRE(run_until(io, [&] { return stopped.calls.load() == 1; }));
    CHECK(empty.ec == evr::errc::empty_handle);
    CHECK(stopped.ec == evr::errc::reactor_stopped);
    CHECK(empty.live_bytes_at_call == 0);
    CHECK(stopped.live_bytes_at_call == 0);
  }
  CHECK(counts.allocations.load() == counts.deallocations.load());
  CHECK(counts.live_bytes.load() == 0);
}

TEST_CASE(
    "allocator: a completion never run (its io_context destroyed) still frees the operation") {
  evr::sim::device sim;
  allocation_counts counts;
  handler_record rec;
  {
    auto io = std::make_unique<asio::io_context>();
    evr::reactor r(sim, quick_options(evr::strategy::fence));
    evr::stream st(sim, 0);
    {
      evr::gpu_waiter waiter(io->get_executor(), r);
      waiter.async_wait(st, tracked_handler{&counts, &rec});
      REQUIRE(wait_until([&] { return r.metrics().completed == 1; }));
    }
    r.stop();  // joins the reactor thread: the completion has been posted to io by now
    CHECK(counts.live_bytes.load() > 0);  // queued in io, which never runs it
    io.reset();  // destroys the queued completion, and with it the operation
    CHECK(counts.live_bytes.load() == 0);
  }
  CHECK(rec.calls.load() == 0);
  CHECK(counts.allocations.load() == 1);
  CHECK(counts.deallocations.load() == 1);
}

// --- callbacks that throw on the reactor thread -------------------------------------------------

TEST_CASE("an on_complete callback that throws: reported on stderr, dropped; the reactor goes on") {
  evr::sim::device sim;
  std::atomic<int> after{0};  // before the reactor: its destructor completes pending waits
  evr::reactor r(sim, quick_options(evr::strategy::adaptive));
  evr::stream st(sim, 0);
  std::string report;
  {
    stderr_capture capture;
    REQUIRE_FALSE(evr::on_complete(
        r, st, [](std::error_code) { throw std::runtime_error("callback failure 1234"); }));
    REQUIRE_FALSE(evr::on_complete(r, st, [](std::error_code) { throw 42; }));
    REQUIRE_FALSE(evr::on_complete(r, st, [&](std::error_code ec) { after += !ec; }));
    REQUIRE(wait_until([&] { return after.load() == 1; }));
    report = capture.text();
  }
  CHECK(evr::test::contains(report, "on_complete callback threw"));
  CHECK(evr::test::contains(report, "callback failure 1234"));
  CHECK(evr::test::contains(report, "not derived from std::exception"));
  // The reactor still serves new waits.
  REQUIRE_FALSE(evr::on_complete(r, st, [&](std::error_code ec) { after += !ec; }));
  CHECK(wait_until([&] { return after.load() == 2; }));
  CHECK(r.metrics().completed == 4);
}

TEST_CASE("a gpu_waiter handler delivered inline that throws: reported, dropped; others go on") {
  evr::sim::device sim;
  asio::io_context io;
  std::atomic<int> after{0};  // before the reactor: pending inline handlers run until it goes
  evr::reactor r(sim, quick_options(evr::strategy::poll));
  evr::gpu_waiter waiter(io.get_executor(), r);
  waiter.set_delivery(evr::delivery::inline_on_reactor);
  evr::stream st(sim, 0);
  std::string report;
  {
    stderr_capture capture;
    waiter.async_wait(st, [](evr::asio_error_code) { throw std::logic_error("inline oops"); });
    waiter.async_wait(st, [&](evr::asio_error_code ec) { after += !ec; });
    REQUIRE(wait_until([&] { return after.load() == 1; }));
    report = capture.text();
  }
  CHECK(evr::test::contains(report, "inline_on_reactor threw"));
  CHECK(evr::test::contains(report, "inline oops"));
  waiter.async_wait(st, [&](evr::asio_error_code ec) { after += !ec; });
  CHECK(wait_until([&] { return after.load() == 2; }));
}

TEST_CASE("a posted gpu_waiter handler that throws: the exception leaves io_context::run()") {
  evr::sim::device sim;
  asio::io_context io;
  evr::reactor r(sim, quick_options(evr::strategy::fence));
  evr::gpu_waiter waiter(io.get_executor(), r);
  evr::stream st(sim, 0);
  waiter.async_wait(st, [](evr::asio_error_code) { throw std::runtime_error("posted oops"); });
  CHECK_THROWS_WITH_AS(io.run(), "posted oops", std::runtime_error);
  // The io_context and the reactor are usable afterwards.
  bool ok = false;
  waiter.async_wait(st, [&](evr::asio_error_code ec) { ok = !ec; });
  REQUIRE(run_until(io, [&] { return ok; }));
}
