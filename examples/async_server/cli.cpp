#include "cli.hpp"

#include "evr_tool_cli.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

#include <CLI/CLI.hpp>

namespace {

/// A path a client may request: starts with '/', no whitespace (it goes into a request line).
const CLI::Validator request_path(
    [](std::string& v) -> std::string {
      if (v.empty() || v.front() != '/' || v.find_first_of(" \r\n\t") != std::string::npos)
        return "takes a path starting with '/' without spaces, like /busy?us=2000, not '" + v + "'";
      return {};
    },
    "PATH", "request path");

/// --drain-seconds, --drain-idle-grace: seconds in [0, 3600] (CLI::Range alone lets "nan" through).
const CLI::Validator drain_seconds(
    [](std::string& v) -> std::string {
      char* end = nullptr;
      const double d = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(d >= 0.0 && d <= 3600.0))
        return "takes seconds from 0 to 3600, not '" + v + "'";
      return {};
    },
    "SECONDS", "drain seconds");

/// --devices: "all", or device indices separated by commas, each at most once ("0,1").
std::string parse_devices(const std::string& v, std::vector<int>& out) {
  out.clear();
  if (v == "all") return {};
  const std::string bad =
      "takes 'all' or device indices separated by commas, like 0,1, not '" + v + "'";
  std::size_t at = 0;
  for (;;) {
    const std::size_t comma = v.find(',', at);
    const std::string item =
        v.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (item.empty() || item.size() > 3 ||
        item.find_first_not_of("0123456789") != std::string::npos)
      return bad;
    const int d = std::stoi(item);
    for (int seen : out)
      if (seen == d) return "names device " + item + " twice";
    out.push_back(d);
    if (comma == std::string::npos) return {};
    at = comma + 1;
  }
}

[[noreturn]] void usage_error(const std::string& program, const std::string& why) {
  std::fprintf(stderr, "%s: %s\nRun with --help for more information.\n", program.c_str(),
               why.c_str());
  std::exit(2);
}

[[noreturn]] void usage_error(CLI::App& app, const std::string& why) {
  usage_error(app.get_name(), why);
}

}  // namespace

