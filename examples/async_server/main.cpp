// evr-async-server: an Asio HTTP/1.1 server whose requests launch GPU work and co_await its
// completion through evr — or, for comparison, wait as a user would without evr: a host function
// that posts (--mode hostfunc), io threads that query events (--mode poll), a blocked thread of a
// pool or of their connection (--mode pool / thread). Runs on every GPU there is (--devices), on
// the simulated device when there is none, and says which.
//
//   evr-async-server                                  self-test, then exit
//   evr-async-server --self-test 2000 --compare       ... then evr vs the blocking pool
//   evr-async-server --load-connections 256 --load-path '/busy?us=2000' [--mode pool]
//   evr-async-server --port 8080                      serve until Ctrl-C; try
//       curl 'http://127.0.0.1:8080/busy?us=2000'  and  curl http://127.0.0.1:8080/metrics
//
// Files: see README.md ("Files"); this file is the wiring.
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <asio/post.hpp>
#include <asio/signal_set.hpp>
#include <asio/strand.hpp>

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "cli.hpp"
#include "gpus.hpp"
#include "instance.hpp"
#include "lanes.hpp"
#include "load.hpp"
#include "metrics.hpp"
#include "mlp.hpp"
#include "server.hpp"

namespace {

/// A thousand connections need a thousand descriptors, more than the usual soft limit (1024).
/// Returns the limit in force afterwards.
std::uint64_t raise_descriptor_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return 1024;
  if (lim.rlim_cur < lim.rlim_max) {
    const rlim_t before = lim.rlim_cur;
    lim.rlim_cur = lim.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) lim.rlim_cur = before;
  }
  return lim.rlim_cur == RLIM_INFINITY ? std::uint64_t{1} << 20 : lim.rlim_cur;
}

void print_latency(const char* what, const load_report& r) {
  std::printf("latency (%s): p50 %.1f us, p90 %.1f us, p99 %.1f us, max %.1f us\n", what,
              r.percentile(0.5), r.percentile(0.9), r.percentile(0.99), r.percentile(1.0));
}

std::string mode_label(wait_mode m, sync_kind s) {
  return blocks_a_thread(m) ? std::string(to_string(m)) + "/" + to_string(s) : to_string(m);
}

struct process {
  const settings& cfg;
  gpus& dev;
  const mlp::model& model;
  const server_lanes& lanes;

  /// --threads as a count (pool: 0 is one thread per lane).
  int threads_for(wait_mode m, int threads) const {
    if (m == wait_mode::thread) return 1;
    return threads == 0 ? static_cast<int>(lanes.total()) : threads;
  }

  instance_config config_for(wait_mode m, sync_kind s, int requested_threads) const {
    const int threads = threads_for(m, requested_threads);
    instance_config c;
    c.threads = threads;
    c.reactor.strategy = cfg.strategy;
    if (cfg.spin_window_us >= 0)
      c.reactor.spin_window = std::chrono::microseconds(cfg.spin_window_us);
    if (cfg.max_sleep_us >= 0) c.reactor.max_sleep = std::chrono::microseconds(cfg.max_sleep_us);
    if (cfg.coalesce_us >= 0) c.reactor.coalesce = std::chrono::microseconds(cfg.coalesce_us);
    c.reactor.kernel_fences = cfg.kernel_fences;
    server_config& sc = c.server;
    sc.address = cfg.address;
    sc.port = static_cast<std::uint16_t>(cfg.port < 0 ? 0 : cfg.port);
    sc.mode = m;
    sc.sync = s;
    sc.max_n = cfg.max_n;
    sc.max_busy_us = cfg.max_busy_us;
    sc.check_every = cfg.check_every;
    sc.busy_signal = cfg.busy_signal;
    sc.batching.max_rows = cfg.mlp_max_batch;
    sc.batching.window = std::chrono::microseconds(cfg.mlp_window_us);
    sc.batching.inflight = cfg.mlp_inflight;
    sc.io_timeout = std::chrono::seconds(cfg.timeout_seconds);
    sc.max_connection_requests = cfg.max_connection_requests;
    sc.connections = {cfg.max_connections, cfg.max_connections_per_address};
    sc.request_memory = std::uint64_t{cfg.request_memory_mib} << 20;
    sc.large_n = cfg.large_n;
    sc.large_concurrency = cfg.large_concurrency;
    sc.drain_timeout =
        std::chrono::milliseconds(static_cast<std::int64_t>(cfg.drain_seconds * 1000.0));
    sc.drain_idle_grace =
        std::chrono::milliseconds(static_cast<std::int64_t>(cfg.drain_idle_grace * 1000.0));
    sc.reuse_port = cfg.reuse_port;
    sc.info = {to_string(m),
               blocks_a_thread(m) ? to_string(s) : "none",
               dev.label,
               m == wait_mode::evr ? evr::to_string(cfg.strategy) : "none",
               m == wait_mode::thread ? 0 : threads,
               static_cast<int>(lanes.total()),
               static_cast<int>(dev.devices.size())};
    return c;
  }

