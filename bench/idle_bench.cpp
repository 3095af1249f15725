// evr-bench idle — how late each way of waiting finds GPU work of the lengths users run, and what
// it costs the CPU: the sweep behind the default idle policy (docs/benchmarks.md; the history in
// docs/notebook.md).
//
// Method: the gate kernels of `evr-bench latency`, many at once. Each lane (a stream) runs jobs
// one after another: a one-thread gate kernel is launched, the notification under test is put
// behind it (an evr wait, an event record, a host function), and an opener thread opens the gate
// D after the notification was submitted, D drawn per job (steady D +-jitter, uniform, bimodal).
// From the waiting side this is GPU work that ends D after the wait was submitted; the gate's
// opening time t0 is known exactly, so a job's latency is t1 - t0 where t1 is taken in the
// handler (or when the waiting thread returns), as in the floor measurement (kernel writes an
// ack, the host spins on it) taken in the same run. The next job of a lane is launched once its
// previous one was seen done: each lane is a closed loop, one request in flight, back to back.
// Lockstep workloads (--lockstep-streams, 16 and 64) launch every lane's job together and the next
// round once all were seen done, as a server's burst of requests does: every window overlaps, and
// the floor is one thread spinning over all the lanes' acks.
//
// Rows (idle_rows.hpp): the floor; each evr method delivered inline on the reactor thread (one
// driver thread launches the jobs); the default delivered to an io_context thread, which also runs
// the closed loops (its handler launches the next job, as a server's coroutine does), with each
// delivery: `post` (the default: the thread polls near predicted completions, the figure users
// see), `woken` (the reactor wakes the thread ahead), `plain` (a plain post to a thread parked in
// run()) and `busy` (a plain post to a thread that never sleeps); the thread-per-stream baselines.
//
// CPU: for evr, the reactor thread's CPU clock, plus for posted rows the io thread's outside the
// user's work (its handler's launches): every thread evr adds or wakes, over back-to-back work; for
// the thread-per-stream baselines, the waiting threads' CPU clocks summed over their waits (the
// driver's host-function thread, which runs host functions for the host_func rows, is not
// counted: it belongs to the driver).
//
// Files: idle_lanes.hpp (workloads, lanes, the gate opener), idle_rows (one row per way of
// waiting), idle_report (tables, goals, JSON), this file (the command line and the sweep).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <evr/evr.hpp>

#include "bench_device.hpp"
#include "cli.hpp"
#include "cpu_case.hpp"
#include "idle_lanes.hpp"
#include "idle_report.hpp"
#include "idle_rows.hpp"
#include "methods.hpp"
#include "stats.hpp"
#include "subcommands.hpp"

