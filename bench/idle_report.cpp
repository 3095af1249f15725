// bench/idle_report.cpp — what `evr-bench idle` prints and writes (idle_report.hpp).
#include "idle_report.hpp"

#include <cstdio>
#include <stdexcept>

namespace evr::bench {
namespace {

const row_result* find_row(const scenario_result& s, const std::string& key,
                           const std::string& delivery) {
  for (const auto& r : s.rows)
    if (r.key == key && (delivery.empty() || r.delivery == delivery)) return &r;
  return nullptr;
}

/// A power-of-two histogram as a JSON array of counts (bucket i: [2^i, 2^(i+1)) ns).
std::string histogram_json(const latency_histogram& h) {
  std::vector<double> v(h.counts.begin(), h.counts.end());
  return json_writer::array(v);
}

std::string row_json(const row_result& r, const series& floor) {
  const series s{r.name, r.group, r.samples};
  return "{\"key\":" + json_writer::quote(r.key) + ",\"name\":" + json_writer::quote(r.name) +
         ",\"delivery\":" + json_writer::quote(r.delivery) +
         ",\"group\":" + json_writer::quote(r.group) +
         ",\"samples\":" + std::to_string(r.samples.size()) +
         ",\"p50_ns\":" + json_writer::number(s.p50()) +
         ",\"p90_ns\":" + json_writer::number(s.p90()) +
         ",\"p99_ns\":" + json_writer::number(s.p99()) +
         ",\"p50_over_floor\":" + json_writer::number(s.p50() / floor.p50()) +
         ",\"p99_over_floor_p99\":" + json_writer::number(s.p99() / floor.p99()) +
         ",\"cpu_percent\":" + json_writer::number(r.cpu_percent()) +
         ",\"cpu_ns_per_completion\":" + json_writer::number(r.cpu_per_completion()) +
         ",\"reactor_cpu_pct\":" + json_writer::number(r.reactor_cpu_percent()) +
         ",\"prediction_misses\":" + std::to_string(r.misses) +
         ",\"doorbells\":" + std::to_string(r.doorbells) +
         ",\"wakeups\":" + std::to_string(r.wakeups) + ",\"sweeps\":" + std::to_string(r.sweeps) +
         ",\"event_queries\":" + std::to_string(r.event_queries) +
         ",\"naps\":" + std::to_string(r.naps) +
         ",\"host_passes\":" + std::to_string(r.host_passes) +
         ",\"host_completions\":" + std::to_string(r.host_completions) +
         ",\"pass_lock_sleeps\":" + std::to_string(r.pass_lock_sleeps) +
         ",\"nap_overshoot_log2_ns\":" + histogram_json(r.nap_overshoot) +
         ",\"probe_time_log2_ns\":" + histogram_json(r.probe_time) +
         ",\"failed\":" + (r.failed ? "true" : "false") +
         ",\"samples_ns\":" + json_writer::array(r.samples) + "}";
}

/// The floor of a scenario (its "floor" row), or `fallback` when it has none.
series floor_of(const scenario_result& sc, const series& fallback) {
  for (const auto& r : sc.rows)
    if (r.key == "floor" && !r.samples.empty()) return series{r.name, r.group, r.samples};
  return fallback;
}

/// One goal line: met / missed and the numbers.
void goal(std::string& json, const std::string& what, bool met, const std::string& figures) {
  std::printf("  %-7s %s: %s\n", met ? "met" : "MISSED", what.c_str(), figures.c_str());
  if (json.size() > 1) json += ",";
  json += "{\"goal\":" + json_writer::quote(what) + ",\"met\":" + (met ? "true" : "false") +
          ",\"figures\":" + json_writer::quote(figures) + "}";
}

std::string fmt(const char* f, double a, double b = 0, double c = 0, double d = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, a, b, c, d);
  return buf;
}

/// The goals of the default's inline row (the reactor's own latency, issue 10).
template <typename Ratio>
void inline_goals(std::string& json, const scenario_result& sc, const row_result& d, Ratio ratio) {
  const workload& w = sc.w;
  const std::string where = w.name();
  if (w.kind == workload::shape::steady && w.lanes == 1 && w.d_us >= 200) {
    const double cap = w.d_us >= 1000 ? 12 : 25;
    goal(json, where + ": p50 <= 1.5x floor, p99 <= 3x floor p99, CPU <= " + fmt("%g", cap) + "%",
         ratio(d, 0.5) <= 1.5 && ratio(d, 0.99) <= 3 && d.cpu_percent() <= cap,
         fmt("p50 %.2fx, p99 %.2fx, CPU %.1f%%", ratio(d, 0.5), ratio(d, 0.99), d.cpu_percent()));
  } else if (w.kind == workload::shape::steady && w.lanes == 1 && w.d_us < 200) {
    goal(json, where + ": p50 <= 1.5x floor", ratio(d, 0.5) <= 1.5,
         fmt("p50 %.2fx (CPU %.1f%%)", ratio(d, 0.5), d.cpu_percent()));
  } else if (w.kind != workload::shape::steady) {
    // The better of host functions and blocking sync, in this run: evr host_func (inline) and
    // the two thread-per-stream baselines.
    double best50 = 0, best99 = 0;
    std::string best;
    for (const char* key : {"host_func", "host-func-promise", "blocking-sync"}) {
      const row_result* b = find_row(sc, key, key == std::string("host_func") ? "inline" : "");
      if (b == nullptr || b->samples.empty()) continue;
      const series s{"", "", b->samples};
      if (best.empty() || s.p50() < best50) best50 = s.p50();
      if (best.empty() || s.p99() < best99) best99 = s.p99();
      best += std::string(best.empty() ? "" : ", ") + key;
    }
    if (best.empty()) return;
    const series s{"", "", d.samples};
    goal(json, where + ": p50 and p99 <= the better of (" + best + "), CPU <= 25%",
         s.p50() <= best50 && s.p99() <= best99 && d.cpu_percent() <= 25,
         fmt("p50 %.1f us vs %.1f, p99 %.1f us vs %.1f", s.p50() / 1000, best50 / 1000,
             s.p99() / 1000, best99 / 1000) +
             fmt(", CPU %.1f%%", d.cpu_percent()));
  }
}

/// The goals of many streams in lockstep (issue 32), for the default's posted row `p`: the figure
/// users see, every thread evr adds or wakes counted.
template <typename Ratio>
void lockstep_goals(std::string& json, const scenario_result& sc, const row_result& p,
                    Ratio ratio) {
  const workload& w = sc.w;
  if (w.kind == workload::shape::steady) {
    if (w.d_us < 1000) return;
    goal(json,
         w.name() +
             ", posted: p50 <= 3x floor, p99 <= 15x floor p99, CPU <= 30% (reactor + io "
             "thread)",
         ratio(p, 0.5) <= 3 && ratio(p, 0.99) <= 15 && p.cpu_percent() <= 30,
         fmt("p50 %.2fx, p99 %.2fx, CPU %.1f%%", ratio(p, 0.5), ratio(p, 0.99), p.cpu_percent()));
    return;
  }
  const row_result* b = find_row(sc, "blocking-sync", "");
  if (b == nullptr || b->samples.empty() || w.lanes > 16) return;
  const series s{"", "", p.samples}, bs{"", "", b->samples};
  goal(json, w.name() + ", posted: p50 <= 1/2 and p99 <= 1/3 of blocking-sync (thread per stream)",
       s.p50() * 2 <= bs.p50() && s.p99() * 3 <= bs.p99(),
       fmt("p50 %.1f us vs %.1f, p99 %.1f us vs %.1f", s.p50() / 1000, bs.p50() / 1000,
           s.p99() / 1000, bs.p99() / 1000) +
           fmt(", CPU %.1f%%", p.cpu_percent()));
}

}  // namespace

