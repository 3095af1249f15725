// Misuse on the simulated device: each case makes one mistake while a "bystander" wait is pending
// on the same reactor, then checks that the mistake got a clear error naming the problem, and that
// nothing was corrupted or lost: the bystander still completes exactly once with success, and
// fresh waits on both devices, through both front ends, complete. docs/reliability.md has the
// table (one row per misuse, with the tests that show it, here and in other files).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "support/asio.hpp"
#include "support/helpers.hpp"

using namespace std::chrono_literals;
using evr::test::contains;
using evr::test::quick_options;
using evr::test::run_until;
using evr::test::thrown;
using evr::test::wait_until;

namespace {

const std::error_code invalid_handle =
    evr::make_cuda_error(evr::cuda_value::invalid_resource_handle);

/// A callback's outcome, written on whichever thread completes it. The handler shares the state,
/// so that it outlives a reactor declared before it: should a test stop half-way, the reactor's
/// destructor completes the waits still pending (with operation_aborted) on its thread.
struct result {
  struct state {
    std::atomic<int> calls{0};
    std::error_code ec;
  };
  std::shared_ptr<state> s = std::make_shared<state>();
  std::atomic<int>& calls = s->calls;
  std::error_code& ec = s->ec;
  auto handler() {
    return [s = s](std::error_code e) {
      s->ec = e;
      s->calls.fetch_add(1, std::memory_order_release);
    };
  }
  bool done() const { return calls.load(std::memory_order_acquire) > 0; }
};

/// Two simulated devices, a reactor, a stream on each device, an Asio waiter, and a bystander
/// wait on s0 held pending behind a gate until check_unharmed().
struct scene {
  explicit scene(evr::strategy s = evr::strategy::poll) : r(sim, quick_options(s)) {
    auto open = gate_open;
    sim.launch_kernel(s0.native(), {}, [open] {
      while (!open->load(std::memory_order_acquire)) std::this_thread::sleep_for(20us);
    });
    REQUIRE_FALSE(evr::on_complete(r, s0, bystander.handler()));
  }
  ~scene() { gate_open->store(true); }

  /// Nothing was corrupted or lost by the misuse just made.
  void check_unharmed() {
    CHECK_FALSE(bystander.done());  // still held by the gate: the misuse did not complete it
    gate_open->store(true, std::memory_order_release);
    REQUIRE(wait_until([&] { return bystander.done(); }));
    CHECK(bystander.calls.load() == 1);
    CHECK_FALSE(bystander.ec);
    result f0, f1;
    REQUIRE_FALSE(evr::on_complete(r, s0, f0.handler()));
    REQUIRE_FALSE(evr::on_complete(r, s1, f1.handler()));
    int asio_done = 0;
    std::error_code asio_ec{1, std::generic_category()};
    waiter.async_wait(s1, [&](std::error_code ec) {
      ++asio_done;
      asio_ec = ec;
    });
    REQUIRE(run_until(io, [&] { return asio_done == 1 && f0.done() && f1.done(); }));
    CHECK_FALSE(f0.ec);
    CHECK_FALSE(f1.ec);
    CHECK_FALSE(asio_ec);
    CHECK(wait_until([&] { return r.metrics().in_flight == 0; }));
    io.run_for(2ms);
    CHECK(asio_done == 1);
    CHECK(bystander.calls.load() == 1);
  }

  // Declaration order is destruction order, reversed: the waiter goes before the reactor (its
  // destructor calls into it), the reactor before the io_context it posts to and before the
  // bystander it may still complete (with operation_aborted, should a test stop half-way).
  evr::sim::device sim{evr::sim::options{.devices = 2, .mode = evr::sim::run_mode::threaded}};
  std::shared_ptr<std::atomic<bool>> gate_open = std::make_shared<std::atomic<bool>>(false);
  result bystander;
  asio::io_context io;
  evr::reactor r;
  evr::stream s0{sim, 0}, s1{sim, 1};
  evr::gpu_waiter waiter{io.get_executor(), r};
};

/// A cancellable plain-callback wait the test owns (on_complete with a wait_handle), so that it
/// may be cancelled at any time while it lives. Its outcome is shared with the callback (result).
struct owned_op : result {
  evr::wait_handle handle;
  auto callback() { return handler(); }
};

}  // namespace