namespace evr::bench {
namespace {

/// "NAME:key=value,key=value": the default's options with some changed, as an extra method named
/// "evr default, NAME" (tuning runs compare them with the default in one run). Keys: strategy,
/// idle, prespin_us, final_sleep_us, coalesce_us, poll_period_us, spin_fraction, poll_budget,
/// poll_looks (per second), spin_window_us, max_sleep_us, doorbell_after_us, fence_streams (a
/// number, or "unlimited"), host_events (0 or 1: reactor_options::host_event_waits), kernel_fences
/// (0 or 1: reactor_options::kernel_fences), host_pass_us
/// (reactor_options::host_pass_deliver_after).
/// Throws std::invalid_argument naming what is wrong.
evr_method parse_variant(const std::string& spec) {
  const std::size_t colon = spec.find(':');
  if (colon == 0 || colon == std::string::npos || colon + 1 == spec.size())
    throw std::invalid_argument("--variant '" + spec + "': expected NAME:key=value[,key=value]");
  evr_method m{"default-" + spec.substr(0, colon), "evr default, " + spec.substr(0, colon), {}};
  std::size_t at = colon + 1;
  while (at < spec.size()) {
    std::size_t comma = spec.find(',', at);
    if (comma == std::string::npos) comma = spec.size();
    const std::string kv = spec.substr(at, comma - at);
    at = comma + 1;
    const std::size_t eq = kv.find('=');
    if (eq == std::string::npos)
      throw std::invalid_argument("--variant '" + spec + "': '" + kv + "' is not key=value");
    const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
    auto number = [&] {
      std::size_t used = 0;
      double v = 0;
      try {
        v = std::stod(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != value.size() || v < 0)
        throw std::invalid_argument("--variant '" + spec + "': " + key +
                                    " takes a number >= 0, not '" + value + "'");
      return v;
    };
    auto us = [&] { return nanoseconds(static_cast<std::int64_t>(number() * 1000)); };
    reactor_options& o = m.options;
    if (key == "strategy") {
      auto v = strategy_from_string(value);
      if (!v) throw std::invalid_argument("--variant '" + spec + "': no strategy '" + value + "'");
      o.strategy = *v;
    } else if (key == "idle") {
      auto v = idle_mode_from_string(value);
      if (!v) throw std::invalid_argument("--variant '" + spec + "': no idle mode '" + value + "'");
      o.idle = *v;
    } else if (key == "prespin_us") {
      o.prespin = us();
    } else if (key == "final_sleep_us") {
      o.final_sleep = us();
    } else if (key == "coalesce_us") {
      o.coalesce = us();
    } else if (key == "poll_period_us") {
      o.poll_period = us();
    } else if (key == "spin_window_us") {
      o.spin_window = us();
    } else if (key == "max_sleep_us") {
      o.max_sleep = us();
    } else if (key == "doorbell_after_us") {
      o.doorbell_after = us();
    } else if (key == "spin_fraction") {
      o.spin_fraction = number();
    } else if (key == "poll_budget") {
      o.poll_budget = number();
    } else if (key == "poll_looks") {
      o.poll_looks_per_second = static_cast<std::size_t>(number());
    } else if (key == "host_events") {
      o.host_event_waits = number() != 0;
    } else if (key == "host_pass_us") {
      o.host_pass_deliver_after = us();
    } else if (key == "kernel_fences") {
      o.kernel_fences = number() != 0;
    } else if (key == "fence_streams") {
      o.max_fence_streams = value == "unlimited" ? SIZE_MAX : static_cast<std::size_t>(number());
    } else {
      throw std::invalid_argument("--variant '" + spec + "': unknown key '" + key + "'");
    }
  }
  return m;
}

struct idle_settings_cli {
  std::string device = "auto";
  std::vector<double> lengths_us{20, 200, 1000, 5000, 20000};
  std::vector<int> lanes{1, 64};
  /// Streams launched together each round (workload::lockstep), and their steady lengths.
  std::vector<int> lockstep_lanes{16, 64};
  std::vector<double> lockstep_lengths_us{1000, 5000, 20000};
  bool lockstep = true;
  double jitter = 0.05;
  double scale = 1.0;
  bool steady = true;
  bool irregular = true;
  bool idle_case = true;
  std::vector<std::string> methods{"default",    "signal", "fence-spin",    "poll-spin",
                                   "host_func",  "ladder", "blocking-sync", "host-func-promise",
                                   "stream-sync"};
  bool posted = true;
  std::vector<std::string> deliveries{"post", "woken", "plain", "busy"};
  int floor_samples = 300;
  std::string json;
};

/// Samples measured per workload (before --scale): enough jobs for p99 within a few seconds.
int default_samples(const workload& w) {
  if (w.lockstep) return 1280;  // at least 20 rounds of 64 streams
  if (w.lanes > 1) return 640;
  const double mean = w.mean_us();
  if (mean <= 50) return 1000;
  if (mean <= 500) return 600;
  if (mean <= 2000) return 300;
  if (mean <= 10000) return 150;
  return 60;
}

/// For `lanes` streams: the steady `lengths_us`, then (when `irregular`) uniform and bimodal work.
void add_workloads(std::vector<workload>& out, int lanes, bool lockstep,
                   const std::vector<double>& lengths_us, bool irregular, double jitter) {
  for (double d : lengths_us) {
    workload w;
    w.kind = workload::shape::steady;
    w.d_us = d;
    w.jitter = jitter;
    w.lanes = lanes;
    w.lockstep = lockstep;
    out.push_back(w);
  }
  if (!irregular) return;
  workload u;
  u.kind = workload::shape::uniform;
  u.lanes = lanes;
  u.lockstep = lockstep;
  out.push_back(u);
  workload b;
  b.kind = workload::shape::bimodal;
  b.jitter = jitter;
  b.lanes = lanes;
  b.lockstep = lockstep;
  out.push_back(b);
}

std::vector<workload> workloads(const idle_settings_cli& cfg) {
  std::vector<workload> out;
  const std::vector<double> none;
  for (int lanes : cfg.lanes)
    add_workloads(out, lanes, /*lockstep=*/false, cfg.steady ? cfg.lengths_us : none, cfg.irregular,
                  cfg.jitter);
  for (int lanes : cfg.lockstep ? cfg.lockstep_lanes : std::vector<int>{})
    add_workloads(out, lanes, /*lockstep=*/true, cfg.steady ? cfg.lockstep_lengths_us : none,
                  cfg.irregular, cfg.jitter);
  for (auto& w : out)
    w.samples = std::max(20, static_cast<int>(std::lround(default_samples(w) * cfg.scale)));
  return out;
}

}  // namespace

int idle_main(int argc, char** argv) {
  idle_settings_cli cfg;
  CLI::App app{
      "GPU work of the lengths users run (20 us..20 ms, steady and irregular, 1 and 64 streams "
      "each in its own loop, 16 and 64 in lockstep): "
      "how late each way of waiting finds it (ratio to the floor of the same run) and the CPU it "
      "costs; plus 1000 waits on a 100 ms kernel and the idle reactor.",
      "evr-bench idle"};
  app.add_option("--device", cfg.device, "cuda, sim or auto")
      ->check(CLI::IsMember({"auto", "cuda", "sim"}))
      ->capture_default_str();
  app.add_option("--lengths-us", cfg.lengths_us, "steady work lengths, us")
      ->check(CLI::Range(1.0, 1e6))
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--streams", cfg.lanes, "stream counts (one closed loop per stream)")
      ->check(CLI::Range(1, 256))
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--lockstep-streams", cfg.lockstep_lanes,
                 "stream counts launched together each round, the next round once all were seen "
                 "done (a burst of requests: every window overlaps)")
      ->check(CLI::Range(2, 256))
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--lockstep-lengths-us", cfg.lockstep_lengths_us,
                 "steady work lengths of the lockstep workloads, us")
      ->check(CLI::Range(1.0, 1e6))
      ->delimiter(',')
      ->capture_default_str();
  app.add_flag("!--no-lockstep", cfg.lockstep, "skip the lockstep workloads");
  app.add_option("--jitter", cfg.jitter, "steady work: +- this fraction of the length")
      ->check(CLI::Range(0.0, 0.5))
      ->capture_default_str();
  app.add_option("--scale", cfg.scale, "multiplies the samples per workload")
      ->check(CLI::Range(0.001, 100.0))
      ->capture_default_str();
  app.add_option("--methods", cfg.methods,
                 "default, signal (the default, the kernel signalling a slot), graph-signal (the "
                 "default, a CUDA graph whose last node signals: library work), fence-spin, "
                 "poll-spin, host_func, ladder, blocking-sync, host-func-promise, stream-sync")
      ->check(CLI::IsMember({"default", "signal", "graph-signal", "fence-spin", "poll-spin",
                             "host_func", "ladder", "blocking-sync", "host-func-promise",
                             "stream-sync"}))
      ->delimiter(',')
      ->capture_default_str();
  app.add_flag("!--no-steady", cfg.steady, "skip the steady workloads (--lengths-us)");
  app.add_flag("!--no-irregular", cfg.irregular, "skip the uniform and bimodal workloads");
  app.add_flag("!--no-idle-case", cfg.idle_case, "skip 1000 waits on a 100 ms kernel + idle");
  app.add_flag("!--no-posted", cfg.posted, "evr rows: inline delivery only");
  app.add_option("--deliveries", cfg.deliveries,
                 "posted rows of the default: post (the default delivery), woken, plain (a plain "
                 "post to a parked thread), busy (to a thread that never sleeps); other methods "
                 "get post only")
      ->check(CLI::IsMember({"post", "woken", "plain", "busy"}))
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--floor-samples", cfg.floor_samples, "samples of the floor")
      ->check(CLI::Range(10, 100000))
      ->capture_default_str();
  std::vector<std::string> variants;
  app.add_option(
      "--variant", variants,
      "NAME:key=value[,key=value]: also the default with these options changed (keys: "
      "strategy, idle, prespin_us, final_sleep_us, coalesce_us, poll_period_us, "
      "spin_fraction, poll_budget, poll_looks, spin_window_us, "
      "max_sleep_us, doorbell_after_us, fence_streams, host_events, kernel_fences, host_pass_us); "
      "repeatable");
  app.add_option("--json", cfg.json, "write the results here");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  std::vector<evr_method> extra;
  try {
    for (const auto& v : variants) extra.push_back(parse_variant(v));
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s\nRun with --help for more information.\n", e.what());
    return 2;
  }

