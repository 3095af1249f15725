// The HTTP server: accepts connections, reads requests (keep-alive, pipelining), runs each
// request's GPU work on a lane and answers with the checked result.
//
// Routes:
//   GET|POST /saxpy?n=N[&a=A][&seed=S]   y = a*x + y on N floats (POST: parameters in the body,
//   GET|POST /sum?n=N[&seed=S]           application/x-www-form-urlencoded) — see job.hpp
//   GET /metrics                         Prometheus text format (metrics.hpp)
//
// Two ways to wait for the GPU, with everything else identical:
//   * wait_mode::evr       the request's coroutine co_awaits evr::gpu_waiter::async_wait: its
//                          thread goes on serving other connections meanwhile, so one thread
//                          serves any number of requests in flight.
//   * wait_mode::blocking  the request's thread blocks in the backend's synchronize_stream
//                          (cudaStreamSynchronize): requests in flight <= threads running the
//                          io_context. The comparison a thread-pool server makes.
//
// Threads: any number may run the io_context. Each connection lives on its own strand, so its
// socket, deadline timer and coroutine are never touched by two threads at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>

#include <asio/awaitable.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/strand.hpp>

#include <evr/evr.hpp>

#include "http.hpp"
#include "job.hpp"
#include "lanes.hpp"
#include "metrics.hpp"

enum class wait_mode { evr, blocking };
const char* to_string(wait_mode m) noexcept;

struct server_config {
  std::string address = "127.0.0.1";
  std::uint16_t port = 0;  ///< 0: an ephemeral port (see server::port())
  wait_mode mode = wait_mode::evr;
  std::size_t max_n = std::size_t{1} << 22;
  /// A connection that sends no complete request head (or does not take its response) for this
  /// long is closed: keeps idle keep-alive clients and slow senders from holding sockets forever.
  std::chrono::milliseconds io_timeout{30000};
  std::string device_label;    ///< for evr_server_info
  std::string strategy_label;  ///< for evr_server_info
};

class server {
 public:
  /// `reactor` is required in wait_mode::evr and ignored in wait_mode::blocking.
  server(asio::io_context& io, server_config cfg, lane_pool& lanes, evr::reactor* reactor,
         server_metrics& metrics);
  server(const server&) = delete;
  server& operator=(const server&) = delete;

  /// Binds, listens and starts accepting (on the io_context's threads). Throws std::runtime_error
  /// naming the address and the reason when the address is invalid or the port cannot be bound.
  void start();
  std::uint16_t port() const noexcept { return port_; }
  const server_config& config() const noexcept { return cfg_; }

  /// Stops accepting and closes every connection; a request being served finishes its GPU work
  /// first (its response then fails to send). When all are gone, io_context::run() returns.
  /// Thread-safe, idempotent.
  void stop();

 private:
  struct connection;
  struct response {
    int status = 200;
    std::string content_type = "application/json";
    std::string body;
    std::string extra_headers;  ///< "Name: value\r\n" lines
    bool close = false;         ///< close the connection after this response
  };

  asio::awaitable<void> accept_loop();
  /// Registers and serves an accepted socket; false once the server is stopping.
  bool start_connection(asio::ip::tcp::socket socket);
  asio::awaitable<void> serve(std::shared_ptr<connection> c);
  asio::awaitable<response> handle(const http::request& req, connection& c);
  asio::awaitable<response> run_job(const job::spec& spec, connection& c);
  static response error_response(int status, std::string message, bool close = false);
  void arm_deadline(const std::shared_ptr<connection>& c);
  void forget(const std::shared_ptr<connection>& c);

  asio::io_context& io_;
  server_config cfg_;
  lane_pool& lanes_;
  evr::reactor* reactor_;
  server_metrics& metrics_;
  asio::strand<asio::io_context::executor_type> accept_strand_;
  asio::ip::tcp::acceptor acceptor_;
  std::uint16_t port_ = 0;

  std::mutex mutex_;  // guards connections_ and stopping_ (accept strand vs. stop() vs. serve exit)
  std::unordered_set<std::shared_ptr<connection>> connections_;
  bool stopping_ = false;
};