  instance start(wait_mode m, sync_kind s, int requested_threads) const {
    return instance(*dev.backend, lanes.by_device(), model, config_for(m, s, requested_threads));
  }

  server_limits limits(wait_mode m) const {
    return {cfg.max_n, cfg.max_busy_us, cfg.mlp_max_batch, &model, m == wait_mode::evr};
  }
};

/// Prints the server's own tally; returns its count of failures (wrong answers, GPU errors).
std::uint64_t print_server_summary(const server_metrics& m) {
  const std::uint64_t ok = m.count(200, 299), client_errors = m.count(400, 499),
                      server_errors = m.count(500, 599);
  // 500: a wrong answer or a failed GPU wait. (501 and 505 answer requests this server does not
  // support, which the edge cases send on purpose; 503 says it is full for now: a limit, not a
  // failure.)
  const std::uint64_t failures = m.count(500, 500);
  const std::uint64_t responses = ok + client_errors + server_errors;
  std::printf(
      "server: %llu %s: %llu 2xx, %llu 4xx, %llu 5xx (%llu %s: wrong answers, GPU errors)\n",
      static_cast<unsigned long long>(responses), responses == 1 ? "response" : "responses",
      static_cast<unsigned long long>(ok), static_cast<unsigned long long>(client_errors),
      static_cast<unsigned long long>(server_errors), static_cast<unsigned long long>(failures),
      failures == 1 ? "failure" : "failures");
  return failures;
}

/// What the server admits, on one line (README.md, "Limits").
void print_limits(const settings& cfg) {
  std::printf(
      "limits: %zu connections (%s), %zu per client address; request memory %zu MiB; /saxpy "
      "and /sum above n=%zu: %zu at once, off the io threads\n",
      cfg.max_connections, cfg.connections_because.c_str(), cfg.max_connections_per_address,
      cfg.request_memory_mib, cfg.large_n, cfg.large_concurrency);
}

/// After stop() and join(): what the server left behind, on one line (requests, lanes, reactor
/// waits: all 0 after a clean shutdown). True when nothing was left.
bool print_leftovers(instance& inst) {
  const std::int64_t requests = inst.metrics().in_flight();
  const std::size_t leased = inst.lanes().leased();
  const std::uint64_t waits = inst.reactor() ? inst.reactor()->metrics().in_flight : 0;
  std::printf("shutdown: afterwards %lld requests, %zu of %zu lanes, %llu reactor waits left\n",
              static_cast<long long>(requests), leased, inst.lanes().size(),
              static_cast<unsigned long long>(waits));
  return requests == 0 && leased == 0 && waits == 0;
}

/// The reactor's counters on one line (evr mode); returns them.
std::optional<evr::reactor_metrics> print_reactor(instance& inst) {
  if (inst.reactor() == nullptr) return std::nullopt;
  const evr::reactor_metrics m = inst.reactor()->metrics();
  std::printf("reactor: %s\n", reactor_summary(m).c_str());
  return m;
}

