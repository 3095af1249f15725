// The built-in HTTP client: the self-test's checks and a closed-loop load generator, so the
// server can be measured where wrk is not installed (the GPU machine has no package registry).
//
// Each runs its own io_context on the calling thread, apart from the server's threads, so the
// client's work never delays the server's event loop (they only share the CPU).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <asio/ip/tcp.hpp>

struct load_options {
  asio::ip::tcp::endpoint server;
  int connections = 4;         ///< keep-alive connections, each with one request in flight
  std::uint64_t requests = 0;  ///< stop after this many requests in all (0: run for `duration`)
  std::chrono::milliseconds duration{0};
  /// One target for every request ("/saxpy?n=65536"), checked for status 200 only. Empty: the
  /// self-test's mix of /saxpy and /sum requests (GET and POST, several sizes), each answer
  /// checked against the CPU (job::reference).
  std::string target;
  std::size_t max_n = std::size_t{1} << 22;  ///< the self-test mix stays within the server's limit
};

struct load_report {
  std::uint64_t requests = 0;  ///< responses received (good or not)
  std::uint64_t errors = 0;    ///< wrong status, wrong answer, or a connection failure
  double seconds = 0;
  std::vector<double> latency_us;  ///< per response: request written → response read
  std::string first_error;

  double percentile(double q) const;  ///< q in [0, 1]; 0 when there are no samples
  double requests_per_second() const {
    return seconds > 0 ? static_cast<double>(requests) / seconds : 0;
  }
};

load_report run_load(const load_options& options);

struct edge_report {
  int checked = 0;
  std::vector<std::string> failures;  ///< one line per failed check
};

/// Malformed and unusual requests, each on its own connection, each with the status (and, for
/// some, the connection behaviour) it must get: bad n, unknown parameters, unknown path, wrong
/// method, garbage request line, header without colon, bad or conflicting Content-Length, an
/// oversized head, HTTP/1.1 without Host, HTTP/2.0, chunked bodies, a POST with a form body,
/// pipelining, HTTP/1.0 without keep-alive, a head split across writes, and GET /metrics.
/// `evr_mode`: /metrics must then include the reactor's counters.
edge_report run_edge_cases(const asio::ip::tcp::endpoint& server, bool evr_mode);