TEST_CASE("misuse: waiting on a never-recorded event") {
  scene sc;
  // An evr::event knows it was never recorded: refused with a clear error (CUDA would report it
  // complete, which hides the bug).
  evr::event never(sc.sim);
  result posted;
  CHECK(evr::on_complete(sc.r, never, [](std::error_code) {}) == evr::errc::event_never_recorded);
  sc.waiter.async_wait(never, posted.handler());
  CHECK_FALSE(posted.done());  // never inside async_wait
  REQUIRE(run_until(sc.io, [&] { return posted.done(); }));
  CHECK(posted.ec == evr::errc::event_never_recorded);
  CHECK(posted.ec.message().find("never recorded") != std::string::npos);
  // A raw native event carries no history: as in CUDA, never recorded reads as complete.
  evr::device::native_event raw = nullptr;
  REQUIRE_FALSE(sc.sim.create_event(0, evr::device::event_flags::none, raw));
  result complete;
  REQUIRE_FALSE(
      evr::on_complete(sc.r, evr::wait_target::of_event(sc.sim, raw, 0), complete.handler()));
  REQUIRE(wait_until([&] { return complete.done(); }));
  CHECK_FALSE(complete.ec);
  sc.check_unharmed();
  sc.sim.destroy_event(raw);
}

TEST_CASE("misuse: recording an event on a stream of another device") {
  scene sc;
  evr::event ev(sc.sim);
  ev.record(sc.s0);  // created on device 0, captures the gated work
  std::string what;
  CHECK(thrown([&] { ev.record(sc.s1); }, &what) == evr::errc::device_mismatch);
  CHECK(contains(what, "of device 0"));
  CHECK(contains(what, "of device 1"));
  std::error_code ec;
  ev.record(sc.s1, ec);
  CHECK(ec == evr::errc::device_mismatch);
  CHECK(sc.sim.record_event(ev.native(), sc.s1.native()) ==
        evr::errc::device_mismatch);  // the backend too
  // The refused records changed nothing: a wait on the event watches its device-0 record.
  result w;
  REQUIRE_FALSE(evr::on_complete(sc.r, ev, w.handler()));
  std::this_thread::sleep_for(5ms);
  CHECK_FALSE(w.done());
  sc.check_unharmed();
  REQUIRE(wait_until([&] { return w.done(); }));
  CHECK_FALSE(w.ec);
}

