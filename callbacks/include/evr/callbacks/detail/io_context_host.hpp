// evr/callbacks/detail/io_context_host.hpp — an io_context's threads as the reactor's poll_host
// (evr/reactor/detail/poll_host.hpp): the last hop of delivery::post and delivery::post_woken.
//
// Why: a completion posted to an io_context whose thread is parked in epoll_wait runs 20-70 us
// after the reactor found it (H100 host), 5-15 times what finding it took. A thread that wakes
// itself with a timer it armed is awake within a few us of the time it asked for.
//
// Role polls (delivery::post, the default):
//   * when a wait is submitted, the reactor estimates when its window opens (its stream's model:
//     reactor_access::submit_hosted); the host arms a timerfd for that time less its margin (how
//     late its timer has fired lately), from one of the context's threads (a timer armed on
//     another core wakes this one as slowly as a post would: that case posts the arming);
//   * when the timer fires (an Asio wait on the timerfd), the host polls in the timer's handler
//     (not posted: a post would queue behind the handlers that came meanwhile); each poll is a
//     pass of the reactor on this thread (detail::poll_here), which takes the waits submitted
//     since the last one (those of this thread: the reactor thread is not woken for them), retires
//     the host's waits that are done and posts their completions to the context's queue while
//     it holds the pass lock (io_context_posts.hpp: in stream order with the reactor thread's
//     posts); the poll re-posts itself (a continuation: no lock, no wake-up,
//     run after the handlers queued meanwhile) while a window of its waits is open, and, while the
//     thread is awake anyway (the poll waited behind other handlers, or delivered completions
//     whose handlers run next) and a window opens soon, after each batch of handlers: a look
//     then costs a few memory reads. When the thread would otherwise sleep and the next window is
//     not open yet, it arms the timer for that window and stops (no free-running tick:
//     overlapping windows of many streams are polled through, as one stream's are; the looks at
//     irregular work fall on the points of a grid, so that they come due together: tick_grid.hpp);
//   * the reactor thread does not wake for such windows: it looks after a window closed (a
//     safety net), or sooner when a sweep it makes for other streams comes by; when it learns of a
//     window this host does not know of (a wait submitted from another thread, queued behind
//     others), it calls look_by, which posts the arming here.
// Role woken (delivery::post_woken): the reactor calls wake_until shortly before a window (lead_ns,
// learned from how late its wake-ups ran here); the posted keep-awake re-posts itself until a
// completion of a hosted wait ran on this context or the window closed. The reactor finds the
// completion itself, so two threads spin through the window.
//
// Work: the timer's wait keeps run() from returning (an Asio I/O operation); it is kept only while
// hosted waits are pending, which keep run() going anyway, and cancelled when the last finishes.
//
// Threads: every member may be called from any thread; the state is under `mutex_`, polls run on
// one thread at a time (`polling_`). Lifetime: owned by reactor_service (one per reactor and role
// on an io_context), destroyed by its shutdown after the context's waits were detached; what it
// posted and what is queued on the timerfd is destroyed with the context's queues unrun.
// Linux only (timerfd); elsewhere waits are not hosted.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>

#include <evr/callbacks/detail/asio_forward.hpp>
#include <evr/callbacks/detail/slot_allocator.hpp>
#include <evr/reactor/detail/ring.hpp>
#include <evr/reactor/reactor.hpp>

#if defined(__linux__)
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>
#if defined(EVR_ASIO_BOOST)
#include <boost/asio/posix/stream_descriptor.hpp>
#else
#include <asio/posix/stream_descriptor.hpp>
#endif
#define EVR_HAS_IO_CONTEXT_HOST 1
#else
#define EVR_HAS_IO_CONTEXT_HOST 0
#endif

