// Tests of the simulated device itself (evr/sim/device.hpp): the CUDA semantics it models (order,
// events, host functions, fence words, timing, interprocess events, identity, threads). Its
// controls (stepping, stalls, faults, counters, teardown) are in sim_device_controls_test.cpp.
// Every test builds its own sim::device.
#include <doctest/doctest.h>

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <evr/device/error.hpp>
#include <evr/sim/device.hpp>

#include "support/sim_device_helpers.hpp"

using namespace evr::test::sim_helpers;

TEST_SUITE_BEGIN("sim_device");

TEST_CASE("sim: operations of a stream complete in order (threaded)") {
  evr::sim::device d(threaded());
  native_stream s = make_stream(d);
  std::vector<int> order;  // written only by the stream's worker, read after synchronize
  constexpr int n = 50;
  for (int i = 0; i < n; ++i) {
    // Longer kernels first: completing out of order would show up.
    REQUIRE_FALSE(d.launch_kernel(s, std::chrono::microseconds((n - i) * 20),
                                  [&order, i] { order.push_back(i); }));
  }
  CHECK(d.query_stream(s) == not_ready);
  REQUIRE_FALSE(d.synchronize_stream(s));
  CHECK_FALSE(d.query_stream(s));
  REQUIRE(order.size() == n);
  for (int i = 0; i < n; ++i) CHECK(order[static_cast<std::size_t>(i)] == i);
}

TEST_CASE("sim: events complete as their stream passes them (manual)") {
  evr::sim::device d(manual());
  native_stream s = make_stream(d);
  native_event e1 = make_event(d);
  native_event e2 = make_event(d);
  REQUIRE_FALSE(d.launch_kernel(s));
  REQUIRE_FALSE(d.record_event(e1, s));
  REQUIRE_FALSE(d.launch_kernel(s));
  REQUIRE_FALSE(d.record_event(e2, s));
  CHECK(d.pending_operations(s) == 4);
  CHECK(d.query_event(e1) == not_ready);
  CHECK(d.query_event(e2) == not_ready);
  CHECK(d.step(s) == 1);  // kernel
  CHECK(d.query_event(e1) == not_ready);
  CHECK(d.step(s) == 1);  // record e1
  CHECK_FALSE(d.query_event(e1));
  CHECK(d.query_event(e2) == not_ready);
  CHECK(d.query_stream(s) == not_ready);
  CHECK(d.step(s, 5) == 2);
  CHECK_FALSE(d.query_event(e2));
  CHECK_FALSE(d.query_stream(s));
  CHECK(d.pending_operations(s) == 0);
}

TEST_CASE("sim: a never-recorded event is complete") {
  evr::sim::device d(manual());
  native_stream s = make_stream(d);
  native_event e = make_event(d, 0, event_flags::timing);
  CHECK_FALSE(d.query_event(e));
  CHECK_FALSE(d.synchronize_event(e));
  // Waiting on it enqueues nothing (cudaStreamWaitEvent on an unrecorded event is a no-op).
  CHECK_FALSE(d.stream_wait_event(s, e));
  CHECK(d.pending_operations(s) == 0);
  float ms = 1.0f;
  CHECK(d.elapsed_ms(e, e, ms) == evr::errc::event_never_recorded);
}

TEST_CASE("sim: re-recording overwrites what an event watches, not enqueued waits") {
  evr::sim::device d(manual());
  native_stream a = make_stream(d);
  native_stream b = make_stream(d);
  native_event e = make_event(d);
  REQUIRE_FALSE(d.record_event(e, a));
  CHECK(d.step(a) == 1);
  CHECK_FALSE(d.query_event(e));

  REQUIRE_FALSE(d.stream_wait_event(b, e));  // captures the completed record
  REQUIRE_FALSE(d.launch_kernel(a));
  REQUIRE_FALSE(d.record_event(e, a));  // re-record behind pending work
  CHECK(d.query_event(e) == not_ready);
  CHECK(d.step(b) == 1);  // b's wait is on the old record: it proceeds

  REQUIRE_FALSE(d.stream_wait_event(b, e));  // captures the new record
  REQUIRE_FALSE(d.launch_kernel(b));
  CHECK(d.step(b) == 0);  // blocked
  CHECK(d.step(a) == 1);  // kernel
  CHECK(d.step(b) == 0);
  CHECK(d.step(a) == 1);  // record
  CHECK_FALSE(d.query_event(e));
  CHECK(d.step(b, 5) == 2);
}

