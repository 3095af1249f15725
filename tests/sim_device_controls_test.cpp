// Tests of the simulated device's controls (evr/sim/device.hpp): manual stepping, stalls, fault
// injection, misuse, call counters, and teardown with work in flight. Its CUDA semantics are in
// sim_device_test.cpp. Every test builds its own sim::device.
#include <doctest/doctest.h>

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <evr/device/error.hpp>
#include <evr/sim/device.hpp>

#include "support/sim_device_helpers.hpp"

using namespace evr::test::sim_helpers;

TEST_SUITE_BEGIN("sim_device");

TEST_CASE("sim: manual mode step counts") {
  evr::sim::device d(manual());
  native_stream a = make_stream(d);
  native_stream b = make_stream(d);
  for (int i = 0; i < 5; ++i) REQUIRE_FALSE(d.launch_kernel(a, 1s));  // durations ignored
  for (int i = 0; i < 3; ++i) REQUIRE_FALSE(d.launch_kernel(b));
  CHECK(d.pending_operations(a) == 5);
  CHECK(d.step(a, 2) == 2);
  CHECK(d.pending_operations(a) == 3);
  CHECK(d.step(a, 0) == 0);
  CHECK(d.step(a, 10) == 3);
  CHECK(d.step(a) == 0);
  CHECK(d.pending_operations(b) == 3);  // untouched
  CHECK(d.run_until_blocked() == 3);
  CHECK(d.run_until_blocked() == 0);

  evr::sim::device t(threaded());
  native_stream ts = make_stream(t);
  CHECK(t.step(ts) == 0);  // no manual stepping in threaded mode
  CHECK(t.run_until_blocked() == 0);
}

TEST_CASE("sim: stall holds a stream, resume releases it") {
  SUBCASE("threaded") {
    evr::sim::device d(threaded());
    native_stream s = make_stream(d);
    native_stream other = make_stream(d);
    d.stall(s);
    std::atomic<int> ran{0};
    REQUIRE_FALSE(d.launch_host_func(s, count_call, &ran));
    REQUIRE_FALSE(d.launch_host_func(other, count_call, &ran));
    d.wait_idle();  // returns although s holds work: it is stalled
    CHECK(ran.load() == 1);
    CHECK(d.query_stream(s) == not_ready);
    CHECK(d.pending_operations(s) == 1);
    d.resume(s);
    CHECK_FALSE(d.synchronize_stream(s));
    CHECK(ran.load() == 2);
  }
  SUBCASE("manual") {
    evr::sim::device d(manual());
    native_stream s = make_stream(d);
    REQUIRE_FALSE(d.launch_kernel(s));
    d.stall(s);
    CHECK(d.step(s) == 0);
    CHECK(d.run_until_blocked() == 0);
    d.resume(s);
    CHECK(d.step(s) == 1);
  }
}

TEST_CASE("sim: a fault is sticky on its device and leaves other devices alone") {
  evr::sim::device d(threaded(2));
  native_stream s0 = make_stream(d, 0);
  native_stream s0b = make_stream(d, 0);
  native_stream s1 = make_stream(d, 1);
  native_event unrelated = make_event(d, 0);  // never recorded
  native_event e1 = make_event(d, 1);
  fence_block block;
  REQUIRE_FALSE(d.allocate_fence_block(0, 1, block));
  std::atomic<int> ran{0};

  d.stall(s0);  // enqueue everything before the fault strikes
  d.stall(s0b);
  REQUIRE_FALSE(d.launch_faulting_kernel(s0));
  REQUIRE_FALSE(d.launch_host_func(s0, count_call, &ran));
  REQUIRE_FALSE(d.write_fence(s0, block.device_word(0), 42));
  REQUIRE_FALSE(d.launch_host_func(s0b, count_call, &ran));  // another stream, same device
  d.resume(s0);

  const std::error_code ec = d.synchronize_stream(s0);  // returns the fault, does not hang
  CHECK(ec == illegal_address);
  CHECK(evr::is_sticky(ec));
  CHECK(d.fault(0) == illegal_address);
  CHECK_FALSE(d.fault(1));
  CHECK(d.query_stream(s0) == illegal_address);
  CHECK(d.query_stream(s0b) == illegal_address);
  CHECK(d.query_event(unrelated) == illegal_address);
  CHECK(d.record_event(unrelated, s0b) == illegal_address);
  CHECK(d.synchronize_event(unrelated) == illegal_address);
  CHECK(d.synchronize_stream(s0b) == illegal_address);
  CHECK(d.launch_host_func(s0b, count_call, &ran) == illegal_address);
  CHECK(d.write_fence(s0b, block.device_word(0), 7) == illegal_address);
  CHECK(d.launch_kernel(s0b) == illegal_address);
  native_event fresh = nullptr;
  CHECK(d.create_event(0, event_flags::none, fresh) == illegal_address);
  d.resume(s0b);
  d.wait_idle();
  std::this_thread::sleep_for(20ms);
  CHECK(ran.load() == 0);                                                  // host funcs never ran
  CHECK(std::atomic_ref<std::uint64_t>(*block.host_word(0)).load() == 0);  // fence never landed
  CHECK(d.counters().fence_writes_landed == 0);

  // Device 1 works as before.
  REQUIRE_FALSE(d.launch_host_func(s1, count_call, &ran));
  REQUIRE_FALSE(d.record_event(e1, s1));
  CHECK_FALSE(d.synchronize_event(e1));
  CHECK_FALSE(d.query_event(e1));
  CHECK_FALSE(d.query_stream(s1));
  CHECK(ran.load() == 1);
  d.free_fence_block(block);
}