namespace evr::detail {
inline namespace EVR_ASIO_FLAVOUR_NAMESPACE {

/// How late a timer or a wake-up has been here lately: the largest of the last 32 samples (about
/// the 97th percentile), clamped (a wake-up a millisecond late, which this host sees now and then,
/// opens the next 32 windows 200 us early at most). The fourth largest (about the 90th) was tried:
/// 10 % fewer us of polling, but every tenth window opened late (H100, 200 us work: p90 13x the
/// floor against 1.8x).
using lateness = recent_max<32>;

/// Memory for one posted function at a time (slot_allocator.hpp), so that what the host posts
/// (from the reactor thread too) allocates nothing in steady state.
class post_slot {
 public:
  static constexpr std::size_t size = 128;
  /// The handle slot_allocator keeps.
  class ref {
   public:
    explicit ref(post_slot* s) noexcept : s_(s) {}
    void* take(std::size_t bytes, std::size_t align) noexcept {
      if (bytes > size || align > alignof(std::max_align_t) ||
          s_->busy_.exchange(true, std::memory_order_acquire))
        return nullptr;
      return s_->bytes_;
    }
    bool give_back(void* p) noexcept {
      if (p != s_->bytes_) return false;
      s_->busy_.store(false, std::memory_order_release);
      return true;
    }
    bool operator==(const ref& o) const noexcept { return s_ == o.s_; }

   private:
    post_slot* s_;
  };

 private:
  std::atomic<bool> busy_{false};
  alignas(std::max_align_t) unsigned char bytes_[size];
};

class io_context_host final : public poll_host {
 public:
  io_context_host(asio::io_context& io, std::weak_ptr<reactor_core> core, role r)
      : poll_host(r), io_(io), core_(std::move(core)) {
    timer_margin_ns.store(margin_.high(), std::memory_order_relaxed);
    lead_ns.store(lead_.high(), std::memory_order_relaxed);
#if EVR_HAS_IO_CONTEXT_HOST
    // Now, not at the first window that needs it: the descriptor's first use creates Asio's
    // descriptor service and epoll reactor (heap), which would otherwise fall into a steady
    // state that allocates nothing per wait. Failing here leaves arm() to try again.
    if (r == role::polls) (void)open_timer();
#endif
  }
  ~io_context_host() { close(); }

  asio::io_context& context() const noexcept { return io_; }

  /// Whether hosting works here (a timerfd could be made); false: deliver plainly.
  static constexpr bool available() noexcept { return EVR_HAS_IO_CONTEXT_HOST != 0; }

  /// A hosted wait is about to be submitted (before reactor_access::submit_hosted).
  void wait_started() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    ++pending_;
  }
  /// The wait was submitted; its window opens at `open_ns` (0: the reactor will say).
  void wait_submitted(std::int64_t open_ns) {
    if (open_ns == 0 || host_role() != role::polls) return;
    if (io_.get_executor().running_in_this_thread()) {
      std::lock_guard<std::mutex> lock(mutex_);
      arm(open_ns, now_ns());
    } else {
      look_by(open_ns);  // armed from the context's thread (see the file comment)
    }
  }
  /// A hosted wait finished (its handler is about to run on this context, it was destroyed with
  /// the context, or it was refused). The last one ends the timer's wait, so run() may return.
  void wait_finished() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    ++delivered_;
    if (--pending_ == 0) disarm();
  }

  // What the reactor tells the host (look_by, wake_until) is coalesced: one post in flight at a
  // time carries the earliest look (the latest keep-awake), so told_slot_ is always free when
  // it is needed and the host never takes the heap, however the threads are scheduled.

  void look_by(std::int64_t open_ns) noexcept override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      told_look_ns_ = std::min(told_look_ns_, open_ns);
      if (std::exchange(told_posted_, true)) return;  // the post in flight takes it
    }
    // Out of memory: the reactor's look after the window finds the wait.
    if (!post(told_slot_, /*continuation=*/false, [this] { take_told_look(); })) {
      std::lock_guard<std::mutex> lock(mutex_);
      told_posted_ = false;
    }
  }

  void wake_until(std::int64_t until_ns) noexcept override {
    const std::int64_t posted = now_ns();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      told_until_ns_ = std::max(told_until_ns_, until_ns);
      if (std::exchange(told_posted_, true)) return;  // the post in flight takes it
    }
    // Out of memory: the completion is posted as usual, only later.
    if (!post(told_slot_, /*continuation=*/false, [this, posted] { take_told_wake(posted); })) {
      std::lock_guard<std::mutex> lock(mutex_);
      told_posted_ = false;
    }
  }

  /// Closes the timerfd: no more timer waits. reactor_service's shutdown.
  void close() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
#if EVR_HAS_IO_CONTEXT_HOST
    if (timer_) {
      asio_error_code ignored;
      timer_->close(ignored);  // closes the timerfd too (the descriptor owns it)
      timer_.reset();
    }
