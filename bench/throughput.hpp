// bench/throughput.hpp — what the measurements of `evr-bench throughput` share: the settings, the
// run's device and streams, the rows each measurement returns, and the measurements themselves:
//   throughput_drains.cpp  sustained submission and the burst drain (the GPU's pace), with the
//                          poller baselines, and how deep a stream's queue of markers may get
//   throughput_ready.cpp   the ready drain: the reactor's own cost per completion
//   throughput_memory.cpp  memory per in-flight wait
//   throughput_report.cpp  the tables and the JSON
//   throughput_bench.cpp   the command lines of `throughput` and `cpu`, and the order of the run
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <evr/evr.hpp>

#include "bench_device.hpp"

namespace evr::bench {

struct tp_settings {
  std::string device = "auto";
  int streams = 64;
  int ops = 100000;
  int threads = 4;
  int inflight_streams = 128;  // per memory row (2048 gated streams in all blocked the H100 run)
  /// Per memory row. The five rows stay pending together behind closed gates: 100 000 in all, as
  /// many as one row had when it was alone. With 100 000 per row (500 000 queued records) the
  /// H100's driver blocked the enqueuing thread in the second row until the run timed out.
  int inflight_waits = 20000;
  double coalesce_us = 100;   ///< the burst drain's extra rows with reactor_options::coalesce
  int max_fence_streams = 0;  ///< reactor_options::max_fence_streams of the evr rows (0: backend's)
  std::string json;
};

/// What every measurement of one run shares.
struct tp_run {
  const tp_settings& cfg;
  bench_device& dev;
  device::backend& be;
  std::vector<evr::stream>& streams;  // cfg.streams streams of device 0
  /// The evr rows' options: the strategy, and the fence-stream limit asked for.
  reactor_options evr_options(strategy s) const {
    reactor_options opts;
    opts.strategy = s;
    opts.max_fence_streams = static_cast<std::size_t>(cfg.max_fence_streams);
    return opts;
  }
};

struct tp_row {
  std::string name;
  double seconds = 0;
  double per_second = 0;
  double poller_cpu_ns_per_completion = 0;
  /// evr rows of the burst drain: the reactor's busy time (metrics().busy_time) per completion:
  /// its own work, without the polling between completions. -1: not measured (baselines).
  double busy_ns_per_completion = -1;
  /// evr rows of the burst drain: event queries (driver calls) per completion. -1: not measured.
  double queries_per_completion = -1;
};

/// How deep a stream's queue of markers behind an unfinished kernel may get before the enqueue
/// itself blocks (8192: no limit found).
struct queue_depths {
  int fence = 0, record = 0;
};

struct burst_drain {
  std::vector<tp_row> rows;         // the evr strategies, the baselines, then coalesce's rows
  std::size_t first_coalesced = 0;  // the first of coalesce's rows
  int per_stream_round = 0;         // waits per stream per round
};

struct ready_row {
  std::string name;
  int streams = 0, waits = 0;
  double cpu_ns_per_completion = 0, queries_per_completion = 0, completions_per_second = 0;
};

struct memory_row {
  std::string name;
  double rss_bytes = 0, heap_bytes = -1;  // per in-flight wait; heap -1: no mallinfo2
};

/// One evr wait (plain callback on the reactor thread) whose completion bumps `done`.
void wait_counting(reactor& r, const evr::stream& s, std::atomic<std::uint64_t>& done);

/// cfg.ops waits (each behind a tiny kernel) from cfg.threads threads: each evr strategy, then
/// the poller baselines.
std::vector<tp_row> measure_sustained(const tp_run& run);
queue_depths measure_queue_depths(const tp_run& run);
/// Every wait submitted behind closed gates, then the gates opened at once, in rounds of at most
/// half the queue depth per stream.
burst_drain measure_burst_drain(const tp_run& run, const queue_depths& depths);
/// The reactor held while every marker completes, then released.
std::vector<ready_row> measure_ready_drain(const tp_run& run);
/// Many waits pending behind closed gates (poll: an event each), against the device alone.
std::vector<memory_row> measure_memory(const tp_run& run);

void print_throughput(const tp_run& run, const std::vector<tp_row>& rows,
                      const queue_depths& depths, const burst_drain& burst,
                      const std::vector<ready_row>& ready, const std::vector<memory_row>& memory);
void write_throughput_json(const tp_run& run, const std::vector<tp_row>& rows,
                           const queue_depths& depths, const burst_drain& burst,
                           const std::vector<ready_row>& ready,
                           const std::vector<memory_row>& memory);

}  // namespace evr::bench
