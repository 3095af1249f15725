// bench/idle_rows.cpp — one row of `evr-bench idle` per way of waiting (idle_rows.hpp).
#include "idle_rows.hpp"

#include <algorithm>
#include <barrier>
#include <functional>
#include <future>
#include <stdexcept>
#include <thread>

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>

#include "budget.hpp"

namespace evr::bench {
namespace {

/// For the budget's report of a row that never finished: what the lanes and the reactor (if the
/// row has one) were doing. Reads atomics and reactor::metrics() only (called on the watchdog).
std::string progress_of(const std::vector<std::unique_ptr<lane>>& lanes, const reactor* r) {
  int waiting_to_open = 0, open_not_seen = 0;
  for (const auto& l : lanes) {
    if (l->due.load(std::memory_order_acquire) != 0) ++waiting_to_open;
    if (l->t_open.load(std::memory_order_acquire) > l->t_done.load(std::memory_order_acquire))
      ++open_not_seen;
  }
  std::string text = std::to_string(lanes.size()) + " lanes: " + std::to_string(waiting_to_open) +
                     " gates not yet opened, " + std::to_string(open_not_seen) +
                     " opened and not seen done";
  if (r == nullptr) return text;
  const reactor_metrics m = r->metrics();
  auto field = [&](const char* name, std::uint64_t v) {
    text += std::string(", ") + name + " " + std::to_string(v);
  };
  text += "; reactor:";
  field("submitted", m.submitted);
  field("completed", m.completed);
  field("in flight", m.in_flight);
  field("sweeps", m.sweeps);
  field("parks", m.parks);
  field("wake-ups", m.wakeups);
  field("doorbells", m.doorbells);
  field("host passes", m.host_passes);
  field("host completions", m.host_completions);
  return text;
}

std::string row_name(const workload& w, const std::string& name, const std::string& delivery) {
  return w.name() + ": " + name + " (" + delivery + ")";
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
  int warm_done = 0, finished_lanes = 0, in_flight = 0;
  std::int64_t wall0 = now_ns();
  while (finished_lanes < lanes_n) {
    bool busy = false;
    // In lockstep a round starts only when every lane's job of the last one was seen done.
    const bool may_launch = !w.lockstep || in_flight == 0;
    for (auto& lp : lanes) {
      lane& l = *lp;
      if (l.in_flight) {
        poll(l);
        const std::int64_t t1 = l.t_done.load(std::memory_order_acquire);
        if (t1 == 0) continue;
        busy = true;
        l.in_flight = false;
        --in_flight;
        if (l.launched > warmup_per_lane) {
          out.samples.push_back(static_cast<double>(t1 - l.t_open.load(std::memory_order_acquire)));
        } else if (++warm_done == lanes_n * warmup_per_lane) {
          wall0 = now_ns();
          measuring_starts();
        }
        if (l.launched == quota) ++finished_lanes;
      }
      if (may_launch && !l.in_flight && l.launched < quota) {
        busy = true;
        ++in_flight;
        launch_gate(dev, l, ack);
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

/// Copies the reactor's counters over the measured part of a row into `out`.
void take_metrics(row_result& out, const reactor_metrics& m0, const reactor_metrics& m1) {
  out.misses = m1.prediction_misses - m0.prediction_misses;
  out.doorbells = m1.doorbells - m0.doorbells;
  out.wakeups = m1.wakeups - m0.wakeups;
  out.sweeps = m1.sweeps - m0.sweeps;
  out.event_queries = m1.event_queries - m0.event_queries;
  out.naps = m1.parks - m0.parks;
  out.host_passes = m1.host_passes - m0.host_passes;
  out.host_completions = m1.host_completions - m0.host_completions;
  out.pass_lock_sleeps = m1.pass_lock_sleeps - m0.pass_lock_sleeps;
  for (int i = 0; i < latency_histogram::buckets; ++i) {
    out.nap_overshoot.counts[i] = m1.nap_overshoot.counts[i] - m0.nap_overshoot.counts[i];
    out.probe_time.counts[i] = m1.fault_probe_time.counts[i] - m0.fault_probe_time.counts[i];
  }
}

row_result evr_row(const evr_method& m, const std::string& delivery) {
  row_result out;
  out.key = m.key;
  out.name = m.name;
  out.delivery = delivery;
  out.group = "evr";
  return out;
}

}  // namespace

const char* to_string(io_delivery d) noexcept {
  switch (d) {
    case io_delivery::post: return "post";
    case io_delivery::post_woken: return "woken";
    case io_delivery::post_plain: return "plain";
    case io_delivery::post_plain_busy: return "busy";
  }
  return "?";
}

row_result run_floor(bench_device& dev, std::vector<std::unique_ptr<lane>>& lanes,
                     const workload& w) {
  row_result out;
  out.key = "floor";
  out.name = "floor: kernel writes ack to mapped memory, host spins";
  out.delivery = "spin";
  out.group = "floor";
  row_scope row(row_name(w, out.name, out.delivery), [&] { return progress_of(lanes, nullptr); });
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

row_result run_evr_inline(bench_device& dev, std::vector<std::unique_ptr<lane>>& lanes,
                          const workload& w, const evr_method& m) {
  row_result out = evr_row(m, "inline");
  reactor r(dev.backend(), m.options);
  row_scope row(row_name(w, out.name, out.delivery), [&] { return progress_of(lanes, &r); });
  lane_slots slots(lanes, r, m);
  std::chrono::nanoseconds cpu0{};
  reactor_metrics metrics0{};
  drive(
      dev, lanes, w, /*ack=*/false,
      [&](lane& l) {
        evr::throw_if(on_complete(r, l.target(),
                                  [p = &l](std::error_code ec) {
                                    if (ec) p->failed.store(true, std::memory_order_relaxed);
                                    p->t_done.store(now_ns(), std::memory_order_release);
                                  }),
                      "on_complete");
      },
      [](lane&) {}, out,
      [&] {
        cpu0 = r.cpu_time();
        metrics0 = r.metrics();
      });
  out.cpu_ns = static_cast<double>((r.cpu_time() - cpu0).count());
  out.reactor_cpu_ns = out.cpu_ns;
  take_metrics(out, metrics0, r.metrics());
  return out;
}

namespace {

/// One posted row's closed loops, all on the io_context's thread: each lane's handler takes its
/// sample and launches the lane's next job (the user's work, timed on the thread's CPU clock to
/// be left out of evr's CPU), then waits for it: as a server's coroutine does.
class io_loops {
 public:
  io_loops(bench_device& dev, std::vector<std::unique_ptr<lane>>& lanes, const workload& w,
           reactor& r, gpu_waiter& waiter)
      : dev_(dev), lanes_(lanes), w_(w), r_(r), waiter_(waiter), quota_(per_lane_quota(w)) {}

  /// On the io thread: starts every lane.
  void start() {
    for (auto& l : lanes_) {
      l->launched = 0;
      next_job(*l);
    }
  }
  std::future<void> finished() { return done_.get_future(); }

  std::vector<double> samples;
  std::int64_t wall_ns = 0, io_cpu_ns = 0, user_cpu_ns = 0;
  std::chrono::nanoseconds reactor_cpu{};
  reactor_metrics m0{}, m1{};

 private:
  void next_job(lane& l) {
    const std::int64_t c0 = thread_cpu_ns();
    launch_gate(dev_, l);
    schedule_open(w_, l);
    ++l.launched;
    const std::int64_t c1 = thread_cpu_ns();
    if (measuring_) user_cpu_ns += c1 - c0;
    waiter_.async_wait(l.target(), [this, p = &l](asio_error_code ec) { job_done(*p, ec); });
  }

  /// Lockstep: the last lane of a round seen done starts the next round, every lane at once.
  void round_done() {
    if (++round_done_ < static_cast<int>(lanes_.size())) return;
    round_done_ = 0;
    for (auto& l : lanes_)
      if (l->launched < quota_) next_job(*l);
  }

  void job_done(lane& l, asio_error_code ec) {
    const std::int64_t t1 = now_ns();
    if (ec) l.failed.store(true, std::memory_order_relaxed);
    if (l.launched > warmup_per_lane) {
      samples.push_back(static_cast<double>(t1 - l.t_open.load(std::memory_order_acquire)));
    } else if (++warm_done_ == static_cast<int>(lanes_.size()) * warmup_per_lane) {
      measuring_ = true;
      wall_ns = -now_ns();
      io_cpu_ns = -thread_cpu_ns();
      reactor_cpu = -r_.cpu_time();
      m0 = r_.metrics();
    }
    const bool last = l.launched == quota_;
    if (!last) {
      if (w_.lockstep) {
        round_done();
      } else {
        next_job(l);
      }
    } else if (++finished_ == static_cast<int>(lanes_.size())) {
      wall_ns += now_ns();
      io_cpu_ns += thread_cpu_ns();
      reactor_cpu += r_.cpu_time();
      m1 = r_.metrics();
      done_.set_value();
    }
  }

  bench_device& dev_;
  std::vector<std::unique_ptr<lane>>& lanes_;
  const workload& w_;
  reactor& r_;
  gpu_waiter& waiter_;
  const int quota_;
  int warm_done_ = 0, finished_ = 0, round_done_ = 0;
  bool measuring_ = false;
  std::promise<void> done_;
};

}  // namespace

row_result run_evr_posted(bench_device& dev, std::vector<std::unique_ptr<lane>>& lanes,
                          const workload& w, const evr_method& m, io_delivery how) {
  row_result out = evr_row(m, to_string(how));
  reactor r(dev.backend(), m.options);
  row_scope row(row_name(w, out.name, out.delivery), [&] { return progress_of(lanes, &r); });
  lane_slots slots(lanes, r, m);
  asio::io_context io(1);
  gpu_waiter waiter(io.get_executor(), r);
  switch (how) {
    case io_delivery::post: waiter.set_delivery(delivery::post); break;
    case io_delivery::post_woken: waiter.set_delivery(delivery::post_woken); break;
    case io_delivery::post_plain:
    case io_delivery::post_plain_busy: waiter.set_delivery(delivery::post_plain); break;
  }
  const bool sim = dev.name() == "sim";
  std::atomic<bool> stop{false};
  auto guard = asio::make_work_guard(io);
  std::thread io_thread([&] {
    name_this_thread("bench-io");  // the user's io thread, apart from the others in a profile
    if (how == io_delivery::post_plain_busy) {
      while (!stop.load(std::memory_order_relaxed)) io.poll();  // a thread that never sleeps
    } else {
      io.run();
    }
  });
  {
    gate_opener opener(dev, lanes, sim);
    io_loops loops(dev, lanes, w, r, waiter);
    std::future<void> finished = loops.finished();
    asio::post(io, [&] { loops.start(); });
    finished.wait();
    out.samples = std::move(loops.samples);
    out.wall_ns = static_cast<double>(loops.wall_ns);
    // Every thread evr adds or wakes: the reactor, and the io thread outside the user's work.
    out.cpu_ns =
        static_cast<double>(loops.reactor_cpu.count() + loops.io_cpu_ns - loops.user_cpu_ns);
    out.reactor_cpu_ns = static_cast<double>(loops.reactor_cpu.count());
    take_metrics(out, loops.m0, loops.m1);
  }
  stop.store(true);
  guard.reset();
  io_thread.join();
  for (auto& l : lanes) out.failed |= l->failed.exchange(false);
  return out;
}

row_result run_baseline(bench_device& dev, std::vector<std::unique_ptr<lane>>& lanes,
                        const workload& w, const baseline& b) {
  row_result out{b.key, b.name, "thread", "baseline", {}, 0, 0, 0, 0, 0, false, {}, {}};
  row_scope row(row_name(w, out.name, out.delivery), [&] { return progress_of(lanes, nullptr); });
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
  // Lockstep: every thread launches its round's job together with the others.
  std::barrier round(static_cast<std::ptrdiff_t>(lanes.size()));
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < lanes.size(); ++i) {
    threads.emplace_back([&, i] {
      lane& l = *lanes[i];
      per_thread& res = results[i];
      device::native_event ev = nullptr;
      if (b.kind == baseline::how::blocking_sync_event)
        evr::throw_if(be.create_event(0, device::event_flags::blocking_sync, ev), "create event");
      for (int k = 0; k < quota; ++k) {
        if (w.lockstep) round.arrive_and_wait();
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

}  // namespace evr::bench