settings parse_command_line(int argc, char** argv) {
  settings s;
  CLI::App app{
      "An HTTP/1.1 server whose requests run GPU work (/busy, /mlp, /saxpy, /sum) and wait for it\n"
      "through evr (--mode evr) or, for comparison, as a user would without evr: a host function\n"
      "that posts (hostfunc), io threads querying events (poll), a blocked thread of a pool\n"
      "(pool) or of their own connection (thread). Without --port: a self-test (edge cases,\n"
      "checked requests of every route, a shutdown with requests in flight), then exit.",
      "evr-async-server"};
  app.option_defaults()->always_capture_default();
  app.get_formatter()->column_width(34);

  std::string mode = "evr", sync = "spin", strategy = "adaptive", devices = "all";
  const std::map<std::string, evr::strategy> strategies = {{"adaptive", evr::strategy::adaptive},
                                                           {"poll", evr::strategy::poll},
                                                           {"fence", evr::strategy::fence},
                                                           {"host_func", evr::strategy::host_func}};

  // --- what to do ---
  auto* self_test =
      app.add_option("--self-test", s.self_test_requests,
                     "self-test: this many checked requests over --connections connections")
          ->check(CLI::Range(1, 100000000))
          ->group("What to do");
  auto* load_c = app.add_option("--load-connections", s.connections,
                                "closed-loop load with this many keep-alive connections...")
                     ->check(CLI::Range(1, 10000))
                     ->group("What to do");
  auto* load_s = app.add_option("--load-seconds", s.load_seconds, "...for this many seconds...")
                     ->check(CLI::Range(0.1, 3600.0))
                     ->group("What to do");
  auto* load_p = app.add_option("--load-path", s.load_path, "...on this path; prints requests/s")
                     ->check(request_path)
                     ->group("What to do");
  app.add_option("--port", s.port,
                 "serve on this port (0: any free one) until SIGINT/SIGTERM: the first signal "
                 "drains (stops accepting, /readyz 503, answers what it accepted, then exits), a "
                 "second stops at once")
      ->check(CLI::Range(0, 65535))
      ->group("What to do");
  app.add_option("--drain-seconds", s.drain_seconds,
                 "serve mode: how long the requests accepted before SIGTERM may take to finish; "
                 "what is left then is cut off")
      ->check(drain_seconds)
      ->group("What to do");
  app.add_option("--drain-idle-grace", s.drain_idle_grace,
                 "serve mode, draining: how long a kept-alive connection between requests may take "
                 "to send one more (answered with Connection: close) before it is closed; 0 closes "
                 "it at once")
      ->check(drain_seconds)
      ->group("What to do");
  app.add_flag("--reuse-port", s.reuse_port,
               "SO_REUSEPORT: several server processes may listen on one --port (the kernel "
               "spreads new connections over them)")
      ->group("What to do");
  app.add_flag("--compare", s.compare,
               "after the self-test: evr and the blocking pool (spin), same --threads, under the "
               "same built-in load; prints one line comparing them")
      ->group("What to do");
  app.add_option("--compare-path", s.compare_path, "the --compare load's path")
      ->check(request_path)
      ->group("What to do");
  app.add_option("--compare-connections", s.compare_connections, "the --compare load's connections")
      ->check(CLI::Range(1, 10000))
      ->group("What to do");
  app.add_option("--compare-seconds", s.compare_seconds, "the --compare load's seconds per mode")
      ->check(CLI::Range(0.1, 600.0))
      ->group("What to do");
  app.add_option("--connections", s.connections, "client connections of the self-test")
      ->check(CLI::Range(1, 10000))
      ->group("What to do");
  self_test->excludes(load_c)->excludes(load_s)->excludes(load_p);

  // --- how to serve ---
  app.add_option("--mode", mode,
                 "evr: co_await the GPU through evr; hostfunc: a host function behind the work "
                 "posts the request's resumption; poll: each io thread queries its requests' "
                 "events between I/O; pool: a pool of --threads threads, each request blocks its "
                 "thread until the GPU is done; thread: a thread per connection, blocking the "
                 "same way")
      ->check(CLI::IsMember({"evr", "hostfunc", "poll", "pool", "thread"}))
      ->group("Serving");
  auto* sync_opt =
      app.add_option("--sync", sync,
                     "how pool and thread modes block: spin (cudaStreamSynchronize, "
                     "cudaDeviceScheduleSpin), auto (cudaStreamSynchronize under the driver's "
                     "default scheduling) or blocking-sync (an event made with "
                     "cudaEventBlockingSync, cudaEventSynchronize)")
          ->check(CLI::IsMember({"spin", "auto", "blocking-sync"}))
          ->group("Serving");
  auto* threads_opt = app.add_option("--threads", s.threads,
                                     "threads running the server (evr, hostfunc, poll: io "
                                     "threads; pool: its threads, 0 for one per lane); the same "
                                     "number for each is the fair comparison")
                          ->check(CLI::Range(0, 1024))
                          ->group("Serving");
  app.add_option("--streams", s.streams,
                 "GPU streams (lanes) per device, shared by all requests: how much GPU work may "
                 "be in flight (0: as many /busy kernels as the GPU runs at once, from its SM "
                 "count and the kernel's occupancy, at most 128; 64 on the simulated device)")
      ->check(CLI::Range(0, 4096))
      ->group("Serving");
  app.add_option("--devices", devices,
                 "the GPUs to serve on: all, or indices separated by commas (0,1); the lanes and "
                 "/mlp's batchers are spread over them, one reactor watches them all")
      ->check(CLI::Validator(
          [](std::string& v) {
            std::vector<int> ignored;
            return parse_devices(v, ignored);
          },
          "all|I,J,...", "device list"))
      ->group("Serving");
  app.add_option("--sim-devices", s.sim_devices,
                 "how many GPUs the simulated device has (--device sim, or no GPU found)")
      ->check(CLI::Range(1, 16))
      ->group("Serving");
  app.add_option("--cuda-connections", s.cuda_connections,
                 "CUDA_DEVICE_MAX_CONNECTIONS (the GPU's hardware work queues the streams share) "
                 "unless the environment sets it; 0 leaves the driver's default (8)")
      ->check(CLI::Range(0, 32))
      ->group("Serving");
  app.add_option("--strategy", strategy, "the evr reactor's strategy")
      ->check(CLI::IsMember({"adaptive", "poll", "fence", "host_func"}))
      ->group("Serving");
  app.add_option("--spin-window-us", s.spin_window_us,
                 "the evr reactor's busy-poll window after progress (-1: its default, 50)")
      ->check(CLI::Range(-1, 1000000))
      ->group("Serving");
  app.add_option("--max-sleep-us", s.max_sleep_us,
                 "the evr reactor's longest sleep between sweeps while waits pend (-1: its "
                 "default, 1000): the most a completion may be seen late once the reactor idles")
      ->check(CLI::Range(-1, 1000000))
      ->group("Serving");
  app.add_option("--coalesce-us", s.coalesce_us,
                 "the evr reactor's batching under load (-1: its default, 0): after a pass that "
                 "delivered, it naps this long so the next pass finds a batch (reactor_options::"
                 "coalesce)")
      ->check(CLI::Range(-1, 1000000))
      ->group("Serving");
  app.add_flag("--kernel-fences,!--no-kernel-fences", s.kernel_fences,
               "evr mode: past the GPU's hardware queues, a stream wait's fence word is written by "
               "evr's fence kernel rather than an event recorded (reactor_options::kernel_fences, "
               "off by default; compute capability 9.0); --no-kernel-fences: events")
      ->group("Serving");
  evr::tool::add_device_option(app, s.device)->group("Serving");
  app.add_option("--address", s.address, "address to listen on")->group("Serving");
  app.add_option("--timeout", s.timeout_seconds,
                 "close a connection idle (or stuck sending/receiving) this many seconds")
      ->check(CLI::Range(1, 86400))
      ->group("Serving");
  app.add_option("--max-connection-requests", s.max_connection_requests,
                 "answer a connection's Nth request with Connection: close, so that clients "
                 "reconnect and a balancer that balances connections (HAProxy in mode tcp, "
                 "--reuse-port) spreads them again after a restart (0: no limit)")
      ->check(CLI::Range(0u, 100000000u))
      ->group("Serving");
  app.add_option("--max-connections", s.max_connections,
                 "open connections at most; when full, the ones waiting longest for a request "
                 "head are closed to make room, and a new one is refused (503) only when none "
                 "waits (0: the descriptor limit less 128 for the process; --mode thread: four "
                 "descriptors a connection, at most 2048)")
      ->check(CLI::Range(std::size_t{0}, std::size_t{10000000}))
      ->group("Limits");
  app.add_option("--max-connections-per-address", s.max_connections_per_address,
                 "open connections from one client address at most; over it, that address's "
                 "connections waiting longest for a request head make room, and a new one is "
                 "refused (503) only when none waits (0: half of --max-connections; behind a "
                 "proxy, set it to --max-connections)")
      ->check(CLI::Range(std::size_t{0}, std::size_t{10000000}))
      ->group("Limits");
  app.add_option("--request-memory-mib", s.request_memory_mib,
                 "memory the requests being served may hold beyond the lanes' own buffers "
                 "(/mlp rows, /saxpy and /sum above --large-n); a request that does not fit "
                 "gets 503 with Retry-After (at least one /saxpy of --max-n)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20))
      ->group("Limits");
  app.add_option("--large-n", s.large_n,
                 "/saxpy and /sum above this n are large: buffers of their own, given back "
                 "afterwards, filled and checked on --large-concurrency threads of their own "
                 "rather than an io thread")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 28))
      ->group("Limits");
  app.add_option("--large-concurrency", s.large_concurrency,
                 "large /saxpy and /sum served at once (the rest wait their turn, holding no lane)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{256}))
      ->group("Limits");

  // --- routes ---
  app.add_option("--max-n", s.max_n, "largest n of /saxpy and /sum")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 28))
      ->group("Routes");
  app.add_option("--max-busy-us", s.max_busy_us, "largest us of /busy")
      ->check(CLI::Range(1u, 10000000u))
      ->group("Routes");
  app.add_option("--check-every", s.check_every,
                 "/busy and /mlp: compare every Nth answer with the CPU (/saxpy, /sum: every one)")
      ->check(CLI::Range(1u, 1000000u))
      ->group("Routes");
  app.add_flag("!--no-busy-signal", s.busy_signal,
               "evr mode: /busy's kernel does not signal an evr slot (a device-signalled wait); "
               "the wait puts a marker on the stream, as in the other modes")
      ->group("Routes");
  app.add_flag("!--no-mlp-graphs", s.mlp_graphs,
               "on a GPU, /mlp's forward pass is queued call by call rather than as a CUDA graph "
               "per batch-size bucket (in the evr mode a graph ends in evr's signal: the wait "
               "reads a word instead of putting a marker on the stream)")
      ->group("Routes");
  app.add_flag("--busy-graph", s.busy_graph,
               "on a GPU, /busy's kernel (which then does not signal itself) runs as a CUDA graph "
               "per lane, its arguments set per request; in the evr mode the graph ends in evr's "
               "signal unless --no-busy-signal (library work waited on through a graph)")
      ->group("Routes");
  app.add_option("--mlp-width", s.mlp_width,
                 "/mlp hidden layer width (0: 8192 on a GPU, 1024 on the simulated device)")
      ->check(CLI::Range(0, 65536))
      ->group("Routes");
  app.add_option("--mlp-layers", s.mlp_layers, "/mlp hidden layers")
      ->check(CLI::Range(0, 64))
      ->group("Routes");
  app.add_option("--mlp-max-batch", s.mlp_max_batch,
                 "/mlp rows per batch at most (evr mode; also the most rows one request may send)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{4096}))
      ->group("Routes");
  app.add_option("--mlp-inflight", s.mlp_inflight,
                 "/mlp (evr mode): while fewer batches than this run, a request starts a batch at "
                 "once; otherwise it joins the next one")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1024}))
      ->group("Routes");
  app.add_option("--mlp-window-us", s.mlp_window_us,
                 "/mlp (evr mode): the longest a batch gathers requests while the GPU is busy "
                 "(0: no batching, every request alone)")
      ->check(CLI::Range(0, 1000000))
      ->group("Routes");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints the message (naming the option); its exit codes vary by error kind, ours is 2.
    std::exit(app.exit(e) == 0 ? 0 : 2);
  }

  const std::map<std::string, wait_mode> modes = {{"evr", wait_mode::evr},
                                                  {"hostfunc", wait_mode::hostfunc},
                                                  {"poll", wait_mode::poll},
                                                  {"pool", wait_mode::pool},
                                                  {"thread", wait_mode::thread}};
  const std::map<std::string, sync_kind> syncs = {{"spin", sync_kind::spin},
                                                  {"auto", sync_kind::automatic},
                                                  {"blocking-sync", sync_kind::blocking_sync}};
  s.mode = modes.at(mode);
  s.sync = syncs.at(sync);
  s.strategy = strategies.at(strategy);
  parse_devices(devices, s.devices);
  if (!blocks_a_thread(s.mode) && sync_opt->count() > 0)
    usage_error(app, std::string("--sync applies to --mode pool and --mode thread (") +
                         to_string(s.mode) + " never blocks a thread)");
  if (s.mode == wait_mode::thread && threads_opt->count() > 0)
    usage_error(app, "--threads does not apply to --mode thread (one thread per connection)");
  if (s.threads == 0 && s.mode != wait_mode::pool)
    usage_error(app, "--threads 0 (one per lane) applies to --mode pool only");

  if (const std::size_t largest = (3 * sizeof(float) * s.max_n + (1 << 20) - 1) >> 20;
      s.request_memory_mib < largest)
    usage_error(app, "--request-memory-mib " + std::to_string(s.request_memory_mib) +
                         " cannot hold one /saxpy of --max-n " + std::to_string(s.max_n) + " (" +
                         std::to_string(largest) + " MiB)");

  const bool load = load_c->count() + load_s->count() + load_p->count() > 0;
  if (load)
    s.what = action::load;
  else if (self_test->count() > 0 || s.port < 0)
    s.what = action::self_test;
  else
    s.what = action::serve;
  if (s.compare && s.what != action::self_test)
    usage_error(app,
                "--compare runs after the self-test, not with --load-* or when serving (--port)");
  return s;
}

