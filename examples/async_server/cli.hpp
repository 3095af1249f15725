// evr-async-server's command line.
#pragma once

#include <cstdint>
#include <string>

#include <evr/reactor/options.hpp>

#include "server.hpp"

enum class action {
  self_test,  ///< edge cases + a fixed number of checked requests, then exit (the default)
  load,       ///< closed-loop load on a fixed URL for a few seconds, then exit
  serve,      ///< serve until SIGINT/SIGTERM (when --port is given)
};

struct settings {
  action what = action::self_test;
  std::string device = "auto";  ///< auto | cuda | sim
  wait_mode mode = wait_mode::evr;
  std::string address = "127.0.0.1";
  int port = -1;    ///< -1: not given (ephemeral for self-test and load)
  int threads = 0;  ///< 0: the mode's default (evr 1, blocking 8)
  int streams = 8;
  std::size_t max_n = std::size_t{1} << 22;
  evr::strategy strategy = evr::strategy::adaptive;
  std::uint64_t self_test_requests = 200;
  int connections = 4;  ///< self-test and load connections
  double load_seconds = 3;
  std::string load_path = "/saxpy?n=65536";
  int timeout_seconds = 30;  ///< idle / slow-client timeout per connection
};

/// Parses argv; prints a message and exits with status 2 on bad input (0 for --help).
settings parse_command_line(int argc, char** argv);

/// The threads running the server's io_context when --threads is not given.
int default_threads(wait_mode m);
