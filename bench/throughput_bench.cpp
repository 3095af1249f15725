// evr-bench throughput — S streams x N tiny operations, waits submitted from T threads:
// completions per second and reactor CPU time per completion, for each evr strategy and for two
// poller baselines; the reactor's own cost per completion when every marker is already done (the
// ready drain); then memory per in-flight wait. throughput.hpp lists the files of each part.
// evr-bench cpu — reactor CPU use while 1000 waits sit on a 100 ms kernel, and when idle.
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <evr/evr.hpp>

#include "bench_device.hpp"
#include "cli.hpp"
#include "cpu_case.hpp"
#include "methods.hpp"
#include "stats.hpp"
#include "subcommands.hpp"
#include "throughput.hpp"

namespace evr::bench {
namespace {

void add_throughput_options(CLI::App& app, tp_settings& s) {
  app.add_option("--streams", s.streams, "streams")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--ops", s.ops, "waits per run")
      ->check(CLI::Range(1, 100000000))
      ->capture_default_str();
  app.add_option("--threads", s.threads, "submitting threads")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--inflight-streams", s.inflight_streams, "streams of the bytes-per-wait run")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--inflight-waits", s.inflight_waits, "waits of the bytes-per-wait run")
      ->check(CLI::Range(1, 100000000))
      ->capture_default_str();
  app.add_option("--coalesce-us", s.coalesce_us,
                 "burst drain: also fence, poll and adaptive with reactor_options::coalesce of "
                 "this many us (0: no such rows)")
      ->check(CLI::Range(0.0, 100000.0))
      ->capture_default_str();
  app.add_option("--max-fence-streams", s.max_fence_streams,
                 "reactor_options::max_fence_streams of the evr rows: busy streams per device "
                 "up to which waits get fence markers, events beyond (0: the backend's number "
                 "of hardware queues; the simulated device has no limit)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
}

/// The command line of `throughput` (cpu == false) or `cpu`; returns -1 to run, else the exit
/// code.
int parse(int argc, char** argv, bool cpu, tp_settings& s) {
  CLI::App app{cpu ? "reactor CPU while waits sit on a 100 ms kernel, and when idle"
                   : "completions per second and reactor CPU per completion, sustained and in a "
                     "burst; bytes per in-flight wait",
               cpu ? "evr-bench cpu" : "evr-bench throughput"};
  add_device_option(app, s.device);
  add_json_option(app, s.json);
  if (cpu) {
    s.ops = 1000;
    app.add_option("--waits", s.ops, "waits on the long kernel")
        ->check(CLI::Range(1, 10000000))
        ->capture_default_str();
  } else {
    add_throughput_options(app, s);
  }
  return parse_cli(app, argc, argv);
}

}  // namespace

int throughput_main(int argc, char** argv) {
  tp_settings cfg;
  if (int rc = parse(argc, argv, false, cfg); rc >= 0) return rc;
  auto dev = make_bench_device(cfg.device);
  device::backend& be = dev->backend();
  std::fprintf(stderr, "throughput on %s: %d streams x %d ops from %d threads\n",
               dev->describe().c_str(), cfg.streams, cfg.ops, cfg.threads);
  std::vector<evr::stream> streams;
  for (int i = 0; i < cfg.streams; ++i) streams.emplace_back(be, 0);
  const tp_run run{cfg, *dev, be, streams};
  const std::vector<tp_row> rows = measure_sustained(run);
  const queue_depths depths = measure_queue_depths(run);
  const burst_drain burst = measure_burst_drain(run, depths);
  const std::vector<ready_row> ready = measure_ready_drain(run);
  const std::vector<memory_row> memory = measure_memory(run);
  print_throughput(run, rows, depths, burst, ready, memory);
  if (!cfg.json.empty()) write_throughput_json(run, rows, depths, burst, ready, memory);
  return 0;
}

int cpu_main(int argc, char** argv) {
  tp_settings cfg;
  if (int rc = parse(argc, argv, true, cfg); rc >= 0) return rc;
  const int waits = cfg.ops;
  auto dev = make_bench_device(cfg.device);
  std::fprintf(stderr, "cpu on %s: %d waits on a 100 ms kernel, then 1 s idle\n",
               dev->describe().c_str(), waits);
  const std::vector<cpu_case_row> rows = measure_cpu_case(*dev, evr_methods(), waits, 100000);
  std::printf("\ncpu: reactor thread CPU while %d waits sit on a 100 ms kernel, and idle (%s)\n",
              waits, dev->describe().c_str());
  std::printf("%-44s %18s %14s %18s\n", "method", "busy % of a core", "idle % core",
              "idle wake-ups/s");
  for (auto& r : rows)
    std::printf("%-44s %18.2f %14.3f %18.0f\n", r.name.c_str(), r.busy_percent, r.idle_percent,
                r.idle_wakeups_per_s);
  if (!cfg.json.empty()) {
    std::FILE* f = std::fopen(cfg.json.c_str(), "w");
    if (f == nullptr) throw std::runtime_error("cannot write " + cfg.json);
    json_writer j(f);
    j.raw("{\"subcommand\":\"cpu\",\"device\":" + json_writer::quote(dev->describe()) +
          ",\"backend\":" + json_writer::quote(dev->name()) +
          ",\"waits\":" + std::to_string(waits) + ",\"rows\":" + cpu_case_json(rows) + "}\n");
    std::fclose(f);
  }
  return 0;
}

}  // namespace evr::bench

int evr_bench_throughput(int argc, char** argv) { return evr::bench::throughput_main(argc, argv); }

int evr_bench_cpu(int argc, char** argv) { return evr::bench::cpu_main(argc, argv); }
