// evr-saxpy-streams: requests that each launch GPU work (y = a*x + y over N floats: copy in,
// kernel, copy out) on one of several streams and co_await its completion through evr, on one
// io_context thread. Every answer is checked against the CPU. Runs on the GPU when there is one, on
// the simulated device otherwise, and says which.
//
//   evr-saxpy-streams [--device auto|cuda|sim] [--streams S] [--requests R] [--elements N]
//            [--strategy adaptive|poll|fence|host_func]        (--help: the usage)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <asio.hpp>

#include <evr/callbacks/asio_compat.hpp>
#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "example_cli.hpp"

#if defined(EVR_SAXPY_STREAMS_HAVE_KERNELS)
#include <cuda_runtime.h>

#include "saxpy.hpp"
#endif

namespace {

using clock_type = std::chrono::steady_clock;

struct settings {
  std::string device = "auto";
  int streams = 8;
  int requests = 2000;
  std::size_t elements = 1 << 16;
  evr::strategy strategy = evr::strategy::adaptive;
};

/// Reads the command line into `s`. Returns -1 to run, or the exit code (0 after --help).
int parse(int argc, char** argv, settings& s) {
  CLI::App app{
      "Requests that launch GPU work (y = a*x + y) on several streams and co_await it "
      "through evr, on one io_context thread; every answer is checked",
      "evr-saxpy-streams"};
  examples::add_device_option(app, s.device);
  app.add_option("--streams", s.streams, "streams the requests are spread over")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--requests", s.requests, "requests in all")
      ->check(CLI::Range(1, 100000000))
      ->capture_default_str();
  app.add_option("--elements", s.elements, "floats per request")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 28))
      ->capture_default_str();
  const std::map<std::string, evr::strategy> strategies{{"adaptive", evr::strategy::adaptive},
                                                        {"poll", evr::strategy::poll},
                                                        {"fence", evr::strategy::fence},
                                                        {"host_func", evr::strategy::host_func}};
  std::string strategy = evr::to_string(s.strategy);
  app.add_option("--strategy", strategy, "how the reactor learns of completions")
      ->check(CLI::IsMember(strategies))
      ->capture_default_str();
  const int rc = examples::parse_cli(app, argc, argv);
  if (rc < 0) s.strategy = strategies.at(strategy);
  return rc;
}

/// One stream's buffers and how to enqueue a request's work on it.
class lane {
 public:
  virtual ~lane() = default;
  virtual const evr::stream& stream() const = 0;
  /// Enqueues: x,y in → y = a*x + y → y out, into result(). Throws on a device error.
  virtual void enqueue(float a, const std::vector<float>& x, const std::vector<float>& y) = 0;
  virtual const float* result() const = 0;
};

class sim_lane final : public lane {
 public:
  sim_lane(evr::sim::device& dev, std::size_t n) : dev_(dev), stream_(dev, 0), out_(n) {}
  const evr::stream& stream() const override { return stream_; }
  void enqueue(float a, const std::vector<float>& x, const std::vector<float>& y) override {
    // The simulated kernel does the arithmetic on the stream's worker thread, about 1 ns/element.
    auto body = [this, a, &x, &y] {
      for (std::size_t i = 0; i < out_.size(); ++i) out_[i] = a * x[i] + y[i];
    };
    evr::throw_if(dev_.launch_kernel(stream_.native(), std::chrono::nanoseconds(out_.size()), body),
                  "sim launch_kernel");
  }
  const float* result() const override { return out_.data(); }

 private:
  evr::sim::device& dev_;
  evr::stream stream_;
  std::vector<float> out_;
};

#if defined(EVR_SAXPY_STREAMS_HAVE_KERNELS)
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw evr::error(evr::make_cuda_error(e), what);
}

class cuda_lane final : public lane {
 public:
  explicit cuda_lane(std::size_t n) : stream_(evr::device::cuda_backend(), 0), n_(n) {
    check(cudaMalloc(&x_, n * sizeof(float)), "cudaMalloc");
    check(cudaMalloc(&y_, n * sizeof(float)), "cudaMalloc");
    check(cudaMallocHost(&host_, n * sizeof(float)), "cudaMallocHost");
  }
  ~cuda_lane() override {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_.native()));
    cudaFree(x_);
    cudaFree(y_);
    cudaFreeHost(host_);
  }
  const evr::stream& stream() const override { return stream_; }
  void enqueue(float a, const std::vector<float>& x, const std::vector<float>& y) override {
    auto s = static_cast<cudaStream_t>(stream_.native());
    check(cudaMemcpyAsync(x_, x.data(), n_ * sizeof(float), cudaMemcpyHostToDevice, s),
          "copy x in");
    check(cudaMemcpyAsync(y_, y.data(), n_ * sizeof(float), cudaMemcpyHostToDevice, s),
          "copy y in");
    check(static_cast<cudaError_t>(saxpy_streams::launch_saxpy(s, a, x_, y_, n_)), "saxpy kernel");
    check(cudaMemcpyAsync(host_, y_, n_ * sizeof(float), cudaMemcpyDeviceToHost, s), "copy y out");
  }
  const float* result() const override { return host_; }

 private:
  evr::stream stream_;
  std::size_t n_;
  float* x_ = nullptr;
  float* y_ = nullptr;
  float* host_ = nullptr;
};
#endif

struct totals {
  int done = 0;
  int wrong = 0;
  int failed = 0;
  std::vector<double> latency_us;
};