std::size_t descriptors_per_connection(wait_mode m) noexcept {
  return m == wait_mode::thread ? 4 : 1;
}

void settle_connection_limits(settings& s, std::uint64_t descriptors) {
  const std::size_t per = descriptors_per_connection(s.mode);
  const std::uint64_t spare =
      descriptors > reserved_descriptors ? descriptors - reserved_descriptors : 0;
  const std::size_t room = std::max<std::size_t>(1, static_cast<std::size_t>(spare / per));
  const std::string why =
      "the descriptor limit (RLIMIT_NOFILE " + std::to_string(descriptors) + ") less " +
      std::to_string(reserved_descriptors) + " for the process" +
      (per == 1 ? std::string() : ", " + std::to_string(per) + " descriptors a connection");
  if (s.max_connections == 0) {
    s.max_connections = room;
    s.connections_because = "from " + why;
    if (s.mode == wait_mode::thread && s.max_connections > thread_mode_connections) {
      s.max_connections = thread_mode_connections;
      s.connections_because = "--mode thread's default: a thread each";
    }
  } else if (s.max_connections > room) {
    usage_error("evr-async-server", "--max-connections " + std::to_string(s.max_connections) +
                                        ": " + why + " leaves room for " + std::to_string(room) +
                                        " at most");
  } else {
    s.connections_because = "--max-connections";
  }
  if (s.max_connections_per_address == 0) {
    s.max_connections_per_address = std::max<std::size_t>(1, s.max_connections / 2);
  } else if (s.max_connections_per_address > s.max_connections) {
    usage_error("evr-async-server",
                "--max-connections-per-address " + std::to_string(s.max_connections_per_address) +
                    " is above --max-connections (" + std::to_string(s.max_connections) + ")");
  }
}
