// evr-bench: one binary, one subcommand per measurement (DESIGN.md, "Bench"). The table below is
// the only place that lists them.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "budget.hpp"
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

/// Every subcommand's time budget unless --budget-s says otherwise: far above what the largest
/// default sweep takes on a GPU (evr-bench idle: about 7 minutes), so that only a hang meets it.
constexpr long default_budget_s = 1800;

int usage(std::FILE* out, int code) {
  std::fprintf(out,
               "usage: evr-bench <subcommand> [--budget-s S] [options]   (evr-bench <subcommand> "
               "--help for its options)\n\n"
               "subcommands:\n");
  for (const subcommand& s : subcommands) std::fprintf(out, "  %-12s %s\n", s.name, s.summary);
  std::fprintf(out,
               "\n--budget-s S: when the subcommand has not finished after S seconds (default "
               "%ld, 0: no limit), it names the row it was in and exits with status %d\n",
               default_budget_s, evr::bench::over_budget_status);
  return code;
}

/// Takes `--budget-s S` (or `--budget-s=S`) out of the subcommand's arguments. Returns false, with
/// a message, for a value that is not a whole number of seconds >= 0.
bool take_budget(std::vector<char*>& args, long& seconds) {
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string arg = args[i];
    std::string value;
    std::size_t used = 1;
    if (arg == "--budget-s") {
      if (i + 1 >= args.size()) {
        std::fprintf(stderr, "evr-bench: --budget-s needs a number of seconds\n");
        return false;
      }
      value = args[i + 1];
      used = 2;
    } else if (arg.rfind("--budget-s=", 0) == 0) {
      value = arg.substr(11);
    } else {
      continue;
    }
    char* end = nullptr;
    seconds = std::strtol(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || seconds < 0) {
      std::fprintf(stderr, "evr-bench: --budget-s takes whole seconds >= 0, not '%s'\n",
                   value.c_str());
      return false;
    }
    args.erase(args.begin() + static_cast<std::ptrdiff_t>(i),
               args.begin() + static_cast<std::ptrdiff_t>(i + used));
    --i;
  }
  return true;
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
    std::vector<char*> args(argv + 1, argv + argc);
    long budget = default_budget_s;
    if (!take_budget(args, budget)) return 2;
    evr::bench::start_budget(s.name, std::chrono::seconds(budget));
    args.push_back(nullptr);  // argv[argc] is a null pointer
    // One place reports what a subcommand throws (a device that fails, a file that cannot be
    // written): its message, named by the subcommand, and exit status 1.
    try {
      return s.run(static_cast<int>(args.size()) - 1, args.data());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "evr-bench %s: %s\n", s.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "evr-bench: unknown subcommand '%s'\n\n", argv[1]);
  return usage(stderr, 2);
}