#endif
    closed_ = true;
  }

 private:
  using clock = std::chrono::steady_clock;
  static std::int64_t now_ns() noexcept { return clock::now().time_since_epoch().count(); }
  /// Below this far ahead a timer costs more than spinning to the look (a wake-up, its margin);
  /// the pass makes looks due that soon itself.
  static constexpr std::int64_t min_sleep_ns = poll_host::look_ahead_ns;
  /// A poll that ran this long after it was posted waited behind other handlers: the thread is
  /// awake anyway (an idle thread runs it within a microsecond or two, an epoll look included).
  static constexpr std::int64_t busy_after_ns = 5'000;
  /// While the thread is awake anyway, a look after each batch of handlers for windows opening
  /// within this: cheaper than a timer (a syscall to arm it, an epoll wake-up and a read), and on
  /// time. Farther windows get the timer.
  static constexpr std::int64_t awake_horizon_ns = 200'000;

  /// An executor's execute: a member from Asio 1.29, the execution::execute customisation point
  /// before (the member is private there).
  template <typename Ex, typename F>
  static void execute(const Ex& ex, F&& f) {
#if EVR_ASIO_VERSION >= 102900
    ex.execute(std::forward<F>(f));
#else
    asio::execution::execute(ex, std::forward<F>(f));
#endif
  }

  /// Posts `f` to the context with memory from `slot`; a continuation goes to the private queue
  /// of the calling thread when it runs the context (no lock, no wake-up). False when posting
  /// failed (out of memory).
  template <typename F>
  bool post(post_slot& slot, bool continuation, F&& f) noexcept {
    try {
      auto ex = asio::prefer(
          io_.get_executor(), asio::execution::blocking.never,
          asio::execution::allocator(slot_allocator<void, post_slot::ref>(post_slot::ref(&slot))));
      if (continuation) {
        execute(asio::prefer(ex, asio::execution::relationship.continuation), std::forward<F>(f));
      } else {
        execute(asio::prefer(ex, asio::execution::relationship.fork), std::forward<F>(f));
      }
      return true;
    } catch (...) {
      return false;
    }
  }

  /// (mutex_) Looks from `look_ns` on: arms the timer for it less the margin (less a `tick`'s
  /// lead), unless the host polls now or its timer fires before that anyway; starts polling if
  /// that is now.
  void arm(std::int64_t look_ns, std::int64_t now, bool tick = false) {
    // pending_ == 0: the wait submitted has finished already (wait_submitted runs after it was
    // handed to the reactor); nothing is left to look for.
    if (polling_ || closed_ || pending_ == 0) return;
    // Early by the timer's lateness, but at most by half the time to the look: a look soon
    // (irregular work's next tick) is slept for, not spun towards.
    const std::int64_t lead = std::min(tick ? tick_lead() : margin_.high(),
                                       std::max<std::int64_t>(0, (look_ns - now) / 2));
    const std::int64_t at = look_ns - lead;
    if (at - now < min_sleep_ns) {
      start_polling();
      return;
    }
    if (at >= armed_for_) return;
#if EVR_HAS_IO_CONTEXT_HOST
    if (!timer_ && !open_timer()) return;
    itimerspec spec{};
    spec.it_value.tv_sec = static_cast<time_t>(at / 1'000'000'000);
    spec.it_value.tv_nsec = static_cast<long>(at % 1'000'000'000);
    if (::timerfd_settime(timer_->native_handle(), TFD_TIMER_ABSTIME, &spec, nullptr) != 0) return;
    armed_for_ = at;
    looks_at_ns.store(at, std::memory_order_relaxed);
    if (!waiting_) wait_for_timer(/*learn=*/true);
#endif
  }

  /// (mutex_) How early to arm for a tick of irregular work (poll_result::next_is_tick): by the
  /// least lateness seen plus look_ahead_ns, so that the fire lands within the pass's reach of
  /// the tick (no second fire, no spin to it) and is late only by the lateness above the least
  /// (docs/notebook.md, "A tick's timer").
  std::int64_t tick_lead() const noexcept { return margin_.low() + look_ahead_ns; }

#if EVR_HAS_IO_CONTEXT_HOST
  /// (mutex_) Starts the one wait on the timerfd (`waiting_`); it ends in timer_fired, which
  /// learns the timer's lateness from it if `learn`. Out of memory: no wait, and nothing armed
  /// (the next arm tries again; the reactor's look after the window finds the waits meanwhile).
  void wait_for_timer(bool learn) noexcept {
    try {
      timer_->async_wait(asio::posix::stream_descriptor::wait_read,
                         [this](const asio_error_code& ec) { timer_fired(ec); });
    } catch (...) {
      armed_for_ = never;
      looks_at_ns.store(never, std::memory_order_relaxed);
      return;
    }
    waiting_ = true;  // after the call: its handler takes mutex_ first, so it cannot run before
    timer_learns_ = learn;
  }
#endif

  /// (mutex_) No hosted wait is left: the timer's wait ends (run() may return).
  void disarm() noexcept {
#if EVR_HAS_IO_CONTEXT_HOST
    armed_for_ = never;
    if (!polling_) looks_at_ns.store(never, std::memory_order_relaxed);
    if (timer_ && waiting_) {
      itimerspec off{};
      (void)::timerfd_settime(timer_->native_handle(), TFD_TIMER_ABSTIME, &off, nullptr);
      asio_error_code ignored;
      timer_->cancel(ignored);
    }
#endif
  }

#if EVR_HAS_IO_CONTEXT_HOST
  bool open_timer() noexcept {
    const int fd = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (fd < 0) return false;
    try {
      timer_.emplace(io_, fd);
    } catch (...) {
      ::close(fd);
      return false;
    }
    return true;
  }

  void timer_fired(const asio_error_code& ec) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      waiting_ = false;
      if (!timer_) return;  // closed
      if (ec) {
        // Cancelled when the last hosted wait finished (disarm).
        //  * A wait submitted before this handler ran armed the timer again but found waiting_
        //    still set, so it started no wait of its own: wait for that expiry now, and do not
        //    learn from it (it may be long past). Without this the timerfd expired unread and
        //    every later arm() found armed_for_ already due and returned: the host stopped
        //    looking until its waits ran out, and the reactor found every completion instead.
        //  * Otherwise clear the armed time, so that no later arm() trusts a wait that is gone.
        if (ec == asio::error::operation_aborted && !closed_ && pending_ > 0 && armed_for_ != never)
          wait_for_timer(/*learn=*/false);
        else
          armed_for_ = never;
        return;
      }
      std::uint64_t expirations = 0;
      if (::read(timer_->native_handle(), &expirations, sizeof expirations) < 0) expirations = 0;
      const std::int64_t now = now_ns();
      if (expirations > 0 && armed_for_ != never && timer_learns_) {
        margin_.add(now - armed_for_);
        timer_margin_ns.store(margin_.high(), std::memory_order_relaxed);
      }
      armed_for_ = never;
      // A poll chain may have started since the timer was armed (a look came due sooner): one
      // chain at a time (a second would double the looks and take the heap for its posts).
      if (pending_ == 0 || polling_ || closed_) return;
      // The timer's handler runs on the context's thread at the time asked for: it is the
      // chain's first poll. Posting it instead would run it after every handler queued on this
      // thread meanwhile, which under load is later than the window it was armed for.
      polling_ = true;
      poll_posted_ns_ = now;
      looks_at_ns.store(now, std::memory_order_relaxed);
    }
    poll(/*posted=*/false);
  }