TEST_CASE("sim: a wait on an event blocks another stream until the record completes") {
  SUBCASE("threaded") {
    evr::sim::device d(threaded());
    native_stream a = make_stream(d);
    native_stream b = make_stream(d);
    native_event e = make_event(d);
    gate g;
    g.launch(d, a);
    REQUIRE_FALSE(d.record_event(e, a));
    REQUIRE_FALSE(d.stream_wait_event(b, e));
    std::atomic<int> ran{0};
    REQUIRE_FALSE(d.launch_host_func(b, count_call, &ran));
    std::this_thread::sleep_for(30ms);
    CHECK(ran.load() == 0);
    CHECK(d.query_stream(b) == not_ready);
    CHECK(d.query_event(e) == not_ready);
    g.open();
    CHECK_FALSE(d.synchronize_stream(b));
    CHECK(ran.load() == 1);
    CHECK_FALSE(d.query_event(e));
  }
  SUBCASE("manual: run_until_blocked resolves cross-stream waits") {
    evr::sim::device d(manual());
    native_stream a = make_stream(d);
    native_stream b = make_stream(d);
    native_event e = make_event(d);
    REQUIRE_FALSE(d.launch_kernel(a));
    REQUIRE_FALSE(d.record_event(e, a));
    REQUIRE_FALSE(d.stream_wait_event(b, e));
    REQUIRE_FALSE(d.launch_kernel(b));
    CHECK(d.step(b, 10) == 0);
    CHECK(d.pending_operations(b) == 2);
    CHECK(d.run_until_blocked() == 4);
    CHECK_FALSE(d.query_stream(a));
    CHECK_FALSE(d.query_stream(b));
    CHECK(d.run_until_blocked() == 0);
  }
}

TEST_CASE("sim: host functions run in order on the worker, with in_host_func set") {
  evr::sim::device d(threaded());
  evr::sim::device other(threaded());
  native_stream s = make_stream(d);
  host_log log;
  log.device = &d;
  std::vector<host_call> calls;
  constexpr int n = 100;
  calls.reserve(n);
  for (int i = 0; i < n; ++i) calls.push_back({&log, i});
  for (auto& c : calls) REQUIRE_FALSE(d.launch_host_func(s, append_tag, &c));
  REQUIRE_FALSE(d.synchronize_stream(s));
  CHECK_FALSE(d.in_host_func());

  REQUIRE(log.entries.size() == n);
  for (int i = 0; i < n; ++i) {
    const auto& entry = log.entries[static_cast<std::size_t>(i)];
    CHECK(entry.tag == i);
    CHECK(entry.in_host_func);
    CHECK(entry.thread != std::this_thread::get_id());
  }
  CHECK(d.counters().host_funcs_run == n);

  // in_host_func is per backend: another sim::device's host function does not count.
  host_log other_log;
  other_log.device = &d;  // asks `d` while running on `other`
  native_stream os = make_stream(other);
  host_call oc{&other_log, 7};
  REQUIRE_FALSE(other.launch_host_func(os, append_tag, &oc));
  REQUIRE_FALSE(other.synchronize_stream(os));
  REQUIRE(other_log.entries.size() == 1);
  CHECK_FALSE(other_log.entries[0].in_host_func);

  CHECK(d.launch_host_func(s, nullptr, nullptr) == evr::errc::invalid_argument);
}

TEST_CASE("sim: manual mode runs host functions on the stepping thread") {
  evr::sim::device d(manual());
  native_stream s = make_stream(d);
  host_log log;
  log.device = &d;
  host_call c0{&log, 0}, c1{&log, 1}, c2{&log, 2};
  for (auto* c : {&c0, &c1, &c2}) REQUIRE_FALSE(d.launch_host_func(s, append_tag, c));
  CHECK(log.tags().empty());  // nothing runs by itself
  CHECK(d.step(s, 2) == 2);
  CHECK(log.tags() == std::vector<int>{0, 1});
  CHECK_FALSE(d.synchronize_stream(s));  // runs the rest on the caller
  CHECK(log.tags() == std::vector<int>{0, 1, 2});
  for (const auto& e : log.entries) {
    CHECK(e.in_host_func);
    CHECK(e.thread == std::this_thread::get_id());
  }
  CHECK_FALSE(d.in_host_func());
}