TEST_CASE("sim: fault kinds: custom fault, inject_fault, first fault sticks") {
  evr::sim::device d(manual(2));
  native_stream s = make_stream(d, 0);
  const auto launch_failure = evr::make_cuda_error(cuda_value::launch_failure);
  REQUIRE_FALSE(d.launch_kernel(s));
  REQUIRE_FALSE(d.launch_faulting_kernel(s, launch_failure));
  REQUIRE_FALSE(d.launch_kernel(s));
  CHECK(d.step(s, 5) == 1);  // the faulting kernel starts, faults, never completes
  CHECK(d.fault(0) == launch_failure);
  CHECK(d.pending_operations(s) == 2);
  d.inject_fault(0, illegal_address);
  CHECK(d.fault(0) == launch_failure);  // the first fault sticks

  d.inject_fault(1);
  CHECK(d.fault(1) == illegal_address);  // default fault
  CHECK(d.fault(2) == evr::errc::no_device);
}

TEST_CASE("sim: inject_fault_after counts operations of every stream of the device") {
  evr::sim::device d(manual(2));
  native_stream a = make_stream(d, 0);
  native_stream b = make_stream(d, 0);
  native_stream c = make_stream(d, 1);
  std::atomic<int> ran{0};
  for (auto s : {a, b, c}) {
    for (int i = 0; i < 2; ++i) REQUIRE_FALSE(d.launch_host_func(s, count_call, &ran));
  }
  d.inject_fault_after(0, 3, evr::make_cuda_error(cuda_value::misaligned_address));
  CHECK(d.step(a) == 1);  // operation 1
  CHECK(d.step(c) == 1);  // device 1: not counted
  CHECK(d.step(b) == 1);  // operation 2
  CHECK_FALSE(d.fault(0));
  CHECK(d.step(a) == 0);  // operation 3 faults as it starts
  CHECK(d.fault(0) == evr::make_cuda_error(cuda_value::misaligned_address));
  CHECK(d.step(b) == 0);
  CHECK(ran.load() == 3);
  CHECK(d.pending_operations(a) == 1);
  CHECK(d.step(c) == 1);  // device 1 unaffected
  CHECK_FALSE(d.fault(1));
  CHECK(d.counters().host_funcs_run == 4);

  evr::sim::device t(threaded());
  native_stream ts = make_stream(t);
  t.inject_fault_after(0, 1);
  std::atomic<int> tran{0};
  REQUIRE_FALSE(t.launch_host_func(ts, count_call, &tran));
  CHECK(t.synchronize_stream(ts) == illegal_address);
  CHECK(tran.load() == 0);
}

