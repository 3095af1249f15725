// The recent lateness a host arms its timers by (reactor/include/evr/reactor/detail/ring.hpp,
// recent_max): its largest and smallest of the last N samples, clamped.
#include <doctest/doctest.h>

#include <cstdint>

#include <evr/reactor/detail/ring.hpp>

TEST_CASE("recent_max: the largest and smallest of the last N samples, clamped") {
  evr::detail::recent_max<4> r(20, /*lo=*/2, /*hi=*/100);
  CHECK(r.high() == 20);  // before the first sample: the initial guess
  CHECK(r.low() == 2);    // and the least a sample may be
  for (std::int64_t s : {7, 30, 5, 9}) r.add(s);
  CHECK(r.high() == 30);
  CHECK(r.low() == 5);
  r.add(8);  // 7 leaves
  r.add(6);  // 30 leaves
  CHECK(r.high() == 9);
  CHECK(r.low() == 5);
  r.add(1000);  // clamped to hi
  r.add(0);     // clamped to lo
  CHECK(r.high() == 100);
  CHECK(r.low() == 2);
}
