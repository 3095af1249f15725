// evr-bench pool — acquire+release pairs per second, at 1..16 threads, for:
//   evr             evr::event_pool (pooled_event acquire + release)
//   mutex-deque     std::mutex + std::deque, FIFO (PyTorch c10d's CUDAEventCache pattern)
//   mps-stack       std::recursive_mutex + std::vector used as a stack (PyTorch's MPSEventPool)
//   create-destroy  a new event per use (backend create_event + destroy_event)
// Every method creates its events through the same backend: real CUDA events on a GPU, simulated
// ones otherwise. Each thread runs acquire+release pairs back to back for a fixed time; nothing is
// recorded, so this measures the pools themselves.
//
// Output: a table (threads x method: M pairs/s across all threads, and ns per pair per thread,
// i.e. wall time x threads / pairs) with the ratio evr / mutex-deque, and with --json every raw
// number.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <evr/device/backend.hpp>
#include <evr/pool/event_pool.hpp>
#include <evr/sim/device.hpp>

#include "cli.hpp"
#include "subcommands.hpp"

namespace {

namespace dev = evr::device;
using steady = std::chrono::steady_clock;

// --- the baselines -------------------------------------------------------------------------------

/// PyTorch c10d's CUDAEventCache: one mutex, a deque, take from the front, give back at the end.
class mutex_deque_pool {
 public:
  mutex_deque_pool(dev::backend& b, int device) : backend_(b), device_(device) {}
  ~mutex_deque_pool() {
    for (dev::native_event e : events_) backend_.destroy_event(e);
  }
  dev::native_event acquire() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!events_.empty()) {
        dev::native_event e = events_.front();
        events_.pop_front();
        return e;
      }
    }
    dev::native_event e = nullptr;
    if (backend_.create_event(device_, dev::event_flags::none, e)) return nullptr;
    return e;
  }
  void release(dev::native_event e) {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back(e);
  }

 private:
  dev::backend& backend_;
  int device_;
  std::mutex mutex_;
  std::deque<dev::native_event> events_;
};

/// PyTorch's MPSEventPool: a recursive mutex and a stack; creation under the lock.
class mps_stack_pool {
 public:
  mps_stack_pool(dev::backend& b, int device) : backend_(b), device_(device) {}
  ~mps_stack_pool() {
    for (dev::native_event e : events_) backend_.destroy_event(e);
  }
  dev::native_event acquire() {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    if (events_.empty()) {
      dev::native_event e = nullptr;
      if (backend_.create_event(device_, dev::event_flags::none, e)) return nullptr;
      return e;
    }
    dev::native_event e = events_.back();
    events_.pop_back();
    return e;
  }
  void release(dev::native_event e) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    events_.push_back(e);
  }

 private:
  dev::backend& backend_;
  int device_;
  std::recursive_mutex mutex_;
  std::vector<dev::native_event> events_;
};

/// No pool: an event created and destroyed per use.
class create_destroy {
 public:
  create_destroy(dev::backend& b, int device) : backend_(b), device_(device) {}
  dev::native_event acquire() {
    dev::native_event e = nullptr;
    if (backend_.create_event(device_, dev::event_flags::none, e)) return nullptr;
    return e;
  }
  void release(dev::native_event e) { backend_.destroy_event(e); }

 private:
  dev::backend& backend_;
  int device_;
};

/// evr::event_pool through its RAII handle (what a user writes).
class evr_pool {
 public:
  evr_pool(dev::backend& b, int device, std::size_t batch)
      : pool_(b, device, evr::event_class::plain, evr::pool_options{.initial = 0, .batch = batch}) {
  }
  evr::pooled_event acquire() {
    std::error_code ec;
    return pool_.acquire(ec);
  }
  static void release(evr::pooled_event& e) { e.release(); }
  evr::event_pool& pool() { return pool_; }

 private:
  evr::event_pool pool_;
};

// --- one measurement -------------------------------------------------------------------------

struct point {
  std::string method;
  int threads = 0;
  std::uint64_t pairs = 0;
  double seconds = 0;
  std::vector<std::uint64_t> per_thread;
  std::uint64_t failures = 0;
  std::optional<evr::pool_stats> evr_stats;  // evr only: the pool's stats after the run

  double mpairs_per_s() const {
    return seconds > 0 ? static_cast<double>(pairs) / seconds / 1e6 : 0;
  }
  double ns_per_pair_per_thread() const {
    return pairs > 0 ? seconds * 1e9 * threads / static_cast<double>(pairs) : 0;
  }
};

struct alignas(64) padded_count {
  std::uint64_t pairs = 0;
  std::uint64_t failures = 0;
  steady::time_point end{};
};

