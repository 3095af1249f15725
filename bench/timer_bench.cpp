// evr-bench timer — how late this machine's timed sleeps end, measured the way the reactor sleeps
// (a condition variable's wait_until on the steady clock, timer slack 1 ns), to tell the
// predictive idle policy's tail apart from the host's: a wait found late while the reactor slept
// is a timer that fired late, not a wrong prediction.
//
//   single       one sleep of D to a deadline D from now;
//   final F      the same deadline reached by a sleep to F before it, then a sleep of F: whether a
//                long sleep's rare late wake-ups (a vCPU halted for milliseconds) shrink when the
//                last sleep before the deadline is short.
// Overshoot = when the thread runs again - the deadline. No GPU needed: a property of the host.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include "cli.hpp"
#include "stats.hpp"
#include "subcommands.hpp"

namespace evr::bench {
namespace {

using std::chrono::microseconds;
using std::chrono::nanoseconds;

struct timer_row {
  std::string variant;  // "single" or "final <F> us"
  double length_us = 0;
  std::vector<double> overshoot_us;
  std::size_t over(double us) const {
    return static_cast<std::size_t>(
        std::count_if(overshoot_us.begin(), overshoot_us.end(), [us](double v) { return v > us; }));
  }
};

/// Sleeps like the reactor's wakeup::nap_until: a timed wait that nothing signals.
class sleeper {
 public:
  void until(bench_clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mutex_);
    condition_.wait_until(lock, deadline, [] { return false; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable condition_;
};

timer_row measure(sleeper& s, nanoseconds length, nanoseconds final_sleep, int samples) {
  timer_row row;
  row.length_us = std::chrono::duration<double, std::micro>(length).count();
  row.variant = final_sleep.count() == 0
                    ? std::string("single")
                    : "final " + std::to_string(final_sleep.count() / 1000) + " us";
  row.overshoot_us.reserve(static_cast<std::size_t>(samples));
  for (int i = 0; i < samples; ++i) {
    const bench_clock::time_point deadline = bench_clock::now() + length;
    if (final_sleep.count() != 0) s.until(deadline - final_sleep);
    s.until(deadline);
    row.overshoot_us.push_back(ns_between(deadline, bench_clock::now()) / 1000.0);
  }
  return row;
}

}  // namespace
}  // namespace evr::bench

int evr_bench_timer(int argc, char** argv) {
  using namespace evr::bench;
  CLI::App app{
      "How late this machine's timed sleeps end (condition variable wait_until, 1 ns timer "
      "slack, as the reactor sleeps): one sleep per deadline, and the same deadline reached by a "
      "long sleep and a short final one.",
      "evr-bench timer"};
  int samples = 200;
  std::vector<double> lengths_us{50, 200, 1000, 5000, 19000};
  std::vector<double> finals_us{1000, 250};
  std::string json;
  app.add_option("--samples", samples, "sleeps per row")->check(CLI::Range(10, 100000));
  app.add_option("--lengths-us", lengths_us,
                 "sleep lengths (deadline from now), us, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(1.0, 1e6));
  app.add_option("--finals-us", finals_us,
                 "final-sleep lengths to try for deadlines longer than them, us, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(1.0, 1e6));
  add_json_option(app, json);
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;

#if defined(__linux__)
  (void)prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);  // as the reactor thread does
#endif
  sleeper s;
  std::vector<timer_row> rows;
  std::printf("%-14s %10s %9s %9s %9s %9s %8s %8s\n", "variant", "length us", "p50 us", "p99 us",
              "p99.9 us", "max us", ">200us", ">500us");
  for (double length : lengths_us) {
    std::vector<double> variants{0};
    for (double f : finals_us)
      if (f < length) variants.push_back(f);
    for (double f : variants) {
      const auto length_ns = nanoseconds(static_cast<std::int64_t>(length * 1000));
      const auto final_ns = nanoseconds(static_cast<std::int64_t>(f * 1000));
      timer_row r = measure(s, length_ns, final_ns, samples);
      std::printf("%-14s %10.0f %9.1f %9.1f %9.1f %9.1f %8zu %8zu\n", r.variant.c_str(),
                  r.length_us, percentile(r.overshoot_us, 0.5), percentile(r.overshoot_us, 0.99),
                  percentile(r.overshoot_us, 0.999),
                  *std::max_element(r.overshoot_us.begin(), r.overshoot_us.end()), r.over(200),
                  r.over(500));
      std::fflush(stdout);
      rows.push_back(std::move(r));
    }
  }
  if (json.empty()) return 0;
  std::FILE* f = std::fopen(json.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "evr-bench timer: cannot write %s\n", json.c_str());
    return 1;
  }
  json_writer w(f);
  w.raw("{\n  \"subcommand\": \"timer\",\n  \"samples\": " + json_writer::number(samples) +
        ",\n  \"rows\": [\n");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const timer_row& r = rows[i];
    w.raw("    {\"variant\": " + json_writer::quote(r.variant) +
          ", \"length_us\": " + json_writer::number(r.length_us) +
          ", \"p50_us\": " + json_writer::number(percentile(r.overshoot_us, 0.5)) +
          ", \"p99_us\": " + json_writer::number(percentile(r.overshoot_us, 0.99)) +
          ", \"overshoot_us\": " + json_writer::array(r.overshoot_us) + "}" +
          (i + 1 < rows.size() ? ",\n" : "\n"));
  }
  w.raw("  ]\n}\n");
  const bool ok = std::fclose(f) == 0;
  if (ok) std::printf("\nwrote %s\n", json.c_str());
  return ok ? 0 : 1;
}
