// evr-bench idle — how late each way of waiting finds GPU work of the lengths users run, and what
// it costs the CPU: the sweep behind the default idle policy's goals (docs/benchmarks.md).
//
// Method: the gate kernels of `evr-bench latency`, many at once. Each lane (a stream) runs jobs
// one after another: a one-thread gate kernel is launched, the notification under test is put
// behind it (an evr wait, an event record, a host function), and an opener thread opens the gate
// D after the notification was submitted, D drawn per job (steady D +-jitter, uniform, bimodal).
// From the waiting side this is GPU work that ends D after the wait was submitted; the gate's
// opening time t0 is known exactly, so a job's latency is t1 - t0 where t1 is taken in the
// handler (or when the waiting thread returns), as in the floor measurement (kernel writes an
// ack, the host spins on it) taken in the same run. The next job of a lane is launched once its
// previous one was seen done: each lane is a closed loop, one request in flight, back to back.
//
// CPU: for evr, the reactor thread's own CPU clock; for the thread-per-stream baselines, the
// waiting threads' CPU clocks summed over their waits (the driver's host-function thread, which
// runs host functions for the host_func rows, is not counted: it belongs to the driver).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <functional>
#include <future>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <evr/evr.hpp>

#include "bench_device.hpp"
#include "cli.hpp"
#include "cpu_case.hpp"
#include "io_thread.hpp"
#include "methods.hpp"
#include "stats.hpp"
#include "subcommands.hpp"

namespace evr::bench {
namespace {

using std::chrono::nanoseconds;

std::int64_t now_ns() { return bench_clock::now().time_since_epoch().count(); }

std::int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// ---- workloads ----------------------------------------------------------------------------------

struct workload {
  enum class shape { steady, uniform, bimodal } kind = shape::steady;
  double d_us = 1000;                // steady: the length
  double jitter = 0.05;              // steady: +- this fraction, uniform
  double lo_us = 100, hi_us = 5000;  // uniform: the range; bimodal: the two lengths (+- jitter)
  int lanes = 1;
  int samples = 100;  // measured jobs over all lanes

  std::string name() const {
    char buf[96];
    switch (kind) {
      case shape::steady:
        std::snprintf(buf, sizeof buf, "steady %s +-%g%%", us_text(d_us).c_str(), jitter * 100);
        break;
      case shape::uniform:
        std::snprintf(buf, sizeof buf, "uniform %s-%s", us_text(lo_us).c_str(),
                      us_text(hi_us).c_str());
        break;
      case shape::bimodal:
        std::snprintf(buf, sizeof buf, "bimodal %s / %s", us_text(lo_us).c_str(),
                      us_text(hi_us).c_str());
        break;
    }
    return std::string(buf) + ", " + std::to_string(lanes) + (lanes == 1 ? " stream" : " streams");
  }
  const char* kind_name() const {
    switch (kind) {
      case shape::steady: return "steady";
      case shape::uniform: return "uniform";
      case shape::bimodal: return "bimodal";
    }
    return "?";
  }
  double mean_us() const {
    switch (kind) {
      case shape::steady: return d_us;
      case shape::uniform:
      case shape::bimodal: return (lo_us + hi_us) / 2;
    }
    return d_us;
  }
  nanoseconds draw(std::mt19937_64& rng) const {
    std::uniform_real_distribution<double> u(-jitter, jitter);
    double us = d_us;
    switch (kind) {
      case shape::steady: us = d_us * (1 + u(rng)); break;
      case shape::uniform: us = std::uniform_real_distribution<double>(lo_us, hi_us)(rng); break;
      case shape::bimodal: us = (rng() & 1 ? hi_us : lo_us) * (1 + u(rng)); break;
    }
    return nanoseconds(static_cast<std::int64_t>(us * 1000));
  }
  static std::string us_text(double us) {
    char buf[32];
    if (us >= 1000)
      std::snprintf(buf, sizeof buf, "%g ms", us / 1000);
    else
      std::snprintf(buf, sizeof buf, "%g us", us);
    return buf;
  }
};

// ---- lanes and the gate opener ------------------------------------------------------------------

/// One stream running one job at a time. The atomics are shared between the driver (or the
/// lane's own thread), the opener and the handler.
struct lane {
  lane(device::backend& be, std::size_t g, std::uint64_t seed)
      : stream(be, 0), gate(g), rng(seed) {}
  evr::stream stream;
  std::size_t gate;
  std::mt19937_64 rng;
  std::atomic<std::int64_t> due{0};     // the opener opens the gate at this time (0: nothing to)
  std::atomic<std::int64_t> t_open{0};  // when it did (t0)
  std::atomic<std::int64_t> t_done{0};  // when the waiting code learned it (t1)
  std::atomic<bool> failed{false};
  int launched = 0;
  bool in_flight = false;
};

/// Opens each lane's gate at its due time: a thread spinning over the lanes (on the simulated
/// device it yields between passes: CI machines are small).
class gate_opener {
 public:
  gate_opener(bench_device& dev, std::vector<std::unique_ptr<lane>>& lanes, bool yield)
      : dev_(dev), lanes_(lanes), yield_(yield), thread_([this] { run(); }) {}
  ~gate_opener() {
    stop_.store(true);
    thread_.join();
  }