std::uint64_t at_least(const latency_histogram& h, std::uint64_t ns) {
  std::uint64_t n = 0;
  for (int i = 0; i < latency_histogram::buckets; ++i)
    if ((std::uint64_t{1} << i) >= ns) n += h.counts[static_cast<std::size_t>(i)];
  return n;
}

std::string evaluate_goals(const std::vector<scenario_result>& results, const series& floor,
                           const std::vector<cpu_case_row>& cpu_rows) {
  std::string json = "[";
  std::printf(
      "\ngoals (default = evr default; \"inline\": on the reactor thread, \"post\": the default "
      "delivery to an io_context thread, the figure users see; ratios to the floor of the same "
      "workload, measured in this run)\n");
  for (const auto& sc : results) {
    const series fl = floor_of(sc, floor);
    auto ratio = [&](const row_result& r, double q) {
      const series s{"", "", r.samples};
      const double f = q == 0.5 ? fl.p50() : q == 0.9 ? fl.p90() : fl.p99();
      return (q == 0.5 ? s.p50() : q == 0.9 ? s.p90() : s.p99()) / f;
    };
    const workload& w = sc.w;
    const std::string where = w.name();
    const row_result* d = find_row(sc, "default", "inline");
    const row_result* p = find_row(sc, "default", "post");
    if (p != nullptr && p->samples.empty()) p = nullptr;
    if (d != nullptr && !d->samples.empty()) inline_goals(json, sc, *d, ratio);
    if (p == nullptr) continue;
    if (w.lockstep) {
      lockstep_goals(json, sc, *p, ratio);
      const row_result* sig = find_row(sc, "signal", "post");
      if (sig != nullptr && !sig->samples.empty() && w.kind == workload::shape::steady &&
          w.d_us >= 1000)
        goal(json, where + ", device-signalled, posted: p50 <= 2x floor, CPU <= 20%",
             ratio(*sig, 0.5) <= 2 && sig->cpu_percent() <= 20,
             fmt("p50 %.2fx, p99 %.2fx, CPU %.1f%%", ratio(*sig, 0.5), ratio(*sig, 0.99),
                 sig->cpu_percent()));
    } else if (w.kind == workload::shape::steady && w.lanes == 1 && w.d_us >= 200) {
      const double cap = w.d_us >= 1000 ? 15 : 30;
      goal(json,
           where + ", posted: p50 <= 2.5x floor, p90 <= 5x floor p90, CPU <= " + fmt("%g", cap) +
               "% (reactor + io thread)",
           ratio(*p, 0.5) <= 2.5 && ratio(*p, 0.9) <= 5 && p->cpu_percent() <= cap,
           fmt("p50 %.2fx, p90 %.2fx, CPU %.1f%%", ratio(*p, 0.5), ratio(*p, 0.9),
               p->cpu_percent()));
    } else if (w.kind == workload::shape::steady && w.lanes > 1 && w.d_us >= 1000) {
      goal(json, where + ", posted: p50 <= 4x floor, p99 <= 20x floor p99, CPU <= 35%",
           ratio(*p, 0.5) <= 4 && ratio(*p, 0.99) <= 20 && p->cpu_percent() <= 35,
           fmt("p50 %.2fx, p99 %.2fx, CPU %.1f%%", ratio(*p, 0.5), ratio(*p, 0.99),
               p->cpu_percent()));
    } else if (w.kind != workload::shape::steady) {
      const row_result* b = find_row(sc, "blocking-sync", "");
      if (b == nullptr || b->samples.empty()) continue;
      const series s{"", "", p->samples}, bs{"", "", b->samples};
      goal(json,
           where +
               ", posted: p50 <= 1/3 and p99 <= 1/2 of blocking-sync (thread per stream), "
               "CPU <= 30%",
           s.p50() * 3 <= bs.p50() && s.p99() * 2 <= bs.p99() && p->cpu_percent() <= 30,
           fmt("p50 %.1f us vs %.1f, p99 %.1f us vs %.1f", s.p50() / 1000, bs.p50() / 1000,
               s.p99() / 1000, bs.p99() / 1000) +
               fmt(", CPU %.1f%%", p->cpu_percent()));
    }
  }
  // 64 streams: CPU per completion no higher than with one stream, same work.
  for (const auto& many : results) {
    if (many.w.lanes == 1 || many.w.lockstep) continue;
    for (const auto& one : results) {
      if (one.w.lanes != 1 || one.w.kind != many.w.kind || one.w.d_us != many.w.d_us) continue;
      const row_result* a = find_row(one, "default", "inline");
      const row_result* b = find_row(many, "default", "inline");
      if (a == nullptr || b == nullptr || a->samples.empty() || b->samples.empty()) continue;
      goal(json, many.w.name() + ": CPU per completion <= 1 stream's",
           b->cpu_per_completion() <= a->cpu_per_completion(),
           fmt("%.0f ns vs %.0f ns", b->cpu_per_completion(), a->cpu_per_completion()));
    }
  }
  for (const auto& c : cpu_rows) {
    if (c.key != "default") continue;
    goal(json, "1000 waits on a 100 ms kernel: reactor CPU <= 2% of a core", c.busy_percent <= 2,
         fmt("%.2f%%", c.busy_percent));
    goal(json, "idle: 0 wake-ups per second", c.idle_wakeups_per_s == 0,
         fmt("%g wake-ups/s", c.idle_wakeups_per_s));
  }
  return json + "]";
}

