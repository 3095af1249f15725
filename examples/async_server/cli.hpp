// evr-async-server's command line (CLI11): --help lists every option with its default; a bad
// value exits with status 2 and a message that names the option.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <evr/reactor/options.hpp>

#include "lanes.hpp"
#include "server.hpp"

enum class action {
  self_test,  ///< edge cases + checked requests + a shutdown with requests in flight (default)
  load,       ///< closed-loop load on one URL for a few seconds, then exit
  serve,      ///< serve until SIGINT/SIGTERM (when --port is given)
};

struct settings {
  action what = action::self_test;
  /// After the self-test: evr and the blocking pool, same thread count, under the same load.
  bool compare = false;
  std::string device = "auto";  ///< auto | cuda | sim
  std::vector<int> devices;     ///< the GPUs to serve on (--devices); empty: every one there is
  int sim_devices = 1;          ///< simulated GPUs (--device sim, or no GPU)
  wait_mode mode = wait_mode::evr;
  sync_kind sync = sync_kind::spin;
  std::string address = "127.0.0.1";
  int port = -1;  ///< -1: not given (ephemeral for self-test and load)
  /// io threads (evr, hostfunc, poll) or pool threads (pool: 0 is one per lane); thread mode: one
  /// per connection instead
  int threads = 1;
  /// Lanes per device; 0: from the GPU's concurrency (main.cpp), 64 on the simulated device
  int streams = 0;
  int cuda_connections = 32;  ///< CUDA_DEVICE_MAX_CONNECTIONS unless the environment sets it
  std::size_t max_n = std::size_t{1} << 22;
  std::uint32_t max_busy_us = 100000;
  std::uint32_t check_every = 16;
  bool busy_signal = true;  ///< evr mode: /busy's work signals an evr::signal_slot (lanes.hpp)
  bool mlp_graphs = true;   ///< /mlp as CUDA graphs per batch-size bucket (make_cuda_lane)
  bool busy_graph = false;  ///< /busy as a CUDA graph per lane (cuda_lane_options)
  evr::strategy strategy = evr::strategy::adaptive;
  int mlp_width = 0;  ///< 0: 8192 on a GPU, 1024 on the simulated device
  int mlp_layers = 3;
  std::size_t mlp_max_batch = 128;
  int mlp_window_us = 1000;
  std::size_t mlp_inflight = 2;
  int spin_window_us = -1;  ///< -1: the reactor's default
  int max_sleep_us = -1;    ///< -1: the reactor's default
  int coalesce_us = -1;     ///< -1: the reactor's default (0: none)
  bool kernel_fences = evr::reactor_options{}.kernel_fences;  ///< evr mode
  std::uint64_t self_test_requests = 200;
  int connections = 16;  ///< self-test and load connections
  double load_seconds = 3;
  std::string load_path = "/busy?us=2000";
  std::string compare_path = "/busy?us=2000";
  int compare_connections = 256;
  double compare_seconds = 2;
  int timeout_seconds = 30;                   ///< idle / slow-client timeout per connection
  std::uint32_t max_connection_requests = 0;  ///< server_config::max_connection_requests
  /// Open connections at most; 0 until settle_connection_limits derives it from the descriptor
  /// limit.
  std::size_t max_connections = 0;
  /// From one client address at most; 0 until settled (half of max_connections).
  std::size_t max_connections_per_address = 0;
  std::string connections_because;       ///< how max_connections was chosen (for the start-up line)
  std::size_t request_memory_mib = 512;  ///< server_config::request_memory, in MiB
  std::size_t large_n = std::size_t{1} << 18;
  std::size_t large_concurrency = 2;
  double drain_seconds = 30;       ///< serve mode, SIGTERM: server_config::drain_timeout
  double drain_idle_grace = 0.25;  ///< server_config::drain_idle_grace, in seconds
  bool reuse_port = false;         ///< server_config::reuse_port
};

/// Parses argv; prints a message and exits with status 2 on bad input (0 after --help).
settings parse_command_line(int argc, char** argv);

/// Descriptors the process keeps for itself beside its connections: stdio, the listener, the
/// spare descriptor, each io_context's epoll, eventfd and timerfd, CUDA's driver files, and the
/// connections being closed to make room (connection_table::evict_batch, at most 64).
inline constexpr std::size_t reserved_descriptors = 128;
/// Descriptors per connection: its socket; in --mode thread also its own io_context's three.
std::size_t descriptors_per_connection(wait_mode m) noexcept;
/// Thread mode's default cap: a thread per connection costs ~220 KB of memory (3 000 idle
/// sockets made 680 MB), and a blocking baseline gains nothing from more threads than this.
inline constexpr std::size_t thread_mode_connections = 2048;

/// Fills in the connection limits from the descriptor limit `descriptors` (RLIMIT_NOFILE, once
/// raised): by default (descriptors - reserved_descriptors) / descriptors_per_connection (thread
/// mode: at most thread_mode_connections), half of that per address. An explicit value the
/// descriptors cannot hold, or a per-address limit above the total, is refused with a message
/// naming the option (exit status 2).
void settle_connection_limits(settings& s, std::uint64_t descriptors);
