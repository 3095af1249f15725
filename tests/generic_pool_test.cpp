// event_pool, pooled_event and pool_set on the device under test (sim in evr_tests, CUDA in
// evr_gpu_tests). Backend-level balance is checked through a counting wrapper, so it holds on the
// GPU too.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <evr/pool/event_pool.hpp>
#include <evr/pool/pool_set.hpp>

#include "pool_test_backend.hpp"
#include "support/device_under_test.hpp"
#include "support/helpers.hpp"

namespace {

using evr::event_class;
using evr::event_pool;
using evr::pool_options;
using evr::pooled_event;
using evr::test::counting_backend;
using evr::test::dut;

/// created == destroyed + cached + in_use, for a quiescent pool.
void check_balance(const evr::pool_stats& s) {
  CHECK(s.created == s.destroyed + s.cached + s.in_use);
}

}  // namespace

TEST_CASE("pool: acquire, release and reuse without new events") {
  counting_backend backend(dut().backend());
  event_pool pool(backend, 0, event_class::plain, pool_options{.initial = 0, .batch = 4});
  CHECK(pool.device() == 0);
  CHECK(pool.klass() == event_class::plain);
  CHECK(&pool.backend() == &backend);

  std::set<evr::device::native_event> seen;
  {
    pooled_event e = pool.acquire();
    REQUIRE(e);
    CHECK(e.native() != nullptr);
    CHECK(e.device() == 0);
    CHECK(e.klass() == event_class::plain);
    seen.insert(e.native());
  }
  CHECK(backend.created() == 4);
  for (int i = 0; i < 100; ++i) {
    pooled_event e = pool.acquire();
    REQUIRE(e);
    seen.insert(e.native());
  }
  CHECK(backend.created() == 4);  // every acquire after the first batch was served from the cache
  CHECK(seen.size() <= 4);
  const auto s = pool.stats();
  CHECK(s.created == 4);
  CHECK(s.destroyed == 0);
  CHECK(s.cached == 4);
  CHECK(s.in_use == 0);
  CHECK(s.acquires == 101);
  CHECK(s.growths == 1);
  check_balance(s);
}

TEST_CASE("pool: stats balance, batch growth counts and peak") {
  counting_backend backend(dut().backend());
  event_pool pool(backend, 0, event_class::plain, pool_options{.initial = 0, .batch = 4});
  std::vector<pooled_event> held;
  for (int i = 0; i < 10; ++i) held.push_back(pool.acquire());
  auto s = pool.stats();
  CHECK(s.growths == 3);  // 4 + 4 + 4 events for 10 acquires
  CHECK(s.created == 12);
  CHECK(s.in_use == 10);
  CHECK(s.cached == 2);
  CHECK(s.acquires == 10);
  CHECK(s.peak_in_use == 10);
  check_balance(s);

  held.resize(5);  // releases five
  s = pool.stats();
  CHECK(s.in_use == 5);
  CHECK(s.cached == 7);
  CHECK(s.peak_in_use == 10);
  check_balance(s);

  held.clear();
  s = pool.stats();
  CHECK(s.in_use == 0);
  CHECK(s.cached == 12);
  CHECK(s.peak_in_use == 10);
  CHECK(s.destroyed == 0);
  check_balance(s);
  CHECK(backend.live() == 12);
}

TEST_CASE("pool: initial events are created by the constructor") {
  counting_backend backend(dut().backend());
  event_pool pool(backend, 0, event_class::plain, pool_options{.initial = 5, .batch = 3});
  CHECK(backend.created() == 5);
  auto s = pool.stats();
  CHECK(s.created == 5);
  CHECK(s.cached == 5);
  CHECK(s.growths == 0);
  std::vector<pooled_event> held;
  for (int i = 0; i < 5; ++i) held.push_back(pool.acquire());
  CHECK(pool.stats().growths == 0);
  held.push_back(pool.acquire());
  s = pool.stats();
  CHECK(s.growths == 1);
  CHECK(s.created == 8);
  check_balance(s);
}

TEST_CASE("pool: a batch of 0 is refused") {
  counting_backend backend(dut().backend());
  CHECK_THROWS_AS(
      event_pool(backend, 0, event_class::plain, pool_options{.initial = 0, .batch = 0}),
      evr::error);
  try {
    event_pool pool(backend, 0, event_class::plain, pool_options{.initial = 0, .batch = 0});
  } catch (const evr::error& e) {
    CHECK(e.code() == evr::errc::invalid_argument);
  }
}

