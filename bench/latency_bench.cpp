// evr-bench latency — from "the GPU work is done" to "the completion handler runs".
//
// Method (as ../shared/probes/gpu_limits.cu): a one-thread gate kernel spins on a host-visible
// flag; the notification under test is enqueued behind it; the host sleeps (--gap-us), takes t0,
// opens the gate, and t1 is taken where the completion is first known to the code that wanted it
// (the handler, the thread blocked in a wait, ...). Every method runs in the same process, on the
// same stream, one after another; each row discards warm-up samples.
//
// The sender rows (evr::async_wait, evr/callbacks/sender.hpp) sit beside on_complete's: the
// operation state is built in place before the sample (as a P2300 algorithm builds it), its
// receiver stamps t1 on the reactor thread, or after continues_on a thread pool of bench code
// (sender_pool.hpp; stdexec is not a dependency). "sender over on_complete" is their p50 minus
// on_complete's, per strategy: the price of the sender front end.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <new>
#include <stop_token>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <asio.hpp>

#include <evr/evr.hpp>

#include "bench_device.hpp"
#include "cli.hpp"
#include "sender_pool.hpp"
#include "stats.hpp"
#include "subcommands.hpp"

namespace evr::bench {
namespace {

struct latency_settings {
  std::string device = "auto";
  int samples = 300;
  int warmup = 20;
  int gap_us = 200;
  std::string json;
};

/// The time a completion became known, published by whichever thread learned it.
class stamp {
 public:
  void reset() { ns_.store(0, std::memory_order_relaxed); }
  void set() {
    ns_.store(bench_clock::now().time_since_epoch().count(), std::memory_order_release);
  }
  bench_clock::time_point wait() const {
    std::int64_t v;
    while ((v = ns_.load(std::memory_order_acquire)) == 0) {
    }
    return bench_clock::time_point(bench_clock::duration(v));
  }

 private:
  std::atomic<std::int64_t> ns_{0};
};

/// A receiver that stamps t1 when the wait completes (its last access to itself); with a stop
/// token in its environment when `Env` has one.
template <class Env>
struct stamp_receiver {
  using receiver_concept = exec::receiver_t;
  stamp* t1;
  Env env{};
  void set_value() && noexcept { t1->set(); }
  void set_error(std::error_code) && noexcept { t1->set(); }
  void set_stopped() && noexcept { t1->set(); }
  Env get_env() const noexcept { return env; }
};

/// An environment with a std::stop_token (a stop callback is registered for every wait).
struct stop_token_env {
  std::stop_token token;
  std::stop_token query(exec::get_stop_token_t) const noexcept { return token; }
};

/// One operation state at a time, built in place (operation states cannot move). The previous
/// one is destroyed when the next is built: by then its completion has long returned.
template <class Op>
class op_slot {
 public:
  op_slot() = default;
  op_slot(const op_slot&) = delete;
  ~op_slot() { reset(); }
  template <class Make>
  Op& construct(Make&& make) {
    reset();
    op_ = ::new (static_cast<void*>(storage_)) Op(make());
    return *op_;
  }
  void reset() {
    if (op_ != nullptr) std::exchange(op_, nullptr)->~Op();
  }

 private:
  alignas(Op) unsigned char storage_[sizeof(Op)];
  Op* op_ = nullptr;
};

/// One method: arm() enqueues the notification behind the gate (and starts whatever will wait),
/// finish() returns t1 and cleans up the sample.
struct method {
  std::string name;
  std::string group;
  bool ack = false;
  std::function<void()> arm;
  std::function<bench_clock::time_point()> finish;
};

class runner {
 public:
  runner(bench_device& dev, const latency_settings& cfg)
      : dev_(dev), cfg_(cfg), stream_(dev.backend(), 0) {}
  const evr::stream& stream() const { return stream_; }

  series measure(const method& m) {
    series out{m.name, m.group, {}};
    for (int i = 0; i < cfg_.warmup + cfg_.samples; ++i) {
      dev_.close_gate();
      dev_.launch_gate(stream_.native(), m.ack);
      m.arm();
      std::this_thread::sleep_for(std::chrono::microseconds(cfg_.gap_us));
      const auto t0 = bench_clock::now();
      dev_.open_gate();
      const auto t1 = m.finish();
      if (i >= cfg_.warmup) out.samples.push_back(ns_between(t0, t1));
      evr::throw_if(dev_.backend().synchronize_stream(stream_.native()),
                    "synchronize after sample");
    }
    std::fprintf(stderr, "  %-44s p50 %8.2f us\n", m.name.c_str(), out.p50() / 1000.0);
    return out;
  }