TEST_CASE("sim: fence writes land in order, as release stores") {
  SUBCASE("manual: one write per step") {
    evr::sim::device d(manual());
    native_stream s = make_stream(d);
    fence_block block;
    REQUIRE_FALSE(d.allocate_fence_block(0, 4, block));
    CHECK(block.words == 4);
    CHECK(reinterpret_cast<std::uintptr_t>(block.host) % 64 == 0);
    CHECK(block.device_address == reinterpret_cast<std::uintptr_t>(block.host));
    for (std::size_t i = 0; i < 4; ++i) CHECK(*block.host_word(i) == 0);
    for (std::uint64_t v = 1; v <= 3; ++v) REQUIRE_FALSE(d.write_fence(s, block.device_word(2), v));
    CHECK(*block.host_word(2) == 0);
    for (std::uint64_t v = 1; v <= 3; ++v) {
      CHECK(d.step(s) == 1);
      CHECK(*block.host_word(2) == v);
    }
    CHECK(*block.host_word(1) == 0);
    CHECK(*block.host_word(3) == 0);
    // Only words of a live block can be written.
    CHECK(d.write_fence(s, block.device_word(4), 1) == evr::errc::invalid_argument);
    CHECK(d.write_fence(s, block.device_word(0) + 4, 1) == evr::errc::invalid_argument);
    CHECK(d.write_fence(s, 0, 1) == evr::errc::invalid_argument);
    // A write still queued when its block is freed never lands (and does not crash).
    REQUIRE_FALSE(d.write_fence(s, block.device_word(0), 9));
    d.free_fence_block(block);
    CHECK(block.host == nullptr);
    CHECK(d.step(s) == 1);
    CHECK(d.counters().fence_writes_enqueued == 4);
    CHECK(d.counters().fence_writes_landed == 3);
  }
  SUBCASE("threaded: a reader never sees a later word before an earlier one") {
    evr::sim::device d(threaded());
    native_stream s = make_stream(d);
    fence_block block;
    REQUIRE_FALSE(d.allocate_fence_block(0, 2, block));
    constexpr std::uint64_t n = 20000;
    std::atomic<bool> violated{false};
    std::thread reader([&] {
      std::atomic_ref<std::uint64_t> w0(*block.host_word(0));
      std::atomic_ref<std::uint64_t> w1(*block.host_word(1));
      std::uint64_t last = 0;
      while (last < n) {
        const std::uint64_t v0 = w0.load(std::memory_order_acquire);
        const std::uint64_t v1 = w1.load(std::memory_order_acquire);
        // word 1 is written before word 0 each round; word 0 never goes backwards.
        if (v1 < v0 || v0 < last) violated.store(true);
        last = v0;
      }
    });
    for (std::uint64_t v = 1; v <= n; ++v) {
      REQUIRE_FALSE(d.write_fence(s, block.device_word(1), v));
      REQUIRE_FALSE(d.write_fence(s, block.device_word(0), v));
    }
    reader.join();
    CHECK_FALSE(violated.load());
    REQUIRE_FALSE(d.synchronize_stream(s));
    CHECK(d.counters().fence_writes_landed == 2 * n);
    d.free_fence_block(block);
  }
}

TEST_CASE("sim: elapsed_ms") {
  SUBCASE("errors") {
    evr::sim::device d(manual(2));
    native_stream s = make_stream(d);
    native_event plain = make_event(d);
    native_event t0 = make_event(d, 0, event_flags::timing);
    native_event t1 = make_event(d, 0, event_flags::timing);
    native_event other = make_event(d, 1, event_flags::timing);
    float ms = 0;
    CHECK(d.elapsed_ms(plain, t1, ms) == evr::errc::timing_disabled);
    CHECK(d.elapsed_ms(t0, plain, ms) == evr::errc::timing_disabled);
    CHECK(d.elapsed_ms(t0, t1, ms) == evr::errc::event_never_recorded);
    CHECK(d.elapsed_ms(t0, other, ms) == evr::errc::device_mismatch);
    REQUIRE_FALSE(d.record_event(t0, s));
    CHECK(d.elapsed_ms(t0, t1, ms) == evr::errc::event_never_recorded);
    REQUIRE_FALSE(d.record_event(t1, s));
    CHECK(d.elapsed_ms(t0, t1, ms) == not_ready);
    CHECK(d.step(s) == 1);
    CHECK(d.elapsed_ms(t0, t1, ms) == not_ready);
    CHECK(d.step(s) == 1);
    CHECK_FALSE(d.elapsed_ms(t0, t1, ms));
    CHECK(ms >= 0.0f);
    d.inject_fault(0);
    CHECK(d.elapsed_ms(t0, t1, ms) == illegal_address);
  }
  SUBCASE("measures the time between the records (threaded)") {
    evr::sim::device d(threaded());
    native_stream s = make_stream(d);
    native_event t0 = make_event(d, 0, event_flags::timing);
    native_event t1 = make_event(d, 0, event_flags::timing);
    REQUIRE_FALSE(d.record_event(t0, s));
    REQUIRE_FALSE(d.launch_kernel(s, 30ms));
    REQUIRE_FALSE(d.record_event(t1, s));
    REQUIRE_FALSE(d.synchronize_event(t1));
    float ms = 0;
    REQUIRE_FALSE(d.elapsed_ms(t0, t1, ms));
    CHECK(ms >= 29.0f);
    CHECK(ms < 5000.0f);
  }
}