TEST_CASE("pool: empty_cache destroys the cached events only") {
  counting_backend backend(dut().backend());
  event_pool pool(backend, 0, event_class::plain, pool_options{.initial = 0, .batch = 4});
  std::vector<pooled_event> held;
  for (int i = 0; i < 3; ++i) held.push_back(pool.acquire());
  CHECK(pool.stats().cached == 1);
  pool.empty_cache();
  auto s = pool.stats();
  CHECK(s.destroyed == 1);
  CHECK(s.cached == 0);
  CHECK(s.in_use == 3);
  CHECK(backend.destroyed() == 1);
  check_balance(s);
  for (auto& e : held) CHECK(e);  // the held events are untouched
  held.clear();
  s = pool.stats();
  CHECK(s.cached == 3);
  CHECK(s.destroyed == 1);
  check_balance(s);
  pool.empty_cache();
  CHECK(backend.live() == 0);
  check_balance(pool.stats());
}

TEST_CASE("pool: events released by a live thread are visible to others and to empty_cache") {
  counting_backend backend(dut().backend());
  event_pool pool(backend, 0, event_class::plain, pool_options{.initial = 0, .batch = 1});
  // A thread takes and gives back one event, then stays alive (holding its per-thread cache).
  std::mutex m;
  std::condition_variable cv;
  int phase = 0;
  std::thread owner([&] {
    { pooled_event e = pool.acquire(); }
    std::unique_lock<std::mutex> lock(m);
    phase = 1;
    cv.notify_all();
    cv.wait(lock, [&] { return phase == 2; });
  });
  {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return phase == 1; });
  }
  CHECK(pool.stats().cached == 1);
  {
    pooled_event mine = pool.acquire();  // found, not created
    CHECK(mine);
    CHECK(backend.created() == 1);
  }
  {
    // Park it in the other thread's cache again, then empty everything from here.
    std::thread([&] { pooled_event e = pool.acquire(); }).join();
  }
  pool.empty_cache();
  CHECK(pool.stats().cached == 0);
  CHECK(backend.live() == 0);
  {
    std::lock_guard<std::mutex> lock(m);
    phase = 2;
  }
  cv.notify_all();
  owner.join();
  check_balance(pool.stats());
}

TEST_CASE("pool: pooled_event move semantics") {
  counting_backend backend(dut().backend());
  event_pool pool(backend, 0, event_class::plain, pool_options{.initial = 0, .batch = 4});

  SUBCASE("default handle is empty") {
    pooled_event e;
    CHECK_FALSE(e);
    CHECK(e.native() == nullptr);
    CHECK(e.device() == -1);
    e.release();  // harmless
    CHECK_FALSE(e);
  }
  SUBCASE("move construction transfers ownership") {
    pooled_event a = pool.acquire();
    auto native = a.native();
    pooled_event b(std::move(a));
    CHECK_FALSE(a);  // NOLINT(bugprone-use-after-move): moved-from state is specified
    CHECK(b.native() == native);
    CHECK(pool.stats().in_use == 1);
  }
  SUBCASE("move assignment into an empty handle") {
    pooled_event a = pool.acquire();
    pooled_event b;
    auto native = a.native();
    b = std::move(a);
    CHECK_FALSE(a);  // NOLINT(bugprone-use-after-move)
    CHECK(b.native() == native);
    CHECK(pool.stats().in_use == 1);
  }
  SUBCASE("move assignment into a non-empty handle releases the event held before") {
    pooled_event a = pool.acquire();
    pooled_event b = pool.acquire();
    auto native_a = a.native();
    auto native_b = b.native();
    CHECK(native_a != native_b);
    CHECK(pool.stats().in_use == 2);
    b = std::move(a);
    CHECK_FALSE(a);  // NOLINT(bugprone-use-after-move)
    CHECK(b.native() == native_a);
    auto s = pool.stats();
    CHECK(s.in_use == 1);  // native_b went back to the cache, not leaked
    CHECK(s.cached == 3);
    check_balance(s);
    CHECK(backend.live() == 4);
  }
  SUBCASE("self move assignment keeps the event") {
    pooled_event a = pool.acquire();
    auto native = a.native();
    pooled_event& alias = a;
    a = std::move(alias);
    CHECK(a);
    CHECK(a.native() == native);
    CHECK(pool.stats().in_use == 1);
  }
  SUBCASE("release is idempotent") {
    pooled_event a = pool.acquire();
    a.release();
    CHECK_FALSE(a);
    a.release();
    CHECK(pool.stats().in_use == 0);
    CHECK(pool.stats().cached == 4);
  }
  check_balance(pool.stats());
}