 private:
  bench_device& dev_;
  const latency_settings& cfg_;
  evr::stream stream_;
};

/// An io_context served by one thread, parked in run() or spinning in poll().
class io_thread {
 public:
  explicit io_thread(bool spin) : spin_(spin) {
    thread_ = std::thread([this] {
      if (spin_) {
        while (!stop_.load(std::memory_order_relaxed)) {
          io_.poll();
          io_.restart();
        }
      } else {
        io_.run();
      }
    });
  }
  ~io_thread() {
    work_.reset();
    stop_ = true;
    io_.stop();
    thread_.join();
  }
  asio::io_context& io() { return io_; }

 private:
  bool spin_;
  asio::io_context io_{1};
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

int latency_main(int argc, char** argv) {
  latency_settings cfg;
  CLI::App app{
      "GPU done -> handler, per evr strategy and delivery, against the floor and the "
      "baselines a user would pick instead (the gate-kernel method, one work length)",
      "evr-bench latency"};
  add_device_option(app, cfg.device);
  app.add_option("--samples", cfg.samples, "samples per row")
      ->check(CLI::Range(10, 1000000))
      ->capture_default_str();
  app.add_option("--warmup", cfg.warmup, "warm-up samples per row (discarded)")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  app.add_option("--gap-us", cfg.gap_us,
                 "how long the host waits before opening the gate (the work's length), us")
      ->check(CLI::Range(0, 10000000))
      ->capture_default_str();
  add_json_option(app, cfg.json);
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  auto dev = make_bench_device(cfg.device);
  device::backend& be = dev->backend();
  std::fprintf(stderr, "latency on %s: %d samples per row (+%d warm-up), gap %d us\n",
               dev->describe().c_str(), cfg.samples, cfg.warmup, cfg.gap_us);
  runner run(*dev, cfg);
  const auto native = run.stream().native();
  std::vector<series> rows;
  stamp t1;

  device::native_event ev = nullptr, ev_blocking = nullptr;
  evr::throw_if(be.create_event(0, device::event_flags::none, ev), "create event");
  evr::throw_if(be.create_event(0, device::event_flags::blocking_sync, ev_blocking),
                "create event");
  device::fence_block fence;
  evr::throw_if(be.allocate_fence_block(0, 1, fence), "allocate fence");
  std::uint64_t fence_seq = 0;
  std::thread waiter_thread;

  // ---- baselines: what a user would do without evr --------------------------------------------
  rows.push_back(run.measure({"floor: kernel writes ack to mapped memory", "floor", true, [] {},
                              [&] {
                                while (!dev->acked()) {
                                }
                                return bench_clock::now();
                              }}));
  rows.push_back(run.measure({"raw cudaEventQuery spin", "raw", false,
                              [&] { evr::throw_if(be.record_event(ev, native), "record"); },
                              [&] {
                                while (is_not_ready(be.query_event(ev))) {
                                }
                                return bench_clock::now();
                              }}));
  rows.push_back(run.measure(
      {"raw fence (cuStreamWriteValue64) spin", "raw", false,
       [&] { evr::throw_if(be.write_fence(native, fence.device_word(0), ++fence_seq), "fence"); },
       [&] {
         auto* w = fence.host_word(0);
         while (std::atomic_ref<std::uint64_t>(*w).load(std::memory_order_acquire) < fence_seq) {
         }
         return bench_clock::now();
       }}));
  auto thread_per_wait = [&](device::native_event e) {
    return [&, e] {
      evr::throw_if(be.record_event(e, native), "record");
      t1.reset();
      waiter_thread = std::thread([&, e] {
        (void)be.synchronize_event(e);
        t1.set();
      });
    };
  };
  auto join_waiter = [&] {
    auto t = t1.wait();
    waiter_thread.join();
    return t;
  };
  rows.push_back(run.measure({"cudaEventSynchronize (spin), thread per wait", "baseline", false,
                              thread_per_wait(ev), join_waiter}));
  rows.push_back(run.measure({"cudaEventSynchronize (blocking sync), thread per wait", "baseline",
                              false, thread_per_wait(ev_blocking), join_waiter}));
  std::atomic<int> host_flag{0};
  rows.push_back(run.measure({"raw cudaLaunchHostFunc + atomic spin", "raw", false,
                              [&] {
                                host_flag = 0;
                                evr::throw_if(be.launch_host_func(
                                                  native,
                                                  [](void* p) {
                                                    static_cast<std::atomic<int>*>(p)->store(
                                                        1, std::memory_order_release);
                                                  },
                                                  &host_flag),
                                              "host func");
                              },
                              [&] {
                                while (host_flag.load(std::memory_order_acquire) == 0) {
                                }
                                return bench_clock::now();
                              }}));
  std::promise<void> promise;
  rows.push_back(run.measure(
      {"cudaLaunchHostFunc + std::promise (thread waits)", "baseline", false,
       [&] {
         promise = std::promise<void>();
         t1.reset();
         waiter_thread = std::thread([&, f = promise.get_future()]() mutable {
           f.get();
           t1.set();
         });
         evr::throw_if(
             be.launch_host_func(
                 native, [](void* p) { static_cast<std::promise<void>*>(p)->set_value(); },
                 &promise),
             "host func");
       },
       join_waiter}));

  // Pollers of the "watchdog over an event cache" kind, with 63 other events in flight.
  evr::stream background(be, 0);
  dev->launch_busy(background.native(), 2000000);  // keeps the background events pending (2 s)
  std::vector<device::native_event> others(63);
  for (auto& o : others) {
    evr::throw_if(be.create_event(0, device::event_flags::none, o), "create event");
    evr::throw_if(be.record_event(o, background.native()), "record");
  }
  {
    // Every event every pass (HPX / PyTorch watchdog pattern): a mutex-guarded list, all queried.
    std::mutex mutex;
    std::vector<device::native_event> watched = others;
    std::atomic<bool> stop{false};
    std::thread poller([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        std::lock_guard<std::mutex> lock(mutex);
        for (std::size_t i = 0; i < watched.size();) {
          if (!be.query_event(watched[i])) {
            if (watched[i] == ev) t1.set();
            watched[i] = watched.back();
            watched.pop_back();
          } else {
            ++i;
          }
        }
      }
    });
    rows.push_back(run.measure({"poller: every event every pass (64 in flight)", "baseline", false,
                                [&] {
                                  evr::throw_if(be.record_event(ev, native), "record");
                                  t1.reset();
                                  std::lock_guard<std::mutex> lock(mutex);
                                  watched.push_back(ev);
                                },
                                [&] { return t1.wait(); }}));
    stop = true;
    poller.join();
  }
  {
    // Head of each stream's queue, 10 us sleep between passes, one mutex (TensorFlow EventMgr).
    std::mutex mutex;
    std::vector<std::vector<device::native_event>> queues(2);
    queues[1] = others;
    std::atomic<bool> stop{false};
    std::thread poller([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        {
          std::lock_guard<std::mutex> lock(mutex);
          for (auto& q : queues) {
            while (!q.empty() && !be.query_event(q.front())) {
              if (q.front() == ev) t1.set();
              q.erase(q.begin());
            }
          }
        }
        std::this_thread::sleep_for(std::chrono::microseconds(10));
      }
    });
    rows.push_back(run.measure({"poller: head per stream + 10 us sleep + mutex", "baseline", false,
                                [&] {
                                  evr::throw_if(be.record_event(ev, native), "record");
                                  t1.reset();
                                  std::lock_guard<std::mutex> lock(mutex);
                                  queues[0].push_back(ev);
                                },
                                [&] { return t1.wait(); }}));
    stop = true;
    poller.join();
  }

