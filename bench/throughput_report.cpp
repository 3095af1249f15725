// bench/throughput_report.cpp — `evr-bench throughput`'s tables (stdout) and JSON (--json).
#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "stats.hpp"
#include "throughput.hpp"

namespace evr::bench {
namespace {

/// The four evr rows of the burst drain without coalesce (the first ones).
std::size_t evr_burst_rows(const burst_drain& burst) {
  return std::min<std::size_t>(4, burst.rows.size());
}

void print_burst(const tp_run& run, const burst_drain& burst) {
  std::printf(
      "burst drain: %d waits on %d streams submitted behind closed gates (rounds of %d per "
      "stream), then released at once\n",
      run.cfg.ops, run.cfg.streams, burst.per_stream_round);
  std::printf("%-42s %14s %22s %22s %14s\n", "method", "completions/s", "poller CPU ns/completion",
              "reactor busy ns/compl.", "queries/compl.");
  for (auto& r : burst.rows) {
    std::printf("%-42s %14.0f %22.1f", r.name.c_str(), r.per_second,
                r.poller_cpu_ns_per_completion);
    if (r.busy_ns_per_completion >= 0)
      std::printf(" %22.1f %14.3f\n", r.busy_ns_per_completion, r.queries_per_completion);
    else
      std::printf(" %22s %14s\n", "-", "-");
  }
  // The hot-path goal's figure (docs/architecture.md, "Where a wait's bytes and time go"): the
  // reactor's CPU from the gates' opening to the last completion, per completion, one figure
  // per evr row.
  auto print_evr_rows = [&](const char* what, double tp_row::*field) {
    std::printf("%s (burst drain):", what);
    for (std::size_t i = 0; i < evr_burst_rows(burst); ++i)
      std::printf("%s %s %.1f", i ? "," : "", burst.rows[i].name.c_str(), burst.rows[i].*field);
    std::printf("\n");
  };
  print_evr_rows("reactor CPU ns per completion", &tp_row::poller_cpu_ns_per_completion);
  // The same passes' own work, without the polling between completions (metrics().busy_time).
  print_evr_rows("reactor busy ns per completion", &tp_row::busy_ns_per_completion);
  if (burst.first_coalesced < burst.rows.size()) {
    std::printf("with coalesce, reactor CPU / busy ns per completion and completions/s:");
    for (std::size_t i = burst.first_coalesced; i < burst.rows.size(); ++i)
      std::printf("%s %s %.1f / %.1f, %.0f/s", i > burst.first_coalesced ? ";" : "",
                  burst.rows[i].name.c_str(), burst.rows[i].poller_cpu_ns_per_completion,
                  burst.rows[i].busy_ns_per_completion, burst.rows[i].per_second);
    std::printf("\n");
  }
}

void print_ready(const std::vector<ready_row>& ready) {
  std::printf(
      "\nready drain: every marker done before the held reactor is released; reactor CPU from the "
      "release to the last completion\n");
  std::printf("%-44s %8s %8s %14s %22s %14s\n", "method", "streams", "waits", "completions/s",
              "reactor CPU ns/compl.", "queries/compl.");
  for (auto& r : ready)
    std::printf("%-44s %8d %8d %14.0f %22.1f %14.3f\n", r.name.c_str(), r.streams, r.waits,
                r.completions_per_second, r.cpu_ns_per_completion, r.queries_per_completion);
  std::printf("reactor CPU ns per completion (ready drain):");
  for (std::size_t i = 0; i < ready.size(); ++i)
    std::printf("%s %s %.1f", i ? "," : "", ready[i].name.c_str(), ready[i].cpu_ns_per_completion);
  std::printf("\n");
}

void print_memory(const tp_run& run, const std::vector<memory_row>& memory) {
  std::printf("\nmemory per in-flight wait (poll: an event each; %d waits on %d streams)\n",
              run.cfg.inflight_waits, run.cfg.inflight_streams);
  std::printf("%-44s %14s %14s\n", "", "RSS delta B", "heap in use B");
  for (auto& m : memory)
    std::printf("%-44s %14.0f %14.0f\n", m.name.c_str(), m.rss_bytes, m.heap_bytes);
  if (memory.size() >= 3) {
    // evr's own: each evr row minus the device alone (the mean of the first and last rows).
    const double device_rss = (memory.front().rss_bytes + memory.back().rss_bytes) / 2;
    const double device_heap = (memory.front().heap_bytes + memory.back().heap_bytes) / 2;
    for (std::size_t i = 1; i + 1 < memory.size(); ++i) {
      std::printf("%s: evr's own (minus the device alone): RSS %.0f B, heap %.0f B per wait\n",
                  memory[i].name.c_str(), memory[i].rss_bytes - device_rss,
                  memory[i].heap_bytes - device_heap);
    }
  }
}

/// `[...]` of `rows`, each written by `one(row)` as `{...}`.
template <typename Row, typename One>
void json_array(json_writer& j, const std::vector<Row>& rows, One&& one) {
  for (std::size_t i = 0; i < rows.size(); ++i) j.raw(std::string(i ? "," : "") + one(rows[i]));
}

std::string json_row(const tp_row& r) {
  return "{\"name\":" + json_writer::quote(r.name) +
         ",\"seconds\":" + json_writer::number(r.seconds) +
         ",\"completions_per_second\":" + json_writer::number(r.per_second) +
         ",\"poller_cpu_ns_per_completion\":" + json_writer::number(r.poller_cpu_ns_per_completion);
}

std::string json_ready_row(const ready_row& r) {
  return "{\"name\":" + json_writer::quote(r.name) + ",\"streams\":" + std::to_string(r.streams) +
         ",\"waits_per_round\":" + std::to_string(r.waits) +
         ",\"completions_per_second\":" + json_writer::number(r.completions_per_second) +
         ",\"reactor_cpu_ns_per_completion\":" + json_writer::number(r.cpu_ns_per_completion) +
         ",\"event_queries_per_completion\":" + json_writer::number(r.queries_per_completion) + "}";
}

std::string json_memory_row(const memory_row& r) {
  return "{\"name\":" + json_writer::quote(r.name) +
         ",\"rss_bytes_per_inflight_wait\":" + json_writer::number(r.rss_bytes) +
         ",\"heap_bytes_per_inflight_wait\":" + json_writer::number(r.heap_bytes) + "}";
}

}  // namespace

void print_throughput(const tp_run& run, const std::vector<tp_row>& rows,
                      const queue_depths& depths, const burst_drain& burst,
                      const std::vector<ready_row>& ready, const std::vector<memory_row>& memory) {
  std::printf("\nthroughput: %d streams x %d ops, %d submitting threads (%s)\n", run.cfg.streams,
              run.cfg.ops, run.cfg.threads, run.dev.describe().c_str());
  std::printf("%-42s %14s %22s\n", "method", "completions/s", "poller CPU ns/completion");
  for (auto& r : rows)
    std::printf("%-42s %14.0f %22.1f\n", r.name.c_str(), r.per_second,
                r.poller_cpu_ns_per_completion);
  std::printf(
      "\nmarkers queued behind an unfinished kernel before the enqueue blocks: %d fence writes, "
      "%d event records (8192: no limit found)\n",
      depths.fence, depths.record);
  print_burst(run, burst);
  print_ready(ready);
  print_memory(run, memory);
}

void write_throughput_json(const tp_run& run, const std::vector<tp_row>& rows,
                           const queue_depths& depths, const burst_drain& burst,
                           const std::vector<ready_row>& ready,
                           const std::vector<memory_row>& memory) {
  const tp_settings& cfg = run.cfg;
  std::FILE* f = std::fopen(cfg.json.c_str(), "w");
  if (f == nullptr) throw std::runtime_error("cannot write " + cfg.json);
  json_writer j(f);
  j.raw("{\"subcommand\":\"throughput\",\"device\":" + json_writer::quote(run.dev.describe()) +
        ",\"backend\":" + json_writer::quote(run.dev.name()) +
        ",\"streams\":" + std::to_string(cfg.streams) + ",\"ops\":" + std::to_string(cfg.ops) +
        ",\"threads\":" + std::to_string(cfg.threads) +
        ",\"max_fence_streams\":" + std::to_string(cfg.max_fence_streams) + ",\"rows\":[");
  json_array(j, rows, [](const tp_row& r) { return json_row(r) + "}"; });
  j.raw("],\"drain_rows\":[");
  json_array(j, burst.rows, [](const tp_row& r) {
    return json_row(r) +
           ",\"reactor_busy_ns_per_completion\":" + json_writer::number(r.busy_ns_per_completion) +
           ",\"event_queries_per_completion\":" + json_writer::number(r.queries_per_completion) +
           "}";
  });
  j.raw("],\"ready_rows\":[");
  json_array(j, ready, json_ready_row);
  j.raw("],\"fence_queue_depth\":" + std::to_string(depths.fence) +
        ",\"record_queue_depth\":" + std::to_string(depths.record) +
        ",\"bytes_per_inflight_wait\":" + json_writer::number(memory[1].rss_bytes) +
        ",\"heap_bytes_per_inflight_wait\":" + json_writer::number(memory[1].heap_bytes) +
        ",\"memory_rows\":[");
  json_array(j, memory, json_memory_row);
  j.raw("],");
  auto json_evr_rows = [&](const char* key, double tp_row::*field) {
    j.raw(json_writer::quote(key) + ":{");
    for (std::size_t i = 0; i < evr_burst_rows(burst); ++i)
      j.raw(std::string(i ? "," : "") + json_writer::quote(burst.rows[i].name) + ":" +
            json_writer::number(burst.rows[i].*field));
    j.raw("}");
  };
  json_evr_rows("reactor_cpu_ns_per_completion_burst", &tp_row::poller_cpu_ns_per_completion);
  j.raw(",");
  json_evr_rows("reactor_busy_ns_per_completion_burst", &tp_row::busy_ns_per_completion);
  j.raw("}\n");
  std::fclose(f);
}

}  // namespace evr::bench
