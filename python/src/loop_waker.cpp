// python/src/loop_waker.cpp — see loop_waker.hpp.
#include "loop_waker.hpp"

#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <system_error>

namespace evr_py {
namespace {

constexpr double weight = 1.0 / 8;                 // EWMA weight of a new sample
constexpr std::uint32_t min_samples = 3;           // before a stream's model is trusted
constexpr double max_dev_share = 0.25;             // predictable: dev <= 25 % of the mean ...
constexpr std::int64_t dev_allowance_ns = 20'000;  // ... + 20 us (short work jitters in absolute)
constexpr std::int64_t window_margin_ns = 20'000;  // polled past the predicted end + 3 dev
constexpr std::int64_t min_lead_ns = 5'000;
constexpr std::int64_t max_lead_ns = 300'000;
constexpr std::int64_t max_late_sample_ns = 500'000;  // a busy loop's lateness is not the timer's
constexpr std::size_t max_models = 4096;              // streams (handles) with a model, per loop
constexpr std::uint32_t max_late_in_a_row = 3;        // late first looks: the third is a bound

void update(double& mean, double& dev, double sample, bool first) noexcept {
  if (first) {
    mean = sample;
    dev = 0;
    return;
  }
  dev += weight * (std::fabs(sample - mean) - dev);
  mean += weight * (sample - mean);
}

}  // namespace

std::int64_t monotonic_ns() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

loop_waker::loop_waker() : max_spin_ns_(200'000) {
  fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "timerfd_create");
  stats_.lead_ns = static_cast<std::int64_t>(late_mean_ns_ + 2 * late_dev_ns_) + min_lead_ns;
}

loop_waker::~loop_waker() {
  if (fd_ >= 0) ::close(fd_);
}

void loop_waker::set_max_spin_ns(std::int64_t ns) noexcept {
  max_spin_ns_ = std::max<std::int64_t>(0, ns);
  if (max_spin_ns_ == 0) clear();
}

std::int64_t loop_waker::on_submit(completion* c, std::uintptr_t key) noexcept {
  const std::int64_t now = monotonic_ns();
  c->submitted_ns = now;
  c->key = key;
  c->wake_ticket = 0;
  const bool gets_window = predictable(key);
  ++in_flight_;  // after the check: predictable() counts the waits in flight before this one
  if (!gets_window) return 0;
  model& m = models_.find(key)->second;
  const auto predicted_end = now + static_cast<std::int64_t>(m.mean_ns);
  const auto dev = static_cast<std::int64_t>(m.dev_ns);
  c->wake_at = std::max(now, predicted_end - 2 * dev - stats_.lead_ns);
  c->spin_until = predicted_end + 3 * dev + window_margin_ns;
  c->wake_ticket = next_ticket_++;
  const bool earliest = schedule_.empty() || c->wake_at < schedule_.begin()->wake_at;
  schedule_.insert(slot{c->wake_at, c->wake_ticket, c->spin_until, c});
  m.scheduled_ticket = c->wake_ticket;
  ++stats_.predicted;
  if (earliest) arm();
  return c->wake_at;
}

bool loop_waker::predictable(std::uintptr_t key) const noexcept {
  if (max_spin_ns_ == 0 || in_flight_ >= max_waits_) return false;
  auto it = models_.find(key);
  if (it == models_.end() || it->second.samples < min_samples) return false;
  const model& m = it->second;
  if (m.dev_ns > max_dev_share * m.mean_ns + dev_allowance_ns) return false;  // irregular work
  // One scheduled wait per stream: waits queued behind it complete with it or after it, and
  // its poller drains whatever comes (10 000 waits on one stream must not cost 10 000 windows).
  return m.scheduled_ticket == 0;
}

void loop_waker::drop(std::set<slot>::iterator it) noexcept {
  completion* node = it->node;
  auto m = models_.find(node->key);  // its stream may schedule another wait now
  if (m != models_.end() && m->second.scheduled_ticket == it->ticket)
    m->second.scheduled_ticket = 0;
  node->wake_ticket = 0;  // out of the schedule: on_drained has nothing to erase
  schedule_.erase(it);
}

