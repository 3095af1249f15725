// The built-in HTTP client: the self-test's checks, a closed-loop load generator (so the server
// can be measured where wrk is not installed), and a shutdown with requests in flight.
//
// Each runs its own io_context on the calling thread, apart from the server's threads, so the
// client's work never delays the server's event loop (they only share the CPU).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <asio/ip/tcp.hpp>

#include "mlp.hpp"

/// What the server accepts, so that the client's requests stay within it (and its malformed ones
/// just outside).
struct server_limits {
  std::size_t max_n = std::size_t{1} << 22;
  std::uint32_t max_busy_us = 100000;
  std::size_t mlp_max_rows = 128;
  const mlp::model* model = nullptr;  ///< required by the self-test mix and the edge cases
  bool evr_mode = true;               ///< /metrics must then list the reactor's counters
};

struct load_options {
  asio::ip::tcp::endpoint server;
  int connections = 4;         ///< keep-alive connections, each with one request in flight
  std::uint64_t requests = 0;  ///< stop after this many requests in all (0: run for `duration`)
  std::chrono::milliseconds duration{0};
  /// One target for every request ("/busy?us=2000"), checked for status 200 only. Empty: the
  /// self-test's mix of every route (GET and POST, several sizes, and some malformed requests
  /// that must get their 4xx), each answer checked against the CPU.
  std::string target;
  server_limits limits;
};

struct load_report {
  std::uint64_t requests = 0;  ///< responses received (good or not)
  std::uint64_t refused = 0;   ///< of which the malformed requests' expected 4xx
  std::uint64_t errors = 0;    ///< wrong status, wrong answer, or a connection failure
  double seconds = 0;
  std::vector<double> latency_us;  ///< per response: request written -> response read
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
/// some, the connection behaviour) it must get: bad n, us, rows and parameters; batch overflow;
/// malformed and oversized /mlp bodies; unknown path; wrong method; garbage request line; header
/// without colon; bad or conflicting Content-Length; an oversized head; HTTP/1.1 without Host;
/// HTTP/2.0; chunked bodies; a POST with a form body; pipelining; HTTP/1.0 without keep-alive; a
/// head split across writes; GET /metrics. A connection that must stay open must then serve a
/// follow-up request: a refusal loses nothing.
edge_report run_edge_cases(const asio::ip::tcp::endpoint& server, const server_limits& limits);

struct shutdown_report {
  int sent = 0;      ///< requests written, one per connection
  int answered = 0;  ///< of which got a 200 before the connection closed
  int closed = 0;    ///< of which saw the connection closed without a response
  std::vector<std::string> failures;
};

/// Opens one connection per target and sends it; waits until `ready()` says the server holds the
/// requests it should (at most 10 s), calls `stop()`, then reads what each connection gets: a 200
/// or the connection closed are both fine (a request in flight finishes its GPU work, but its
/// response may find the socket closed). Anything else, or a connection that hangs, is a failure.
shutdown_report run_shutdown_check(const asio::ip::tcp::endpoint& server,
                                   const std::vector<std::string>& targets,
                                   const std::function<bool()>& ready,
                                   const std::function<void()>& stop);