TEST_CASE("pool: the raw interface has the same accounting") {
  counting_backend backend(dut().backend());
  event_pool pool(backend, 0, event_class::plain, pool_options{.initial = 0, .batch = 2});
  std::error_code ec;
  auto a = pool.acquire_native(ec);
  REQUIRE_FALSE(ec);
  auto b = pool.acquire_native(ec);
  REQUIRE_FALSE(ec);
  CHECK(a != b);
  CHECK(pool.stats().in_use == 2);
  pool.release_native(a);
  pool.release_native(b);
  pool.release_native(nullptr);  // ignored
  auto s = pool.stats();
  CHECK(s.in_use == 0);
  CHECK(s.cached == 2);
  CHECK(s.acquires == 2);
}

TEST_CASE("pool: a failed creation is reported, a partial batch still serves") {
  counting_backend backend(dut().backend());
  event_pool pool(backend, 0, event_class::plain, pool_options{.initial = 0, .batch = 8});

  backend.fail_creates_after(0);
  std::error_code ec;
  pooled_event e = pool.acquire(ec);
  CHECK(ec);
  CHECK_FALSE(e);
  CHECK(pool.acquire_native(ec) == nullptr);
  CHECK(ec);
  try {
    (void)pool.acquire();
    FAIL("acquire should have thrown");
  } catch (const evr::error& err) {
    CHECK(std::string(err.what()).find("evr::event_pool::acquire(device 0, class plain)") !=
          std::string::npos);
  }
  auto s = pool.stats();
  CHECK(s.created == 0);
  CHECK(s.growths == 0);
  CHECK(s.in_use == 0);

  backend.fail_creates_after(2);
  pooled_event f = pool.acquire(ec);
  CHECK_FALSE(ec);
  CHECK(f);
  s = pool.stats();
  CHECK(s.created == 2);
  CHECK(s.growths == 1);
  CHECK(s.cached == 1);
  backend.stop_failing();
  check_balance(s);
}

TEST_CASE("pool: release after the pool was destroyed destroys the event") {
  counting_backend backend(dut().backend());
  auto pool = std::make_unique<event_pool>(backend, 0, event_class::plain,
                                           pool_options{.initial = 0, .batch = 4});
  std::vector<pooled_event> held;
  for (int i = 0; i < 3; ++i) held.push_back(pool->acquire());
  pooled_event moved_later = std::move(held.back());
  held.pop_back();
  CHECK(backend.live() == 4);

  pool.reset();                  // destroys the one cached event
  CHECK(backend.live() == 3);    // ... the held ones are alive
  CHECK(held[0].device() == 0);  // a handle still knows its pool's device and class
  CHECK(held[0].klass() == event_class::plain);

  held[0].release();
  CHECK(backend.live() == 2);  // destroyed, not cached
  pooled_event target;
  target = std::move(moved_later);  // moving a handle of a destroyed pool is fine
  held.clear();
  CHECK(backend.live() == 1);
  target.release();
  CHECK(backend.live() == 0);
  CHECK(backend.created() == backend.destroyed());
}

TEST_CASE("pool: release on another thread, after the acquiring thread exited") {
  counting_backend backend(dut().backend());
  event_pool pool(backend, 0, event_class::plain, pool_options{.initial = 0, .batch = 4});

  std::vector<pooled_event> handed_over;
  std::thread([&] {
    for (int i = 0; i < 6; ++i) handed_over.push_back(pool.acquire());
  }).join();
  CHECK(pool.stats().in_use == 6);
  handed_over.clear();  // released on the main thread; the acquiring thread is gone
  auto s = pool.stats();
  CHECK(s.in_use == 0);
  CHECK(s.cached == s.created);
  CHECK(s.acquires == 6);
  check_balance(s);

  // Events cached by a thread that exited are still found by others: no new creation.
  const auto created_before = backend.created();
  std::thread([&] {
    std::vector<pooled_event> v;
    for (int i = 0; i < 8; ++i) v.push_back(pool.acquire());
  }).join();
  std::vector<pooled_event> all;
  for (std::uint64_t i = 0; i < created_before; ++i) all.push_back(pool.acquire());
  CHECK(backend.created() == created_before);
  all.clear();
  check_balance(pool.stats());
}

