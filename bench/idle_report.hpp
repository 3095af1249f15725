// bench/idle_report.hpp — what `evr-bench idle` prints (tables per workload, the goals met or
// missed) and writes (--json: every sample, for scripts/study/bench-tables.py and plot-bench.py).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cpu_case.hpp"
#include "idle_lanes.hpp"
#include "stats.hpp"

namespace evr::bench {

/// One workload's rows.
struct scenario_result {
  workload w;
  std::vector<row_result> rows;
  double seconds = 0;
};

/// Samples of `h` at or above `ns` (bucket resolution: counts buckets starting at or above it).
std::uint64_t at_least(const latency_histogram& h, std::uint64_t ns);

/// The tables, one per workload.
void print_tables(const std::string& device, const series& floor,
                  const std::vector<scenario_result>& results,
                  const std::vector<cpu_case_row>& cpu_rows);

/// Prints each goal as met / missed with its figures; returns them as a JSON array.
std::string evaluate_goals(const std::vector<scenario_result>& results, const series& floor,
                           const std::vector<cpu_case_row>& cpu_rows);

/// Writes every row and sample, the idle case and the goals. Throws std::runtime_error when the
/// file cannot be written.
void write_json(const std::string& path, const std::string& device, const std::string& backend,
                const series& floor, const std::vector<scenario_result>& results,
                const std::vector<cpu_case_row>& cpu_rows, const std::string& goals);

}  // namespace evr::bench