asio::awaitable<void> client(evr::gpu_waiter& waiter, lane& l, int requests, std::size_t n,
                             totals& t) {
  std::vector<float> x(n), y(n);
  for (int r = 0; r < requests; ++r) {
    const float a = 0.5f + static_cast<float>(r % 7);
    for (std::size_t i = 0; i < n; ++i) {
      x[i] = static_cast<float>((i * 31 + static_cast<std::size_t>(r)) % 1000) * 0.01f;
      y[i] = static_cast<float>((i * 17) % 100) * 0.1f;
    }
    const auto t0 = clock_type::now();
    l.enqueue(a, x, y);
    auto [ec] = co_await waiter.async_wait(l.stream(), evr::compat::as_tuple(asio::use_awaitable));
    t.latency_us.push_back(
        std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
    if (ec) {
      ++t.failed;
      std::fprintf(stderr, "request failed: %s\n", ec.message().c_str());
      continue;
    }
    const float* out = l.result();
    for (std::size_t i = 0; i < n; i += std::max<std::size_t>(1, n / 64)) {
      if (std::fabs(out[i] - (a * x[i] + y[i])) > 1e-3f * std::fabs(a * x[i] + y[i]) + 1e-5f) {
        ++t.wrong;
        break;
      }
    }
    ++t.done;
  }
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  settings cfg;
  if (int rc = parse(argc, argv, cfg); rc >= 0) return rc;
  bool use_cuda = false;
  if (cfg.device == "cuda" || cfg.device == "auto") {
#if defined(EVR_SAXPY_STREAMS_HAVE_KERNELS)
    use_cuda = evr::device::cuda_device_available();
#endif
    if (cfg.device == "cuda" && !use_cuda) {
      std::fprintf(
          stderr,
          "evr-saxpy-streams: --device cuda, but no usable CUDA device (or built without CUDA)\n");
      return 1;
    }
  }
  std::unique_ptr<evr::sim::device> sim;
  evr::device::backend* backend = nullptr;
  if (use_cuda) {
    backend = &evr::device::cuda_backend();
    std::printf("device: %s\n", backend->describe().c_str());
  } else {
    sim = std::make_unique<evr::sim::device>(
        evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::threaded});
    backend = sim.get();
    std::printf("device: SIMULATED (no GPU %s) — %s\n", cfg.device == "sim" ? "requested" : "found",
                sim->describe().c_str());
  }
  std::printf("work: %d requests over %d streams, y = a*x + y on %zu floats each, strategy %s\n",
              cfg.requests, cfg.streams, cfg.elements, evr::to_string(cfg.strategy));

  try {
    evr::reactor_options opts;
    opts.strategy = cfg.strategy;
    evr::reactor reactor(*backend, opts);
    asio::io_context io(1);
    evr::gpu_waiter waiter(io.get_executor(), reactor);

    std::vector<std::unique_ptr<lane>> lanes;
    for (int i = 0; i < cfg.streams; ++i) {
#if defined(EVR_SAXPY_STREAMS_HAVE_KERNELS)
      if (use_cuda) {
        lanes.push_back(std::make_unique<cuda_lane>(cfg.elements));
        continue;
      }
#endif
      lanes.push_back(std::make_unique<sim_lane>(*sim, cfg.elements));
    }
    std::vector<totals> per_lane(lanes.size());
    const auto t0 = clock_type::now();
    for (std::size_t i = 0; i < lanes.size(); ++i) {
      int share =
          cfg.requests / cfg.streams + (static_cast<int>(i) < cfg.requests % cfg.streams ? 1 : 0);
      asio::co_spawn(io, client(waiter, *lanes[i], share, cfg.elements, per_lane[i]),
                     [](std::exception_ptr e) {
                       if (e) std::rethrow_exception(e);
                     });
    }
    io.run();  // one thread serves every request: no thread blocks per request
    const double seconds = std::chrono::duration<double>(clock_type::now() - t0).count();

    totals all;
    for (auto& t : per_lane) {
      all.done += t.done;
      all.wrong += t.wrong;
      all.failed += t.failed;
      all.latency_us.insert(all.latency_us.end(), t.latency_us.begin(), t.latency_us.end());
    }
    auto m = reactor.metrics();
    std::printf(
        "requests: %d completed, %d wrong answers, %d failed, in %.3f s (%.0f requests/s)\n",
        all.done, all.wrong, all.failed, seconds, all.done / seconds);
    std::printf("latency per request (launch to handler): p50 %.1f us, p90 %.1f us, p99 %.1f us\n",
                percentile(all.latency_us, 0.5), percentile(all.latency_us, 0.9),
                percentile(all.latency_us, 0.99));
    std::printf(
        "reactor: %llu waits completed, %llu sweeps, %llu event queries, %llu stream probes, "
        "%llu doorbells, %llu sleeps, %llu wake-ups\n",
        static_cast<unsigned long long>(m.completed), static_cast<unsigned long long>(m.sweeps),
        static_cast<unsigned long long>(m.event_queries),
        static_cast<unsigned long long>(m.stream_queries),
        static_cast<unsigned long long>(m.doorbells), static_cast<unsigned long long>(m.parks),
        static_cast<unsigned long long>(m.wakeups));
    std::printf("result: %s on the %s device\n",
                (all.wrong == 0 && all.failed == 0 && all.done == cfg.requests) ? "OK" : "FAILED",
                use_cuda ? "CUDA" : "simulated");
    return (all.wrong == 0 && all.failed == 0 && all.done == cfg.requests) ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "evr-saxpy-streams: %s\n", e.what());
    return 1;
  }
}