TEST_CASE("pool: 16 threads never share an event and the stats balance") {
  counting_backend backend(dut().backend());
  event_pool pool(backend, 0, event_class::plain, pool_options{.initial = 0, .batch = 8});
  auto owners = std::make_unique<evr::test::ownership_map>();
  constexpr int threads = 16;
  const int rounds = evr::test::sanitized() ? 300 : 3000;
  std::atomic<int> double_handouts{0};
  std::atomic<int> bad_releases{0};
  std::atomic<std::uint64_t> total_acquires{0};

  // A shared hand-off so that some events are released by another thread than their acquirer.
  std::mutex handoff_mutex;
  std::vector<pooled_event> handoff;

  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::vector<pooled_event> mine;
      std::uint64_t acquired = 0;
      for (int r = 0; r < rounds; ++r) {
        const int k = 1 + (r + t) % 4;
        for (int i = 0; i < k; ++i) {
          pooled_event e = pool.acquire();
          ++acquired;
          if (!owners->claim(e.native())) double_handouts.fetch_add(1);
          mine.push_back(std::move(e));
        }
        if ((r + t) % 5 == 0) {
          std::lock_guard<std::mutex> lock(handoff_mutex);
          handoff.push_back(std::move(mine.back()));
          mine.pop_back();
        }
        for (auto& e : mine) {
          if (!owners->unclaim(e.native())) bad_releases.fetch_add(1);
          e.release();
        }
        mine.clear();
        pooled_event other;
        {
          std::lock_guard<std::mutex> lock(handoff_mutex);
          if (!handoff.empty()) {
            other = std::move(handoff.back());
            handoff.pop_back();
          }
        }
        if (other) {
          if (!owners->unclaim(other.native())) bad_releases.fetch_add(1);
          other.release();
        }
      }
      total_acquires.fetch_add(acquired);
    });
  }
  for (auto& w : workers) w.join();
  for (auto& e : handoff) {
    if (!owners->unclaim(e.native())) bad_releases.fetch_add(1);
  }
  handoff.clear();

  CHECK(double_handouts.load() == 0);
  CHECK(bad_releases.load() == 0);
  const auto s = pool.stats();
  CHECK(s.in_use == 0);
  CHECK(s.acquires == total_acquires.load());
  CHECK(s.peak_in_use >= 1);
  CHECK(s.peak_in_use <= s.created);
  check_balance(s);
  CHECK(backend.live() == s.created - s.destroyed);
  CHECK(s.cached == s.created);  // nothing was destroyed, everything came back
}

TEST_CASE("pool_set: one pool per device and class, bad device indices refused") {
  counting_backend backend(dut().backend());
  int devices = 0;
  REQUIRE_FALSE(backend.device_count(devices));
  REQUIRE(devices >= 1);
  evr::pool_set pools(backend, pool_options{.initial = 0, .batch = 2});
  CHECK(&pools.backend() == &backend);

  for (event_class k : {event_class::plain, event_class::timing, event_class::interprocess,
                        event_class::blocking}) {
    CAPTURE(evr::to_string(k));
    event_pool& p = pools.get(0, k);
    CHECK(p.device() == 0);
    CHECK(p.klass() == k);
    CHECK(&pools.get(0, k) == &p);  // the same pool again
    pooled_event e = p.acquire();
    CHECK(e.klass() == k);
  }
  if (devices >= 2) CHECK(pools.get(1).device() == 1);
  CHECK(&pools.get(0) == &pools.get(0, event_class::plain));

  for (int bad : {-1, devices, evr::pool_set::max_devices, 1000}) {
    CAPTURE(bad);
    std::error_code ec;
    CHECK(pools.get(bad, event_class::plain, ec) == nullptr);
    CHECK(ec == evr::errc::no_device);
    try {
      (void)pools.get(bad, event_class::timing);
      FAIL("get should have thrown");
    } catch (const evr::error& e) {
      CHECK(e.code() == evr::errc::no_device);
      CHECK(std::string(e.what()).find("evr::pool_set::get(device " + std::to_string(bad) +
                                       ", class timing)") != std::string::npos);
    }
  }
  std::error_code ec;
  CHECK(pools.get(0, static_cast<event_class>(9), ec) == nullptr);
  CHECK(ec == evr::errc::invalid_argument);

  auto s = pools.stats();
  CHECK(s.created == 8);  // a batch of 2 for each of the 4 classes
  CHECK(s.acquires == 4);
  CHECK(s.in_use == 0);
  check_balance(s);
  pools.empty_cache();
  s = pools.stats();
  CHECK(s.cached == 0);
  CHECK(s.destroyed == s.created);
}

TEST_CASE("pool_set: events outlive their pool_set") {
  counting_backend backend(dut().backend());
  pooled_event survivor;
  {
    evr::pool_set pools(backend);
    survivor = pools.get(0).acquire();
  }
  CHECK(survivor);
  CHECK(backend.live() == 1);
  survivor.release();
  CHECK(backend.live() == 0);
}
