// python/src/loop_waker.cpp — see loop_waker.hpp.
#include "loop_waker.hpp"

#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <system_error>

#include <Python.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define EVR_PY_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define EVR_PY_CPU_RELAX() asm volatile("yield")
#else
#define EVR_PY_CPU_RELAX() (void)0
#endif

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

void loop_waker::on_submit(completion* c, std::uintptr_t key) noexcept {
  const std::int64_t now = monotonic_ns();
  c->submitted_ns = now;
  c->key = key;
  c->wake_ticket = 0;
  if (max_spin_ns_ == 0) return;
  auto it = models_.find(key);
  if (it == models_.end() || it->second.samples < min_samples) return;
  const model& m = it->second;
  if (m.dev_ns > max_dev_share * m.mean_ns + dev_allowance_ns) return;  // not predictable
  const auto predicted_end = now + static_cast<std::int64_t>(m.mean_ns);
  const auto dev = static_cast<std::int64_t>(m.dev_ns);
  c->wake_at = std::max(now, predicted_end - 2 * dev - stats_.lead_ns);
  c->spin_until = predicted_end + 3 * dev + window_margin_ns;
  c->wake_ticket = next_ticket_++;
  const bool earliest = schedule_.empty() || c->wake_at < schedule_.begin()->wake_at;
  schedule_.insert(slot{c->wake_at, c->wake_ticket, c->spin_until});
  ++stats_.predicted;
  if (earliest) arm();
}

void loop_waker::forget(const completion* c) noexcept {
  if (c->wake_ticket != 0) schedule_.erase(slot{c->wake_at, c->wake_ticket, c->spin_until});
}

void loop_waker::on_drained(const completion* c, std::int64_t now) noexcept {
  ++stats_.completions;
  const std::int64_t hop = std::max<std::int64_t>(1, now - c->pushed_ns);
  const auto bucket = std::min<std::size_t>(stats_.hop_log2_ns.size() - 1,
                                            64 - __builtin_clzll(static_cast<std::uint64_t>(hop)));
  ++stats_.hop_log2_ns[bucket];
  last_ = {c->submitted_ns, c->pushed_ns, now};
  forget(c);
  // Learn only from waits that completed: a cancelled or failed one says nothing of the work.
  if (c->ec) return;
  // Bounded: a program that waits on ever new handles (events made per request) must not grow
  // the table forever; forgetting every model costs a few unpredicted waits per stream.
  if (models_.size() >= max_models && models_.find(c->key) == models_.end()) models_.clear();
  model& m = models_[c->key];
  update(m.mean_ns, m.dev_ns, static_cast<double>(c->pushed_ns - c->submitted_ns), m.samples == 0);
  if (m.samples < min_samples) ++m.samples;
}

void loop_waker::on_timer(const completion_sink& sink, bool loop_idle) noexcept {
  std::uint64_t expirations;
  while (::read(fd_, &expirations, sizeof expirations) < 0 && errno == EINTR) {
  }
  std::int64_t now = monotonic_ns();
  if (armed_for_ != 0 && now >= armed_for_) {
    // How late this loop's timer wake-ups are: the lead for the next predictions.
    const auto late = static_cast<double>(std::min(now - armed_for_, max_late_sample_ns));
    update(late_mean_ns_, late_dev_ns_, late, false);
    stats_.lead_ns = std::clamp<std::int64_t>(
        static_cast<std::int64_t>(late_mean_ns_ + 2 * late_dev_ns_) + min_lead_ns, min_lead_ns,
        max_lead_ns);
  }
  armed_for_ = 0;
  if (schedule_.empty() || schedule_.begin()->wake_at > now) {
    arm();  // fired for an entry that has since gone (drained or forgotten)
    return;
  }
  ++stats_.timer_fires;
  if (sink.has_pending()) {
    ++stats_.spin_hits;  // already there (its eventfd reader may be next in line): just drain
    return;
  }
  if (!loop_idle) {
    // Other callbacks are ready: do not hold them up. The due waits fall back to the eventfd.
    while (!schedule_.empty() && schedule_.begin()->wake_at <= now) {
      schedule_.erase(schedule_.begin());
      ++stats_.skipped_busy;
    }
    arm();
    return;
  }
  // Poll until a completion arrives or the earliest due wait's window has passed.
  std::int64_t until = now + max_spin_ns_;
  for (auto it = schedule_.begin(); it != schedule_.end() && it->wake_at <= now; ++it)
    until = std::min(until, it->spin_until);
  until = std::max(until, now + 1'000);
  ++stats_.spins;
  bool hit = false;
  PyThreadState* ts = PyEval_SaveThread();  // other Python threads run while we poll
  do {
    for (int i = 0; i < 16; ++i) EVR_PY_CPU_RELAX();
    hit = sink.has_pending();
  } while (!hit && monotonic_ns() < until);
  PyEval_RestoreThread(ts);
  stats_.spin_ns += monotonic_ns() - now;
  if (hit) {
    ++stats_.spin_hits;
    return;  // the caller drains next, then rearm() drops the entries whose window has passed
  }
  // Nothing came within max_spin or the window: every wait that was due falls back to the
  // eventfd (never polled for twice).
  while (!schedule_.empty() && schedule_.begin()->wake_at <= now) {
    schedule_.erase(schedule_.begin());
    ++stats_.spin_misses;
  }
}

void loop_waker::rearm(std::int64_t now) noexcept {
  while (!schedule_.empty() && schedule_.begin()->spin_until <= now) {
    // Its window passed without the completion: the prediction missed; the eventfd brings it.
    schedule_.erase(schedule_.begin());
    ++stats_.spin_misses;
  }
  // An entry further back may have passed too (windows differ in length); it is dropped when it
  // reaches the front, and firing for it costs one cheap timer callback.
  arm();
}

void loop_waker::clear() noexcept {
  schedule_.clear();
  arm();
}

void loop_waker::arm() noexcept {
  const std::int64_t at = schedule_.empty() ? 0 : schedule_.begin()->wake_at;
  if (at == armed_for_) return;
  itimerspec spec{};
  if (at != 0) {
    spec.it_value.tv_sec = at / 1'000'000'000;
    spec.it_value.tv_nsec = at % 1'000'000'000;
  }
  // Absolute time: a time already past fires at once. A zero it_value disarms.
  if (::timerfd_settime(fd_, TFD_TIMER_ABSTIME, &spec, nullptr) == 0) armed_for_ = at;
}

}  // namespace evr_py