void loop_waker::forget(const completion* c) noexcept {
  if (c->probe) std::erase(probed_, c);
  if (c->wake_ticket == 0) return;
  auto it = schedule_.find(slot{c->wake_at, c->wake_ticket, c->spin_until, nullptr});
  if (it != schedule_.end()) drop(it);
}

void loop_waker::on_refused(const completion* c) noexcept {
  forget(c);
  if (in_flight_ > 0) --in_flight_;
}

void loop_waker::on_probed(completion* c) {
  c->probe_short_ns = c->submitted_ns;
  probed_.push_back(c);
}

completion* loop_waker::take_reached(std::int64_t now) noexcept {
  completion* found = nullptr;
  for (completion* c : probed_) {
    // Pushed already (the reactor came first): the drain resolves it.
    if (c->settled.load(std::memory_order_relaxed) != completion::nobody) continue;
    if (!c->probe_reached()) {
      c->probe_short_ns = now;  // `now` was read before this look: the earlier bound
    } else if (found == nullptr) {
      found = c;
    }
  }
  if (found == nullptr) return nullptr;
  // The work ended between the last look that found it short and this one. The reactor learns
  // the midpoint, as from its own looks (idle_governor::done_time).
  const std::int64_t bracket = now - found->probe_short_ns;
  const std::int64_t midpoint = found->probe_short_ns + bracket / 2;
  found->probe.saw_reached(std::chrono::nanoseconds(monotonic_ns() - midpoint));
  ++stats_.probe_hits;
  left_flight(found, now, lesson_of(*found, now));  // out of probed_
  return found;
}

loop_waker::lesson loop_waker::lesson_of(const completion& c, std::int64_t now) noexcept {
  // This loop's model learns the midpoint only from a narrow bracket (two looks within twice the
  // loop's lead: the poller's). A wider one gives it only "by now": most often the first look,
  // at the window, found the work done, and the midpoint would then be a false outlier whenever
  // steady work merely ended a little before its window, so that the windows after it opened
  // early and missed; a busy loop whose looks inside a window are far apart gets the same
  // treatment (measured: learning the midpoint there made its windows miss more,
  // docs/notebook.md). The look's time is learnt then, as from any late look, and counts as a
  // bound (see left_flight for two in a row)...
  const std::int64_t bracket = now - c.probe_short_ns;
  if (bracket <= 2 * stats_.lead_ns) return {c.probe_short_ns + bracket / 2, lesson::exact};
  // ... unless no look found the work short since the wait's wake-up time and this first look came
  // later than twice the lead after it: the loop was late (blocked, or its thread not running),
  // and steady work is done by then anyway. Such a look says little of the work's length
  // (left_flight: a few in a row do count). (No look yet: probe_short_ns is the submission,
  // which is also the wake-up time of a wait due at once.)
  const bool first_look_in_window =
      c.probe_short_ns < c.wake_at || c.probe_short_ns == c.submitted_ns;
  if (first_look_in_window && now - c.wake_at > 2 * stats_.lead_ns) {
    ++stats_.late_looks;
    return {now, lesson::late};
  }
  return {now, lesson::bound};
}

void loop_waker::on_drained(const completion* c, std::int64_t now) noexcept {
  // Learn only from waits that completed: a cancelled or failed one says nothing of the work.
  left_flight(c, now, {c->pushed_ns, c->ec ? lesson::nothing : lesson::exact});
  const std::int64_t hop = std::max<std::int64_t>(1, now - c->pushed_ns);
  const auto bucket = std::min<std::size_t>(stats_.hop_log2_ns.size() - 1,
                                            64 - __builtin_clzll(static_cast<std::uint64_t>(hop)));
  ++stats_.hop_log2_ns[bucket];
}

