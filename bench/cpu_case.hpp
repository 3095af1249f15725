// bench/cpu_case.hpp — the reactor's CPU while many waits sit on one long kernel, and while idle
// (shared by `evr-bench cpu` and `evr-bench idle`).
#pragma once

#include <string>
#include <vector>

#include "bench_device.hpp"
#include "methods.hpp"

namespace evr::bench {

struct cpu_case_row {
  std::string key, name;
  double busy_percent = 0;        ///< reactor thread CPU / wall while the waits pend
  double idle_percent = 0;        ///< reactor thread CPU / wall over 1 s with nothing pending
  double idle_wakeups_per_s = 0;  ///< sweeps + sleeps over that second
  std::uint64_t doorbells = 0;
};

/// For each method: `waits` waits on one stream behind a `kernel_us` kernel (the reactor's CPU
/// while they pend), then one idle second. Prints one line per method to stderr as it goes.
std::vector<cpu_case_row> measure_cpu_case(bench_device& dev,
                                           const std::vector<evr_method>& methods, int waits,
                                           unsigned kernel_us);

/// The JSON array of rows (for --json).
std::string cpu_case_json(const std::vector<cpu_case_row>& rows);

}  // namespace evr::bench
