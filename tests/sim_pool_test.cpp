// event_pool on a local simulated device: leak checks through the simulator's own counters,
// which threads create events, what each class of event can do, faults.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <evr/pool/event_pool.hpp>
#include <evr/pool/pool_set.hpp>
#include <evr/sim/device.hpp>

#include "pool_test_backend.hpp"

namespace {

using evr::event_class;
using evr::event_pool;
using evr::pool_options;
using evr::pooled_event;
namespace dev = evr::device;

evr::sim::device make_sim(int devices = 1) {
  return evr::sim::device(
      evr::sim::options{.devices = devices, .mode = evr::sim::run_mode::threaded});
}

}  // namespace

TEST_CASE("sim pool: nothing leaks, whatever the order of destruction") {
  evr::sim::device sim(evr::sim::options{.devices = 2, .mode = evr::sim::run_mode::threaded});
  {
    std::vector<pooled_event> outlive_pools;
    std::vector<pooled_event> released_on_other_thread;
    auto pools = std::make_unique<evr::pool_set>(sim, pool_options{.initial = 2, .batch = 4});
    for (int d = 0; d < 2; ++d) {
      for (event_class k : {event_class::plain, event_class::timing, event_class::interprocess,
                            event_class::blocking}) {
        event_pool& p = pools->get(d, k);
        outlive_pools.push_back(p.acquire());
        released_on_other_thread.push_back(p.acquire());
        pooled_event released_now = p.acquire();
      }
    }
    // A thread that used the pools and still holds an event when they are destroyed; it releases
    // that event afterwards and exits later still (its per-thread records are then orphans).
    std::mutex m;
    std::condition_variable cv;
    int phase = 0;  // 1: the thread holds its event; 2: the pools are gone
    std::thread user([&] {
      pooled_event e = pools->get(0).acquire();
      pooled_event f = pools->get(1, event_class::timing).acquire();
      e.release();
      std::unique_lock<std::mutex> lock(m);
      phase = 1;
      cv.notify_all();
      cv.wait(lock, [&] { return phase == 2; });
      f.release();  // destroyed, not cached: its pool is gone
    });
    {
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [&] { return phase == 1; });
    }
    pools.reset();
    CHECK(sim.counters().events_created - sim.counters().events_destroyed ==
          outlive_pools.size() + released_on_other_thread.size() + 1);
    {
      std::lock_guard<std::mutex> lock(m);
      phase = 2;
    }
    cv.notify_all();
    user.join();
    std::thread([&] { released_on_other_thread.clear(); }).join();
    CHECK(sim.counters().events_created - sim.counters().events_destroyed == outlive_pools.size());
  }
  const auto c = sim.counters();
  CHECK(c.events_created > 0);
  CHECK(c.events_created == c.events_destroyed);
}

TEST_CASE("sim pool: events are created only by threads that acquire") {
  evr::sim::device sim = make_sim();
  evr::test::counting_backend backend(sim);
  event_pool pool(backend, 0, event_class::plain, pool_options{.initial = 0, .batch = 4});

  // Acquirers hand their events to a "reactor" thread that only releases (evr's own pattern).
  // Each acquirer waits until the reactor released its event before taking the next one, so the
  // cache always has something to give and growth stays small.
  std::mutex m;
  std::condition_variable cv;
  std::deque<pooled_event> inbox;
  std::uint64_t released = 0;
  bool done = false;
  std::thread::id reactor_id;
  std::thread reactor([&] {
    reactor_id = std::this_thread::get_id();
    std::unique_lock<std::mutex> lock(m);
    for (;;) {
      cv.wait(lock, [&] { return done || !inbox.empty(); });
      while (!inbox.empty()) {
        pooled_event e = std::move(inbox.front());
        inbox.pop_front();
        e.release();  // under the lock: the acquirer sees the release once it sees `released`
        ++released;
      }
      cv.notify_all();
      if (done) return;
    }
  });

  std::set<std::thread::id> acquirers;
  std::vector<std::thread> producers;
  std::mutex ids_mutex;
  for (int t = 0; t < 4; ++t) {
    producers.emplace_back([&] {
      {
        std::lock_guard<std::mutex> lock(ids_mutex);
        acquirers.insert(std::this_thread::get_id());
      }
      for (int i = 0; i < 500; ++i) {
        pooled_event e = pool.acquire();
        std::unique_lock<std::mutex> lock(m);
        inbox.push_back(std::move(e));
        const std::uint64_t target = released + inbox.size();
        cv.notify_all();
        cv.wait(lock, [&] { return released >= target; });
      }
    });
  }
  for (auto& p : producers) p.join();
  {
    std::lock_guard<std::mutex> lock(m);
    done = true;
  }
  cv.notify_all();
  reactor.join();

  const auto creators = backend.creator_threads();
  CHECK_FALSE(creators.empty());
  CHECK(creators.count(reactor_id) == 0);
  for (auto id : creators) CHECK(acquirers.count(id) == 1);
  CHECK(backend.destroyed() == 0);  // a live pool never destroys on release
  const auto s = pool.stats();
  CHECK(s.in_use == 0);
  CHECK(s.acquires == 2000);
  CHECK(s.created == s.cached);
  CHECK(s.created <= 4 * 4 * 2);  // events released by the reactor were reused by the acquirers
}

