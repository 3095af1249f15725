// A host's schedule of looks (reactor/include/evr/reactor/detail/host_schedule.hpp) on synthetic
// streams: no reactor, no device.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include <evr/reactor/detail/host_schedule.hpp>

namespace {
struct stream_state {
  std::uint32_t epoch = 0;  // a stand-in: the stream's current plan epoch
};
using host_schedule = evr::detail::basic_host_schedule<stream_state>;

bool current(const host_schedule::entry& e) { return e.epoch == e.stream->epoch; }

/// The entries' streams, in order.
std::vector<stream_state*> streams_of(const std::vector<host_schedule::entry>& entries) {
  std::vector<stream_state*> streams;
  for (const host_schedule::entry& e : entries) streams.push_back(e.stream);
  return streams;
}

/// The streams of the entries due at `now`, in look order.
std::vector<stream_state*> take_due(host_schedule& s, std::int64_t now) {
  std::vector<host_schedule::entry> due;
  s.take_due(now, current, due);
  return streams_of(due);
}
}  // namespace

TEST_CASE("host schedule: due streams come out in look order, each once, stale plans dropped") {
  std::vector<stream_state> streams(3);
  host_schedule s;
  s.add({30, &streams[0], 0}, current);
  s.add({10, &streams[1], 0}, current);
  s.add({20, &streams[2], 0}, current);
  s.add({15, &streams[1], 0}, current);  // the same plan scheduled twice: one look
  streams[2].epoch = 1;                  // planned again: its entry is stale
  CHECK(take_due(s, 25) == std::vector<stream_state*>{&streams[1]});
  CHECK(s.next_ns(current) == 30);
  CHECK(take_due(s, 30) == std::vector<stream_state*>{&streams[0]});
  CHECK(s.next_ns(current) == host_schedule::never);
}

TEST_CASE("host schedule: plans that go stale without a pass never grow it past its start") {
  // A host that does not pass (busy in a handler) while the reactor plans its stream again and
  // again: each plan leaves a stale entry. The heap drops them when full instead of growing, so
  // a host's steady traffic allocates nothing once the schedule has its first capacity.
  stream_state st;
  host_schedule s;
  s.add({0, &st, st.epoch}, current);
  const std::size_t start = s.capacity();
  for (std::int64_t t = 1; t < 100000; ++t) {
    ++st.epoch;
    s.add({t, &st, st.epoch}, current);
  }
  CHECK(s.capacity() == start);
  CHECK(s.size() <= start);
  CHECK(s.next_ns(current) == 99999);
}

TEST_CASE("host schedule: grows when its current entries fill it") {
  std::vector<stream_state> streams(1000);
  host_schedule s;
  for (std::size_t i = 0; i < streams.size(); ++i)
    s.add({static_cast<std::int64_t>(i), &streams[i], 0}, current);
  CHECK(s.size() == streams.size());
  const std::vector<stream_state*> due = take_due(s, host_schedule::never - 1);
  REQUIRE(due.size() == streams.size());
  for (std::size_t i = 0; i < streams.size(); ++i) CHECK(due[i] == &streams[i]);
}

TEST_CASE("host schedule: due looks are appended after those a pass left, a stream once") {
  std::vector<stream_state> streams(3);
  host_schedule s;
  s.add({10, &streams[0], 0}, current);
  s.add({20, &streams[1], 0}, current);
  s.add({30, &streams[2], 0}, current);
  std::vector<host_schedule::entry> due;
  s.take_due(20, current, due);
  REQUIRE(due.size() == 2);
  // The pass looks at streams[0] only and plans it again, due at once; streams[1] is left.
  due.erase(due.begin());
  streams[0].epoch = 1;
  s.add({40, &streams[0], 1}, current);
  s.add({40, &streams[1], 0}, current);  // the left look, scheduled again too: looked at once
  s.take_due(40, current, due);
  CHECK(streams_of(due) == std::vector<stream_state*>{&streams[1], &streams[2], &streams[0]});
  CHECK(s.next_ns(current) == host_schedule::never);
}

TEST_CASE("host schedule: any_until sees the looks up to its bound only, and visits little more") {
  // 100 streams, looks 10 apart, added latest first (the heap reorders them).
  std::vector<stream_state> streams(100);
  host_schedule s;
  for (std::size_t i = streams.size(); i-- > 0;)
    s.add({static_cast<std::int64_t>(10 * i), &streams[i], 0}, current);
  std::vector<std::int64_t> seen;
  const auto record = [&](const host_schedule::entry& e) {
    seen.push_back(e.look_ns);
    return false;
  };
  CHECK_FALSE(s.any_until(25, record));
  std::sort(seen.begin(), seen.end());
  CHECK(seen == std::vector<std::int64_t>{0, 10, 20});  // the pruned subtrees were not visited
  const auto is = [&](std::size_t i) {
    return [&, i](const host_schedule::entry& e) { return current(e) && e.stream == &streams[i]; };
  };
  CHECK(s.any_until(990, is(99)));
  CHECK_FALSE(s.any_until(989, is(99)));
  CHECK(s.any_until(500, is(50)));
  streams[50].epoch = 1;  // planned again: its entry is stale, and the predicate says so
  CHECK_FALSE(s.any_until(500, is(50)));
}
