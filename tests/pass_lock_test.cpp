// The pass lock (reactor/src/pass_lock.hpp) between a reactor thread that waits for it and hosts
// that only try: mutual exclusion, and a reactor that slept on the lock wakes when the host ends.
// No reactor, no device.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "pass_lock.hpp"

namespace {
using evr::detail::pass_lock;

TEST_CASE("pass lock: a reactor that waits through a long host pass enters only after its end") {
  // The host holds the lock until the reactor thread has surely given up spinning (it says so by
  // setting `entering` before enter(); the host then waits for many spin limits' worth of its
  // own tries), and writes a plain field before end(): the reactor must see it (release/acquire)
  // and must not return from enter() before it.
  pass_lock lock;
  REQUIRE(lock.try_begin());
  std::atomic<bool> entering{false};
  int written_in_host_pass = 0;
  int seen_by_reactor = -1;
  std::thread reactor([&] {
    entering.store(true);
    lock.enter();
    seen_by_reactor = written_in_host_pass;
    lock.leave();
  });
  while (!entering.load()) std::this_thread::yield();
  // The lock stays taken whatever the reactor does meanwhile: a second try fails.
  for (int i = 0; i < 1000; ++i) {
    CHECK_FALSE(lock.try_begin());
    std::this_thread::yield();
  }
  written_in_host_pass = 42;
  lock.end();
  reactor.join();
  CHECK(seen_by_reactor == 42);
  // The reactor left: the lock is free again.
  CHECK(lock.try_begin());
  lock.end();
}

TEST_CASE("pass lock: a reactor thread and three hosts never hold it at once, and none is lost") {
  // Each holder increments a plain counter inside (a race shows under TSan and as a lost count);
  // the reactor thread enters and leaves as its loop does, the hosts try until they get in.
  pass_lock lock;
  std::uint64_t inside = 0;
  std::atomic<int> holders{0};
  std::atomic<bool> overlap{false};
  constexpr int reactor_passes = 20000;
  constexpr int host_passes = 20000;
  const auto hold = [&] {
    if (holders.fetch_add(1) != 0) overlap.store(true);
    ++inside;
    holders.fetch_sub(1);
  };
  std::thread reactor([&] {
    for (int i = 0; i < reactor_passes; ++i) {
      lock.enter();
      lock.enter();  // held already: returns at once, as in the reactor's loop after a sleep
      hold();
      lock.leave();
    }
  });
  std::vector<std::thread> hosts;
  for (int h = 0; h < 3; ++h)
    hosts.emplace_back([&] {
      for (int done = 0; done < host_passes;) {
        if (!lock.try_begin()) continue;
        hold();
        lock.end();
        ++done;
      }
    });
  reactor.join();
  for (std::thread& t : hosts) t.join();
  CHECK_FALSE(overlap.load());
  CHECK(inside == std::uint64_t{reactor_passes} + 3 * std::uint64_t{host_passes});
}

}  // namespace