void print_tables(const std::string& device, const series& floor,
                  const std::vector<scenario_result>& results,
                  const std::vector<cpu_case_row>& cpu_rows) {
  std::printf("\nidle: GPU work done -> handler, by work length (%s)\n", device.c_str());
  std::printf(
      "floor (kernel writes ack to mapped memory, host spins): p50 %.2f us, p90 %.2f us, "
      "p99 %.2f us\n",
      floor.p50() / 1000, floor.p90() / 1000, floor.p99() / 1000);
  for (const auto& sc : results) {
    const series fl = floor_of(sc, floor);
    std::printf("\n%s (%zu samples per row, %.1f s)\n", sc.w.name().c_str(),
                sc.rows.empty() ? std::size_t{0} : sc.rows.front().samples.size(), sc.seconds);
    std::printf("  %-58s %-8s %9s %9s %9s %7s %7s %7s %9s\n", "method", "delivery", "p50 us",
                "p90 us", "p99 us", "p50/fl", "p99/fl", "CPU %", "ns/compl");
    for (const auto& r : sc.rows) {
      const series s{r.name, r.group, r.samples};
      std::printf("  %-58s %-8s %9.2f %9.2f %9.2f %7.2f %7.2f %7.1f %9.0f%s\n", r.name.c_str(),
                  r.delivery.c_str(), s.p50() / 1000, s.p90() / 1000, s.p99() / 1000,
                  s.p50() / fl.p50(), s.p99() / fl.p99(), r.cpu_percent(), r.cpu_per_completion(),
                  r.failed ? "  ERRORS" : "");
    }
  }
  if (!cpu_rows.empty()) {
    std::printf("\n1000 waits on a 100 ms kernel (reactor CPU while they pend), then 1 s idle\n");
    std::printf("  %-44s %10s %10s %14s %10s\n", "method", "busy %", "idle %", "idle wake/s",
                "doorbells");
    for (const auto& c : cpu_rows)
      std::printf("  %-44s %10.2f %10.3f %14.0f %10llu\n", c.name.c_str(), c.busy_percent,
                  c.idle_percent, c.idle_wakeups_per_s,
                  static_cast<unsigned long long>(c.doorbells));
  }
}