 private:
  void run() {
    while (!stop_.load(std::memory_order_relaxed)) {
      const std::int64_t now = now_ns();
      for (auto& l : lanes_) {
        const std::int64_t due = l->due.load(std::memory_order_acquire);
        if (due == 0 || now < due) continue;
        l->due.store(0, std::memory_order_relaxed);
        // t0 is published before the gate opens: whoever sees the job done sees t0.
        l->t_open.store(now_ns(), std::memory_order_release);
        dev_.open_gate(l->gate);
      }
      if (yield_) std::this_thread::yield();
    }
  }
  bench_device& dev_;
  std::vector<std::unique_ptr<lane>>& lanes_;
  bool yield_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// ---- one row ------------------------------------------------------------------------------------

struct row_result {
  std::string key, name, delivery, group;  // group: "evr" or "baseline"
  std::vector<double> samples;             // ns, measured jobs only
  double cpu_ns = 0, wall_ns = 0;
  std::uint64_t misses = 0, doorbells = 0, wakeups = 0;
  bool failed = false;
  /// evr rows: the reactor's timed sleeps that ended late, and its fault probes (driver calls)
  /// that took long, during the row: where a late completion's time went.
  latency_histogram nap_overshoot{}, probe_time{};
  /// evr rows: the reactor's sweeps, event queries and timed or untimed sleeps during the row
  /// (where its CPU went: many sweeps of many streams, or few).
  std::uint64_t sweeps = 0, event_queries = 0, naps = 0;
  double cpu_percent() const { return wall_ns > 0 ? 100.0 * cpu_ns / wall_ns : 0; }
  double cpu_per_completion() const {
    return samples.empty() ? 0 : cpu_ns / static_cast<double>(samples.size());
  }
};

constexpr int warmup_per_lane = 8;  // jobs per lane before measuring (the model learns)

int per_lane_quota(const workload& w) {
  return warmup_per_lane + (w.samples + w.lanes - 1) / w.lanes;
}

void launch_gate(bench_device& dev, lane& l) {
  dev.close_gate(l.gate);
  l.t_open.store(0, std::memory_order_relaxed);
  l.t_done.store(0, std::memory_order_relaxed);
  dev.launch_gate(l.stream.native(), false, l.gate);
}

void schedule_open(const workload& w, lane& l) {
  l.due.store(now_ns() + w.draw(l.rng).count(), std::memory_order_release);
}

/// One driver thread (this one) launches every lane's jobs and collects their samples. `submit`
/// puts the notification under test behind the lane's gate kernel (it sets lane::t_done when it
/// learns the job is done); `poll`, called every pass for lanes in flight, may set it too.
template <typename Submit, typename Poll>
void drive(bench_device& dev, std::vector<std::unique_ptr<lane>>& lanes, const workload& w,
           bool ack, Submit submit, Poll poll, row_result& out,
           const std::function<void()>& measuring_starts) {
  const int quota = per_lane_quota(w);
  const int lanes_n = static_cast<int>(lanes.size());
  const bool sim = dev.name() == "sim";
  gate_opener opener(dev, lanes, sim);
  for (auto& l : lanes) {
    l->launched = 0;
    l->in_flight = false;
  }
  int warm_done = 0, finished_lanes = 0;
  std::int64_t wall0 = now_ns();
  while (finished_lanes < lanes_n) {
    bool busy = false;
    for (auto& lp : lanes) {
      lane& l = *lp;
      if (l.in_flight) {
        poll(l);
        const std::int64_t t1 = l.t_done.load(std::memory_order_acquire);
        if (t1 == 0) continue;
        busy = true;
        l.in_flight = false;
        if (l.launched > warmup_per_lane) {
          out.samples.push_back(static_cast<double>(t1 - l.t_open.load(std::memory_order_acquire)));
        } else if (++warm_done == lanes_n * warmup_per_lane) {
          wall0 = now_ns();
          measuring_starts();
        }
        if (l.launched == quota) ++finished_lanes;
      }
      if (!l.in_flight && l.launched < quota) {
        busy = true;
        dev.close_gate(l.gate);
        l.t_open.store(0, std::memory_order_relaxed);
        l.t_done.store(0, std::memory_order_relaxed);
        dev.launch_gate(l.stream.native(), ack, l.gate);
        submit(l);
        schedule_open(w, l);
        ++l.launched;
        l.in_flight = true;
      }
    }
    if (!busy && sim) std::this_thread::yield();
  }
  out.wall_ns = static_cast<double>(now_ns() - wall0);
  for (auto& l : lanes) out.failed |= l->failed.exchange(false);
}

/// The floor of this workload: the gate kernel itself writes an ack to mapped memory when it
/// ends, and the driver, spinning, sees it. Nothing waits for the GPU faster.
row_result run_floor(bench_device& dev, std::vector<std::unique_ptr<lane>>& lanes,
                     const workload& w) {
  row_result out{"floor", "floor: kernel writes ack to mapped memory, host spins",
                 "spin",  "floor",
                 {},      0,
                 0,       0,
                 0,       0,
                 false,   {},
                 {}};
  drive(
      dev, lanes, w, /*ack=*/true, [](lane&) {},
      [&](lane& l) {
        if (dev.acked(l.gate)) l.t_done.store(now_ns(), std::memory_order_release);
      },
      out, [] {});
  out.cpu_ns = out.wall_ns;  // one core spinning
  // The gate kernel, and so the stream, may still be finishing: let the next row start clean.
  for (auto& l : lanes) (void)dev.backend().synchronize_stream(l->stream.native());
  return out;
}

/// evr with method `m`, delivered inline on the reactor thread or posted to an io_context thread.
row_result run_evr(bench_device& dev, std::vector<std::unique_ptr<lane>>& lanes, const workload& w,
                   const evr_method& m, bool posted) {
  row_result out{m.key, m.name, posted ? "posted" : "inline", "evr", {}, 0, 0, 0, 0, 0, false,
                 {},    {}};
  reactor r(dev.backend(), m.options);
  std::unique_ptr<io_thread> io;
  std::unique_ptr<gpu_waiter> waiter;
  if (posted) {
    io = std::make_unique<io_thread>();
    waiter = std::make_unique<gpu_waiter>(io->io().get_executor(), r);
  }
  auto mark = [](lane* l) {
    return [l](std::error_code ec) {
      if (ec) l->failed.store(true, std::memory_order_relaxed);
      l->t_done.store(now_ns(), std::memory_order_release);
    };
  };
  std::chrono::nanoseconds cpu0{};
  reactor_metrics metrics0{};
  drive(
      dev, lanes, w, /*ack=*/false,
      [&](lane& l) {
        if (posted) {
          waiter->async_wait(l.stream, mark(&l));
        } else {
          evr::throw_if(on_complete(r, l.stream, mark(&l)), "on_complete");
        }
      },
      [](lane&) {}, out,
      [&] {
        cpu0 = r.cpu_time();
        metrics0 = r.metrics();
      });
  out.cpu_ns = static_cast<double>((r.cpu_time() - cpu0).count());
  const reactor_metrics m1 = r.metrics();
  out.misses = m1.prediction_misses - metrics0.prediction_misses;
  out.doorbells = m1.doorbells - metrics0.doorbells;
  out.wakeups = m1.wakeups - metrics0.wakeups;
  out.sweeps = m1.sweeps - metrics0.sweeps;
  out.event_queries = m1.event_queries - metrics0.event_queries;
  out.naps = m1.parks - metrics0.parks;
  for (int i = 0; i < latency_histogram::buckets; ++i) {
    out.nap_overshoot.counts[i] = m1.nap_overshoot.counts[i] - metrics0.nap_overshoot.counts[i];
    out.probe_time.counts[i] = m1.fault_probe_time.counts[i] - metrics0.fault_probe_time.counts[i];
  }
  return out;
}

/// What a user writes without evr: a thread per stream that launches its work and blocks.
struct baseline {
  std::string key, name;
  enum class how { blocking_sync_event, host_func_promise, stream_synchronize } kind;
};

row_result run_baseline(bench_device& dev, std::vector<std::unique_ptr<lane>>& lanes,
                        const workload& w, const baseline& b) {
  row_result out{b.key, b.name, "thread", "baseline", {}, 0, 0, 0, 0, 0, false, {}, {}};
  device::backend& be = dev.backend();
  const int quota = per_lane_quota(w);
  const bool sim = dev.name() == "sim";
  gate_opener opener(dev, lanes, sim);
  struct per_thread {
    std::vector<double> samples;
    std::int64_t cpu = 0, first = 0, last = 0;
    bool failed = false;
  };
  std::vector<per_thread> results(lanes.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < lanes.size(); ++i) {
    threads.emplace_back([&, i] {
      lane& l = *lanes[i];
      per_thread& res = results[i];
      device::native_event ev = nullptr;
      if (b.kind == baseline::how::blocking_sync_event)
        evr::throw_if(be.create_event(0, device::event_flags::blocking_sync, ev), "create event");
      for (int k = 0; k < quota; ++k) {
        launch_gate(dev, l);
        std::promise<void> promise;
        std::future<void> done = promise.get_future();
        std::error_code ec;
        switch (b.kind) {
          case baseline::how::blocking_sync_event:
            ec = be.record_event(ev, l.stream.native());
            break;
          case baseline::how::host_func_promise:
            ec = be.launch_host_func(
                l.stream.native(),
                [](void* p) { static_cast<std::promise<void>*>(p)->set_value(); }, &promise);
            break;
          case baseline::how::stream_synchronize: break;
        }
        evr::throw_if(ec, "baseline marker");
        schedule_open(w, l);
        const bool measured = k >= warmup_per_lane;
        const std::int64_t c0 = thread_cpu_ns();
        if (measured && res.first == 0) res.first = now_ns();
        switch (b.kind) {
          case baseline::how::blocking_sync_event: ec = be.synchronize_event(ev); break;
          case baseline::how::host_func_promise: done.get(); break;
          case baseline::how::stream_synchronize:
            ec = be.synchronize_stream(l.stream.native());
            break;
        }
        const std::int64_t t1 = now_ns();
        const std::int64_t c1 = thread_cpu_ns();
        if (ec) res.failed = true;
        if (measured) {
          res.samples.push_back(static_cast<double>(t1 - l.t_open.load(std::memory_order_acquire)));
          res.cpu += c1 - c0;
          res.last = t1;
        }
        // The gate kernel and the marker are done: the next job may reuse the gate.
        (void)be.synchronize_stream(l.stream.native());
      }
      if (ev != nullptr) be.destroy_event(ev);
    });
  }
  for (auto& t : threads) t.join();
  std::int64_t first = 0, last = 0;
  for (auto& r : results) {
    out.samples.insert(out.samples.end(), r.samples.begin(), r.samples.end());
    out.cpu_ns += static_cast<double>(r.cpu);
    if (r.first != 0 && (first == 0 || r.first < first)) first = r.first;
    last = std::max(last, r.last);
    out.failed |= r.failed;
  }
  out.wall_ns = static_cast<double>(last - first);
  return out;
}

// ---- the floor ----------------------------------------------------------------------------------

series measure_floor(bench_device& dev, int samples) {
  evr::stream s(dev.backend(), 0);
  series out{"floor: kernel writes ack to mapped memory", "floor", {}};
  for (int i = 0; i < samples + 20; ++i) {
    dev.close_gate(0);
    dev.launch_gate(s.native(), true, 0);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    const auto t0 = bench_clock::now();
    dev.open_gate(0);
    // Bounded: a gate kernel that never acknowledges (a broken device or bench) must end the run
    // with an error, not hang it.
    while (!dev.acked(0)) {
      if (bench_clock::now() - t0 > std::chrono::seconds(5))
        throw std::runtime_error("floor: the gate kernel did not acknowledge within 5 s");
    }
    const auto t1 = bench_clock::now();
    if (i >= 20) out.samples.push_back(ns_between(t0, t1));
    evr::throw_if(dev.backend().synchronize_stream(s.native()), "synchronize after a floor sample");
  }
  return out;
}

// ---- settings, report ---------------------------------------------------------------------------

/// "NAME:key=value,key=value": the default's options with some changed, as an extra method named
/// "evr default, NAME" (tuning runs compare them with the default in one run). Keys: strategy,
/// idle, prespin_us, final_sleep_us, coalesce_us, poll_period_us, spin_fraction, poll_budget,
/// poll_looks (per second), spin_window_us, max_sleep_us, doorbell_after_us, fence_streams (a
/// number, or "unlimited").
/// Throws std::invalid_argument naming what is wrong.
evr_method parse_variant(const std::string& spec) {
  const std::size_t colon = spec.find(':');
  if (colon == 0 || colon == std::string::npos || colon + 1 == spec.size())
    throw std::invalid_argument("--variant '" + spec + "': expected NAME:key=value[,key=value]");
  evr_method m{"default-" + spec.substr(0, colon), "evr default, " + spec.substr(0, colon), {}};
  std::size_t at = colon + 1;
  while (at < spec.size()) {
    std::size_t comma = spec.find(',', at);
    if (comma == std::string::npos) comma = spec.size();
    const std::string kv = spec.substr(at, comma - at);
    at = comma + 1;
    const std::size_t eq = kv.find('=');
    if (eq == std::string::npos)
      throw std::invalid_argument("--variant '" + spec + "': '" + kv + "' is not key=value");
    const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
    auto number = [&] {
      std::size_t used = 0;
      double v = 0;
      try {
        v = std::stod(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != value.size() || v < 0)
        throw std::invalid_argument("--variant '" + spec + "': " + key +
                                    " takes a number >= 0, not '" + value + "'");
      return v;
    };
    auto us = [&] { return nanoseconds(static_cast<std::int64_t>(number() * 1000)); };
    reactor_options& o = m.options;
    if (key == "strategy") {
      auto v = strategy_from_string(value);
      if (!v) throw std::invalid_argument("--variant '" + spec + "': no strategy '" + value + "'");
      o.strategy = *v;
    } else if (key == "idle") {
      auto v = idle_mode_from_string(value);
      if (!v) throw std::invalid_argument("--variant '" + spec + "': no idle mode '" + value + "'");
      o.idle = *v;
    } else if (key == "prespin_us") {
      o.prespin = us();
    } else if (key == "final_sleep_us") {
      o.final_sleep = us();
    } else if (key == "coalesce_us") {
      o.coalesce = us();
    } else if (key == "poll_period_us") {
      o.poll_period = us();
    } else if (key == "spin_window_us") {
      o.spin_window = us();
    } else if (key == "max_sleep_us") {
      o.max_sleep = us();
    } else if (key == "doorbell_after_us") {
      o.doorbell_after = us();
    } else if (key == "spin_fraction") {
      o.spin_fraction = number();
    } else if (key == "poll_budget") {
      o.poll_budget = number();
    } else if (key == "poll_looks") {
      o.poll_looks_per_second = static_cast<std::size_t>(number());
    } else if (key == "fence_streams") {
      o.max_fence_streams = value == "unlimited" ? SIZE_MAX : static_cast<std::size_t>(number());
    } else {
      throw std::invalid_argument("--variant '" + spec + "': unknown key '" + key + "'");
    }
  }
  return m;
}

struct idle_settings_cli {
  std::string device = "auto";
  std::vector<double> lengths_us{20, 200, 1000, 5000, 20000};
  std::vector<int> lanes{1, 64};
  double jitter = 0.05;
  double scale = 1.0;
  bool steady = true;
  bool irregular = true;
  bool idle_case = true;
  std::vector<std::string> methods{"default", "fence-spin",    "poll-spin",         "host_func",
                                   "ladder",  "blocking-sync", "host-func-promise", "stream-sync"};
  bool posted = true;
  int floor_samples = 300;
  std::string json;
};

/// Samples measured per workload (before --scale): enough jobs for p99 within a few seconds.
int default_samples(const workload& w) {
  if (w.lanes > 1) return 640;
  const double mean = w.mean_us();
  if (mean <= 50) return 1000;
  if (mean <= 500) return 600;
  if (mean <= 2000) return 300;
  if (mean <= 10000) return 150;
  return 60;
}

std::vector<workload> workloads(const idle_settings_cli& cfg) {
  std::vector<workload> out;
  for (int lanes : cfg.lanes) {
    for (double d : cfg.steady ? cfg.lengths_us : std::vector<double>{}) {
      workload w;
      w.kind = workload::shape::steady;
      w.d_us = d;
      w.jitter = cfg.jitter;
      w.lanes = lanes;
      out.push_back(w);
    }
    if (cfg.irregular) {
      workload u;
      u.kind = workload::shape::uniform;
      u.lanes = lanes;
      out.push_back(u);
      workload b;
      b.kind = workload::shape::bimodal;
      b.jitter = cfg.jitter;
      b.lanes = lanes;
      out.push_back(b);
    }
  }
  for (auto& w : out)
    w.samples = std::max(20, static_cast<int>(std::lround(default_samples(w) * cfg.scale)));
  return out;
}

struct scenario_result {
  workload w;
  std::vector<row_result> rows;
  double seconds = 0;
};

const row_result* find_row(const scenario_result& s, const std::string& key,
                           const std::string& delivery) {
  for (const auto& r : s.rows)
    if (r.key == key && (delivery.empty() || r.delivery == delivery)) return &r;
  return nullptr;
}

/// A power-of-two histogram as a JSON array of counts (bucket i: [2^i, 2^(i+1)) ns).
std::string histogram_json(const latency_histogram& h) {
  std::vector<double> v(h.counts.begin(), h.counts.end());
  return json_writer::array(v);
}

/// Samples of `h` at or above `ns` (bucket resolution: counts buckets starting at or above it).
std::uint64_t at_least(const latency_histogram& h, std::uint64_t ns) {
  std::uint64_t n = 0;
  for (int i = 0; i < latency_histogram::buckets; ++i)
    if ((std::uint64_t{1} << i) >= ns) n += h.counts[static_cast<std::size_t>(i)];
  return n;
}

std::string row_json(const row_result& r, const series& floor) {
  const series s{r.name, r.group, r.samples};
  return "{\"key\":" + json_writer::quote(r.key) + ",\"name\":" + json_writer::quote(r.name) +
         ",\"delivery\":" + json_writer::quote(r.delivery) +
         ",\"group\":" + json_writer::quote(r.group) +
         ",\"samples\":" + std::to_string(r.samples.size()) +
         ",\"p50_ns\":" + json_writer::number(s.p50()) +
         ",\"p90_ns\":" + json_writer::number(s.p90()) +
         ",\"p99_ns\":" + json_writer::number(s.p99()) +
         ",\"p50_over_floor\":" + json_writer::number(s.p50() / floor.p50()) +
         ",\"p99_over_floor_p99\":" + json_writer::number(s.p99() / floor.p99()) +
         ",\"cpu_percent\":" + json_writer::number(r.cpu_percent()) +
         ",\"cpu_ns_per_completion\":" + json_writer::number(r.cpu_per_completion()) +
         ",\"prediction_misses\":" + std::to_string(r.misses) +
         ",\"doorbells\":" + std::to_string(r.doorbells) +
         ",\"wakeups\":" + std::to_string(r.wakeups) + ",\"sweeps\":" + std::to_string(r.sweeps) +
         ",\"event_queries\":" + std::to_string(r.event_queries) +
         ",\"naps\":" + std::to_string(r.naps) +
         ",\"nap_overshoot_log2_ns\":" + histogram_json(r.nap_overshoot) +
         ",\"probe_time_log2_ns\":" + histogram_json(r.probe_time) +
         ",\"failed\":" + (r.failed ? "true" : "false") +
         ",\"samples_ns\":" + json_writer::array(r.samples) + "}";
}

/// The floor of a scenario (its "floor" row), or `fallback` when it has none.
series floor_of(const scenario_result& sc, const series& fallback) {
  for (const auto& r : sc.rows)
    if (r.key == "floor" && !r.samples.empty()) return series{r.name, r.group, r.samples};
  return fallback;
}

/// One goal line: met / missed and the numbers.
void goal(std::string& json, const std::string& what, bool met, const std::string& figures) {
  std::printf("  %-7s %s: %s\n", met ? "met" : "MISSED", what.c_str(), figures.c_str());
  if (json.size() > 1) json += ",";
  json += "{\"goal\":" + json_writer::quote(what) + ",\"met\":" + (met ? "true" : "false") +
          ",\"figures\":" + json_writer::quote(figures) + "}";
}

std::string fmt(const char* f, double a, double b = 0, double c = 0, double d = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, a, b, c, d);
  return buf;
}

std::string evaluate_goals(const std::vector<scenario_result>& results, const series& floor,
                           const std::vector<cpu_case_row>& cpu_rows) {
  std::string json = "[";
  std::printf(
      "\ngoals (default = evr default, inline delivery; ratios to the floor of the same "
      "workload, measured in this run)\n");
  for (const auto& sc : results) {
    const series fl = floor_of(sc, floor);
    auto ratio = [&](const row_result& r, double q) {
      const series s{"", "", r.samples};
      return q == 0.5 ? s.p50() / fl.p50() : s.p99() / fl.p99();
    };
    const row_result* d = find_row(sc, "default", "inline");
    if (d == nullptr || d->samples.empty()) continue;
    const workload& w = sc.w;
    const std::string where = w.name();
    if (w.kind == workload::shape::steady && w.lanes == 1 && w.d_us >= 200) {
      const double cap = w.d_us >= 1000 ? 12 : 25;
      goal(json, where + ": p50 <= 1.5x floor, p99 <= 3x floor p99, CPU <= " + fmt("%g", cap) + "%",
           ratio(*d, 0.5) <= 1.5 && ratio(*d, 0.99) <= 3 && d->cpu_percent() <= cap,
           fmt("p50 %.2fx, p99 %.2fx, CPU %.1f%%", ratio(*d, 0.5), ratio(*d, 0.99),
               d->cpu_percent()));
    } else if (w.kind == workload::shape::steady && w.lanes == 1 && w.d_us < 200) {
      goal(json, where + ": p50 <= 1.5x floor", ratio(*d, 0.5) <= 1.5,
           fmt("p50 %.2fx (CPU %.1f%%)", ratio(*d, 0.5), d->cpu_percent()));
    } else if (w.kind != workload::shape::steady) {
      // The better of host functions and blocking sync, in this run: evr host_func (inline) and
      // the two thread-per-stream baselines.
      double best50 = 0, best99 = 0;
      std::string best;
      for (const char* key : {"host_func", "host-func-promise", "blocking-sync"}) {
        const row_result* b = find_row(sc, key, key == std::string("host_func") ? "inline" : "");
        if (b == nullptr || b->samples.empty()) continue;
        const series s{"", "", b->samples};
        if (best.empty() || s.p50() < best50) best50 = s.p50();
        if (best.empty() || s.p99() < best99) best99 = s.p99();
        best += std::string(best.empty() ? "" : ", ") + key;
      }
      if (best.empty()) continue;
      const series s{"", "", d->samples};
      goal(json, where + ": p50 and p99 <= the better of (" + best + "), CPU <= 25%",
           s.p50() <= best50 && s.p99() <= best99 && d->cpu_percent() <= 25,
           fmt("p50 %.1f us vs %.1f, p99 %.1f us vs %.1f", s.p50() / 1000, best50 / 1000,
               s.p99() / 1000, best99 / 1000) +
               fmt(", CPU %.1f%%", d->cpu_percent()));
    }
  }
  // 64 streams: CPU per completion no higher than with one stream, same work.
  for (const auto& many : results) {
    if (many.w.lanes == 1) continue;
    for (const auto& one : results) {
      if (one.w.lanes != 1 || one.w.kind != many.w.kind || one.w.d_us != many.w.d_us) continue;
      const row_result* a = find_row(one, "default", "inline");
      const row_result* b = find_row(many, "default", "inline");
      if (a == nullptr || b == nullptr || a->samples.empty() || b->samples.empty()) continue;
      goal(json, many.w.name() + ": CPU per completion <= 1 stream's",
           b->cpu_per_completion() <= a->cpu_per_completion(),
           fmt("%.0f ns vs %.0f ns", b->cpu_per_completion(), a->cpu_per_completion()));
    }
  }
  for (const auto& c : cpu_rows) {
    if (c.key != "default") continue;
    goal(json, "1000 waits on a 100 ms kernel: reactor CPU <= 2% of a core", c.busy_percent <= 2,
         fmt("%.2f%%", c.busy_percent));
    goal(json, "idle: 0 wake-ups per second", c.idle_wakeups_per_s == 0,
         fmt("%g wake-ups/s", c.idle_wakeups_per_s));
  }
  return json + "]";
}

}  // namespace

int idle_main(int argc, char** argv) {
  idle_settings_cli cfg;
  CLI::App app{
      "GPU work of the lengths users run (20 us..20 ms, steady and irregular, 1 and 64 streams): "
      "how late each way of waiting finds it (ratio to the floor of the same run) and the CPU it "
      "costs; plus 1000 waits on a 100 ms kernel and the idle reactor.",
      "evr-bench idle"};
  app.add_option("--device", cfg.device, "cuda, sim or auto")
      ->check(CLI::IsMember({"auto", "cuda", "sim"}))
      ->capture_default_str();
  app.add_option("--lengths-us", cfg.lengths_us, "steady work lengths, us")
      ->check(CLI::Range(1.0, 1e6))
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--streams", cfg.lanes, "stream counts (one closed loop per stream)")
      ->check(CLI::Range(1, 256))
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--jitter", cfg.jitter, "steady work: +- this fraction of the length")
      ->check(CLI::Range(0.0, 0.5))
      ->capture_default_str();
  app.add_option("--scale", cfg.scale, "multiplies the samples per workload")
      ->check(CLI::Range(0.001, 100.0))
      ->capture_default_str();
  app.add_option("--methods", cfg.methods,
                 "default, fence-spin, poll-spin, host_func, ladder, blocking-sync, "
                 "host-func-promise, stream-sync")
      ->check(CLI::IsMember({"default", "fence-spin", "poll-spin", "host_func", "ladder",
                             "blocking-sync", "host-func-promise", "stream-sync"}))
      ->delimiter(',')
      ->capture_default_str();
  app.add_flag("!--no-steady", cfg.steady, "skip the steady workloads (--lengths-us)");
  app.add_flag("!--no-irregular", cfg.irregular, "skip the uniform and bimodal workloads");
  app.add_flag("!--no-idle-case", cfg.idle_case, "skip 1000 waits on a 100 ms kernel + idle");
  app.add_flag("!--no-posted", cfg.posted, "evr rows: inline delivery only");
  app.add_option("--floor-samples", cfg.floor_samples, "samples of the floor")
      ->check(CLI::Range(10, 100000))
      ->capture_default_str();
  std::vector<std::string> variants;
  app.add_option("--variant", variants,
                 "NAME:key=value[,key=value]: also the default with these options changed (keys: "
                 "strategy, idle, prespin_us, final_sleep_us, coalesce_us, poll_period_us, "
                 "spin_fraction, poll_budget, poll_looks, spin_window_us, "
                 "max_sleep_us, doorbell_after_us, fence_streams); repeatable");
  app.add_option("--json", cfg.json, "write the results here");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  std::vector<evr_method> extra;
  try {
    for (const auto& v : variants) extra.push_back(parse_variant(v));
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s\nRun with --help for more information.\n", e.what());
    return 2;
  }

  auto dev = make_bench_device(cfg.device);
  auto wanted = [&](const std::string& key) {
    return std::find(cfg.methods.begin(), cfg.methods.end(), key) != cfg.methods.end();
  };
  std::vector<evr_method> methods;
  for (auto& m : evr_methods())
    if (wanted(m.key)) methods.push_back(m);
  methods.insert(methods.end(), extra.begin(), extra.end());
  std::vector<baseline> baselines;
  if (wanted("blocking-sync"))
    baselines.push_back({"blocking-sync",
                         "cudaEventSynchronize, blocking-sync event (thread per stream)",
                         baseline::how::blocking_sync_event});
  if (wanted("host-func-promise"))
    baselines.push_back({"host-func-promise",
                         "cudaLaunchHostFunc + std::promise (thread per stream)",
                         baseline::how::host_func_promise});
  if (wanted("stream-sync"))
    baselines.push_back({"stream-sync", "cudaStreamSynchronize (thread per stream)",
                         baseline::how::stream_synchronize});

  const auto started = bench_clock::now();
  std::fprintf(stderr, "idle on %s\n", dev->describe().c_str());
  std::fprintf(stderr, "[floor] %d samples\n", cfg.floor_samples);
  const series floor = measure_floor(*dev, cfg.floor_samples);
  std::fprintf(stderr, "  floor p50 %.2f us, p99 %.2f us\n", floor.p50() / 1000,
               floor.p99() / 1000);

  const std::vector<workload> list = workloads(cfg);
  const int max_lanes = *std::max_element(cfg.lanes.begin(), cfg.lanes.end());
  dev->reserve_gates(static_cast<std::size_t>(max_lanes) + 1);
  std::vector<scenario_result> results;
  std::uint64_t seed = 12345;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const workload& w = list[i];
    std::fprintf(stderr, "[%zu/%zu] %s, %d samples per row\n", i + 1, list.size(), w.name().c_str(),
                 w.samples);
    scenario_result sr{w, {}, 0};
    const auto t0 = bench_clock::now();
    std::vector<std::unique_ptr<lane>> lanes;
    for (int k = 0; k < w.lanes; ++k)
      lanes.push_back(
          std::make_unique<lane>(dev->backend(), static_cast<std::size_t>(k) + 1, ++seed));
    auto report = [&](const row_result& r) {
      const series s{r.name, r.group, r.samples};
      std::fprintf(stderr, "  %-60s %-7s p50 %9.2f us  p99 %9.2f us  CPU %6.1f%%%s\n",
                   r.name.c_str(), r.delivery.c_str(), s.p50() / 1000, s.p99() / 1000,
                   r.cpu_percent(), r.failed ? "  (ERRORS)" : "");
      if (r.group == "evr") {
        const auto late = std::count_if(r.samples.begin(), r.samples.end(),
                                        [](double ns) { return ns > 50'000; });
        std::fprintf(stderr,
                     "    found >50 us late: %zu; reactor sleeps that woke >=64 us late: %llu "
                     "(latest < %.0f us); fault probes >=64 us: %llu (longest < %.0f us)\n",
                     static_cast<std::size_t>(late),
                     static_cast<unsigned long long>(at_least(r.nap_overshoot, 65'536)),
                     r.nap_overshoot.quantile_upper_ns(1.0) / 1000.0,
                     static_cast<unsigned long long>(at_least(r.probe_time, 65'536)),
                     r.probe_time.quantile_upper_ns(1.0) / 1000.0);
        const double n = std::max<double>(1, static_cast<double>(r.samples.size()));
        const double s = std::max(1e-9, r.wall_ns / 1e9);
        std::fprintf(stderr,
                     "    per completion: %.1f sweeps, %.1f event queries, %.2f sleeps; sweeps/s "
                     "%.0f; prediction misses %llu\n",
                     static_cast<double>(r.sweeps) / n, static_cast<double>(r.event_queries) / n,
                     static_cast<double>(r.naps) / n, static_cast<double>(r.sweeps) / s,
                     static_cast<unsigned long long>(r.misses));
      }
      sr.rows.push_back(r);
    };
    report(run_floor(*dev, lanes, w));
    for (const auto& m : methods) {
      report(run_evr(*dev, lanes, w, m, false));
      if (cfg.posted) report(run_evr(*dev, lanes, w, m, true));
    }
    for (const auto& b : baselines) report(run_baseline(*dev, lanes, w, b));
    sr.seconds = ns_between(t0, bench_clock::now()) / 1e9;
    results.push_back(std::move(sr));
  }

  std::vector<cpu_case_row> cpu_rows;
  if (cfg.idle_case) {
    std::fprintf(stderr, "[idle case] 1000 waits on a 100 ms kernel, then 1 s idle\n");
    cpu_rows = measure_cpu_case(*dev, methods, 1000, 100000);
  }

  // ---- report -----------------------------------------------------------------------------------
  std::printf("\nidle: GPU work done -> handler, by work length (%s)\n", dev->describe().c_str());
  std::printf(
      "floor (kernel writes ack to mapped memory, host spins): p50 %.2f us, p90 %.2f us, "
      "p99 %.2f us\n",
      floor.p50() / 1000, floor.p90() / 1000, floor.p99() / 1000);
  for (const auto& sc : results) {
    const series fl = floor_of(sc, floor);
    std::printf("\n%s (%zu samples per row, %.1f s)\n", sc.w.name().c_str(),
                sc.rows.empty() ? std::size_t{0} : sc.rows.front().samples.size(), sc.seconds);
    std::printf("  %-58s %-8s %9s %9s %9s %7s %7s %7s %9s\n", "method", "delivery", "p50 us",
                "p90 us", "p99 us", "p50/fl", "p99/fl", "CPU %", "ns/compl");
    for (const auto& r : sc.rows) {
      const series s{r.name, r.group, r.samples};
      std::printf("  %-58s %-8s %9.2f %9.2f %9.2f %7.2f %7.2f %7.1f %9.0f%s\n", r.name.c_str(),
                  r.delivery.c_str(), s.p50() / 1000, s.p90() / 1000, s.p99() / 1000,
                  s.p50() / fl.p50(), s.p99() / fl.p99(), r.cpu_percent(), r.cpu_per_completion(),
                  r.failed ? "  ERRORS" : "");
    }
  }
  if (!cpu_rows.empty()) {
    std::printf("\n1000 waits on a 100 ms kernel (reactor CPU while they pend), then 1 s idle\n");
    std::printf("  %-44s %10s %10s %14s %10s\n", "method", "busy %", "idle %", "idle wake/s",
                "doorbells");
    for (const auto& c : cpu_rows)
      std::printf("  %-44s %10.2f %10.3f %14.0f %10llu\n", c.name.c_str(), c.busy_percent,
                  c.idle_percent, c.idle_wakeups_per_s,
                  static_cast<unsigned long long>(c.doorbells));
  }
  const std::string goals = evaluate_goals(results, floor, cpu_rows);
  std::printf("\nidle: done in %.0f s\n", ns_between(started, bench_clock::now()) / 1e9);

  if (!cfg.json.empty()) {
    std::FILE* f = std::fopen(cfg.json.c_str(), "w");
    if (f == nullptr) throw std::runtime_error("cannot write " + cfg.json);
    json_writer j(f);
    j.raw("{\"subcommand\":\"idle\",\"device\":" + json_writer::quote(dev->describe()) +
          ",\"backend\":" + json_writer::quote(dev->name()) + ",\"floor\":{\"p50_ns\":" +
          json_writer::number(floor.p50()) + ",\"p90_ns\":" + json_writer::number(floor.p90()) +
          ",\"p99_ns\":" + json_writer::number(floor.p99()) + "},\"scenarios\":[");
    for (std::size_t i = 0; i < results.size(); ++i) {
      const auto& sc = results[i];
      j.raw(std::string(i ? "," : "") + "{\"name\":" + json_writer::quote(sc.w.name()) +
            ",\"kind\":" + json_writer::quote(sc.w.kind_name()) + ",\"length_us\":" +
            json_writer::number(sc.w.kind == workload::shape::steady ? sc.w.d_us : sc.w.mean_us()) +
            ",\"streams\":" + std::to_string(sc.w.lanes) +
            ",\"seconds\":" + json_writer::number(sc.seconds) + ",\"rows\":[");
      for (std::size_t k = 0; k < sc.rows.size(); ++k)
        j.raw(std::string(k ? "," : "") + row_json(sc.rows[k], floor_of(sc, floor)));
      j.raw("]}");
    }
    j.raw("],\"cpu_case\":" + cpu_case_json(cpu_rows) + ",\"goals\":" + goals + "}\n");
    std::fclose(f);
  }
  return 0;
}

}  // namespace evr::bench

int evr_bench_idle(int argc, char** argv) { return evr::bench::idle_main(argc, argv); }