  auto dev = make_bench_device(cfg.device);
  auto wanted = [&](const std::string& key) {
    return std::find(cfg.methods.begin(), cfg.methods.end(), key) != cfg.methods.end();
  };
  std::vector<evr_method> methods;
  for (auto& m : evr_methods())
    if (wanted(m.key)) methods.push_back(m);
  methods.insert(methods.end(), extra.begin(), extra.end());
  std::vector<baseline> baselines;
  if (wanted("blocking-sync"))
    baselines.push_back({"blocking-sync",
                         "cudaEventSynchronize, blocking-sync event (thread per stream)",
                         baseline::how::blocking_sync_event});
  if (wanted("host-func-promise"))
    baselines.push_back({"host-func-promise",
                         "cudaLaunchHostFunc + std::promise (thread per stream)",
                         baseline::how::host_func_promise});
  if (wanted("stream-sync"))
    baselines.push_back({"stream-sync", "cudaStreamSynchronize (thread per stream)",
                         baseline::how::stream_synchronize});

  const auto started = bench_clock::now();
  std::fprintf(stderr, "idle on %s\n", dev->describe().c_str());
  std::fprintf(stderr, "[floor] %d samples\n", cfg.floor_samples);
  const series floor = measure_floor(*dev, cfg.floor_samples);
  std::fprintf(stderr, "  floor p50 %.2f us, p99 %.2f us\n", floor.p50() / 1000,
               floor.p99() / 1000);

