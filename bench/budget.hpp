// bench/budget.hpp — every evr-bench subcommand runs within a time budget. A row that cannot
// finish (a wait that never completes, a thread that never wakes) must end the run with a named
// failure, not stall a test suite: when the budget is spent, a watchdog thread prints the
// subcommand, the row being measured and that row's progress, and ends the process with status 3.
//
//   evr-bench idle --budget-s 120 ...          (main.cpp takes --budget-s from any subcommand)
//
//   row_scope row("steady 200 us, 1 stream: evr default, post", [&] { return progress(); });
//
// Thread safety: row_scope may be made on any thread; the progress function is called on the
// watchdog's thread while its scope is alive, so it must only read what is safe to read from
// another thread (atomics, reactor::metrics()). Rows nest: the innermost open row is reported.
#pragma once

#include <chrono>
#include <functional>
#include <string>

namespace evr::bench {

/// The status a subcommand exits with when its budget is spent.
inline constexpr int over_budget_status = 3;

/// Starts the watchdog for `subcommand` (once per process). A budget of zero disables it.
void start_budget(const std::string& subcommand, std::chrono::seconds budget);

/// While alive, names the row being measured (and how far it got) for the budget's report.
class row_scope {
 public:
  explicit row_scope(std::string name, std::function<std::string()> progress = {});
  ~row_scope();
  row_scope(const row_scope&) = delete;
  row_scope& operator=(const row_scope&) = delete;

 private:
  row_scope* outer_;
  std::string name_;
  std::function<std::string()> progress_;
  friend struct budget_state;
};

}  // namespace evr::bench
