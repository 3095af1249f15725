// The idle governor's looks for hosts at irregular work (reactor/src/idle_plans.cpp,
// plan_host_polls and next_look_is_tick; docs/architecture.md, "The last hop"): a host's streams
// in polled windows come due together on the tick's points, and such a look is a tick the host's
// timer need not meet early, unless a steady window of the host's opens just after it.
#include <doctest/doctest.h>

#include <chrono>

#include <evr/reactor/detail/host_schedule.hpp>
#include <evr/reactor/detail/poll_host.hpp>

#include "idle_governor.hpp"
#include "stream_state.hpp"
#include "support/governor_alone.hpp"
#include "tick_grid.hpp"

namespace {

using namespace std::chrono_literals;
using evr::test::governor_alone;
using evr::test::hosted_stream;

/// A point of `g`'s poll tick about 5 ms from now (tick_grid.hpp): looks planned a few us after
/// it fall before the same next point.
std::chrono::steady_clock::time_point tick_point_ahead(const governor_alone& g) {
  return evr::detail::tick_grid::at_or_before(std::chrono::steady_clock::now() + 5ms,
                                              g.options.poll_period);
}

/// Gives `st`'s model irregular work: 4 and 8 ms, alternating.
void learn_irregular(evr::detail::stream_state& st) {
  for (int i = 0; i < 8; ++i) st.plan.model.add(i % 2 == 0 ? 4ms : 8ms);
}

}  // namespace

TEST_CASE("idle governor: hosts' streams in polled windows come due together, on a tick") {
  // Irregular work in its window is looked at by its host every window_poll_period. A look a
  // period after the stream's own last one came due at a time of its own: with 16 such streams
  // the io thread woke for each. On the tick's points (the multiples of the period on the steady
  // clock) they come due together: one pass for all.
  governor_alone g(evr::strategy::fence, evr::idle_mode::predictive);
  const auto period = g.options.poll_period;
  // The first looks on a point of the tick, so that looks planned 7 us apart fall before the same
  // next point.
  const auto in_window = tick_point_ahead(g);
  const auto now = in_window - 5ms;
  hosted_stream a(now), b(now);  // two streams, each with its host (two io threads, or one's)
  learn_irregular(a.st);
  learn_irregular(b.st);
  evr::detail::poll_result out;
  // The hosts' passes plan them 7 us apart.
  g.idle.plan_for_host(a.st, a.host, in_window, out);
  g.idle.plan_for_host(b.st, b.host, in_window + 7us, out);
  REQUIRE_FALSE(out.spin);
  const auto look = a.st.plan.host_look;
  CHECK(b.st.plan.host_look == look);
  CHECK(look == in_window + period);
  // A look on the point is followed by the next one, a period later; a look made half a period
  // late by the same next point; one made 7/8 of a period late by the point after (not crowded
  // against it).
  g.idle.plan_for_host(a.st, a.host, look, out);
  CHECK(a.st.plan.host_look == look + period);
  g.idle.plan_for_host(b.st, b.host, look + period / 2, out);
  CHECK(b.st.plan.host_look == look + period);
  g.idle.plan_for_host(b.st, b.host, look + period + period * 7 / 8, out);
  CHECK(b.st.plan.host_look == look + 3 * period);
  // Each host is told that its next look is a tick, which its timer need not meet early
  // (poll_result::next_is_tick).
  for (hosted_stream* h : {&a, &b}) {
    const auto current = [&](const evr::detail::host_schedule::entry& e) {
      return g.idle.scheduled(e, h->host);
    };
    const evr::detail::host_schedule::entry* next = h->host.schedule.next(current);
    REQUIRE(next != nullptr);
    CHECK(next->look_ns == h->st.plan.host_look.time_since_epoch().count());
    CHECK(next->stream->plan.host_tick);
  }
}

TEST_CASE("idle governor: a host's look at steady work's window is not a tick") {
  // A steady window opens at a time the host must meet: its timer is armed early by its
  // lateness, so the look is not marked as a tick.
  governor_alone g(evr::strategy::fence, evr::idle_mode::predictive);
  const auto now = std::chrono::steady_clock::now();
  hosted_stream s(now);
  for (int i = 0; i < 8; ++i) s.st.plan.model.add(4ms);  // steady
  evr::detail::poll_result out;
  g.idle.plan_for_host(s.st, s.host, now, out);
  REQUIRE(s.st.plan.host_look > now);  // before its window: the look is the window's opening
  const auto current = [&](const evr::detail::host_schedule::entry& e) {
    return g.idle.scheduled(e, s.host);
  };
  const evr::detail::host_schedule::entry* next = s.host.schedule.next(current);
  REQUIRE(next != nullptr);
  CHECK(next->look_ns == s.st.plan.host_look.time_since_epoch().count());
  CHECK_FALSE(next->stream->plan.host_tick);
}

TEST_CASE("idle governor: a tick with a steady window just after it is met early as the window") {
  // The host arms its timer for its earliest look only, and for a tick early by its least
  // lateness alone. A steady window of another of the host's streams that opens within the
  // timer's margin after the tick would be looked at that much late: the tick is then no tick.
  governor_alone g(evr::strategy::fence, evr::idle_mode::predictive);
  const auto in_window = tick_point_ahead(g);
  const auto now = in_window - 5ms;
  hosted_stream irregular(now);
  learn_irregular(irregular.st);
  evr::detail::poll_result out;
  g.idle.plan_for_host(irregular.st, irregular.host, in_window, out);
  const auto tick = irregular.st.plan.host_look;
  REQUIRE(irregular.st.plan.host_tick);
  evr::detail::poll_host& host = irregular.host;
  const auto current = [&](const evr::detail::host_schedule::entry& e) {
    return g.idle.scheduled(e, host);
  };

  // A steady stream's window opens at a fixed time after its wait was submitted: found with a
  // first plan, then its wait is moved so that the window opens 10 us after the tick.
  hosted_stream steady(now, &host);  // a wait of the irregular stream's host
  steady.op.submitted_at_ = in_window;
  for (int i = 0; i < 8; ++i) steady.st.plan.model.add(4ms);
  g.idle.plan_for_host(steady.st, host, in_window, out);
  REQUIRE_FALSE(steady.st.plan.host_tick);
  REQUIRE(steady.st.plan.host_look > in_window);  // before its window
  const auto open_after_submit = steady.st.plan.host_look - steady.op.submitted_at_;
  steady.op.submitted_at_ = tick + 10us - open_after_submit;
  steady.st.plan.stale = true;
  g.idle.plan_for_host(steady.st, host, in_window, out);
  REQUIRE(steady.st.plan.host_look == tick + 10us);

  const evr::detail::host_schedule::entry* next = host.schedule.next(current);
  REQUIRE(next != nullptr);
  REQUIRE(next->stream == &irregular.st);  // the tick is the host's earliest look
  host.timer_margin_ns.store(std::chrono::nanoseconds(20us).count());
  CHECK_FALSE(g.idle.next_look_is_tick(host, *next));  // the window is within the margin
  host.timer_margin_ns.store(std::chrono::nanoseconds(9us).count());
  CHECK(g.idle.next_look_is_tick(host, *next));  // beyond it: the tick's own lead will do
  // Without the steady window (its stream went idle: its entry is stale).
  host.timer_margin_ns.store(std::chrono::nanoseconds(20us).count());
  g.idle.went_idle(steady.st);
  CHECK(g.idle.next_look_is_tick(host, *next));
}