TEST_CASE("misuse: waiting on a destroyed event or stream") {
  for (evr::strategy s : evr::test::all_strategies) {
    CAPTURE(std::string(evr::to_string(s)));
    scene sc(s);
    // A destroyed event: the wait completes with cuda "invalid resource handle" (400).
    evr::device::native_event gone = nullptr;
    REQUIRE_FALSE(sc.sim.create_event(1, evr::device::event_flags::none, gone));
    REQUIRE_FALSE(sc.sim.record_event(gone, sc.s1.native()));
    sc.sim.destroy_event(gone);
    result on_gone, asio_gone;
    REQUIRE_FALSE(
        evr::on_complete(sc.r, evr::wait_target::of_event(sc.sim, gone, 1), on_gone.handler()));
    sc.waiter.async_wait(evr::wait_target::of_event(sc.sim, gone, 1), asio_gone.handler());
    REQUIRE(run_until(sc.io, [&] { return on_gone.done() && asio_gone.done(); }));
    CHECK(on_gone.ec == invalid_handle);
    CHECK(asio_gone.ec == invalid_handle);

    // An event destroyed while a wait on it is pending (its record is behind the gate).
    evr::device::native_event doomed = nullptr;
    REQUIRE_FALSE(sc.sim.create_event(0, evr::device::event_flags::none, doomed));
    REQUIRE_FALSE(sc.sim.record_event(doomed, sc.s0.native()));
    result on_doomed;
    REQUIRE_FALSE(
        evr::on_complete(sc.r, evr::wait_target::of_event(sc.sim, doomed, 0), on_doomed.handler()));
    std::this_thread::sleep_for(3ms);
    CHECK_FALSE(on_doomed.done());
    sc.sim.destroy_event(doomed);
    REQUIRE(wait_until([&] { return on_doomed.done(); }));
    CHECK(on_doomed.ec == invalid_handle);

    // A destroyed stream: refused at submission, whether the reactor knew the stream or not.
    evr::device::native_stream known = nullptr, unknown = nullptr;
    REQUIRE_FALSE(sc.sim.create_stream(0, 0, known));
    REQUIRE_FALSE(sc.sim.create_stream(0, 0, unknown));
    result first;
    REQUIRE_FALSE(
        evr::on_complete(sc.r, evr::wait_target::of_stream(sc.sim, known), first.handler()));
    REQUIRE(wait_until([&] { return first.done(); }));
    CHECK_FALSE(first.ec);
    sc.sim.destroy_stream(known);
    sc.sim.destroy_stream(unknown);
    CHECK(evr::on_complete(sc.r, evr::wait_target::of_stream(sc.sim, known),
                           [](std::error_code) {}) == invalid_handle);
    CHECK(evr::on_complete(sc.r, evr::wait_target::of_stream(sc.sim, unknown),
                           [](std::error_code) {}) == invalid_handle);
    result asio_refused;
    sc.waiter.async_wait(evr::wait_target::of_stream(sc.sim, unknown), asio_refused.handler());
    REQUIRE(run_until(sc.io, [&] { return asio_refused.done(); }));
    CHECK(asio_refused.ec == invalid_handle);

    // A stream destroyed while waits on it are pending: its queued work still runs (as in CUDA),
    // and each wait completes exactly once: done, or "invalid resource handle" when the reactor
    // asked the destroyed handle before the work reached the marker (fence/host_func probe).
    evr::device::native_stream dying = nullptr;
    REQUIRE_FALSE(sc.sim.create_stream(1, 0, dying));
    std::vector<result> on_dying(10);
    REQUIRE_FALSE(sc.sim.launch_kernel(dying, 5ms));
    for (auto& w : on_dying)
      REQUIRE_FALSE(
          evr::on_complete(sc.r, evr::wait_target::of_stream(sc.sim, dying), w.handler()));
    sc.sim.destroy_stream(dying);
    REQUIRE(wait_until([&] {
      for (auto& w : on_dying)
        if (!w.done()) return false;
      return true;
    }));
    for (auto& w : on_dying) CHECK((!w.ec || w.ec == invalid_handle));
    sc.check_unharmed();
    for (auto& w : on_dying) CHECK(w.calls.load() == 1);
  }
}

TEST_CASE("misuse: a released pool id, released twice, used after release") {
  scene sc;
  evr::event_registry reg(sc.sim);
  const auto id = reg.acquire(1);
  reg.record(id, sc.s1.native());
  result w;
  REQUIRE_FALSE(
      evr::on_complete(sc.r, evr::wait_target::of_event(sc.sim, reg.native(id), 1), w.handler()));
  REQUIRE(wait_until([&] { return w.done(); }));
  CHECK_FALSE(w.ec);
  reg.release(id);
  std::error_code ec;
  reg.release(id, ec);  // twice
  CHECK(ec == evr::errc::unknown_event_id);
  std::string what;
  CHECK(thrown([&] { reg.release(id); }, &what) == evr::errc::unknown_event_id);
  CHECK(contains(what, "already released"));
  CHECK(reg.native(id, ec) == nullptr);  // no handle to wait on after release
  CHECK(ec == evr::errc::unknown_event_id);
  reg.record(id, sc.s0.native(), ec);
  CHECK(ec == evr::errc::unknown_event_id);
  CHECK(reg.pools().stats().in_use == 0);
  sc.check_unharmed();
}