/// Runs `threads` threads doing acquire+release pairs on `pool` for `ms` milliseconds.
template <class Pool>
point run_point(Pool& pool, const char* method, int threads, int ms) {
  constexpr int chunk = 64;  // pairs between two looks at the stop flag
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::atomic<bool> stop{false};
  std::vector<padded_count> counts(static_cast<std::size_t>(threads));
  std::vector<std::thread> workers;
  workers.reserve(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      padded_count& mine = counts[static_cast<std::size_t>(t)];
      auto pair = [&] {
        auto e = pool.acquire();
        if (!e) {
          ++mine.failures;
          return;
        }
        pool.release(e);
      };
      for (int i = 0; i < 4 * chunk; ++i) pair();  // warm-up: growth, per-thread setup
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      std::uint64_t n = 0;
      do {
        for (int i = 0; i < chunk; ++i) pair();
        n += chunk;
      } while (!stop.load(std::memory_order_relaxed));
      mine.end = steady::now();
      mine.pairs = n;
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  const steady::time_point start = steady::now();
  go.store(true, std::memory_order_release);
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  stop.store(true, std::memory_order_relaxed);
  for (auto& w : workers) w.join();

  point p;
  p.method = method;
  p.threads = threads;
  steady::time_point end = start;
  for (const padded_count& c : counts) {
    p.pairs += c.pairs;
    p.failures += c.failures;
    p.per_thread.push_back(c.pairs);
    end = std::max(end, c.end);
  }
  p.seconds = std::chrono::duration<double>(end - start).count();
  return p;
}

// --- options -----------------------------------------------------------------------------------

const char* const all_methods[] = {"evr", "mutex-deque", "mps-stack", "create-destroy"};

struct options {
  int ms = 200;
  std::vector<int> threads{1, 2, 4, 8, 16};
  std::string device = "auto";
  std::string json;
  std::vector<std::string> methods{std::begin(all_methods), std::end(all_methods)};
  std::size_t batch = 32;
};

// --- output ----------------------------------------------------------------------------------

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

const point* find(const std::vector<point>& points, const std::string& method, int threads) {
  for (const point& p : points) {
    if (p.method == method && p.threads == threads) return &p;
  }
  return nullptr;
}

void print_table(const options& o, const std::vector<point>& points) {
  std::printf("\n%7s", "threads");
  for (const std::string& m : o.methods) std::printf(" | %-22s", m.c_str());
  const bool ratio = find(points, "evr", o.threads[0]) && find(points, "mutex-deque", o.threads[0]);
  if (ratio) std::printf(" | evr/mutex-deque");
  std::printf("\n%7s", "");
  for (std::size_t i = 0; i < o.methods.size(); ++i)
    std::printf(" | %9s %12s", "M pairs/s", "ns/pair/thr");
  if (ratio) std::printf(" |");
  std::printf("\n");
  for (int t : o.threads) {
    std::printf("%7d", t);
    for (const std::string& m : o.methods) {
      const point* p = find(points, m, t);
      if (p == nullptr) {
        std::printf(" | %22s", "-");
      } else {
        std::printf(" | %9.2f %12.1f", p->mpairs_per_s(), p->ns_per_pair_per_thread());
      }
    }
    if (ratio) {
      const point* e = find(points, "evr", t);
      const point* d = find(points, "mutex-deque", t);
      if (e && d && d->pairs > 0) std::printf(" | %8.2fx", e->mpairs_per_s() / d->mpairs_per_s());
    }
    std::printf("\n");
  }
}

bool write_json(const options& o, const std::string& device_name, const std::string& describe,
                const std::vector<point>& points) {
  std::FILE* f = std::fopen(o.json.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "evr-bench pool: cannot write %s\n", o.json.c_str());
    return false;
  }
  std::fprintf(f,
               "{\n  \"subcommand\": \"pool\",\n  \"device\": \"%s\",\n  \"describe\": \"%s\",\n",
               json_escape(device_name).c_str(), json_escape(describe).c_str());
  std::fprintf(f, "  \"ms_per_point\": %d,\n  \"evr_batch\": %zu,\n  \"hardware_threads\": %u,\n",
               o.ms, o.batch, std::thread::hardware_concurrency());
  std::fprintf(f, "  \"unit\": \"one acquire + one release = one pair\",\n  \"points\": [\n");
  for (std::size_t i = 0; i < points.size(); ++i) {
    const point& p = points[i];
    std::fprintf(f,
                 "    {\"method\": \"%s\", \"threads\": %d, \"pairs\": %llu, \"seconds\": %.6f, "
                 "\"mpairs_per_s\": %.4f, \"ns_per_pair_per_thread\": %.3f, \"failures\": %llu, "
                 "\"per_thread_pairs\": [",
                 p.method.c_str(), p.threads, static_cast<unsigned long long>(p.pairs), p.seconds,
                 p.mpairs_per_s(), p.ns_per_pair_per_thread(),
                 static_cast<unsigned long long>(p.failures));
    for (std::size_t k = 0; k < p.per_thread.size(); ++k) {
      std::fprintf(f, "%s%llu", k ? ", " : "", static_cast<unsigned long long>(p.per_thread[k]));
    }
    std::fprintf(f, "]");
    if (p.evr_stats) {
      const evr::pool_stats& s = *p.evr_stats;
      std::fprintf(
          f,
          ", \"evr_stats\": {\"created\": %llu, \"destroyed\": %llu, \"cached\": %llu, \"in_use\": "
          "%llu, "
          "\"peak_in_use\": %llu, \"acquires\": %llu, \"growths\": %llu}",
          static_cast<unsigned long long>(s.created), static_cast<unsigned long long>(s.destroyed),
          static_cast<unsigned long long>(s.cached), static_cast<unsigned long long>(s.in_use),
          static_cast<unsigned long long>(s.peak_in_use),
          static_cast<unsigned long long>(s.acquires), static_cast<unsigned long long>(s.growths));
    }
    std::fprintf(f, "}%s\n", i + 1 < points.size() ? "," : "");
  }
  std::fprintf(f, "  ],\n  \"ratios_evr_over_mutex_deque\": [");
  bool first = true;
  for (int t : o.threads) {
    const point* e = find(points, "evr", t);
    const point* d = find(points, "mutex-deque", t);
    if (!e || !d || d->pairs == 0) continue;
    std::fprintf(f, "%s\n    {\"threads\": %d, \"ratio\": %.4f}", first ? "" : ",", t,
                 e->mpairs_per_s() / d->mpairs_per_s());
    first = false;
  }
  std::fprintf(f, "\n  ]\n}\n");
  const bool ok = std::fclose(f) == 0;
  if (ok) std::printf("\nwrote %s\n", o.json.c_str());
  return ok;
}

}  // namespace

