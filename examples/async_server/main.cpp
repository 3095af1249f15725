// evr-async-server: an Asio HTTP/1.1 server whose requests launch GPU work sized by the request
// and co_await its completion through evr — or, with --mode blocking, block their thread in
// cudaStreamSynchronize, for comparison. Runs on the GPU when there is one, on the simulated
// device otherwise, and says which.
//
//   evr-async-server                                  self-test (200 requests), then exit
//   evr-async-server --self-test 2000 --device sim
//   evr-async-server --load-connections 16 --load-seconds 3 [--mode blocking]
//   evr-async-server --port 8080                      serve until Ctrl-C; try
//       curl 'http://127.0.0.1:8080/saxpy?n=65536'  and  curl http://127.0.0.1:8080/metrics
//
// Files: http.* (parsing), job.* (what a request computes, the CPU's answer), lanes.* (streams
// and buffers, the pool), kernels.* (CUDA), server.* (connections, routes, the two wait modes),
// metrics.* (Prometheus), load.* (the built-in client), cli.* (options), this file (wiring).
#include <atomic>
#include <csignal>
#include <cstdio>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>

#include <evr/evr.hpp>

#include "cli.hpp"
#include "lanes.hpp"
#include "load.hpp"
#include "metrics.hpp"
#include "server.hpp"

namespace {

struct device_choice {
  bool cuda = false;
  std::unique_ptr<evr::sim::device> sim;  // when !cuda
  evr::device::backend* backend = nullptr;
  std::string label;        ///< "cuda" or "sim"
  std::string description;  ///< what the device line says
};

device_choice choose_device(const std::string& wanted) {
  device_choice d;
#if defined(EVR_ASYNC_SERVER_HAVE_KERNELS)
  if (wanted != "sim") d.cuda = evr::device::cuda_device_available();
#endif
  if (wanted == "cuda" && !d.cuda) {
    std::fprintf(stderr, "evr-async-server: --device cuda, but no usable CUDA device%s\n",
#if defined(EVR_ASYNC_SERVER_HAVE_KERNELS)
                 ""
#else
                 " (built without CUDA kernels)"
#endif
    );
    std::exit(1);
  }
  if (d.cuda) {
    d.backend = &evr::device::cuda_backend();
    d.label = "cuda";
    d.description = d.backend->describe();
  } else {
    d.sim = std::make_unique<evr::sim::device>(
        evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::threaded});
    d.backend = d.sim.get();
    d.label = "sim";
    d.description = std::string("SIMULATED (no GPU ") + (wanted == "sim" ? "requested" : "found") +
                    ") — " + d.sim->describe();
  }
  return d;
}

void print_latency(const char* what, const load_report& r) {
  std::printf("latency (%s): p50 %.1f us, p90 %.1f us, p99 %.1f us, max %.1f us\n", what,
              r.percentile(0.5), r.percentile(0.9), r.percentile(0.99), r.percentile(1.0));
}

}  // namespace