TEST_CASE("misuse: elapsed_time on non-timing, unrecorded, unfinished or cross-device events") {
  scene sc;
  using evr::device::event_flags;
  evr::stream free0(sc.sim, 0);
  evr::event plain(sc.sim), t1(sc.sim, event_flags::timing), t2(sc.sim, event_flags::timing),
      unrecorded(sc.sim, event_flags::timing), other_device(sc.sim, event_flags::timing);
  plain.record(free0);
  t1.record(free0);
  t2.record(sc.s0);  // behind the gate: not finished
  other_device.record(sc.s1);
  t1.synchronize();
  other_device.synchronize();
  std::string what;
  CHECK(thrown([&] { (void)plain.elapsed_time(t1); }, &what) == evr::errc::timing_disabled);
  CHECK(contains(what, "evr::event::elapsed_time("));
  CHECK(thrown([&] { (void)t1.elapsed_time(plain); }) == evr::errc::timing_disabled);
  CHECK(thrown([&] { (void)t1.elapsed_time(unrecorded); }) == evr::errc::event_never_recorded);
  CHECK(thrown([&] { (void)unrecorded.elapsed_time(t1); }) == evr::errc::event_never_recorded);
  CHECK(thrown([&] { (void)t1.elapsed_time(other_device); }) == evr::errc::device_mismatch);
  CHECK(evr::is_not_ready(thrown([&] { (void)t1.elapsed_time(t2); }, &what)));  // cuda 600
  CHECK(contains(what, "cudaErrorNotReady"));
  sc.check_unharmed();
  t2.synchronize();
  CHECK(t1.elapsed_time(t2) >= 0.0f);
}

TEST_CASE("misuse: an interprocess event with timing") {
  scene sc;
  std::string what;
  CHECK(thrown(
            [&] {
              evr::event e(sc.sim, evr::device::event_flags::interprocess |
                                       evr::device::event_flags::timing);
            },
            &what) == evr::errc::interprocess_requires_no_timing);
  CHECK(contains(what, "interprocess|timing"));
  evr::device::native_event raw = nullptr;
  CHECK(sc.sim.create_event(
            0, evr::device::event_flags::interprocess | evr::device::event_flags::timing, raw) ==
        evr::errc::interprocess_requires_no_timing);
  CHECK(raw == nullptr);
  // An interprocess event without timing records and is waited on like any other.
  evr::event ipc(sc.sim, evr::device::event_flags::interprocess);
  ipc.record(sc.s1);
  result w;
  REQUIRE_FALSE(evr::on_complete(sc.r, ipc, w.handler()));
  REQUIRE(wait_until([&] { return w.done(); }));
  CHECK_FALSE(w.ec);
  sc.check_unharmed();
}

TEST_CASE("misuse: opening an invalid IPC handle") {
  scene sc;
  evr::device::ipc_event_handle bogus;
  std::memset(bogus.bytes, 0xAB, sizeof bogus.bytes);
  std::string what;
  CHECK(thrown([&] { (void)evr::event::open(sc.sim, bogus, 0); }, &what) ==
        evr::errc::invalid_ipc_handle);
  CHECK(contains(what, "evr::event::open("));
  // A handle whose exporter is gone, and one made by another simulated device.
  evr::device::ipc_event_handle stale;
  {
    evr::event exporter(sc.sim, evr::device::event_flags::interprocess);
    exporter.record(sc.s1);
    stale = exporter.ipc_handle();
  }
  CHECK(thrown([&] { (void)evr::event::open(sc.sim, stale, 1); }) == evr::errc::invalid_ipc_handle);
  evr::sim::device other;
  evr::stream other_stream(other, 0);
  evr::event foreign(other, evr::device::event_flags::interprocess);
  foreign.record(other_stream);
  CHECK(thrown([&] { (void)evr::event::open(sc.sim, foreign.ipc_handle(), 0); }) ==
        evr::errc::invalid_ipc_handle);
  // A valid handle, opened and waited on through the reactor.
  evr::event exporter(sc.sim, evr::device::event_flags::interprocess);
  exporter.record(sc.s0);  // behind the gate
  evr::event opened = evr::event::open(sc.sim, exporter.ipc_handle(), 0);
  result w;
  REQUIRE_FALSE(evr::on_complete(sc.r, opened, w.handler()));
  std::this_thread::sleep_for(3ms);
  CHECK_FALSE(w.done());
  sc.check_unharmed();
  REQUIRE(wait_until([&] { return w.done(); }));
  CHECK_FALSE(w.ec);
}