  // ---- raw hand-off costs: asio::post to another thread ----------------------------------------
  for (bool spin : {true, false}) {
    io_thread io(spin);
    series s{spin ? "asio::post -> io thread spinning in poll()"
                  : "asio::post -> io thread parked in run()",
             "hand-off",
             {}};
    for (int i = 0; i < cfg.warmup + cfg.samples; ++i) {
      std::this_thread::sleep_for(std::chrono::microseconds(cfg.gap_us));
      t1.reset();
      const auto t0 = bench_clock::now();
      asio::post(io.io(), [&] { t1.set(); });
      const auto t = t1.wait();
      if (i >= cfg.warmup) s.samples.push_back(ns_between(t0, t));
    }
    std::fprintf(stderr, "  %-44s p50 %8.2f us\n", s.name.c_str(), s.p50() / 1000.0);
    rows.push_back(std::move(s));
  }

  {
    // The thread pool the sender rows continue on (bench/sender_pool.hpp): a task queued from
    // another thread to a parked worker.
    thread_pool pool(2);
    struct stamp_task : thread_pool::task {
      stamp* t1;
    } task;
    task.t1 = &t1;
    task.run = [](thread_pool::task* t) noexcept { static_cast<stamp_task*>(t)->t1->set(); };
    series s{"thread pool hand-off -> parked worker (sender_pool.hpp)", "hand-off", {}};
    for (int i = 0; i < cfg.warmup + cfg.samples; ++i) {
      std::this_thread::sleep_for(std::chrono::microseconds(cfg.gap_us));
      t1.reset();
      const auto t0 = bench_clock::now();
      pool.enqueue(&task);
      const auto t = t1.wait();
      if (i >= cfg.warmup) s.samples.push_back(ns_between(t0, t));
    }
    std::fprintf(stderr, "  %-44s p50 %8.2f us\n", s.name.c_str(), s.p50() / 1000.0);
    rows.push_back(std::move(s));
  }