void write_json(const std::string& path, const std::string& device, const std::string& backend,
                const series& floor, const std::vector<scenario_result>& results,
                const std::vector<cpu_case_row>& cpu_rows, const std::string& goals) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) throw std::runtime_error("cannot write " + path);
  json_writer j(f);
  j.raw("{\"subcommand\":\"idle\",\"device\":" + json_writer::quote(device) + ",\"backend\":" +
        json_writer::quote(backend) + ",\"floor\":{\"p50_ns\":" + json_writer::number(floor.p50()) +
        ",\"p90_ns\":" + json_writer::number(floor.p90()) +
        ",\"p99_ns\":" + json_writer::number(floor.p99()) + "},\"scenarios\":[");
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& sc = results[i];
    j.raw(std::string(i ? "," : "") + "{\"name\":" + json_writer::quote(sc.w.name()) +
          ",\"kind\":" + json_writer::quote(sc.w.kind_name()) + ",\"length_us\":" +
          json_writer::number(sc.w.kind == workload::shape::steady ? sc.w.d_us : sc.w.mean_us()) +
          ",\"streams\":" + std::to_string(sc.w.lanes) +
          ",\"lockstep\":" + (sc.w.lockstep ? "true" : "false") +
          ",\"seconds\":" + json_writer::number(sc.seconds) + ",\"rows\":[");
    for (std::size_t k = 0; k < sc.rows.size(); ++k)
      j.raw(std::string(k ? "," : "") + row_json(sc.rows[k], floor_of(sc, floor)));
    j.raw("]}");
  }
  j.raw("],\"cpu_case\":" + cpu_case_json(cpu_rows) + ",\"goals\":" + goals + "}\n");
  std::fclose(f);
}

}  // namespace evr::bench
