// Tests of the simulated device itself (evr/sim/device.hpp): the CUDA semantics it models, its
// fault injection and its manual mode. Every test builds its own sim::device.
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

namespace {

using evr::device::event_flags;
using evr::device::fence_block;
using evr::device::ipc_event_handle;
using evr::device::native_event;
using evr::device::native_stream;
using namespace std::chrono_literals;

namespace cuda_value = evr::cuda_value;

evr::sim::options manual(int devices = 1) {
  return {.devices = devices, .mode = evr::sim::run_mode::manual};
}
evr::sim::options threaded(int devices = 1) {
  return {.devices = devices, .mode = evr::sim::run_mode::threaded};
}

native_stream make_stream(evr::sim::device& d, int device = 0) {
  native_stream s = nullptr;
  REQUIRE_FALSE(d.create_stream(device, 0, s));
  REQUIRE(s != nullptr);
  return s;
}

native_event make_event(evr::sim::device& d, int device = 0,
                        event_flags flags = event_flags::none) {
  native_event e = nullptr;
  REQUIRE_FALSE(d.create_event(device, flags, e));
  REQUIRE(e != nullptr);
  return e;
}

const std::error_code not_ready = evr::make_cuda_error(cuda_value::not_ready);
const std::error_code illegal_address = evr::make_cuda_error(cuda_value::illegal_address);

// A kernel body that holds its stream until open() (as the gate kernel of the GPU tests).
struct gate {
  std::shared_ptr<std::atomic<bool>> flag = std::make_shared<std::atomic<bool>>(false);
  ~gate() { open(); }
  void launch(evr::sim::device& d, native_stream s) const {
    auto f = flag;
    REQUIRE_FALSE(d.launch_kernel(s, {}, [f] {
      while (!f->load(std::memory_order_acquire)) std::this_thread::sleep_for(50us);
    }));
  }
  void open() const { flag->store(true, std::memory_order_release); }
};

// A host function that appends its tag to a shared log (and notes whether in_host_func held).
struct log_entry {
  int tag;
  bool in_host_func;
  std::thread::id thread;
};
struct host_log {
  evr::sim::device* device = nullptr;
  std::mutex mutex;
  std::vector<log_entry> entries;
  std::vector<int> tags() {
    std::lock_guard lock(mutex);
    std::vector<int> out;
    for (const auto& e : entries) out.push_back(e.tag);
    return out;
  }
};
struct host_call {
  host_log* log;
  int tag;
};
void append_tag(void* p) {
  auto* call = static_cast<host_call*>(p);
  std::lock_guard lock(call->log->mutex);
  call->log->entries.push_back(
      {call->tag, call->log->device->in_host_func(), std::this_thread::get_id()});
}

void count_call(void* p) { static_cast<std::atomic<int>*>(p)->fetch_add(1); }

}  // namespace

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
