// The server's own counters and their rendering, with the reactor's, in the Prometheus text
// exposition format (version 0.0.4) for GET /metrics.
//
// Server metrics:
//   evr_server_info{mode,sync,device,strategy,threads,lanes,devices}  1
//   evr_server_requests_total{path,status}                  counter
//   evr_server_requests_in_flight                           gauge: heads read, responses not yet
//                                                           written
//   evr_server_connections                                  gauge: connections open
//   evr_server_lanes_leased                                 gauge: lanes taken by work
//   evr_server_request_memory_bytes{of}                     gauge: request buffers held ("used")
//                                                           and their budget ("limit")
//   evr_server_large_requests{state}                        gauge: large /saxpy and /sum
//                                                           "running" or "waiting" their turn
//   evr_server_connections_accepted_total                   counter
//   evr_server_connections_refused_total{reason}            counter: per_address, total (the
//                                                           server full, none idle), descriptors
//   evr_server_connections_evicted_total                    counter: idle ones closed for room
//   evr_server_request_duration_seconds{path}               histogram: head read -> response
//                                                           written
//   evr_server_gpu_wait_seconds{path}                       histogram: GPU work enqueued -> the
//                                                           request knows it is done (evr: the
//                                                           co_await; blocking: the synchronize)
//   evr_server_mlp_batch_rows                               histogram: rows per /mlp batch run
//   evr_server_checks_total{result}                         counter: answers compared with the CPU
//   evr_server_requests_abandoned_total{stage}              counter: requests left unanswered as
//                                                           their client left: queued (dropped
//                                                           before any GPU work) or running
// Reactor metrics (evr mode): evr_reactor_<counter>_total, evr_reactor_in_flight (gauge), and the
//   submit->deliver and detect->deliver histograms from the reactor's power-of-two buckets. The
//   reactor keeps counts per bucket but no sum of the samples, so their _sum is NaN ("unknown" in
//   the format) rather than an estimate; evr_server_gpu_wait_seconds has the exact sum.
//
// Every histogram has _bucket lines with increasing `le` (ending at +Inf), _sum and _count.
// Thread safety: every record_* and the gauge from any thread (relaxed atomics: statistics, not
// synchronization); render() from any thread (a snapshot whose lines may be a few requests apart).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include <evr/reactor/metrics.hpp>

/// A fixed-bucket histogram of non-negative values with their exact sum. The bucket bounds are
/// the caller's (the same array for every call of one histogram).
template <std::size_t Bounds>
class histogram {
 public:
  void record(const std::array<double, Bounds>& bounds, double v) noexcept;
  /// Appends the _bucket, _sum and _count lines of `name` with `labels` ("" or `path="/mlp"`).
  void render(const std::array<double, Bounds>& bounds, std::string& out, const char* name,
              std::string_view labels) const;

 private:
  std::array<std::atomic<std::uint64_t>, Bounds + 1> counts_{};  // last: above every bound
  std::atomic<double> sum_{0.0};
};

/// What happened to a connection at the door (connection_table.hpp).
enum class connection_event : std::uint8_t {
  accepted,
  refused_per_address,  ///< over --max-connections-per-address
  refused_total,        ///< over --max-connections with none idle to close
  refused_descriptors,  ///< the process ran out of descriptors
  evicted,              ///< an idle connection closed to make room
};

class server_metrics {
 public:
  /// Paths are a closed set so that a scanner requesting random URLs cannot grow the label space.
  static constexpr std::array<std::string_view, 8> paths = {
      "/saxpy", "/sum", "/busy", "/mlp", "/healthz", "/readyz", "/metrics", "other"};
  static constexpr std::array<int, 12> statuses = {200, 400, 404, 405, 408, 413,
                                                   422, 431, 500, 501, 503, 505};
  /// Upper bounds (seconds) of the latency buckets; +Inf is implied.
  static constexpr std::array<double, 18> latency_bounds = {
      25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3,
      25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0,  2.5,    5.0,  10.0};
  /// Upper bounds of the batch-size buckets (rows).
  static constexpr std::array<double, 11> batch_bounds = {1,  2,   4,   8,   16,  32,
                                                          64, 128, 256, 512, 1024};