TEST_CASE("misuse: submitting after shutdown") {
  evr::sim::device sim;
  evr::stream st(sim, 0);
  asio::io_context io;
  auto r = std::make_unique<evr::reactor>(sim, quick_options(evr::strategy::fence));
  evr::gpu_waiter waiter(io.get_executor(), *r);
  r->stop();
  CHECK(evr::on_complete(*r, st, [](std::error_code) { FAIL("a refused callback ran"); }) ==
        evr::errc::reactor_stopped);
  result posted;
  waiter.async_wait(st, posted.handler());
  CHECK_FALSE(posted.done());  // posted, never inside async_wait
  REQUIRE(run_until(io, [&] { return posted.done(); }));
  CHECK(posted.ec == evr::errc::reactor_stopped);
  CHECK(posted.ec.message().find("stopped") != std::string::npos);
  owned_op op;
  CHECK(evr::on_complete(*r, st, op.callback(), op.handle) == evr::errc::reactor_stopped);
  CHECK(op.calls.load() == 0);  // refused: not completed, the handle stays empty
  CHECK_FALSE(op.handle);
  // release_after: refused, so it waits for the GPU on the calling thread before destroying.
  struct probe {
    evr::sim::device* sim;
    evr::stream* st;
    std::error_code* seen;
    ~probe() {
      if (sim != nullptr) *seen = sim->query_stream(st->native());
    }
    probe(evr::sim::device* d, evr::stream* s, std::error_code* e) : sim(d), st(s), seen(e) {}
    probe(probe&& o) noexcept : sim(std::exchange(o.sim, nullptr)), st(o.st), seen(o.seen) {}
  };
  std::error_code at_destruction{1, std::generic_category()};
  sim.launch_kernel(st.native(), 20ms);
  CHECK(evr::release_after(*r, st, probe(&sim, &st, &at_destruction)) ==
        evr::errc::reactor_stopped);
  CHECK_FALSE(at_destruction);  // the stream was idle when the resource was destroyed
  CHECK(r->metrics().rejected == 4);
  // The device is fine: another reactor serves it.
  evr::reactor fresh(sim, quick_options(evr::strategy::fence));
  result ok;
  REQUIRE_FALSE(evr::on_complete(fresh, st, ok.handler()));
  REQUIRE(wait_until([&] { return ok.done(); }));
  CHECK_FALSE(ok.ec);
}

TEST_CASE("misuse: calling evr from inside a host function") {
  scene sc;
  struct context {
    evr::reactor* r;
    evr::gpu_waiter* waiter;
    evr::stream* st;
    evr::sim::device* sim;
    std::error_code plain, raw, sync, release;
    owned_op op;
    result posted;
  } cx{&sc.r, &sc.waiter, &sc.s1, &sc.sim, {}, {}, {}, {}, {}, {}};
  std::atomic<bool> ran{false};
  struct call {
    context* cx;
    std::atomic<bool>* ran;
  } c{&cx, &ran};
  REQUIRE_FALSE(sc.sim.launch_host_func(
      sc.s1.native(),
      [](void* p) {
        auto* k = static_cast<call*>(p);
        context& x = *k->cx;
        x.plain = evr::on_complete(*x.r, *x.st, [](std::error_code) {});
        x.raw = evr::on_complete(*x.r, *x.st, x.op.callback(), x.op.handle);
        x.waiter->async_wait(*x.st, x.posted.handler());
        x.sync =
            x.sim->synchronize_stream(x.st->native());  // the device refuses blocking calls too
        // Refused too; it cannot wait for the GPU here either (see docs/reliability.md).
        x.release = evr::release_after(*x.r, *x.st, std::make_unique<int>(1));
        k->ran->store(true, std::memory_order_release);
      },
      &c));
  REQUIRE(wait_until([&] { return ran.load(std::memory_order_acquire); }));
  CHECK(cx.plain == evr::errc::called_from_host_func);
  CHECK(cx.raw == evr::errc::called_from_host_func);
  CHECK(cx.op.calls.load() == 0);
  CHECK(cx.sync == evr::errc::called_from_host_func);
  CHECK(cx.release == evr::errc::called_from_host_func);
  REQUIRE(run_until(sc.io, [&] { return cx.posted.done(); }));
  CHECK(cx.posted.ec == evr::errc::called_from_host_func);
  CHECK(cx.posted.ec.message().find("host function") != std::string::npos);
  sc.check_unharmed();
}