TEST_CASE("sim pool: each class gets its flags") {
  CHECK(evr::flags_of(event_class::plain) == dev::event_flags::none);
  CHECK(evr::flags_of(event_class::timing) == dev::event_flags::timing);
  CHECK(evr::flags_of(event_class::interprocess) == dev::event_flags::interprocess);
  CHECK(evr::flags_of(event_class::blocking) == dev::event_flags::blocking_sync);
  CHECK(std::string(evr::to_string(event_class::interprocess)) == "interprocess");
  CHECK(std::string(evr::to_string(static_cast<event_class>(7))) == "invalid");

  evr::sim::device sim = make_sim();
  evr::pool_set pools(sim, pool_options{.initial = 0, .batch = 2});
  dev::native_stream stream = nullptr;
  REQUIRE_FALSE(sim.create_stream(0, 0, stream));

  SUBCASE("timing events measure elapsed time") {
    event_pool& p = pools.get(0, event_class::timing);
    pooled_event a = p.acquire();
    pooled_event b = p.acquire();
    REQUIRE_FALSE(sim.record_event(a.native(), stream));
    REQUIRE_FALSE(sim.launch_kernel(stream, std::chrono::milliseconds(2)));
    REQUIRE_FALSE(sim.record_event(b.native(), stream));
    REQUIRE_FALSE(sim.synchronize_event(b.native()));
    float ms = -1.0f;
    CHECK_FALSE(sim.elapsed_ms(a.native(), b.native(), ms));
    CHECK(ms >= 1.0f);
  }
  SUBCASE("plain and blocking events refuse elapsed time") {
    for (event_class k : {event_class::plain, event_class::blocking}) {
      event_pool& p = pools.get(0, k);
      pooled_event a = p.acquire();
      pooled_event b = p.acquire();
      REQUIRE_FALSE(sim.record_event(a.native(), stream));
      REQUIRE_FALSE(sim.record_event(b.native(), stream));
      REQUIRE_FALSE(sim.synchronize_event(b.native()));
      float ms = 0.0f;
      CHECK(sim.elapsed_ms(a.native(), b.native(), ms) == evr::errc::timing_disabled);
    }
  }
  SUBCASE("interprocess events can be exported, plain ones cannot") {
    pooled_event ipc = pools.get(0, event_class::interprocess).acquire();
    pooled_event plain = pools.get(0, event_class::plain).acquire();
    REQUIRE_FALSE(sim.record_event(ipc.native(), stream));
    REQUIRE_FALSE(sim.record_event(plain.native(), stream));
    dev::ipc_event_handle h;
    CHECK_FALSE(sim.export_event(ipc.native(), h));
    CHECK(sim.export_event(plain.native(), h));
  }
  sim.wait_idle();
  sim.destroy_stream(stream);
}

TEST_CASE("sim pool: a faulted device still hands out cached events, growth reports the fault") {
  evr::sim::device sim = make_sim();
  {
    event_pool pool(sim, 0, event_class::plain, pool_options{.initial = 2, .batch = 2});
    sim.inject_fault(0);
    pooled_event a = pool.acquire();
    pooled_event b = pool.acquire();
    CHECK(a);
    CHECK(b);
    std::error_code ec;
    pooled_event c = pool.acquire(ec);
    CHECK_FALSE(c);
    CHECK(ec == sim.fault(0));
    CHECK(evr::is_sticky(ec));
  }
  CHECK(sim.counters().events_created == sim.counters().events_destroyed);
}

TEST_CASE("sim pool: the constructor reports a failed initial creation and leaks nothing") {
  evr::sim::device sim = make_sim();
  sim.inject_fault(0);
  try {
    event_pool pool(sim, 0, event_class::plain, pool_options{.initial = 3, .batch = 2});
    FAIL("the constructor should have thrown");
  } catch (const evr::error& e) {
    CHECK(e.code() == sim.fault(0));
    CHECK(std::string(e.what()).find("evr::event_pool(device 0, class plain)") !=
          std::string::npos);
  }
  CHECK(sim.counters().events_created == sim.counters().events_destroyed);
}

TEST_CASE("sim pool: pools of a device that does not exist fail to grow with the backend's error") {
  evr::sim::device sim = make_sim();
  event_pool pool(sim, 5, event_class::plain);  // event_pool itself does not check the index
  std::error_code ec;
  CHECK_FALSE(pool.acquire(ec));
  CHECK(ec);
}

TEST_CASE("sim pool: a thread's records of destroyed pools are pruned safely") {
  evr::sim::device sim = make_sim();
  // All on a fresh thread, so that its per-thread records start empty.
  std::thread([&] {
    auto a = std::make_unique<event_pool>(sim, 0, event_class::plain);
    { pooled_event e = a->acquire(); }  // this thread now has a record for `a`, used last
    a.reset();                          // `a`'s state is freed: the record is an orphan

    auto b = std::make_unique<event_pool>(sim, 0, event_class::plain);
    pooled_event held;
    std::thread([&] { held = b->acquire(); }).join();  // acquired elsewhere: no record here
    b.reset();
    held.release();  // here: prunes the orphan, finds `b` closed, destroys the event

    event_pool c(sim, 0, event_class::plain);
    for (int i = 0; i < 3; ++i) {
      pooled_event e = c.acquire();
      CHECK(e);
    }
    CHECK(c.stats().cached == c.stats().created);
  }).join();
  CHECK(sim.counters().events_created == sim.counters().events_destroyed);
}
