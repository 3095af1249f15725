// bench/budget.cpp — the watchdog behind evr-bench's time budget (budget.hpp).
#include "budget.hpp"

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <utility>

namespace evr::bench {

struct budget_state {
  std::mutex mutex;
  std::condition_variable stop_requested;
  bool stopping = false;
  row_scope* innermost = nullptr;
  std::thread watchdog;

  ~budget_state() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    stop_requested.notify_all();
    if (watchdog.joinable()) watchdog.join();
  }

  void expire(const std::string& subcommand, std::chrono::seconds budget) {
    // Under the mutex: the row cannot end (and its progress function go away) while it is read.
    std::string row = "(before its first row)", progress;
    if (innermost != nullptr) {
      row = innermost->name_;
      if (innermost->progress_) progress = innermost->progress_();
    }
    std::fprintf(stderr,
                 "evr-bench %s: over its budget of %lld s, still in row: %s%s%s\n"
                 "evr-bench %s: stopping (exit status %d)\n",
                 subcommand.c_str(), static_cast<long long>(budget.count()), row.c_str(),
                 progress.empty() ? "" : "\n  progress: ", progress.c_str(), subcommand.c_str(),
                 over_budget_status);
    std::fflush(stdout);
    std::fflush(stderr);
    // The row's threads may be stuck for good: nothing can be joined or destroyed safely.
    std::_Exit(over_budget_status);
  }
};

namespace {
budget_state& state() {
  static budget_state s;
  return s;
}
}  // namespace

void start_budget(const std::string& subcommand, std::chrono::seconds budget) {
  if (budget.count() <= 0) return;
  budget_state& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.watchdog.joinable()) return;
  const auto deadline = std::chrono::steady_clock::now() + budget;
  s.watchdog = std::thread([&s, subcommand, budget, deadline] {
    std::unique_lock<std::mutex> lock(s.mutex);
    if (!s.stop_requested.wait_until(lock, deadline, [&] { return s.stopping; }))
      s.expire(subcommand, budget);
  });
}

row_scope::row_scope(std::string name, std::function<std::string()> progress)
    : outer_(nullptr), name_(std::move(name)), progress_(std::move(progress)) {
  budget_state& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  outer_ = s.innermost;
  s.innermost = this;
}

row_scope::~row_scope() {
  budget_state& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.innermost = outer_;
}

}  // namespace evr::bench