TEST_CASE("misuse: a null, per-thread default or empty stream, an empty event or target") {
  scene sc;
  auto noop = [](std::error_code) {};
  const auto per_thread =
      evr::wait_target::of_stream(sc.sim, reinterpret_cast<void*>(2));  // cudaStreamPerThread
  CHECK(evr::on_complete(sc.r, per_thread, noop) == evr::errc::per_thread_default_stream);
  CHECK(evr::on_complete(sc.r, evr::stream{}, noop) == evr::errc::empty_handle);
  CHECK(evr::on_complete(sc.r, evr::event{}, noop) == evr::errc::empty_handle);
  CHECK(evr::on_complete(sc.r, evr::wait_target{}, noop) == evr::errc::empty_handle);
  CHECK(evr::on_complete(sc.r, evr::wait_target::of_event(sc.sim, nullptr, 0), noop) ==
        evr::errc::empty_handle);
  // The legacy default stream (nullptr) is a stream on CUDA; the simulator does not model it and
  // says so (invalid_argument), which the reactor passes on.
  CHECK(evr::on_complete(sc.r, evr::wait_target::of_stream(sc.sim, nullptr), noop) ==
        evr::errc::invalid_argument);
  result posted_per_thread, posted_empty;
  sc.waiter.async_wait(per_thread, posted_per_thread.handler());
  sc.waiter.async_wait(evr::stream{}, posted_empty.handler());
  REQUIRE(run_until(sc.io, [&] { return posted_per_thread.done() && posted_empty.done(); }));
  CHECK(posted_per_thread.ec == evr::errc::per_thread_default_stream);
  CHECK(posted_empty.ec == evr::errc::empty_handle);
  CHECK(posted_per_thread.ec.message().find("PerThread") != std::string::npos);
  sc.check_unharmed();
}

TEST_CASE("misuse: cancelling twice, and after completion") {
  for (evr::strategy s : evr::test::all_strategies) {
    CAPTURE(std::string(evr::to_string(s)));
    // Outlive the scene's context, which frees a pending wait's operation (clearing its slot).
    asio::cancellation_signal sig_pending, sig_done;
    scene sc(s);
    // wait_handle: a pending wait cancelled twice completes once, with operation_aborted.
    owned_op pending, finished;
    REQUIRE_FALSE(evr::on_complete(sc.r, sc.s0, pending.callback(), pending.handle));  // gated
    CHECK(pending.handle.cancel());
    CHECK_FALSE(pending.handle.cancel());
    REQUIRE(wait_until([&] { return pending.calls.load() == 1; }));
    CHECK(pending.ec == evr::errc::operation_aborted);
    // A wait that already completed: cancel does nothing.
    REQUIRE_FALSE(evr::on_complete(sc.r, sc.s1, finished.callback(), finished.handle));
    REQUIRE(wait_until([&] { return finished.calls.load() == 1; }));
    CHECK_FALSE(finished.handle.cancel());
    CHECK_FALSE(finished.handle.cancel());
    // Asio: a slot emitted twice while pending, and a slot emitted after completion.
    result slot_pending, slot_done;
    sc.waiter.async_wait(sc.s0,
                         asio::bind_cancellation_slot(sig_pending.slot(), slot_pending.handler()));
    sc.waiter.async_wait(sc.s1, asio::bind_cancellation_slot(sig_done.slot(), slot_done.handler()));
    REQUIRE(run_until(sc.io, [&] { return slot_done.done(); }));
    sig_pending.emit(asio::cancellation_type::terminal);
    sig_pending.emit(asio::cancellation_type::total);
    sig_done.emit(asio::cancellation_type::terminal);
    REQUIRE(run_until(sc.io, [&] { return slot_pending.done(); }));
    sc.waiter.cancel();  // cancel-all with nothing of this waiter pending
    sc.waiter.cancel();
    sc.check_unharmed();
    CHECK(pending.calls.load() == 1);
    CHECK(finished.calls.load() == 1);
    CHECK_FALSE(finished.ec);
    CHECK(slot_pending.calls.load() == 1);
    CHECK(slot_pending.ec == evr::asio_error_code(asio::error::operation_aborted));
    CHECK(slot_done.calls.load() == 1);
    CHECK_FALSE(slot_done.ec);
    CHECK(sc.r.metrics().cancelled == 2);
  }
}