void loop_waker::left_flight(const completion* c, std::int64_t now, lesson learnt) noexcept {
  ++stats_.completions;
  if (in_flight_ > 0) --in_flight_;
  // Every lesson carries a time (a drained node's push, or the look that found a probed one
  // done): a node the probe found may be being pushed right now, so its pushed_ns is not read.
  last_ = {c->submitted_ns, learnt.done_ns, now};
  forget(c);
  if (learnt.kind == lesson::nothing) return;
  // Bounded: a program that waits on ever new handles (events made per request) must not grow
  // the table forever; forgetting every model costs a few unpredicted waits per stream.
  if (models_.size() >= max_models && models_.find(c->key) == models_.end()) models_.clear();
  model& m = models_[c->key];
  double sample = static_cast<double>(learnt.done_ns - c->submitted_ns);
  if (learnt.kind == lesson::late) {
    // A late first look teaches nothing and counts towards no restart (two late wake-ups in a
    // row started the model again on a loaded machine, costing the stream its next windows),
    // unless the loop is late every time: then its looks are the only ones, and a third in a
    // row counts as a bound, so that work which got shorter is still relearnt. What it leaves
    // alone: a bound before it is still the first of two.
    if (++m.late_in_a_row < max_late_in_a_row) return;
    learnt.kind = lesson::bound;
  }
  m.late_in_a_row = 0;
  if (learnt.kind == lesson::exact) {
    m.bounds_in_a_row = 0;
    // A predicted wait done far from its stream's length: less than half of it (less the
    // allowance short work jitters by), or later than four times its window's end.
    // Steady work does not jitter that far (a predictable model's deviation is at most a quarter
    // of its mean plus the allowance), so the work changed; learnt into the old model, such
    // samples kept the stream unpredictable for tens of waits (the mean moves by an eighth a
    // sample, the deviation grows with it). Shorter: the reactor's scout found it before this
    // loop's window opened, which no lateness can fake: as conclusive as two bounds in a row.
    // Longer: a push that late may be the reactor's or the loop's lateness on a loaded host (with
    // the window's end plus the length as the bar, two busy loops beside a 1 ms stream restarted
    // it now and then), so only the second in a row starts the model again, and the first
    // teaches nothing.
    const double window_end = m.mean_ns + 3 * m.dev_ns + static_cast<double>(window_margin_ns);
    const bool predicted = c->wake_at != 0 && m.samples >= min_samples;
    if (predicted && sample < m.mean_ns / 2 - static_cast<double>(dev_allowance_ns)) {
      restart(m, sample);
      return;
    }
    if (predicted && sample > 4 * window_end) {
      if (++m.longer_in_a_row >= 2) restart(m, 0);
      return;
    }
    m.longer_in_a_row = 0;
  } else if (++m.bounds_in_a_row == 1) {
    m.first_bound_ns = sample;
  } else {
    // Two waits in a row found only loosely (mostly: already done at their window's first look):
    // the work got shorter than the model says. Start it again (the stream's next waits get no
    // window and teach the new length in a few waits; learning the bounds instead took tens, each
    // found at the old window). What they teach is capped by the bounds less a lead: waits
    // without a window are unhurried (the reactor does not spin for them), so their pushes come
    // later than the work's end, and a model relearnt from those alone predicted the same late
    // end, whose first looks found the work done again: it started again every five waits, on
    // the simulated device and on a loaded GPU host (docs/notebook.md, "restarts fed by the
    // reactor's late pushes").
    restart(m, std::min(m.first_bound_ns, sample));
    return;
  }
  if (m.relearn_cap_ns > 0) {
    sample = std::min(sample, m.relearn_cap_ns);
    if (m.samples + 1 >= min_samples) m.relearn_cap_ns = 0;
  }
  update(m.mean_ns, m.dev_ns, sample, m.samples == 0);
  if (m.samples < min_samples) ++m.samples;
}

void loop_waker::restart(model& m, double bound) noexcept {
  // At least half the bound: a cap of 0 would be none (work shorter than the lead).
  m.relearn_cap_ns =
      bound > 0 ? std::max(bound - static_cast<double>(stats_.lead_ns), bound / 2) : 0;
  m.mean_ns = m.dev_ns = 0;
  m.samples = 0;
  m.bounds_in_a_row = 0;
  m.longer_in_a_row = 0;
  ++stats_.model_restarts;
}

