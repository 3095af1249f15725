#include "cpu_case.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include <evr/evr.hpp>

#include "budget.hpp"
#include "stats.hpp"

namespace evr::bench {

std::vector<cpu_case_row> measure_cpu_case(bench_device& dev,
                                           const std::vector<evr_method>& methods, int waits,
                                           unsigned kernel_us) {
  device::backend& be = dev.backend();
  std::vector<cpu_case_row> rows;
  evr::stream s(be, 0);
  for (const evr_method& m : methods) {
    if (m.signalled) continue;  // waits on a plain kernel: a signalled row would repeat its own
    reactor r(be, m.options);
    cpu_case_row row;
    row.key = m.key;
    row.name = m.name;
    std::atomic<int> done{0};
    row_scope scope(std::to_string(waits) + " waits on a " + std::to_string(kernel_us / 1000) +
                        " ms kernel, then 1 s idle: " + m.name,
                    [&] {
                      const reactor_metrics rm = r.metrics();
                      return std::to_string(done.load()) + " of " + std::to_string(waits) +
                             " completed; reactor: submitted " + std::to_string(rm.submitted) +
                             ", in flight " + std::to_string(rm.in_flight);
                    });
    dev.launch_busy(s.native(), kernel_us);
    const auto t0 = bench_clock::now();
    const auto c0 = r.cpu_time();
    for (int i = 0; i < waits; ++i)
      evr::throw_if(on_complete(r, s, [&](std::error_code) { done.fetch_add(1); }), "on_complete");
    while (done.load() < waits) std::this_thread::sleep_for(std::chrono::microseconds(200));
    const double wall = ns_between(t0, bench_clock::now());
    row.busy_percent = 100.0 * static_cast<double>((r.cpu_time() - c0).count()) / wall;
    row.doorbells = r.metrics().doorbells;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto m0 = r.metrics();
    const auto i0 = r.cpu_time();
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const auto m1 = r.metrics();
    row.idle_wakeups_per_s = static_cast<double>((m1.parks - m0.parks) + (m1.sweeps - m0.sweeps));
    row.idle_percent = 100.0 * static_cast<double>((r.cpu_time() - i0).count()) / 1e9;
    std::fprintf(stderr, "  %-44s busy %6.2f%%  idle %6.3f%%, %g wake-ups/s\n", row.name.c_str(),
                 row.busy_percent, row.idle_percent, row.idle_wakeups_per_s);
    rows.push_back(row);
  }
  return rows;
}

std::string cpu_case_json(const std::vector<cpu_case_row>& rows) {
  std::string out = "[";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    out += std::string(i ? "," : "") + "{\"key\":" + json_writer::quote(r.key) +
           ",\"name\":" + json_writer::quote(r.name) +
           ",\"busy_percent\":" + json_writer::number(r.busy_percent) +
           ",\"idle_percent\":" + json_writer::number(r.idle_percent) +
           ",\"idle_wakeups_per_second\":" + json_writer::number(r.idle_wakeups_per_s) +
           ",\"doorbells\":" + std::to_string(r.doorbells) + "}";
  }
  return out + "]";
}

}  // namespace evr::bench