int evr_bench_pool(int argc, char** argv) {
  options o;
  CLI::App app{"acquire+release pairs per second of event pools, per thread count and method",
               "evr-bench pool"};
  app.add_option("--ms", o.ms, "measuring time per point, ms")
      ->check(CLI::Range(1, 600000))
      ->capture_default_str();
  app.add_option("--threads", o.threads, "thread counts")
      ->check(CLI::Range(1, 1024))
      ->delimiter(',')
      ->capture_default_str();
  evr::bench::add_device_option(app, o.device);
  app.add_option("--methods", o.methods, "which pools to measure")
      ->check(
          CLI::IsMember(std::vector<std::string>(std::begin(all_methods), std::end(all_methods))))
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--batch", o.batch, "evr's growth batch")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20))
      ->capture_default_str();
  evr::bench::add_json_option(app, o.json);
  if (int rc = evr::bench::parse_cli(app, argc, argv); rc >= 0) return rc;

  std::unique_ptr<evr::sim::device> sim;
  dev::backend* backend = nullptr;
  const bool want_cuda = o.device == "cuda" || (o.device == "auto" && dev::cuda_device_available());
  if (want_cuda) {
    if (!dev::cuda_device_available()) {
      std::fprintf(
          stderr, "evr-bench pool: --device cuda, but no usable GPU (or evr built without CUDA)\n");
      return 2;
    }
    backend = &dev::cuda_backend();
  } else {
    sim = std::make_unique<evr::sim::device>(
        evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::threaded});
    backend = sim.get();
  }
  const std::string device_name(backend->name());
  const std::string describe = backend->describe();
  std::printf("evr-bench pool: %s (%s), %d ms per point, evr batch %zu, %u hardware threads\n",
              device_name.c_str(), describe.c_str(), o.ms, o.batch,
              std::thread::hardware_concurrency());
  if (sim)
    std::printf(
        "  (simulated device: a sanity check only; create-destroy pays the simulator's own "
        "lock)\n");

  std::vector<point> points;
  bool failed = false;
  for (int t : o.threads) {
    for (const std::string& m : o.methods) {
      point p;
      if (m == "evr") {
        evr_pool pool(*backend, 0, o.batch);
        p = run_point(pool, "evr", t, o.ms);
        p.evr_stats = pool.pool().stats();
      } else if (m == "mutex-deque") {
        mutex_deque_pool pool(*backend, 0);
        p = run_point(pool, "mutex-deque", t, o.ms);
      } else if (m == "mps-stack") {
        mps_stack_pool pool(*backend, 0);
        p = run_point(pool, "mps-stack", t, o.ms);
      } else {
        create_destroy pool(*backend, 0);
        p = run_point(pool, "create-destroy", t, o.ms);
      }
      if (p.failures) {
        std::fprintf(stderr, "evr-bench pool: %s at %d threads: %llu acquires failed\n", m.c_str(),
                     t, static_cast<unsigned long long>(p.failures));
        failed = true;
      }
      std::printf("  %-15s %3d threads: %8.2f M pairs/s, %8.1f ns/pair/thread\n", m.c_str(), t,
                  p.mpairs_per_s(), p.ns_per_pair_per_thread());
      std::fflush(stdout);
      points.push_back(std::move(p));
    }
  }
  print_table(o, points);
  if (!o.json.empty() && !write_json(o, device_name, describe, points)) return 1;
  return failed ? 1 : 0;
}