void loop_waker::on_timer_fired() noexcept {
  std::uint64_t expirations;
  while (::read(fd_, &expirations, sizeof expirations) < 0 && errno == EINTR) {
  }
  const std::int64_t now = monotonic_ns();
  if (armed_for_ != 0 && now >= armed_for_) {
    ++stats_.timer_fires;
    // How late this loop's timer wake-ups are: the lead for the next predictions. A timer armed
    // for a time already past (a window closed after the next wait was due) fires at once: its
    // lateness counts from the arming, not from the due time.
    const auto late =
        static_cast<double>(std::min(now - std::max(armed_for_, armed_at_), max_late_sample_ns));
    update(late_mean_ns_, late_dev_ns_, late, false);
    stats_.lead_ns = std::clamp<std::int64_t>(
        static_cast<std::int64_t>(late_mean_ns_ + 2 * late_dev_ns_) + min_lead_ns, min_lead_ns,
        max_lead_ns);
  }
  armed_for_ = 0;  // a timerfd that fired is disarmed (no interval)
}

completion* loop_waker::open_next(std::int64_t now, std::int64_t& until,
                                  std::uint64_t& window) noexcept {
  if (open_window_ != 0 || schedule_.empty() || schedule_.begin()->wake_at > now) {
    arm();  // fired for an entry that has since gone (drained or forgotten), or a window is open
    return nullptr;
  }
  const slot s = *schedule_.begin();
  drop(schedule_.begin());
  window = open_window_ = ++windows_;
  arm();  // disarmed while the window is open (the drain before may have armed it for this entry)
  until = std::max(std::min(s.spin_until, now + max_spin_ns_), now + 1'000);
  return s.node;
}

void loop_waker::window_closed(std::uint64_t window, bool polled, bool hit, std::int64_t opened_ns,
                               std::int64_t now, bool rearm_now) noexcept {
  // Cleared meanwhile (set_loop_spin(0), the loop closed), and perhaps another window opened
  // since: this one is no longer counted as open.
  if (window != open_window_) return;
  open_window_ = 0;
  if (!polled) {
    ++stats_.not_polled;
  } else {
    ++stats_.spins;
    ++(hit ? stats_.spin_hits : stats_.spin_misses);
    stats_.spin_ns += std::max<std::int64_t>(0, now - opened_ns);
  }
  if (rearm_now) rearm(now);
}

void loop_waker::rearm(std::int64_t now) noexcept {
  while (!schedule_.empty() && schedule_.begin()->spin_until <= now) {
    // Its window passed without the completion: the prediction missed; the eventfd brings it.
    drop(schedule_.begin());
    ++stats_.spin_misses;
  }
  // An entry further back may have passed too (windows differ in length); it is dropped when it
  // reaches the front, and firing for it costs one cheap timer callback.
  arm();
}

void loop_waker::clear() noexcept {
  probed_.clear();  // the loop closed: nobody polls, the reactor finishes every wait
  while (!schedule_.empty()) drop(schedule_.begin());
  open_window_ = 0;
  arm();
}

void loop_waker::arm() noexcept {
  // While a window is open its poller drains whatever comes: no timer until it closes.
  const std::int64_t at = (open_window_ != 0 || schedule_.empty()) ? 0 : schedule_.begin()->wake_at;
  if (at == armed_for_) return;
  itimerspec spec{};
  if (at != 0) {
    spec.it_value.tv_sec = at / 1'000'000'000;
    spec.it_value.tv_nsec = at % 1'000'000'000;
  }
  // Absolute time: a time already past fires at once. A zero it_value disarms.
  if (::timerfd_settime(fd_, TFD_TIMER_ABSTIME, &spec, nullptr) == 0) {
    armed_for_ = at;
    armed_at_ = at != 0 ? monotonic_ns() : 0;
  }
}

}  // namespace evr_py
