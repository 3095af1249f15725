// bench/idle_lanes.hpp — what `evr-bench idle` is made of (idle_bench.cpp says how it measures):
// the workloads users run, a lane (a stream running one job at a time), the thread that opens
// each lane's gate when its job should end, and one row's results.
#pragma once

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <evr/evr.hpp>

#include "bench_device.hpp"
#include "methods.hpp"
#include "stats.hpp"

namespace evr::bench {

using std::chrono::nanoseconds;

inline std::int64_t now_ns() { return bench_clock::now().time_since_epoch().count(); }

/// Names the calling thread for top and perf (at most 15 characters; Linux only).
inline void name_this_thread(const char* name) {
#if defined(__linux__)
  (void)pthread_setname_np(pthread_self(), name);
#else
  (void)name;
#endif
}

inline std::int64_t thread_cpu_ns() {
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
  /// Every lane's job launched together, the next round once all were seen done (a server's
  /// burst of requests): the windows of all lanes overlap. Else each lane is its own closed loop.
  bool lockstep = false;
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
    return std::string(buf) + ", " + std::to_string(lanes) + (lanes == 1 ? " stream" : " streams") +
           (lockstep ? " in lockstep" : "");
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
  /// Rows of device-signalled waits: the slot the gate kernel signals (from the row's reactor),
  /// and the ticket of the job in flight. Empty otherwise.
  evr::signal_slot slot;
  evr::signal_ticket ticket;
  /// With a slot: the job is a CUDA graph whose last node signals (else the kernel signals).
  bool graph = false;
  /// What a wait on the job in flight names: the slot's signal, or the stream.
  evr::wait_target target() const {
    return slot ? evr::wait_target(stream, ticket) : evr::wait_target(stream);
  }
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
    name_this_thread("bench-gate");  // apart from the io thread in a profile
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
  /// evr rows: the reactor thread's share of cpu_ns (the rest: the io thread, posted rows).
  double reactor_cpu_ns = 0;
  std::uint64_t misses = 0, doorbells = 0, wakeups = 0;
  bool failed = false;
  /// evr rows: the reactor's timed sleeps that ended late, and its fault probes (driver calls)
  /// that took long, during the row: where a late completion's time went.
  latency_histogram nap_overshoot{}, probe_time{};
  /// evr rows: the reactor's sweeps, event queries and timed or untimed sleeps during the row
  /// (where its CPU went: many sweeps of many streams, or few).
  std::uint64_t sweeps = 0, event_queries = 0, naps = 0;
  /// evr rows: passes run by the io_context's thread near predicted completions (delivery::post:
  /// the last hop) and the completions they found.
  std::uint64_t host_passes = 0, host_completions = 0;
  /// evr rows: times the reactor thread slept waiting for an io thread's pass to end.
  std::uint64_t pass_lock_sleeps = 0;
  double cpu_percent() const { return wall_ns > 0 ? 100.0 * cpu_ns / wall_ns : 0; }
  double reactor_cpu_percent() const { return wall_ns > 0 ? 100.0 * reactor_cpu_ns / wall_ns : 0; }
  double cpu_per_completion() const {
    return samples.empty() ? 0 : cpu_ns / static_cast<double>(samples.size());
  }
};

inline constexpr int warmup_per_lane = 8;  // jobs per lane before measuring (the model learns)

inline int per_lane_quota(const workload& w) {
  return warmup_per_lane + (w.samples + w.lanes - 1) / w.lanes;
}

/// Launches lane `l`'s next gate kernel: with `ack`, one that writes the ack (the floor); with a
/// slot, one that signals it (arming the lane's ticket); else a plain one.
inline void launch_gate(bench_device& dev, lane& l, bool ack = false) {
  dev.close_gate(l.gate);
  l.t_open.store(0, std::memory_order_relaxed);
  l.t_done.store(0, std::memory_order_relaxed);
  if (l.slot) {
    l.ticket = l.slot.arm();
    if (l.graph)
      dev.launch_gate_graph_signalling(l.stream.native(), l.gate, l.slot.ref());
    else
      dev.launch_gate_signalling(l.stream.native(), l.gate, l.slot.ref());
  } else {
    dev.launch_gate(l.stream.native(), ack, l.gate);
  }
}

/// For the rows of a signalled method: a slot of `r` per lane (else none), given back by the
/// guard's destructor.
struct lane_slots {
  lane_slots(std::vector<std::unique_ptr<lane>>& lanes, reactor& r, const evr_method& m)
      : lanes_(lanes) {
    if (!m.signalled) return;
    for (auto& l : lanes_) {
      l->slot = r.pools().signals(0).acquire();
      l->graph = m.graph;
    }
  }
  ~lane_slots() {
    for (auto& l : lanes_) l->slot.release();
  }
  lane_slots(const lane_slots&) = delete;
  lane_slots& operator=(const lane_slots&) = delete;

 private:
  std::vector<std::unique_ptr<lane>>& lanes_;
};

inline void schedule_open(const workload& w, lane& l) {
  l.due.store(now_ns() + w.draw(l.rng).count(), std::memory_order_release);
}

}  // namespace evr::bench