int main(int argc, char** argv) {
  const settings cfg = parse_command_line(argc, argv);
  device_choice dev = choose_device(cfg.device);
  std::printf("device: %s\n", dev.description.c_str());

  try {
    // Order matters for teardown (reverse): the server and lanes go before the io_context, the
    // io_context before the reactor it may still have waits with, the reactor before the device.
    std::optional<evr::reactor> reactor;
    if (cfg.mode == wait_mode::evr) {
      evr::reactor_options opts;
      opts.strategy = cfg.strategy;
      reactor.emplace(*dev.backend, opts);
    }
    asio::io_context io(cfg.threads);

    std::vector<std::unique_ptr<lane>> lanes;
    for (int i = 0; i < cfg.streams; ++i) {
#if defined(EVR_ASYNC_SERVER_HAVE_KERNELS)
      if (dev.cuda) {
        lanes.push_back(make_cuda_lane());
        continue;
      }
#endif
      lanes.push_back(make_sim_lane(*dev.sim));
    }
    lane_pool pool(io.get_executor(), std::move(lanes));
    server_metrics metrics;
    server_config sc;
    sc.address = cfg.address;
    sc.port = static_cast<std::uint16_t>(cfg.port < 0 ? 0 : cfg.port);
    sc.mode = cfg.mode;
    sc.max_n = cfg.max_n;
    sc.io_timeout = std::chrono::seconds(cfg.timeout_seconds);
    sc.device_label = dev.label;
    sc.strategy_label = cfg.mode == wait_mode::evr ? evr::to_string(cfg.strategy) : "none";
    server srv(io, sc, pool, reactor ? &*reactor : nullptr, metrics);
    srv.start();

    std::printf("server: mode %s, %d thread%s, %d stream%s, %s, http://%s:%u/\n",
                to_string(cfg.mode), cfg.threads, cfg.threads == 1 ? "" : "s", cfg.streams,
                cfg.streams == 1 ? "" : "s",
                cfg.mode == wait_mode::evr
                    ? (std::string("strategy ") + evr::to_string(cfg.strategy)).c_str()
                    : "synchronize per request",
                cfg.address.c_str(), srv.port());
    std::fflush(stdout);

    std::optional<asio::signal_set> signals;
    if (cfg.what == action::serve) {
      signals.emplace(io, SIGINT, SIGTERM);
      signals->async_wait([&](std::error_code ec, int sig) {
        if (ec) return;
        std::printf("stopping (signal %d)\n", sig);
        srv.stop();
      });
      std::printf(
          "listening on http://%s:%u/ — try /saxpy?n=65536, /sum?n=65536, /metrics; Ctrl-C stops\n",
          cfg.address.c_str(), srv.port());
      std::fflush(stdout);
    }

    std::atomic<bool> crashed{false};
    std::vector<std::thread> threads;
    // Should anything below throw, stop the server and join its threads before unwinding
    // (destroying a joinable std::thread terminates the process).
    struct joiner {
      server& srv;
      std::vector<std::thread>& threads;
      ~joiner() {
        if (threads.empty() || !threads.front().joinable()) return;
        srv.stop();
        for (auto& t : threads) t.join();
      }
    } join_on_unwind{srv, threads};
    for (int i = 0; i < cfg.threads; ++i) {
      threads.emplace_back([&] {
        try {
          io.run();
        } catch (const std::exception& e) {
          // Only a bug gets here (client errors are answered, connection errors end the
          // connection).
          std::fprintf(stderr, "evr-async-server: io thread: %s\n", e.what());
          crashed = true;
          io.stop();
        }
      });
    }

    const asio::ip::tcp::endpoint endpoint(asio::ip::make_address(cfg.address), srv.port());
    std::optional<edge_report> edges;
    std::optional<load_report> load;
    if (cfg.what == action::self_test) {
      edges = run_edge_cases(endpoint, cfg.mode == wait_mode::evr);
      load_options lo;
      lo.server = endpoint;
      lo.connections = cfg.connections;
      lo.requests = cfg.self_test_requests;
      lo.max_n = cfg.max_n;
      load = run_load(lo);
      srv.stop();
    } else if (cfg.what == action::load) {
      load_options lo;
      lo.server = endpoint;
      lo.connections = cfg.connections;
      lo.duration = std::chrono::milliseconds(static_cast<long long>(cfg.load_seconds * 1000));
      lo.target = cfg.load_path;
      lo.max_n = cfg.max_n;
      load = run_load(lo);
      srv.stop();
    }
    for (auto& t : threads) t.join();  // serve: until a signal stops the server

    bool good = !crashed;
    if (edges) {
      std::printf("edge cases: %d checked, %zu failed\n", edges->checked, edges->failures.size());
      for (const auto& f : edges->failures) std::printf("  FAILED %s\n", f.c_str());
      good = good && edges->failures.empty();
    }
    if (load) {
      if (cfg.what == action::self_test) {
        std::printf(
            "self-test: %llu requests over %d connections in %.3f s (%.0f requests/s), %llu "
            "errors\n",
            static_cast<unsigned long long>(load->requests), cfg.connections, load->seconds,
            load->requests_per_second(), static_cast<unsigned long long>(load->errors));
        good = good && load->requests == cfg.self_test_requests;
      } else {
        std::printf(
            "load: %s on %s with %d connections for %.2f s: %llu requests (%.0f requests/s), %llu "
            "errors\n",
            to_string(cfg.mode), cfg.load_path.c_str(), cfg.connections, load->seconds,
            static_cast<unsigned long long>(load->requests), load->requests_per_second(),
            static_cast<unsigned long long>(load->errors));
      }
      print_latency("client: request written to response read", *load);
      if (!load->first_error.empty()) std::printf("first error: %s\n", load->first_error.c_str());
      good = good && load->errors == 0;
      if (cfg.what == action::load) {
        // One line for scripts (scripts/load-server.sh builds its table from it).
        std::printf(
            "load-result mode=%s device=%s threads=%d connections=%d seconds=%.3f requests=%llu "
            "errors=%llu rps=%.1f p50_us=%.1f p90_us=%.1f p99_us=%.1f max_us=%.1f\n",
            to_string(cfg.mode), dev.label.c_str(), cfg.threads, cfg.connections, load->seconds,
            static_cast<unsigned long long>(load->requests),
            static_cast<unsigned long long>(load->errors), load->requests_per_second(),
            load->percentile(0.5), load->percentile(0.9), load->percentile(0.99),
            load->percentile(1.0));
      }
    }
    const std::uint64_t ok = metrics.count(200, 299), client_errors = metrics.count(400, 499),
                        server_errors = metrics.count(500, 599);
    // 500: a wrong answer or a failed GPU wait; 503: out of memory. (501 and 505 answer requests
    // this server does not support, which the edge cases send on purpose.)
    const std::uint64_t failures = metrics.count(500, 500) + metrics.count(503, 503);
    std::printf(
        "server: %llu responses: %llu 2xx, %llu 4xx, %llu 5xx (%llu failures: wrong answers, GPU "
        "errors)\n",
        static_cast<unsigned long long>(ok + client_errors + server_errors),
        static_cast<unsigned long long>(ok), static_cast<unsigned long long>(client_errors),
        static_cast<unsigned long long>(server_errors), static_cast<unsigned long long>(failures));
    std::optional<evr::reactor_metrics> rm;
    if (reactor) {
      rm = reactor->metrics();
      std::printf("reactor: %s\n", reactor_summary(*rm).c_str());
    }
    good = good && failures == 0 && (!rm || (rm->failed == 0 && rm->in_flight == 0));
    if (cfg.what == action::self_test)
      std::printf("result: %s on the %s device\n", good ? "OK" : "FAILED",
                  dev.cuda ? "CUDA" : "simulated");
    return good ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "evr-async-server: %s\n", e.what());
    return 1;
  }
}