TEST_CASE("sim: misuse: device mismatch, bad devices, default streams, bad handles") {
  evr::sim::device d(manual(2));
  native_stream s0 = make_stream(d, 0);
  native_event e1 = make_event(d, 1);
  CHECK(d.record_event(e1, s0) == evr::errc::device_mismatch);
  CHECK(d.pending_operations(s0) == 0);

  native_stream s = nullptr;
  native_event e = nullptr;
  CHECK(d.create_stream(2, 0, s) == evr::errc::no_device);
  CHECK(d.create_stream(-1, 0, s) == evr::errc::no_device);
  CHECK(d.create_event(2, event_flags::none, e) == evr::errc::no_device);
  CHECK(d.create_event(0, static_cast<event_flags>(64), e) == evr::errc::invalid_argument);
  fence_block block;
  CHECK(d.allocate_fence_block(5, 1, block) == evr::errc::no_device);
  CHECK(d.allocate_fence_block(0, 0, block) == evr::errc::invalid_argument);

  CHECK(d.query_stream(nullptr) == evr::errc::invalid_argument);  // the legacy default stream
  CHECK(d.record_event(e1, nullptr) == evr::errc::invalid_argument);
  CHECK(d.launch_kernel(nullptr) == evr::errc::invalid_argument);
  CHECK(d.query_stream(reinterpret_cast<native_stream>(2)) == evr::errc::per_thread_default_stream);

  // Handles this device does not know (another device's, destroyed ones).
  evr::sim::device other(manual());
  native_stream foreign = make_stream(other);
  const auto invalid_handle = evr::make_cuda_error(cuda_value::invalid_resource_handle);
  CHECK(d.query_stream(foreign) == invalid_handle);
  native_stream gone = make_stream(d, 1);
  d.destroy_stream(gone);
  CHECK(d.query_stream(gone) == invalid_handle);
  native_event gone_event = make_event(d);
  d.destroy_event(gone_event);
  CHECK(d.query_event(gone_event) == invalid_handle);
}

TEST_CASE("sim: call counters") {
  evr::sim::device d(manual());
  native_stream s = make_stream(d);
  native_event a = make_event(d);
  native_event b = make_event(d);
  fence_block block;
  REQUIRE_FALSE(d.allocate_fence_block(0, 1, block));
  std::atomic<int> ran{0};
  REQUIRE_FALSE(d.record_event(a, s));
  CHECK(d.record_event(a, nullptr) == evr::errc::invalid_argument);  // failed calls count too
  for (int i = 0; i < 3; ++i) (void)d.query_event(a);
  for (int i = 0; i < 2; ++i) (void)d.query_stream(s);
  REQUIRE_FALSE(d.launch_host_func(s, count_call, &ran));
  REQUIRE_FALSE(d.launch_host_func(s, count_call, &ran));
  REQUIRE_FALSE(d.write_fence(s, block.device_word(0), 1));

  evr::sim::call_counters c = d.counters();
  CHECK(c.events_created == 2);
  CHECK(c.events_destroyed == 0);
  CHECK(c.event_records == 2);
  CHECK(c.event_queries == 3);
  CHECK(c.stream_queries == 2);
  CHECK(c.host_funcs_launched == 2);
  CHECK(c.host_funcs_run == 0);
  CHECK(c.fence_writes_enqueued == 1);
  CHECK(c.fence_writes_landed == 0);

  CHECK(d.run_until_blocked() == 4);
  d.destroy_event(a);
  d.destroy_event(b);
  c = d.counters();
  CHECK(c.host_funcs_run == 2);
  CHECK(c.fence_writes_landed == 1);
  CHECK(c.events_destroyed == 2);

  d.reset_counters();
  c = d.counters();
  CHECK(c.events_created == 0);
  CHECK(c.event_queries == 0);
  CHECK(c.host_funcs_run == 0);
  CHECK(c.fence_writes_landed == 0);
  d.free_fence_block(block);
}

TEST_CASE("sim: a query costs its caller options::query_cost, and a negative cost is refused") {
  // The cost is a lower bound on the caller's time (a loaded machine only adds to it), which is
  // what tests of the reactor's slow looks rely on.
  evr::sim::options opts = manual();
  opts.query_cost = std::chrono::microseconds(200);
  evr::sim::device d(opts);
  native_stream s = make_stream(d);
  native_event e = make_event(d);
  REQUIRE_FALSE(d.record_event(e, s));
  for (int i = 0; i < 2; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const std::error_code ec = i == 0 ? d.query_event(e) : d.query_stream(s);
    CHECK(std::chrono::steady_clock::now() - start >= opts.query_cost);
    CHECK(ec == not_ready);  // the cost changes no answer
  }
  d.destroy_event(e);

  opts.query_cost = std::chrono::nanoseconds(-1);
  try {
    evr::sim::device refused(opts);
    FAIL("a negative query_cost was accepted");
  } catch (const std::invalid_argument& bad) {
    CHECK(std::string(bad.what()).find("query_cost") != std::string::npos);
  }
}

