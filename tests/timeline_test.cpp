// A stream's timeline (reactor/src/timeline.hpp) keeps its oldest entry's host beside the ring's
// indices (front_host): whatever changes the front must change it too, or the reactor would
// leave a stream to a host that no longer covers it, or look at one the host does.
#include <doctest/doctest.h>

#include <cstdint>
#include <deque>
#include <initializer_list>
#include <system_error>
#include <utility>

#include <evr/reactor/detail/poll_host.hpp>

#include "timeline.hpp"

namespace {
using evr::detail::poll_host;
using evr::detail::timeline;
using evr::detail::timeline_entry;
using evr::detail::wait_op;

void never_completes(wait_op*, std::error_code) noexcept {}

/// A host the timeline only points at: it never calls one.
struct idle_host final : poll_host {
  idle_host() : poll_host(role::polls) {}
  void look_by(std::int64_t) noexcept override {}
  void wake_until(std::int64_t) noexcept override {}
};
idle_host host_storage[2];
poll_host* const host_a = &host_storage[0];
poll_host* const host_b = &host_storage[1];

/// Waits whose entries the tests insert; each keeps its host until the test ends.
struct waits {
  std::deque<wait_op> ops;
  timeline_entry entry(std::uint64_t seq, poll_host* host) {
    wait_op& op = ops.emplace_back(&never_completes);
    op.seq_ = seq;
    op.host_ = host;
    return timeline_entry{seq, nullptr, &op};  // the timeline copies the host
  }
  /// Inserts a wait for each (seq, host), in that order.
  void insert(timeline& t, std::initializer_list<std::pair<std::uint64_t, poll_host*>> waits) {
    for (const auto& [seq, host] : waits) t.insert(entry(seq, host));
  }
};
}  // namespace

TEST_CASE("timeline: the front's host follows inserts, also out of order") {
  timeline t;
  waits w;
  CHECK(t.front_host() == nullptr);
  t.insert(w.entry(5, host_a));
  CHECK(t.front_host() == host_a);
  t.insert(w.entry(6, host_b));  // behind the front
  CHECK(t.front_host() == host_a);
  t.insert(w.entry(4, host_b));  // a submitter that lost the race: it becomes the front
  CHECK(t.at(0).seq == 4);
  CHECK(t.front_host() == host_b);
  t.insert(w.entry(3, nullptr));  // an unhosted wait in front
  CHECK(t.front_host() == nullptr);
}

TEST_CASE("timeline: the front's host follows pops and erases") {
  timeline t;
  waits w;
  w.insert(t, {{1, host_a}, {2, host_b}, {3, host_a}});
  t.erase(1);  // not the front
  CHECK(t.front_host() == host_a);
  t.pop_front();
  CHECK(t.front_host() == host_a);  // seq 3's
  t.insert(w.entry(4, host_b));
  t.erase(0);
  CHECK(t.at(0).seq == 4);
  CHECK(t.front_host() == host_b);
  t.pop_front();
  CHECK(t.empty());
  CHECK(t.front_host() == nullptr);
}

TEST_CASE("timeline: a ghost in front has no host, and the next front brings its own") {
  timeline t;
  waits w;
  w.insert(t, {{1, host_a}, {2, host_b}});
  t.make_ghost(1);  // behind the front: the front's host stays
  CHECK(t.front_host() == host_a);
  CHECK(t.at(1).host == nullptr);
  t.make_ghost(0);
  CHECK(t.front_host() == nullptr);
  CHECK(t.at(0).op == nullptr);
  t.insert(w.entry(3, host_b));
  t.pop_front();
  CHECK(t.front_host() == nullptr);  // seq 2 is a ghost too
  t.pop_front();
  CHECK(t.front_host() == host_b);
}

TEST_CASE("timeline: the front's host when the only entry is erased, and across a wrapped ring") {
  timeline t;
  waits w;
  t.insert(w.entry(1, host_a));
  t.erase(0);  // a cancelled lone device-signalled wait leaves its timeline empty
  CHECK(t.empty());
  CHECK(t.front_host() == nullptr);
  // Steady state: a wait in, the oldest out, so the ring's head goes round (and it grows once
  // when three are pending); the front's host is always the oldest wait's.
  w.insert(t, {{2, host_a}, {3, host_b}});
  std::uint64_t seq = 4;
  for (int i = 0; i < 40; ++i) {
    t.insert(w.entry(seq++, i % 3 == 0 ? nullptr : (i % 2 == 0 ? host_a : host_b)));
    if (i % 8 == 0) t.insert(w.entry(seq++, host_a));
    t.pop_front();
    REQUIRE(!t.empty());
    CHECK(t.front_host() == t.front().op->host_);
  }
}
