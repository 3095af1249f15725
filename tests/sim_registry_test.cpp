// event_registry on a local simulated device: the whole id API, misuse, concurrency.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <evr/pool/event_registry.hpp>
#include <evr/sim/device.hpp>

#include "support/helpers.hpp"

namespace {

using evr::event_class;
using evr::event_registry;
using id_type = event_registry::id_type;
namespace dev = evr::device;

std::string hex(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

/// The message of the evr::error that `fn` throws ("" if it throws none), and its code.
template <class Fn>
std::string thrown_message(Fn&& fn, std::error_code* code = nullptr) {
  try {
    fn();
  } catch (const evr::error& e) {
    if (code) *code = e.code();
    return e.what();
  }
  return {};
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

struct fixture {
  evr::sim::device sim{evr::sim::options{.devices = 2, .mode = evr::sim::run_mode::threaded}};
  dev::native_stream stream = nullptr;
  dev::native_stream other = nullptr;
  fixture() {
    REQUIRE_FALSE(sim.create_stream(0, 0, stream));
    REQUIRE_FALSE(sim.create_stream(0, 0, other));
  }
  ~fixture() {
    sim.wait_idle();
    sim.destroy_stream(stream);
    sim.destroy_stream(other);
  }
};

}  // namespace

TEST_CASE_FIXTURE(fixture, "registry: the whole API on the simulated device") {
  event_registry reg(sim);
  const id_type start = reg.acquire(0, event_class::timing);
  const id_type end = reg.acquire(0, event_class::timing);
  CHECK(start != event_registry::invalid_id);
  CHECK(end != event_registry::invalid_id);
  CHECK(start != end);
  std::error_code ec;
  CHECK(reg.device_of(start, ec) == 0);
  CHECK(reg.class_of(end, ec) == event_class::timing);
  CHECK(reg.native(start) != nullptr);
  CHECK(reg.native(start) != reg.native(end));

  CHECK(reg.query(start));  // never recorded: complete, as in CUDA
  reg.record(start, stream);
  REQUIRE_FALSE(sim.launch_kernel(stream, std::chrono::milliseconds(3)));
  reg.record(end, stream);
  reg.wait(end, other);  // `other` waits for the kernel
  bool ran_after = false;
  REQUIRE_FALSE(sim.launch_kernel(other, {}, [&] { ran_after = true; }));
  reg.synchronize(end);
  CHECK(reg.query(end));
  CHECK(reg.query(start));
  const float ms = reg.elapsed_time(start, end);
  CHECK(ms >= 2.0f);
  REQUIRE_FALSE(sim.synchronize_stream(other));
  CHECK(ran_after);

  CHECK(reg.pools().stats().in_use == 2);
  reg.release(start);
  reg.release(end);
  CHECK(reg.pools().stats().in_use == 0);
  CHECK(reg.pools().stats().cached == reg.pools().stats().created);
}

TEST_CASE_FIXTURE(fixture, "registry: query reports pending work") {
  event_registry reg(sim);
  const id_type id = reg.acquire(0);
  std::atomic<bool> open{false};
  REQUIRE_FALSE(sim.launch_kernel(stream, {}, [&] {
    while (!open.load()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }));
  reg.record(id, stream);
  std::error_code ec;
  CHECK_FALSE(reg.query(id, ec));
  CHECK_FALSE(ec);  // pending is not an error
  CHECK_FALSE(reg.query(id));
  open.store(true);
  reg.synchronize(id);
  CHECK(reg.query(id));
  reg.release(id);
}

TEST_CASE_FIXTURE(fixture,
                  "registry: unknown, released and stale ids are refused with a clear error") {
  event_registry reg(sim);
  const id_type bystander = reg.acquire(0);
  reg.record(bystander, stream);

  SUBCASE("ids never issued") {
    for (id_type bad :
         std::initializer_list<id_type>{0, 12345, (id_type{7} << 32) | 99999,
                                        (id_type{1} << 32) | 0xffffffffULL, ~id_type{0}}) {
      CAPTURE(hex(bad));
      std::error_code ec;
      reg.release(bad, ec);
      CHECK(ec == evr::errc::unknown_event_id);
      reg.record(bad, stream, ec);
      CHECK(ec == evr::errc::unknown_event_id);
      reg.wait(bad, stream, ec);
      CHECK(ec == evr::errc::unknown_event_id);
      CHECK_FALSE(reg.query(bad, ec));
      CHECK(ec == evr::errc::unknown_event_id);
      reg.synchronize(bad, ec);
      CHECK(ec == evr::errc::unknown_event_id);
      CHECK(reg.native(bad, ec) == nullptr);
      CHECK(ec == evr::errc::unknown_event_id);
      CHECK(reg.device_of(bad, ec) == -1);
      CHECK(ec == evr::errc::unknown_event_id);

      std::error_code code;
      const std::string msg = thrown_message([&] { reg.release(bad); }, &code);
      CHECK(code == evr::errc::unknown_event_id);
      CHECK(msg == "evr::event_registry::release(id " + hex(bad) +
                       "): unknown event id (never issued, or already released)");
      CHECK(contains(thrown_message([&] { reg.record(bad, stream); }),
                     "evr::event_registry::record(id " + hex(bad)));
      CHECK(contains(thrown_message([&] { (void)reg.query(bad); }),
                     "evr::event_registry::query(id " + hex(bad) + ")"));
      CHECK(contains(thrown_message([&] { reg.synchronize(bad); }),
                     "synchronize(id " + hex(bad) + ")"));
      CHECK(contains(thrown_message([&] { reg.wait(bad, stream); }), "wait(id " + hex(bad)));
    }
  }
  SUBCASE("double release") {
    const id_type id = reg.acquire(0);
    reg.release(id);
    std::error_code code;
    const std::string msg = thrown_message([&] { reg.release(id); }, &code);
    CHECK(code == evr::errc::unknown_event_id);
    CHECK(contains(msg, "evr::event_registry::release(id " + hex(id) + "): unknown event id"));
    std::error_code ec;
    reg.record(id, stream, ec);
    CHECK(ec == evr::errc::unknown_event_id);
  }
  SUBCASE("a stale id does not reach the slot's next user") {
    const id_type old_id = reg.acquire(0);
    reg.release(old_id);
    const id_type new_id = reg.acquire(0);
    CHECK((new_id & 0xffffffffULL) == (old_id & 0xffffffffULL));  // the slot was reused...
    CHECK(new_id != old_id);                                      // ... under a new generation
    std::error_code ec;
    reg.release(old_id, ec);
    CHECK(ec == evr::errc::unknown_event_id);
    reg.record(old_id, stream, ec);
    CHECK(ec == evr::errc::unknown_event_id);
    reg.record(new_id, stream);  // the new id is untouched
    reg.synchronize(new_id);
    reg.release(new_id);
  }
  SUBCASE("elapsed_time needs two recorded timing events") {
    const id_type plain = reg.acquire(0, event_class::plain);
    const id_type t1 = reg.acquire(0, event_class::timing);
    const id_type t2 = reg.acquire(0, event_class::timing);
    std::error_code ec;
    reg.record(plain, stream);
    reg.record(t1, stream);
    reg.synchronize(t1);

    CHECK(reg.elapsed_time(plain, t1, ec) == 0.0f);
    CHECK(ec == evr::errc::timing_disabled);
    std::error_code code;
    std::string msg = thrown_message([&] { (void)reg.elapsed_time(t1, plain); }, &code);
    CHECK(code == evr::errc::timing_disabled);
    CHECK(contains(msg, "evr::event_registry::elapsed_time(start id " + hex(t1) + ", end id " +
                            hex(plain) + "): end id " + hex(plain)));

    msg = thrown_message([&] { (void)reg.elapsed_time(t1, t2); }, &code);
    CHECK(code == evr::errc::event_never_recorded);
    CHECK(contains(msg, "end id " + hex(t2)));

    msg = thrown_message([&] { (void)reg.elapsed_time(12345, t2); }, &code);
    CHECK(code == evr::errc::unknown_event_id);
    CHECK(contains(msg, "start id 0x3039"));
    msg = thrown_message([&] { (void)reg.elapsed_time(t1, 12345); }, &code);
    CHECK(code == evr::errc::unknown_event_id);
    CHECK(contains(msg, "end id 0x3039"));

    reg.record(t2, stream);
    reg.synchronize(t2);
    CHECK(reg.elapsed_time(t1, t2) >= 0.0f);
    CHECK(reg.elapsed_time(t1, t1) == 0.0f);  // the same id twice is fine
    reg.release(plain);
    reg.release(t1);
    reg.release(t2);
  }
  SUBCASE("bad devices and classes") {
    std::error_code ec;
    CHECK(reg.acquire(7, event_class::plain, ec) == event_registry::invalid_id);
    CHECK(ec == evr::errc::no_device);
    CHECK(reg.acquire(-1, event_class::plain, ec) == event_registry::invalid_id);
    CHECK(ec == evr::errc::no_device);
    CHECK(reg.acquire(0, static_cast<event_class>(9), ec) == event_registry::invalid_id);
    CHECK(ec == evr::errc::invalid_argument);
    const std::string msg = thrown_message([&] { (void)reg.acquire(7, event_class::timing); });
    CHECK(contains(msg, "evr::event_registry::acquire(device 7, class timing)"));
  }

  // The bystander survived every kind of misuse.
  reg.synchronize(bystander);
  CHECK(reg.query(bystander));
  CHECK(reg.pools().stats().in_use == 1);
  reg.release(bystander);
  CHECK(reg.pools().stats().in_use == 0);
}

TEST_CASE_FIXTURE(fixture,
                  "registry: a release during a call waits for the call before recycling") {
  event_registry reg(sim);
  const id_type id = reg.acquire(0);
  std::atomic<bool> open{false};
  REQUIRE_FALSE(sim.launch_kernel(stream, {}, [&] {
    while (!open.load()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }));
  reg.record(id, stream);
  std::atomic<bool> sync_done{false};
  std::error_code sync_ec;
  std::thread waiter([&] {
    reg.synchronize(id, sync_ec);
    sync_done.store(true);
  });
  // Give the waiter time to enter synchronize (not required for correctness: either order is fine).
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  reg.release(id);  // succeeds at once
  std::error_code ec;
  reg.record(id, stream, ec);  // calls starting after the release fail
  CHECK(ec == evr::errc::unknown_event_id);
  if (!sync_done.load()) {
    CHECK(reg.pools().stats().in_use == 1);  // still held by the synchronize in progress
  }
  open.store(true);
  waiter.join();
  CHECK_FALSE(sync_ec);
  CHECK(reg.pools().stats().in_use == 0);
}

TEST_CASE_FIXTURE(fixture, "registry: the destructor returns live ids to a borrowed pool_set") {
  evr::pool_set pools(sim);
  {
    event_registry reg(pools);
    CHECK(&reg.pools() == &pools);
    for (int i = 0; i < 3; ++i) (void)reg.acquire(0);
    const id_type released = reg.acquire(1, event_class::timing);
    reg.release(released);
    CHECK(pools.stats().in_use == 3);
  }
  CHECK(pools.stats().in_use == 0);
}

TEST_CASE("registry: 8 threads acquire, use and release concurrently") {
  evr::sim::device sim(evr::sim::options{.devices = 2, .mode = evr::sim::run_mode::threaded});
  {
    event_registry reg(sim);
    constexpr int threads = 8;
    const int rounds = evr::test::sanitized() ? 200 : 2000;
    std::atomic<int> failures{0};
    std::atomic<int> cross_released{0};
    std::atomic<id_type> shared{event_registry::invalid_id};  // an id another thread releases

    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        dev::native_stream s = nullptr;
        if (sim.create_stream(t % 2, 0, s)) {
          failures.fetch_add(1);
          return;
        }
        std::vector<id_type> mine;
        for (int r = 0; r < rounds; ++r) {
          const event_class k = (r % 3 == 0) ? event_class::timing : event_class::plain;
          std::error_code ec;
          const id_type id = reg.acquire(t % 2, k, ec);
          if (ec) {
            failures.fetch_add(1);
            continue;
          }
          if (r % 16 == 0) {
            reg.record(id, s, ec);
            if (ec) failures.fetch_add(1);
          }
          (void)reg.query(id, ec);
          if (ec) failures.fetch_add(1);
          if (reg.device_of(id, ec) != t % 2) failures.fetch_add(1);
          mine.push_back(id);
          if (r % 7 == 0) {
            // Hand one id to whichever thread comes next; release the one found there.
            const id_type prev = shared.exchange(mine.back());
            mine.pop_back();
            if (prev != event_registry::invalid_id) {
              reg.release(prev, ec);
              if (ec) failures.fetch_add(1);
              cross_released.fetch_add(1);
            }
          }
          if (mine.size() > 4) {
            for (id_type m : mine) {
              reg.release(m, ec);
              if (ec) failures.fetch_add(1);
              reg.release(m, ec);  // a double release is refused and harms nobody
              if (ec != evr::errc::unknown_event_id) failures.fetch_add(1);
            }
            mine.clear();
          }
        }
        for (id_type m : mine) reg.release(m);
        sim.synchronize_stream(s);
        sim.destroy_stream(s);
      });
    }
    for (auto& w : workers) w.join();
    if (id_type last = shared.exchange(event_registry::invalid_id)) reg.release(last);
    CHECK(failures.load() == 0);
    CHECK(cross_released.load() > 0);
    const auto s = reg.pools().stats();
    CHECK(s.in_use == 0);
    CHECK(s.created == s.destroyed + s.cached);
  }
  sim.wait_idle();
  CHECK(sim.counters().events_created == sim.counters().events_destroyed);
}

TEST_CASE("registry: racing releases of one id, exactly one wins") {
  evr::sim::device sim;
  event_registry reg(sim);
  const int rounds = evr::test::sanitized() ? 50 : 300;
  for (int r = 0; r < rounds; ++r) {
    const id_type id = reg.acquire(0);
    std::atomic<int> wins{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> racers;
    for (int t = 0; t < 4; ++t) {
      racers.emplace_back([&] {
        while (!go.load()) std::this_thread::yield();
        std::error_code ec;
        reg.release(id, ec);
        if (!ec) wins.fetch_add(1);
      });
    }
    go.store(true);
    for (auto& t : racers) t.join();
    REQUIRE(wins.load() == 1);
  }
  CHECK(reg.pools().stats().in_use == 0);
}