TEST_CASE("sim: manual synchronize runs the stream forward, and refuses to deadlock") {
  evr::sim::device d(manual());
  native_stream s = make_stream(d);
  native_stream t = make_stream(d);
  native_event e = make_event(d);
  std::atomic<int> ran{0};
  REQUIRE_FALSE(d.launch_host_func(s, count_call, &ran));
  REQUIRE_FALSE(d.record_event(e, s));
  REQUIRE_FALSE(d.launch_host_func(s, count_call, &ran));
  CHECK_FALSE(d.synchronize_event(e));  // runs s only up to the record
  CHECK(ran.load() == 1);
  CHECK(d.pending_operations(s) == 1);

  d.stall(s);
  const auto deadlock = std::make_error_code(std::errc::resource_deadlock_would_occur);
  CHECK(d.synchronize_stream(s) == deadlock);
  REQUIRE_FALSE(d.record_event(e, s));
  CHECK(d.synchronize_event(e) == deadlock);
  REQUIRE_FALSE(d.stream_wait_event(t, e));
  CHECK(d.synchronize_stream(t) == deadlock);  // t waits on s, which nobody may step
  d.resume(s);
  CHECK_FALSE(d.synchronize_stream(s));
  CHECK_FALSE(d.synchronize_stream(t));
  CHECK(ran.load() == 2);
}

TEST_CASE("sim: work enqueued before destroy_stream still completes") {
  evr::sim::device d(threaded());
  native_stream s = make_stream(d);
  native_event e = make_event(d);
  gate g;
  g.launch(d, s);
  REQUIRE_FALSE(d.record_event(e, s));
  d.destroy_stream(s);
  CHECK(d.query_event(e) == not_ready);
  g.open();
  CHECK_FALSE(d.synchronize_event(e));
  CHECK_FALSE(d.query_event(e));
  // Streams come and go; their workers are reaped.
  for (int i = 0; i < 20; ++i) {
    native_stream x = make_stream(d);
    REQUIRE_FALSE(d.launch_kernel(x, 10us));
    d.destroy_stream(x);
  }
  d.wait_idle();
}

TEST_CASE("sim: destroying a device with stuck work does not hang") {
  const auto t0 = std::chrono::steady_clock::now();
  {
    evr::sim::device d(threaded());
    native_stream a = make_stream(d);
    native_stream b = make_stream(d);
    native_stream c = make_stream(d);
    native_event e = make_event(d);
    REQUIRE_FALSE(d.launch_kernel(a, 60s));  // long kernel, running
    d.stall(b);
    REQUIRE_FALSE(d.launch_kernel(b));
    REQUIRE_FALSE(d.record_event(e, b));
    REQUIRE_FALSE(d.stream_wait_event(c, e));  // blocked forever on b
    REQUIRE_FALSE(d.launch_kernel(c));
    std::this_thread::sleep_for(10ms);
    CHECK(d.query_stream(a) == not_ready);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
}

TEST_CASE("sim: wait_idle returns once every stream is drained or stuck") {
  evr::sim::device d(threaded());
  native_stream a = make_stream(d);
  native_stream b = make_stream(d);
  native_stream c = make_stream(d);
  native_event e = make_event(d);
  std::atomic<int> ran{0};
  for (int i = 0; i < 10; ++i) {
    REQUIRE_FALSE(d.launch_kernel(a, 100us));
    REQUIRE_FALSE(d.launch_host_func(a, count_call, &ran));
  }
  d.stall(b);
  REQUIRE_FALSE(d.record_event(e, b));
  REQUIRE_FALSE(d.stream_wait_event(c, e));  // c is stuck behind stalled b
  d.wait_idle();
  CHECK(ran.load() == 10);
  CHECK_FALSE(d.query_stream(a));
  CHECK(d.query_stream(c) == not_ready);
  d.resume(b);
  d.wait_idle();
  CHECK_FALSE(d.query_stream(c));
}

TEST_SUITE_END();