  // ---- evr: each strategy x each delivery -----------------------------------------------------
  struct evr_row {
    strategy strat;
    const char* delivery;  // inline | busy | parked
  };
  for (strategy strat :
       {strategy::fence, strategy::poll, strategy::adaptive, strategy::host_func}) {
    reactor_options opts;
    opts.strategy = strat;
    if (strat == strategy::fence || strat == strategy::poll) {
      // Latency mode: the reactor keeps polling while waits are pending (one core busy).
      opts.spin_window = std::chrono::seconds(10);
    }
    reactor r(be, opts);
    const std::string tag =
        std::string("evr ") + to_string(strat) +
        (opts.spin_window >= std::chrono::seconds(1) ? " (spinning)" : " (defaults)");
    rows.push_back(run.measure({tag + ", inline on reactor", "evr", false,
                                [&] {
                                  t1.reset();
                                  evr::throw_if(on_complete(r, run.stream(),
                                                            [&](std::error_code) { t1.set(); }),
                                                "on_complete");
                                },
                                [&] { return t1.wait(); }}));
    {
      // The sender: the same wait as on_complete's, as a P2300 operation (no stop token in the
      // receiver's environment, then a std::stop_token: a stop callback per wait).
      using plain_op = exec::connect_result_t<gpu_sender, stamp_receiver<exec::empty_env>>;
      op_slot<plain_op> op;
      rows.push_back(run.measure({tag + ", sender, inline on reactor", "evr", false,
                                  [&] {
                                    t1.reset();
                                    exec::start(op.construct([&] {
                                      return exec::connect(async_wait(r, run.stream()),
                                                           stamp_receiver<exec::empty_env>{&t1});
                                    }));
                                  },
                                  [&] { return t1.wait(); }}));
      using stop_op = exec::connect_result_t<gpu_sender, stamp_receiver<stop_token_env>>;
      op_slot<stop_op> sop;
      std::stop_source source;
      rows.push_back(run.measure({tag + ", sender + stop token, inline on reactor", "evr", false,
                                  [&] {
                                    t1.reset();
                                    exec::start(sop.construct([&] {
                                      return exec::connect(async_wait(r, run.stream()),
                                                           stamp_receiver<stop_token_env>{
                                                               &t1, {source.get_token()}});
                                    }));
                                  },
                                  [&] { return t1.wait(); }}));
      thread_pool pool(2);
      using pool_sender = decltype(continues_on(async_wait(r, run.stream()), pool.get_scheduler()));
      using pool_op = exec::connect_result_t<pool_sender, stamp_receiver<exec::empty_env>>;
      op_slot<pool_op> pop;
      rows.push_back(run.measure({tag + ", sender, continued on a thread pool", "evr", false,
                                  [&] {
                                    t1.reset();
                                    exec::start(pop.construct([&] {
                                      return exec::connect(continues_on(async_wait(r, run.stream()),
                                                                        pool.get_scheduler()),
                                                           stamp_receiver<exec::empty_env>{&t1});
                                    }));
                                  },
                                  [&] { return t1.wait(); }}));
    }
    for (bool spin : {true, false}) {
      io_thread io(spin);
      gpu_waiter waiter(io.io().get_executor(), r);
      rows.push_back(
          run.measure({tag + (spin ? ", posted to busy io thread" : ", posted to parked io thread"),
                       "evr", false,
                       [&] {
                         t1.reset();
                         waiter.async_wait(run.stream(), [&](std::error_code) { t1.set(); });
                       },
                       [&] { return t1.wait(); }}));
    }
  }
  be.destroy_event(ev);
  be.destroy_event(ev_blocking);
  for (auto o : others) be.destroy_event(o);
  be.free_fence_block(fence);

