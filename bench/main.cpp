// evr-bench: one binary, one subcommand per measurement (DESIGN.md, "Bench"). The table below is
// the only place that lists them.
#include <cstdio>
#include <cstring>
#include <exception>

#include "subcommands.hpp"

namespace {

struct subcommand {
  const char* name;
  int (*run)(int argc, char** argv);
  const char* summary;
};

constexpr subcommand subcommands[] = {
    {"latency", evr_bench_latency,
     "GPU done -> handler: evr strategies x deliveries vs floor and baselines"},
    {"throughput", evr_bench_throughput,
     "completions/s and reactor CPU ns per completion; bytes per in-flight wait"},
    {"pool", evr_bench_pool,
     "acquire+release pairs/s of evr's event pool vs mutex pools, 1..16 threads"},
    {"cpu", evr_bench_cpu, "reactor CPU while 1000 waits sit on a 100 ms kernel, and when idle"},
    {"idle", evr_bench_idle,
     "work of 20 us..20 ms, steady and irregular, 1 and 64 streams: latency vs CPU per strategy"},
    {"sim", evr_bench_sim,
     "the simulated device's own cost: ns per enqueue and per completion; reactor on it"},
    {"calls", evr_bench_calls,
     "host ns per device call on a wait's path (query, record, fence write) and per submit"},
    {"timer", evr_bench_timer,
     "how late this machine's timed sleeps end (the host's share of the idle policy's tail)"},
};

int usage(std::FILE* out, int code) {
  std::fprintf(out,
               "usage: evr-bench <subcommand> [options]   (evr-bench <subcommand> --help for its "
               "options)\n\n"
               "subcommands:\n");
  for (const subcommand& s : subcommands) std::fprintf(out, "  %-12s %s\n", s.name, s.summary);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage(stderr, 2);
  if (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    return usage(stdout, 0);
  }
  for (const subcommand& s : subcommands) {
    if (std::strcmp(argv[1], s.name) != 0) continue;
    // One place reports what a subcommand throws (a device that fails, a file that cannot be
    // written): its message, named by the subcommand, and exit status 1.
    try {
      return s.run(argc - 1, argv + 1);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "evr-bench %s: %s\n", s.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "evr-bench: unknown subcommand '%s'\n\n", argv[1]);
  return usage(stderr, 2);
}
