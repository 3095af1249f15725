// evr/reactor/detail/poll_host.hpp — a thread that completions are delivered to (an io_context's)
// and that is awake when they land. Not public: the in-repo Asio front end (callbacks/) implements
// it; docs/architecture.md, "The last hop", has the why.
//
// A handler posted to a thread parked in epoll_wait runs tens of us after the reactor found its
// completion; a thread that wakes itself with a timer it armed wakes within a few us. So a host
// comes in two roles, one per wait (wait_op::host_), chosen by the front end:
//   * polls (the default): the host arms its own timer for the window in which the reactor
//     predicts the wait's completion, and through the window it sweeps the reactor's streams of
//     its own waits itself (detail::poll_here: a pass under the reactor's pass lock that
//     runs no user code); completions it finds are posted to its own thread and run next. The
//     reactor thread does not wake for such a window: it looks itself after the window closed (a
//     safety net for a host that is late or busy), or earlier only when a sweep it makes for other
//     streams comes by (idle_governor::plan_host_polls).
//   * woken: the reactor wakes the host's thread shortly before the window (wake_until, learned
//     lead) and the host keeps itself awake until a completion of its arrives; the reactor finds
//     the completion as for any wait. Two threads spin through the window: more CPU, no timer of
//     the host's own.
// A wait without a host (other executors, delivery::post_plain, inline delivery) is delivered
// as before.
//
// Threads: the reactor calls look_by and wake_until from its thread or from a host's pass (under
// the pass lock), only while it holds a pending wait of that host (so the host is alive: a host
// dies with its execution context, whose shutdown first detaches its waits from the reactor).
// Both must be quick, must not block and must not run user code (they post to the host's thread).
// looks_at_ns and lead_ns are read by the reactor (relaxed: a hint, never a guarantee).
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <vector>

#include <evr/reactor/detail/host_schedule.hpp>

namespace evr::detail {

class poll_host {
 public:
  enum class role : std::uint8_t { polls, woken };

  explicit poll_host(role r) noexcept : role_(r) {}
  poll_host(const poll_host&) = delete;
  poll_host& operator=(const poll_host&) = delete;

  role host_role() const noexcept { return role_; }

  /// (role polls) A window of this host's waits opens at `open_ns` (steady clock, ns since its
  /// epoch), and `looks_at_ns` says the host will not be looking by then: the host must arrange
  /// to look from then on (typically: post to its thread, which arms its timer).
  virtual void look_by(std::int64_t open_ns) noexcept = 0;
  /// (role woken) Wake the host's thread now and keep it awake until `until_ns`, or until a
  /// completion of its has run there.
  virtual void wake_until(std::int64_t until_ns) noexcept = 0;

  /// When the host will next look at its waits by itself (its timer, or now while it polls);
  /// `never` when it has nothing planned. Written by the host, read by the reactor.
  std::atomic<std::int64_t> looks_at_ns{never};
  /// (role woken) How long before a window opens the host's thread must be woken to be awake
  /// when it opens: the host's measured wake-up latency. Written by the host.
  std::atomic<std::int64_t> lead_ns{50'000};
  /// (role polls) How early the host's timer must be asked to fire to be awake by a time: how
  /// late its timer wake-ups have been. Written by the host; poll_here publishes looks_at_ns
  /// from it (for a look that is not a tick: poll_result::next_is_tick).
  std::atomic<std::int64_t> timer_margin_ns{20'000};

  /// (role polls) How long this host's passes have lately waited behind the other handlers of
  /// its thread between being posted and running (the largest of the last few): a busy host
  /// looks that late after its promise, and the reactor waits as much longer before it looks in
  /// its place (idle_governor::covered_until). Written by the host.
  std::atomic<std::int64_t> queue_delay_ns{0};
  static constexpr std::int64_t never = std::numeric_limits<std::int64_t>::max();
  /// (role polls) A pass of the host makes the looks due within this of its start, a little
  /// early. A timer for less costs more than it saves, so the host's thread would otherwise spin
  /// to such a look, a pass at each turn of its loop: its timer fires early by its lateness, and
  /// with irregular work that spin was most of its passes. A look this early misses only work
  /// that ends in between, which the next look finds.
  static constexpr std::int64_t look_ahead_ns = 5'000;

  /// (the reactor's, under its pass lock) When this host should look at each of its streams;
  /// `due`, the looks of a pass, and between passes those a cut pass left for the next
  /// (reactor_options::host_pass_deliver_after). A front end never touches either.
  host_schedule schedule;
  std::vector<host_schedule::entry> due;

 protected:
  ~poll_host() = default;

 private:
  const role role_;
};

/// What a hosted submission learns (reactor_access::submit_hosted).
struct host_window {
  /// When the wait's window opens (steady clock ns); 0: not known now (the stream's model is not
  /// ready, waits of the stream are pending before it, or its marker is an event): the reactor
  /// tells the host when it knows, through look_by.
  std::int64_t open_ns = 0;
};

/// What a host learns from one pass of its own (reactor_access::poll_here).
struct poll_result {
  enum class outcome : std::uint8_t {
    swept,    ///< the pass ran
    busy,     ///< the reactor thread (or another host) was in a pass: try again soon
    stopped,  ///< the reactor is stopping: nothing more to poll for
  };
  outcome what = outcome::busy;
  /// A window of this host's waits is open now and its work is steady: poll again at once.
  bool spin = false;
  /// Completions the pass found and posted to the host's thread (they run right after it).
  std::uint32_t delivered = 0;
  /// When the pass ran (steady clock ns), for the host's own timing; 0 when it did not run.
  std::int64_t at_ns = 0;
  /// When the host should look next (steady clock ns): the earliest window of its waits, or the
  /// next poll tick of irregular work in its window; poll_host::never when it has none pending.
  std::int64_t next_look_ns = poll_host::never;
  /// That next look is a tick of irregular work (its stream's plan_state::host_tick): its phase
  /// against the work's end is random, so the host need not meet it early by its timer's
  /// largest lateness (which cost a second fire or a spin to the look); it arms early only by
  /// the least lateness plus look_ahead_ns (io_context_host::tick_lead).
  bool next_is_tick = false;
};

}  // namespace evr::detail
