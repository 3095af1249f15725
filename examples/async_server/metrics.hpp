// The server's own counters and their rendering, with the reactor's, in the Prometheus text
// exposition format (version 0.0.4) for GET /metrics.
//
// Server metrics:  evr_server_requests_total{path,status}   counter
//                  evr_server_request_duration_seconds      histogram (head read → response
//                  written) evr_server_info{mode,device,strategy}    1
// Reactor metrics: evr_reactor_<counter>_total, evr_reactor_in_flight (gauge), and the
//                  submit→deliver and detect→deliver histograms from the reactor's power-of-two
//                  buckets (the reactor keeps no sums, so these histograms have no _sum line;
//                  OpenMetrics makes _sum optional, Prometheus accepts its absence).
//
// Thread safety: record() from any thread (relaxed atomics: statistics, not synchronization).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include <evr/reactor/metrics.hpp>

class server_metrics {
 public:
  /// Paths are a closed set so that a scanner requesting random URLs cannot grow the label space.
  static constexpr std::array<std::string_view, 4> paths = {"/saxpy", "/sum", "/metrics", "other"};
  static constexpr std::array<int, 11> statuses = {200, 400, 404, 405, 408, 413,
                                                   431, 500, 501, 503, 505};
  /// Upper bounds (seconds) of the request latency buckets; +Inf is implied.
  static constexpr std::array<double, 15> latency_bounds = {25e-6, 50e-6,  100e-6, 250e-6, 500e-6,
                                                            1e-3,  2.5e-3, 5e-3,   10e-3,  25e-3,
                                                            50e-3, 100e-3, 250e-3, 1.0,    5.0};

  void record(std::string_view path, int status, std::chrono::nanoseconds latency) noexcept;

  /// Requests answered so far with a status in [lo, hi] (of the statuses listed above).
  std::uint64_t count(int lo, int hi) const noexcept;

  /// The whole /metrics page. `reactor` may be null (blocking mode has no reactor).
  std::string render(const evr::reactor_metrics* reactor, std::string_view mode,
                     std::string_view device, std::string_view strategy) const;

 private:
  static constexpr std::size_t other_status = statuses.size();  // last column: anything else
  std::array<std::array<std::atomic<std::uint64_t>, statuses.size() + 1>, paths.size()> requests_{};
  std::array<std::atomic<std::uint64_t>, latency_bounds.size() + 1> latency_{};  // per bucket
  std::atomic<std::uint64_t> latency_sum_ns_{0};
};

/// One line for logs: "submitted 200, completed 200, ..., wake-ups 3".
std::string reactor_summary(const evr::reactor_metrics& m);