/// The demo's comparison: evr and the blocking pool (spin), same thread count, same load.
bool run_compare(const process& p) {
  struct row {
    load_report load;
    bool ok = false;
  };
  row rows[2];
  const wait_mode modes[2] = {wait_mode::evr, wait_mode::pool};
  for (int i = 0; i < 2; ++i) {
    instance inst = p.start(modes[i], sync_kind::spin, p.cfg.threads);
    load_options lo;
    lo.server = inst.endpoint();
    lo.connections = p.cfg.compare_connections;
    lo.duration = std::chrono::milliseconds(static_cast<long long>(p.cfg.compare_seconds * 1000));
    lo.target = p.cfg.compare_path;
    lo.limits = p.limits(modes[i]);
    rows[i].load = run_load(lo);
    inst.stop();
    rows[i].ok = inst.join() && rows[i].load.errors == 0 && inst.metrics().count(500, 599) == 0;
    if (!rows[i].load.first_error.empty())
      std::printf("compare: %s: first error: %s\n", to_string(modes[i]),
                  rows[i].load.first_error.c_str());
  }
  const double evr_rps = rows[0].load.requests_per_second();
  const double pool_rps = rows[1].load.requests_per_second();
  std::printf(
      "compare: GET %s, %d connections, %d server thread%s each: evr %.0f requests/s vs blocking "
      "pool (spin) %.0f requests/s: %.1fx (p99 %.1f ms vs %.1f ms)\n",
      p.cfg.compare_path.c_str(), p.cfg.compare_connections, p.cfg.threads,
      p.cfg.threads == 1 ? "" : "s", evr_rps, pool_rps, pool_rps > 0 ? evr_rps / pool_rps : 0.0,
      rows[0].load.percentile(0.99) / 1e3, rows[1].load.percentile(0.99) / 1e3);
  return rows[0].ok && rows[1].ok;
}

/// Requests in flight when the server stops: they must finish their GPU work, every lane must
/// come back and the reactor must have nothing left. Returns true when all of that holds.
bool run_shutdown(const process& p, instance& inst) {
  std::vector<std::string> targets;
  const std::uint32_t us = std::min<std::uint32_t>(100000, p.cfg.max_busy_us);
  for (int i = 0; i < 8; ++i)
    targets.push_back(i % 4 == 3 ? "/mlp?seed=" + std::to_string(i)
                                 : "/busy?us=" + std::to_string(us) + "&seed=" + std::to_string(i));
  // The /busy ones take 100 ms: the server must hold them all when it stops (the /mlp ones may
  // be done by then). A pool of N threads holds at most N: the rest wait unread until it frees.
  const std::int64_t busy = static_cast<std::int64_t>(targets.size() - targets.size() / 4);
  const std::int64_t expect =
      p.cfg.mode == wait_mode::pool
          ? std::min<std::int64_t>(busy, p.threads_for(wait_mode::pool, p.cfg.threads))
          : busy;
  // On a slow machine (sanitizers, a loaded CI host) the first requests may finish before the
  // last arrive: after 2 s of waiting for all of them, any request in flight will do. stop() must
  // find at least one in the server, or the check proves nothing.
  const auto patience = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  std::int64_t held_at_stop = 0;
  const shutdown_report r = run_shutdown_check(
      inst.endpoint(), targets,
      [&] {
        held_at_stop = inst.metrics().in_flight();
        return held_at_stop >= expect ||
               (held_at_stop >= 1 && std::chrono::steady_clock::now() > patience);
      },
      [&] { inst.stop(); });
  const bool joined = inst.join();
  const std::int64_t left = inst.metrics().in_flight();
  const std::size_t leased = inst.lanes().leased();
  const std::uint64_t reactor_left = inst.reactor() ? inst.reactor()->metrics().in_flight : 0;
  std::printf(
      "shutdown: stop() with %d requests sent, %lld in the server (%lld wanted): %d answered, "
      "%d closed; afterwards %lld requests, %zu of %zu lanes, %llu reactor waits left\n",
      r.sent, static_cast<long long>(held_at_stop), static_cast<long long>(expect), r.answered,
      r.closed, static_cast<long long>(left), leased, inst.lanes().size(),
      static_cast<unsigned long long>(reactor_left));
  for (const auto& f : r.failures) std::printf("  FAILED %s\n", f.c_str());
  return joined && r.failures.empty() && r.answered + r.closed == r.sent && left == 0 &&
         leased == 0 && reactor_left == 0;
}

}  // namespace