TEST_CASE("sim: interprocess events export and import") {
  evr::sim::device d(manual());
  native_stream s = make_stream(d);
  native_event bad = nullptr;
  CHECK(d.create_event(0, event_flags::interprocess | event_flags::timing, bad) ==
        evr::errc::interprocess_requires_no_timing);
  CHECK(bad == nullptr);

  ipc_event_handle h;
  native_event plain = make_event(d);
  CHECK(d.export_event(plain, h) == evr::make_cuda_error(cuda_value::invalid_resource_handle));

  native_event exporter = make_event(d, 0, event_flags::interprocess);
  REQUIRE_FALSE(d.export_event(exporter, h));
  native_event imported = nullptr;
  REQUIRE_FALSE(d.import_event(h, imported));
  REQUIRE(imported != nullptr);
  CHECK(imported != exporter);
  CHECK_FALSE(d.query_event(imported));  // nothing recorded yet

  // The imported event sees the exporter's records.
  REQUIRE_FALSE(d.record_event(exporter, s));
  CHECK(d.query_event(imported) == not_ready);
  CHECK(d.step(s) == 1);
  CHECK_FALSE(d.query_event(imported));
  float ms = 0;
  CHECK(d.elapsed_ms(imported, imported, ms) == evr::errc::timing_disabled);

  // Exporting again gives the same handle.
  ipc_event_handle h2;
  REQUIRE_FALSE(d.export_event(exporter, h2));
  CHECK(std::memcmp(h.bytes, h2.bytes, sizeof h.bytes) == 0);

  // Handles that name nothing live.
  ipc_event_handle garbage;
  std::memset(garbage.bytes, 0xab, sizeof garbage.bytes);
  native_event out = nullptr;
  CHECK(d.import_event(garbage, out) == evr::errc::invalid_ipc_handle);
  evr::sim::device other(manual());
  CHECK(other.import_event(h, out) == evr::errc::invalid_ipc_handle);
  d.destroy_event(exporter);
  CHECK(d.import_event(h, out) == evr::errc::invalid_ipc_handle);
  CHECK(out == nullptr);
  d.destroy_event(imported);
}

TEST_CASE("sim: streams report device and clamped priority") {
  evr::sim::device d(manual(2));
  native_stream s = nullptr;
  REQUIRE_FALSE(d.create_stream(1, -10, s));
  int dev = -1, prio = 1;
  CHECK_FALSE(d.stream_device(s, dev));
  CHECK(dev == 1);
  CHECK_FALSE(d.stream_priority(s, prio));
  CHECK(prio == -5);
  native_stream low = nullptr;
  REQUIRE_FALSE(d.create_stream(0, 3, low));
  CHECK_FALSE(d.stream_priority(low, prio));
  CHECK(prio == 0);
}

TEST_CASE("sim: identity, device count and the per-thread current device") {
  evr::sim::device d(threaded(2));
  CHECK(d.name() == "sim");
  CHECK(d.is_simulated());
  CHECK(d.mode() == evr::sim::run_mode::threaded);
  CHECK(d.describe() == "simulated device x2 (threaded)");
  int n = 0;
  CHECK_FALSE(d.device_count(n));
  CHECK(n == 2);

  REQUIRE_FALSE(d.set_current_device(1));
  int cur = -1;
  CHECK_FALSE(d.current_device(cur));
  CHECK(cur == 1);
  int seen = -1;
  std::thread([&] { (void)d.current_device(seen); }).join();
  CHECK(seen == 0);  // per thread
  CHECK(d.set_current_device(2) == evr::errc::no_device);
  REQUIRE_FALSE(d.set_current_device(0));
  d.prepare_polling_thread();

  evr::sim::device none({.devices = 0, .mode = evr::sim::run_mode::manual});
  CHECK(none.device_count(n) == evr::make_cuda_error(cuda_value::no_device));
  CHECK(n == 0);
  CHECK(none.describe() == "simulated device x0 (manual)");
}