  const std::vector<workload> list = workloads(cfg);
  int max_lanes = 1;
  for (const workload& w : list) max_lanes = std::max(max_lanes, w.lanes);
  dev->reserve_gates(static_cast<std::size_t>(max_lanes) + 1);
  std::vector<scenario_result> results;
  std::uint64_t seed = 12345;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const workload& w = list[i];
    std::fprintf(stderr, "[%zu/%zu] %s, %d samples per row\n", i + 1, list.size(), w.name().c_str(),
                 w.samples);
    scenario_result sr{w, {}, 0};
    const auto t0 = bench_clock::now();
    std::vector<std::unique_ptr<lane>> lanes;
    for (int k = 0; k < w.lanes; ++k)
      lanes.push_back(
          std::make_unique<lane>(dev->backend(), static_cast<std::size_t>(k) + 1, ++seed));
    auto report = [&](const row_result& r) {
      const series s{r.name, r.group, r.samples};
      std::fprintf(stderr, "  %-60s %-7s p50 %9.2f us  p99 %9.2f us  CPU %6.1f%%%s\n",
                   r.name.c_str(), r.delivery.c_str(), s.p50() / 1000, s.p99() / 1000,
                   r.cpu_percent(), r.failed ? "  (ERRORS)" : "");
      if (r.group == "evr") {
        const auto late = std::count_if(r.samples.begin(), r.samples.end(),
                                        [](double ns) { return ns > 50'000; });
        std::fprintf(stderr,
                     "    found >50 us late: %zu; reactor sleeps that woke >=64 us late: %llu "
                     "(latest < %.0f us); fault probes >=64 us: %llu (longest < %.0f us)\n",
                     static_cast<std::size_t>(late),
                     static_cast<unsigned long long>(at_least(r.nap_overshoot, 65'536)),
                     r.nap_overshoot.quantile_upper_ns(1.0) / 1000.0,
                     static_cast<unsigned long long>(at_least(r.probe_time, 65'536)),
                     r.probe_time.quantile_upper_ns(1.0) / 1000.0);
        const double n = std::max<double>(1, static_cast<double>(r.samples.size()));
        const double s = std::max(1e-9, r.wall_ns / 1e9);
        std::fprintf(stderr,
                     "    per completion: %.1f sweeps, %.1f event queries, %.2f sleeps; sweeps/s "
                     "%.0f; prediction misses %llu; CPU: reactor %.1f%%, other threads %.1f%%\n",
                     static_cast<double>(r.sweeps) / n, static_cast<double>(r.event_queries) / n,
                     static_cast<double>(r.naps) / n, static_cast<double>(r.sweeps) / s,
                     static_cast<unsigned long long>(r.misses), r.reactor_cpu_percent(),
                     r.cpu_percent() - r.reactor_cpu_percent());
        if (r.host_passes > 0)
          std::fprintf(stderr,
                       "    io thread's own passes: %.1f per completion, found %.0f%%; reactor "
                       "slept for the pass lock %llu times\n",
                       static_cast<double>(r.host_passes) / n,
                       100.0 * static_cast<double>(r.host_completions) / n,
                       static_cast<unsigned long long>(r.pass_lock_sleeps));
      }
      sr.rows.push_back(r);
    };
    report(run_floor(*dev, lanes, w));
    for (const auto& m : methods) {
      report(run_evr_inline(*dev, lanes, w, m));
      if (!cfg.posted) continue;
      for (io_delivery how : {io_delivery::post, io_delivery::post_woken, io_delivery::post_plain,
                              io_delivery::post_plain_busy}) {
        const bool listed = std::find(cfg.deliveries.begin(), cfg.deliveries.end(),
                                      to_string(how)) != cfg.deliveries.end();
        if (listed && (m.key == "default" || how == io_delivery::post))
          report(run_evr_posted(*dev, lanes, w, m, how));
      }
    }
    for (const auto& b : baselines) report(run_baseline(*dev, lanes, w, b));
    sr.seconds = ns_between(t0, bench_clock::now()) / 1e9;
    results.push_back(std::move(sr));
  }

  std::vector<cpu_case_row> cpu_rows;
  if (cfg.idle_case) {
    std::fprintf(stderr, "[idle case] 1000 waits on a 100 ms kernel, then 1 s idle\n");
    cpu_rows = measure_cpu_case(*dev, methods, 1000, 100000);
  }

  // ---- report -----------------------------------------------------------------------------------
  print_tables(dev->describe(), floor, results, cpu_rows);
  const std::string goals = evaluate_goals(results, floor, cpu_rows);
  std::printf("\nidle: done in %.0f s\n", ns_between(started, bench_clock::now()) / 1e9);
  if (!cfg.json.empty())
    write_json(cfg.json, dev->describe(), dev->name(), floor, results, cpu_rows, goals);
  return 0;
}

}  // namespace evr::bench

int evr_bench_idle(int argc, char** argv) { return evr::bench::idle_main(argc, argv); }