TEST_CASE("misuse: more streams than the reactor can track") {
  evr::sim::device sim;
  auto opts = quick_options(evr::strategy::poll);
  opts.max_streams = 2;
  evr::reactor r(sim, opts);
  evr::stream a(sim, 0), b(sim, 0), c(sim, 0);
  result wa, wb, wa2;
  REQUIRE_FALSE(evr::on_complete(r, a, wa.handler()));
  REQUIRE_FALSE(evr::on_complete(r, b, wb.handler()));
  CHECK(evr::on_complete(r, c, [](std::error_code) {}) == evr::errc::stream_table_full);
  REQUIRE_FALSE(evr::on_complete(r, a, wa2.handler()));  // known streams go on
  REQUIRE(wait_until([&] { return wa.done() && wb.done() && wa2.done(); }));
  CHECK_FALSE(wa.ec);
  CHECK_FALSE(wb.ec);
  CHECK_FALSE(wa2.ec);
}

TEST_CASE("misuse: destroying the reactor from one of its own handlers, with waits pending") {
  evr::sim::device sim;
  evr::stream gated(sim, 0), free_stream(sim, 0);
  auto open = std::make_shared<std::atomic<bool>>(false);
  sim.launch_kernel(gated.native(), {}, [open] {
    while (!open->load()) std::this_thread::sleep_for(20us);
  });
  auto opts = quick_options(evr::strategy::poll);
  opts.shutdown_drain = 10ms;
  auto* r = new evr::reactor(sim, opts);
  constexpr int pending = 20;
  std::vector<result> held(pending);
  for (auto& w : held) REQUIRE_FALSE(evr::on_complete(*r, gated, w.handler()));
  std::atomic<bool> deleted{false}, submitted{false};
  REQUIRE_FALSE(evr::on_complete(*r, free_stream, [&, r](std::error_code) {
    // Not before on_complete has returned on the main thread: destroying an object while another
    // thread is still inside one of its member functions (submit's wake-up after the push) is a
    // use after free, here as anywhere.
    while (!submitted.load()) std::this_thread::yield();
    delete r;  // on the reactor thread: it finishes the shutdown by itself
    deleted = true;
  }));
  submitted = true;
  REQUIRE(wait_until([&] { return deleted.load(); }));
  // The pending waits are aborted (after the drain), each exactly once.
  REQUIRE(wait_until([&] {
    for (auto& w : held)
      if (!w.done()) return false;
    return true;
  }));
  for (auto& w : held) {
    CHECK(w.calls.load() == 1);
    CHECK(w.ec == evr::errc::operation_aborted);
  }
  // The thread's last act: destroying the markers it could not return. Then a new reactor serves.
  REQUIRE(wait_until([&] {
    auto c = sim.counters();
    return c.events_destroyed == c.events_created;
  }));
  std::this_thread::sleep_for(20ms);
  open->store(true);
  evr::reactor fresh(sim, quick_options(evr::strategy::poll));
  result ok;
  REQUIRE_FALSE(evr::on_complete(fresh, gated, ok.handler()));
  REQUIRE(wait_until([&] { return ok.done(); }));
  CHECK_FALSE(ok.ec);
}

TEST_CASE(
    "misuse: stop() from one of the reactor's own handlers; the destructor still waits for the "
    "shutdown") {
  evr::sim::device sim;
  evr::stream gated(sim, 0), free_stream(sim, 0);
  auto open = std::make_shared<std::atomic<bool>>(false);
  sim.launch_kernel(gated.native(), {}, [open] {
    while (!open->load()) std::this_thread::sleep_for(20us);
  });
  auto opts = quick_options(evr::strategy::poll);
  opts.shutdown_drain = 30ms;
  std::atomic<bool> stopped{false};  // before the reactor: its destructor may run the handler
  auto r = std::make_unique<evr::reactor>(sim, opts);
  constexpr int pending = 20;
  std::vector<result> held(pending);
  for (auto& w : held) REQUIRE_FALSE(evr::on_complete(*r, gated, w.handler()));
  evr::reactor* raw = r.get();
  REQUIRE_FALSE(evr::on_complete(*r, free_stream, [&, raw](std::error_code) {
    raw->stop();  // cannot join itself: the thread goes on shutting down after this handler
    stopped = true;
  }));
  REQUIRE(wait_until([&] { return stopped.load(); }));
  r.reset();  // ~reactor from another thread: must return only once every wait has completed
  int completed = 0;
  for (auto& w : held) completed += w.done();
  CHECK(completed == pending);
  // (If not, wait for the thread before the device goes away, so the failure stays a failure.)
  wait_until([&] {
    for (auto& w : held)
      if (!w.done()) return false;
    auto c = sim.counters();
    return c.events_destroyed == c.events_created;
  });
  std::this_thread::sleep_for(20ms);
  open->store(true);
}