TEST_CASE("sim: cheap and blocking operations interleaved keep their order and their threads") {
  // Records and fence writes may run on the device's runner while the stream's worker sleeps;
  // host functions and kernel bodies run on the worker. Bursts with pauses between them let the
  // worker fall asleep, so both paths are taken.
  evr::sim::device d(threaded());
  native_stream s = make_stream(d);
  native_event e = make_event(d);
  fence_block block;
  REQUIRE_FALSE(d.allocate_fence_block(0, 1, block));
  std::atomic_ref<std::uint64_t> word(*block.host_word(0));

  struct probe {
    std::atomic_ref<std::uint64_t>* word = nullptr;
    std::uint64_t expected = 0;  // the fence value written just before this host function
    std::uint64_t seen = 0;
    std::thread::id thread;
    bool on_worker = false;  // the thread is a stream's worker ("evr-sim-s<id>"), not the runner
  };
  constexpr std::uint64_t rounds = 300;
  std::vector<probe> probes(rounds);
  std::vector<std::thread::id> bodies(rounds);
  for (std::uint64_t i = 0; i < rounds; ++i) {
    probes[i].word = &word;
    probes[i].expected = i + 1;
    REQUIRE_FALSE(d.write_fence(s, block.device_word(0), i + 1));
    REQUIRE_FALSE(d.record_event(e, s));
    REQUIRE_FALSE(d.launch_host_func(
        s,
        [](void* p) {
          auto* pr = static_cast<probe*>(p);
          pr->seen = pr->word->load(std::memory_order_acquire);
          pr->thread = std::this_thread::get_id();
          char name[16] = {};
          pthread_getname_np(pthread_self(), name, sizeof name);
          pr->on_worker = std::strncmp(name, "evr-sim-s", 9) == 0;
        },
        &probes[i]));
    REQUIRE_FALSE(d.launch_kernel(s, {}, [&bodies, i] { bodies[i] = std::this_thread::get_id(); }));
    if (i % 10 == 9) std::this_thread::sleep_for(200us);  // the worker may fall asleep here
  }
  REQUIRE_FALSE(d.synchronize_stream(s));
  CHECK_FALSE(d.query_event(e));
  CHECK(word.load() == rounds);
  const std::thread::id worker = probes[0].thread;
  CHECK(worker != std::this_thread::get_id());
  std::uint64_t out_of_order = 0, elsewhere = 0;
  for (std::uint64_t i = 0; i < rounds; ++i) {
    out_of_order += probes[i].seen != probes[i].expected;
    elsewhere += probes[i].thread != worker || !probes[i].on_worker;
    elsewhere += bodies[i] != worker;
  }
  CHECK(out_of_order == 0);
  CHECK(elsewhere == 0);
  const auto c = d.counters();
  CHECK(c.fence_writes_landed == rounds);
  CHECK(c.host_funcs_run == rounds);
  d.free_fence_block(block);
}

TEST_CASE("sim: concurrent use from many threads") {
  evr::sim::device d(threaded(2));
  constexpr int threads = 4;
  constexpr int rounds = 200;
  std::atomic<int> ran{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      native_stream s = nullptr;
      native_event e = nullptr;
      if (d.create_stream(t % 2, 0, s) || d.create_event(t % 2, event_flags::none, e)) return;
      for (int i = 0; i < rounds; ++i) {
        (void)d.launch_kernel(s, 1us);
        (void)d.launch_host_func(s, count_call, &ran);
        (void)d.record_event(e, s);
        while (evr::is_not_ready(d.query_event(e))) std::this_thread::yield();
      }
      d.destroy_event(e);
      d.destroy_stream(s);
    });
  }
  for (auto& th : pool) th.join();
  d.wait_idle();
  CHECK(ran.load() == threads * rounds);
  CHECK(d.counters().events_created == d.counters().events_destroyed);
}

TEST_SUITE_END();