  // ---- report ---------------------------------------------------------------------------------
  auto find = [&](const std::string& name) -> const series* {
    for (auto& s : rows)
      if (s.name == name) return &s;
    return nullptr;
  };
  const double floor = rows.front().p50();
  std::printf("\nlatency: GPU work done -> completion known (%s, %d samples)\n",
              dev->describe().c_str(), cfg.samples);
  std::printf("%-62s %9s %9s %9s %8s\n", "method", "p50 us", "p90 us", "p99 us", "p50/floor");
  for (auto& s : rows) {
    std::printf("%-62s %9.2f %9.2f %9.2f %8.2f\n", s.name.c_str(), s.p50() / 1000, s.p90() / 1000,
                s.p99() / 1000, s.group == "hand-off" ? 0.0 : s.p50() / floor);
  }
  // evr's own overhead: its end-to-end time minus (the raw mechanism it uses + the raw hand-off).
  std::printf("\nevr overhead at p50 = evr row - (raw mechanism + raw hand-off):\n");
  std::string overheads_json = "[";
  for (auto& s : rows) {
    if (s.group != "evr") continue;
    const series* mech = nullptr;
    if (s.name.find(" poll ") != std::string::npos)
      mech = find("raw cudaEventQuery spin");
    else if (s.name.find(" host_func ") != std::string::npos)
      mech = find("raw cudaLaunchHostFunc + atomic spin");
    else
      mech = find("raw fence (cuStreamWriteValue64) spin");
    double handoff = 0;
    if (s.name.find("busy io") != std::string::npos)
      handoff = find("asio::post -> io thread spinning in poll()")->p50();
    if (s.name.find("parked io") != std::string::npos)
      handoff = find("asio::post -> io thread parked in run()")->p50();
    if (s.name.find("thread pool") != std::string::npos)
      handoff = find("thread pool hand-off -> parked worker (sender_pool.hpp)")->p50();
    const double overhead = s.p50() - (mech->p50() + handoff);
    std::printf("  %-60s %8.2f us\n", s.name.c_str(), overhead / 1000);
    if (overheads_json.size() > 1) overheads_json += ",";
    overheads_json += "{\"name\":" + json_writer::quote(s.name) +
                      ",\"overhead_ns\":" + json_writer::number(overhead) + "}";
  }
  overheads_json += "]";

  // The sender front end against on_complete, the same wait delivered the same way (goal on the
  // H100: at most 0.2 us at p50).
  std::printf("\nsender over on_complete at p50 (same strategy, both inline on the reactor):\n");
  std::string sender_json = "[";
  for (auto& s : rows) {
    const auto at = s.name.find(", sender");
    if (s.group != "evr" || at == std::string::npos) continue;
    if (s.name.find("inline on reactor") == std::string::npos) continue;
    const series* base = find(s.name.substr(0, at) + ", inline on reactor");
    if (base == nullptr) continue;
    const double over = s.p50() - base->p50();
    std::printf("  %-60s %8.2f us\n", s.name.c_str(), over / 1000);
    if (sender_json.size() > 1) sender_json += ",";
    sender_json += "{\"name\":" + json_writer::quote(s.name) +
                   ",\"over_on_complete_p50_ns\":" + json_writer::number(over) + "}";
  }
  sender_json += "]";

  if (!cfg.json.empty()) {
    std::FILE* f = std::fopen(cfg.json.c_str(), "w");
    if (f == nullptr) throw std::runtime_error("cannot write " + cfg.json);
    json_writer j(f);
    j.raw("{\"subcommand\":\"latency\",\"device\":" + json_writer::quote(dev->describe()) +
          ",\"backend\":" + json_writer::quote(dev->name()) + ",\"samples\":" +
          std::to_string(cfg.samples) + ",\"gap_us\":" + std::to_string(cfg.gap_us) +
          ",\"floor_p50_ns\":" + json_writer::number(floor) + ",\"rows\":[");
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& s = rows[i];
      j.raw(std::string(i ? "," : "") + "{\"name\":" + json_writer::quote(s.name) + ",\"group\":" +
            json_writer::quote(s.group) + ",\"p50_ns\":" + json_writer::number(s.p50()) +
            ",\"p90_ns\":" + json_writer::number(s.p90()) +
            ",\"p99_ns\":" + json_writer::number(s.p99()) +
            ",\"samples_ns\":" + json_writer::array(s.samples) + "}");
    }
    j.raw("],\"overheads\":" + overheads_json + ",\"sender_over_on_complete\":" + sender_json +
          "}\n");
    std::fclose(f);
  }
  return 0;
}

}  // namespace evr::bench

int evr_bench_latency(int argc, char** argv) { return evr::bench::latency_main(argc, argv); }