int main(int argc, char** argv) {
  settings cfg = parse_command_line(argc, argv);
  settle_connection_limits(cfg, raise_descriptor_limit());
  if (cfg.device != "sim" && cfg.cuda_connections > 0) {
    // Streams share the GPU's hardware queues (8 by default); work behind a kernel on a shared
    // queue waits for it even when it belongs to another stream. Up to 32 queues: must be set
    // before the CUDA context exists. An explicit environment setting wins.
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", std::to_string(cfg.cuda_connections).c_str(), 0);
  }
  try {
    gpus dev = choose_gpus(cfg);
    std::printf("device: %s\n", dev.description.c_str());
    std::string used;
    for (int d : dev.devices) {
      if (!used.empty()) used += ',';
      used += std::to_string(d);
    }
    std::printf("devices: %s (%zu used)\n", used.c_str(), dev.devices.size());
    prepare_cuda(cfg, dev);
    mlp::shape shape;
    shape.width = cfg.mlp_width > 0 ? cfg.mlp_width : (dev.cuda ? 8192 : 1024);
    shape.hidden = cfg.mlp_layers;
    const mlp::model model(shape);

    // The lanes (and the /mlp weights on a GPU) are the process's: every instance uses them.
    const server_lanes lanes(cfg, dev, model);
    std::printf("lanes: %s\n", lanes.description().c_str());
    const process p{cfg, dev, model, lanes};
    const int streams = static_cast<int>(lanes.total());

    bool good = true;
    {
      instance inst = p.start(cfg.mode, cfg.sync, cfg.threads);
      const int threads = p.threads_for(cfg.mode, cfg.threads);
      char mlp_desc[200];
      std::snprintf(mlp_desc, sizeof mlp_desc,
                    "mlp %d-%dx%d-%d (%.0f M weights), batches of up to %zu rows (%zu running, "
                    "%d us window)",
                    shape.in, shape.width, shape.hidden, shape.out,
                    static_cast<double>(shape.weight_count()) / 1e6, cfg.mlp_max_batch,
                    cfg.mlp_inflight, cfg.mlp_window_us);
      std::printf("server: mode %s, %s, %d stream%s, %s, %s, http://%s:%u/\n",
                  mode_label(cfg.mode, cfg.sync).c_str(),
                  cfg.mode == wait_mode::thread
                      ? "a thread per connection"
                      : (std::to_string(threads) + (threads == 1 ? " thread" : " threads")).c_str(),
                  streams, streams == 1 ? "" : "s",
                  cfg.mode == wait_mode::evr
                      ? (std::string("strategy ") + evr::to_string(cfg.strategy)).c_str()
                  : blocks_a_thread(cfg.mode) ? "blocking waits"
                                              : "waits written by hand",
                  mlp_desc, cfg.address.c_str(), inst.srv().port());
      print_limits(cfg);
      std::fflush(stdout);

      const server_limits limits = p.limits(cfg.mode);
      if (cfg.what == action::serve) {
        // The first SIGINT/SIGTERM drains (a fleet member being restarted: docs/deploy.md), a
        // second one stops at once.
        // On a strand: in pool mode several threads run inst.io(), and the drain's end cancels
        // the wait from the server's control executor.
        asio::signal_set signals(asio::make_strand(inst.io()), SIGINT, SIGTERM);
        std::function<void(std::error_code, int)> on_signal = [&](std::error_code ec, int sig) {
          if (ec) return;
          if (!inst.srv().draining()) {
            std::printf(
                "draining (signal %d): no new connections, /readyz 503, up to %.1f s for the "
                "requests accepted; a second signal stops at once\n",
                sig, cfg.drain_seconds);
            std::fflush(stdout);
            // A second signal while draining stops at once; once drained, the wait for it is
            // cancelled (it would keep this context's run() going).
            inst.srv().drain([&signals] {
              asio::post(signals.get_executor(), [&signals] { signals.cancel(); });
            });
            signals.async_wait(on_signal);
            return;
          }
          std::printf("stopping (signal %d)\n", sig);
          std::fflush(stdout);
          inst.stop();
        };
        signals.async_wait(on_signal);
        std::printf(
            "listening on http://%s:%u/ — try /busy?us=2000, /mlp?seed=1, /saxpy?n=65536, "
            "/sum?n=65536, /healthz, /metrics; Ctrl-C stops\n",
            cfg.address.c_str(), inst.srv().port());
        std::fflush(stdout);
        good = inst.join();
        good = print_leftovers(inst) && good;
        good = print_server_summary(inst.metrics()) == 0 && good;
        print_reactor(inst);
      } else if (cfg.what == action::load) {
        load_options lo;
        lo.server = inst.endpoint();
        lo.connections = cfg.connections;
        lo.duration = std::chrono::milliseconds(static_cast<long long>(cfg.load_seconds * 1000));
        lo.target = cfg.load_path;
        lo.limits = limits;
        const load_report load = run_load(lo);
        inst.stop();
        good = inst.join();
        std::printf(
            "load: %s on %s with %d connections for %.2f s: %llu requests (%.0f requests/s), "
            "%llu errors\n",
            mode_label(cfg.mode, cfg.sync).c_str(), cfg.load_path.c_str(), cfg.connections,
            load.seconds, static_cast<unsigned long long>(load.requests),
            load.requests_per_second(), static_cast<unsigned long long>(load.errors));
        print_latency("client: request written to response read", load);
        if (!load.first_error.empty()) std::printf("first error: %s\n", load.first_error.c_str());
        // One line for scripts (scripts/study/load-server.sh builds its table from it).
        std::printf(
            "load-result mode=%s sync=%s device=%s threads=%d streams=%d connections=%d "
            "seconds=%.3f requests=%llu errors=%llu rps=%.1f p50_us=%.1f p90_us=%.1f p99_us=%.1f "
            "max_us=%.1f\n",
            to_string(cfg.mode), blocks_a_thread(cfg.mode) ? to_string(cfg.sync) : "none",
            dev.label.c_str(), cfg.mode == wait_mode::thread ? 0 : threads, streams,
            cfg.connections, load.seconds, static_cast<unsigned long long>(load.requests),
            static_cast<unsigned long long>(load.errors), load.requests_per_second(),
            load.percentile(0.5), load.percentile(0.9), load.percentile(0.99),
            load.percentile(1.0));
        good = good && load.errors == 0 && print_server_summary(inst.metrics()) == 0;
      } else {
        const edge_report edges = run_edge_cases(inst.endpoint(), limits);
        std::printf("edge cases: %d checked, %zu failed\n", edges.checked, edges.failures.size());
        for (const auto& f : edges.failures) std::printf("  FAILED %s\n", f.c_str());
        load_options lo;
        lo.server = inst.endpoint();
        lo.connections = cfg.connections;
        lo.requests = cfg.self_test_requests;
        lo.limits = limits;
        const load_report load = run_load(lo);
        std::printf(
            "self-test: %llu requests (every route; %llu malformed on purpose, refused as they "
            "must be) over %d connections in %.3f s (%.0f requests/s), %llu errors\n",
            static_cast<unsigned long long>(load.requests),
            static_cast<unsigned long long>(load.refused), cfg.connections, load.seconds,
            load.requests_per_second(), static_cast<unsigned long long>(load.errors));
        print_latency("client: request written to response read", load);
        if (!load.first_error.empty()) std::printf("first error: %s\n", load.first_error.c_str());
        const bool shutdown_ok = run_shutdown(p, inst);
        const std::uint64_t failures = print_server_summary(inst.metrics());
        const std::optional<evr::reactor_metrics> rm = print_reactor(inst);
        good = edges.failures.empty() && load.requests == cfg.self_test_requests &&
               load.errors == 0 && shutdown_ok && failures == 0 &&
               inst.metrics().wrong_answers() == 0 &&
               (!rm || (rm->failed == 0 && rm->in_flight == 0));
      }
    }
    if (cfg.compare) good = run_compare(p) && good;
    if (cfg.what == action::self_test)
      std::printf("result: %s on the %s device\n", good ? "OK" : "FAILED",
                  dev.cuda ? "CUDA" : "simulated");
    return good ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "evr-async-server: %s\n", e.what());
    return 1;
  }
}