#endif

  /// (mutex_) Posts the first poll (a continuation: run after what is queued on this thread).
  void start_polling() noexcept { polling_ = post_poll(); }

  /// (mutex_) Posts a poll, stamped with the time of posting (its queue delay is measured from
  /// there); false when posting failed (out of memory: the reactor's look after the window finds
  /// the waits instead). `promise`: the post is a promise to look now. A poll that found the pass
  /// taken (busy) makes none: the promise of the last pass stands, so a host that the reactor's
  /// passes keep out has its streams looked at by the reactor once that promise has passed by its
  /// grace (idle_governor::covered_until), instead of renewing it on every try.
  bool post_poll(bool promise = true) noexcept {
    if (!post(poll_slot_, /*continuation=*/true, [this] { poll(/*posted=*/true); })) {
      looks_at_ns.store(never, std::memory_order_relaxed);
      return false;
    }
    const std::int64_t now = now_ns();
    poll_posted_ns_ = now;
    if (promise) looks_at_ns.store(now, std::memory_order_relaxed);
    return true;
  }

  /// One pass of the reactor here, then the chain's next step. `posted`: this poll waited in the
  /// context's queue (its delay is the host's queue delay, which the reactor's grace follows);
  /// false: run by the timer's handler itself.
  void poll(bool posted) {
    poll_result r;
    r.what = poll_result::outcome::stopped;
    if (std::shared_ptr<reactor_core> core = core_.lock()) r = poll_here(*core, *this);
    const std::int64_t now = r.at_ns != 0 ? r.at_ns : now_ns();  // the pass's start
    std::lock_guard<std::mutex> lock(mutex_);
    // Whether this poll waited behind other handlers (the thread is awake anyway).
    // poll_posted_ns_ is written by post_poll and timer_fired, neither of which runs while a poll
    // does (polling_). A poll the timer's handler runs counts as not awake (it was asked for by
    // the timer, not queued) and adds no queue-delay sample: the grace follows the posted polls.
    const bool awake = now - poll_posted_ns_ > busy_after_ns;
    if (posted) {
      queue_delay_.add(now - poll_posted_ns_);
      queue_delay_ns.store(queue_delay_.high(), std::memory_order_relaxed);
    }
    const std::int64_t next = r.next_look_ns;
    const bool swept = r.what == poll_result::outcome::swept;
    // Look again after the handlers queued meanwhile: through an open window, when the reactor
    // thread held the pass (busy), or, while this thread is awake anyway (this poll waited, or
    // its completions run next), for a window that opens soon.
    const bool again = !closed_ && pending_ > 0 &&
                       (r.what == poll_result::outcome::busy ||
                        (swept && (r.spin || next - now < min_sleep_ns ||
                                   ((awake || r.delivered > 0) && next - now < awake_horizon_ns))));
    // post_poll stamps the time of posting, not this pass's start: the next poll's delay is its
    // wait behind other handlers, not that plus this pass (a pass of event queries can take
    // longer than busy_after_ns, and an idle thread then looked awake and saturated).
    if (again && post_poll(/*promise=*/r.what != poll_result::outcome::busy)) return;
    polling_ = false;
    if (swept && next != never && pending_ > 0) {
      arm(next, now, r.next_is_tick);
    } else {
      looks_at_ns.store(never, std::memory_order_relaxed);
    }
  }

  /// The post of look_by: arms for the earliest look told since it was posted.
  void take_told_look() {
    std::lock_guard<std::mutex> lock(mutex_);
    told_posted_ = false;
    const std::int64_t at = std::exchange(told_look_ns_, never);
    if (pending_ > 0 && at != never) arm(at, now_ns());
  }

  /// The post of wake_until: keeps awake until the latest time told since it was posted.
  void take_told_wake(std::int64_t posted) {
    std::int64_t until = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      told_posted_ = false;
      until = std::exchange(told_until_ns_, 0);
    }
    keep_awake(until, posted);
  }

  /// Role woken: keeps this thread awake (re-posting itself) until `until` or a hosted wait's
  /// completion ran here; learns how late the wake-up was (the lead the reactor gives).
  void keep_awake(std::int64_t until, std::int64_t posted) {
    std::uint64_t seen = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      lead_.add(now_ns() - posted);
      lead_ns.store(lead_.high(), std::memory_order_relaxed);
      if (awake_until_ != 0) {  // one keeping awake already: extend it
        awake_until_ = std::max(awake_until_, until);
        return;
      }
      awake_until_ = until;
      seen = delivered_;
    }
    stay_awake(seen);
  }

  void stay_awake(std::uint64_t seen) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!closed_ && now_ns() < awake_until_ && delivered_ == seen) {
      // Out of memory: stop keeping awake; the completion comes as a plain post.
      if (post(poll_slot_, /*continuation=*/true, [this, seen] { stay_awake(seen); })) return;
    }
    awake_until_ = 0;
  }

  asio::io_context& io_;
  const std::weak_ptr<reactor_core> core_;
  std::mutex mutex_;