  /// A response was written (or failed to be) for a request on `path`, `latency` after its head
  /// was read.
  void record(std::string_view path, int status, std::chrono::nanoseconds latency) noexcept;
  /// A request on `path` waited `latency` for its GPU work.
  void record_gpu_wait(std::string_view path, std::chrono::nanoseconds latency) noexcept;
  /// An /mlp batch of `rows` rows ran.
  void record_batch(std::size_t rows) noexcept;
  /// An answer was compared with the CPU's.
  void record_check(bool agreed) noexcept;
  /// A request got no answer because its client left (or the server stopped): while it was
  /// queued (dropped before any GPU work) or while its work ran.
  void record_abandoned(bool queued) noexcept {
    abandoned_[queued ? 0 : 1].fetch_add(1, std::memory_order_relaxed);
  }
  std::uint64_t abandoned(bool queued) const noexcept {
    return abandoned_[queued ? 0 : 1].load(std::memory_order_relaxed);
  }
  void record_connection(connection_event e) noexcept {
    connection_events_[static_cast<std::size_t>(e)].fetch_add(1, std::memory_order_relaxed);
  }
  std::uint64_t connections(connection_event e) const noexcept {
    return connection_events_[static_cast<std::size_t>(e)].load(std::memory_order_relaxed);
  }
  void request_started() noexcept { in_flight_.fetch_add(1, std::memory_order_relaxed); }
  void request_finished() noexcept { in_flight_.fetch_sub(1, std::memory_order_relaxed); }
  std::int64_t in_flight() const noexcept { return in_flight_.load(std::memory_order_relaxed); }

  /// Requests answered so far with a status in [lo, hi] (of the statuses listed above).
  std::uint64_t count(int lo, int hi) const noexcept;
  /// Answers the CPU disagreed with.
  std::uint64_t wrong_answers() const noexcept {
    return checks_[1].load(std::memory_order_relaxed);
  }

  /// How this server runs, for evr_server_info.
  struct info {
    std::string mode, sync, device, strategy;
    int threads = 0, lanes = 0, devices = 1;  // lanes: all devices'
  };
  /// What the server holds right now, for the gauges of the page.
  struct gauges {
    std::size_t connections = 0;  ///< open
    std::size_t lanes_leased = 0;
    std::uint64_t request_memory = 0, request_memory_limit = 0;  ///< bytes (memory_budget)
    std::size_t large_running = 0, large_waiting = 0;            ///< large /saxpy and /sum
  };
  /// The whole /metrics page. `reactor` may be null (the blocking modes have no reactor).
  std::string render(const evr::reactor_metrics* reactor, const info& about,
                     const gauges& now) const;

 private:
  static std::size_t path_index(std::string_view path) noexcept;
  static constexpr std::size_t other_status = statuses.size();  // last column: anything else
  std::array<std::array<std::atomic<std::uint64_t>, statuses.size() + 1>, paths.size()> requests_{};
  std::array<histogram<latency_bounds.size()>, paths.size()> duration_{};
  std::array<histogram<latency_bounds.size()>, paths.size()> gpu_wait_{};
  histogram<batch_bounds.size()> batches_{};
  std::array<std::atomic<std::uint64_t>, 2> checks_{};     // agreed, disagreed
  std::array<std::atomic<std::uint64_t>, 2> abandoned_{};  // queued, running
  std::array<std::atomic<std::uint64_t>, 5> connection_events_{};
  std::atomic<std::int64_t> in_flight_{0};
};

/// One line for logs: "submitted 200, completed 200, ..., wake-ups 3".
std::string reactor_summary(const evr::reactor_metrics& m);