TEST_CASE("misuse: stop() from a handler while another thread is in stop(): no deadlock") {
  // Everything the two threads touch lives on the heap, so that, should the two stop() calls
  // deadlock, the test can report it and leave the stuck objects alone (kept, never destroyed)
  // instead of hanging the whole run or letting the stuck threads see a dead stack frame.
  struct shared {
    evr::sim::device sim;
    evr::stream st{sim, 0};
    std::unique_ptr<evr::reactor> r =
        std::make_unique<evr::reactor>(sim, quick_options(evr::strategy::poll));
    std::atomic<bool> in_handler{false}, other_stopping{false}, handler_returned{false},
        other_returned{false};
  };
  auto* sh = new shared;
  REQUIRE_FALSE(evr::on_complete(*sh->r, sh->st, [sh](std::error_code) {
    sh->in_handler = true;
    while (!sh->other_stopping.load()) std::this_thread::sleep_for(100us);
    std::this_thread::sleep_for(20ms);  // the other thread is now inside stop(), joining us
    sh->r->stop();
    sh->handler_returned = true;
  }));
  REQUIRE(wait_until([sh] { return sh->in_handler.load(); }));
  std::thread other([sh] {
    sh->other_stopping = true;
    sh->r->stop();
    sh->other_returned = true;
  });
  const bool finished =
      wait_until([sh] { return sh->handler_returned.load() && sh->other_returned.load(); }, 5s);
  CHECK(finished);
  if (!finished) {
    static std::vector<shared*>* stuck = new std::vector<shared*>;  // reachable: not a leak
    stuck->push_back(sh);
    other.detach();
    return;
  }
  other.join();
  CHECK(sh->r->metrics().completed == 1);
  delete sh;
}

// A wait on a raw event is filed under the device the caller names (wait_target::of_event) or, for
// a cudaEvent_t, under the submitting thread's current device. When that is not the event's device
// and the event's device faults, only that wait may fail: the named, healthy device must not be
// declared faulted (which would fail its waits and refuse every later one). Regression test for
// the fix in the sweep of loose waits (stream_sweep::query_loose).
TEST_CASE(
    "misuse: a raw event filed under the wrong device; its device faults; the named device is "
    "unharmed") {
  for (evr::strategy s : {evr::strategy::poll, evr::strategy::fence}) {
    CAPTURE(std::string(evr::to_string(s)));
    scene sc(s);
    evr::device::native_event ev = nullptr;
    REQUIRE_FALSE(sc.sim.create_event(1, evr::device::event_flags::none, ev));
    REQUIRE_FALSE(sc.sim.launch_kernel(sc.s1.native(), 200ms));
    REQUIRE_FALSE(sc.sim.record_event(ev, sc.s1.native()));
    result w;
    REQUIRE_FALSE(
        evr::on_complete(sc.r, evr::wait_target::of_event(sc.sim, ev, /*wrong*/ 0), w.handler()));
    sc.sim.inject_fault(1);
    REQUIRE(wait_until([&] { return w.done(); }));
    CHECK(w.ec == evr::make_cuda_error(evr::cuda_value::illegal_address));
    // Device 0 is healthy: the bystander and new waits there complete.
    sc.gate_open->store(true);
    REQUIRE(wait_until([&] { return sc.bystander.done(); }));
    CHECK_FALSE(sc.bystander.ec);
    result later;
    REQUIRE_FALSE(evr::on_complete(sc.r, sc.s0, later.handler()));
    REQUIRE(wait_until([&] { return later.done(); }));
    CHECK_FALSE(later.ec);
    CHECK(sc.r.metrics().device_faults <= 1);
    sc.sim.destroy_event(ev);
  }
}