#if EVR_HAS_IO_CONTEXT_HOST
  std::optional<asio::posix::stream_descriptor> timer_;  // owns the timerfd
#endif
  std::int64_t armed_for_ = never;  // the timerfd's expiry (steady clock ns); never: disarmed
  std::size_t pending_ = 0;         // hosted waits not finished
  bool waiting_ = false;            // an async_wait on the timerfd is pending
  bool timer_learns_ = true;        // its completion is a sample of the timer's lateness
  bool polling_ = false;            // a poll is posted or running
  bool closed_ = false;
  std::int64_t awake_until_ = 0;     // role woken: a keep-awake runs until then (0: none)
  std::int64_t poll_posted_ns_ = 0;  // when the poll chain's last poll was posted
  post_slot poll_slot_;              // the poll chain (or the keep-awake chain: one role per host)
  post_slot told_slot_;              // what the reactor posts (look_by, wake_until)
  bool told_posted_ = false;         // (mutex_) a post of told_slot_ is in flight
  std::int64_t told_look_ns_ = never;        // (mutex_) the earliest look told since then
  std::int64_t told_until_ns_ = 0;           // (mutex_) the latest keep-awake told since then
  std::uint64_t delivered_ = 0;              // (mutex_) hosted waits finished here
  lateness margin_{20'000, 2'000, 200'000};  // timer wake-ups: how late (ns)
  lateness lead_{50'000, 10'000, 500'000};   // role woken: post to run (ns)
  lateness queue_delay_{0, 0, 20'000'000};   // role polls: a pass's post to run (ns)
};

}  // namespace EVR_ASIO_FLAVOUR_NAMESPACE
}  // namespace evr::detail
