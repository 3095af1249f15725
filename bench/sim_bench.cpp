// evr-bench sim — what the simulated device costs, so that tests and soaks on it can be sized:
//   enqueue   ns per call of record_event / write_fence / launch_host_func / launch_kernel on a
//             stalled stream (nothing runs meanwhile), then on a running one (its worker runs
//             the operations while the caller enqueues);
//   complete  ns per completed operation: a stalled stream holding a long queue of no-duration
//             operations is resumed and run to the end; then several streams at once;
//   reactor   completions per second of evr::on_complete waits on many streams of one simulated
//             device, per strategy, end to end (submit -> marker -> sweep -> callback).
// Each figure is the median of --repeat runs; --json writes every run. No timing claim is checked
// anywhere: these are figures of the machine the bench runs on.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "cli.hpp"
#include "stats.hpp"
#include "subcommands.hpp"

namespace evr::bench {
namespace {

namespace dev = evr::device;

struct sim_settings {
  int ops = 100000;
  int streams = 8;
  int waits = 200000;
  int reactor_streams = 64;
  int threads = 2;
  int repeat = 3;
  std::vector<std::string> strategies{"poll", "fence", "host_func", "adaptive"};
  std::vector<std::string> groups{"enqueue", "complete", "reactor"};
  std::vector<std::string> kinds{"record_event", "write_fence", "launch_host_func",
                                 "launch_kernel"};
  std::string json;
};

/// One figure: `ops` operations took `seconds` in each run.
struct sim_row {
  std::string group;  // "enqueue", "complete", "reactor"
  std::string name;
  std::uint64_t ops = 0;
  std::vector<double> seconds;  // one per run

  double median_seconds() const { return percentile(seconds, 0.5); }
  double ns_per_op() const { return ops ? median_seconds() * 1e9 / static_cast<double>(ops) : 0.0; }
  double per_second() const {
    const double s = median_seconds();
    return s > 0 ? static_cast<double>(ops) / s : 0.0;
  }
};

/// Throws std::runtime_error naming `what` when `ec` is an error.
void check(std::error_code ec, const std::string& what) {
  if (ec) throw std::runtime_error(what + ": " + ec.message());
}

void noop_host_func(void*) {}

/// The kinds of operation the bench enqueues.
enum class op_kind { record_event, write_fence, launch_host_func, launch_kernel };
constexpr op_kind all_kinds[] = {op_kind::record_event, op_kind::write_fence,
                                 op_kind::launch_host_func, op_kind::launch_kernel};

const char* name_of(op_kind k) {
  switch (k) {
    case op_kind::record_event: return "record_event";
    case op_kind::write_fence: return "write_fence";
    case op_kind::launch_host_func: return "launch_host_func";
    case op_kind::launch_kernel: return "launch_kernel (no duration)";
  }
  return "?";
}

/// The kind's name on the command line (--kinds).
const char* option_name_of(op_kind k) {
  switch (k) {
    case op_kind::record_event: return "record_event";
    case op_kind::write_fence: return "write_fence";
    case op_kind::launch_host_func: return "launch_host_func";
    case op_kind::launch_kernel: return "launch_kernel";
  }
  return "?";
}

/// A simulated device with what the enqueue calls need: one event, one fence word per stream.
class fixture {
 public:
  explicit fixture(int streams) : streams_(static_cast<std::size_t>(streams)) {
    check(sim_.create_event(0, dev::event_flags::none, event_), "create_event");
    check(sim_.allocate_fence_block(0, streams_.size(), fences_), "allocate_fence_block");
    for (auto& s : streams_) check(sim_.create_stream(0, 0, s), "create_stream");
  }
  ~fixture() {
    for (auto s : streams_) sim_.destroy_stream(s);
    sim_.wait_idle();
    sim_.free_fence_block(fences_);
    sim_.destroy_event(event_);
  }
  fixture(const fixture&) = delete;
  fixture& operator=(const fixture&) = delete;

  sim::device& sim() { return sim_; }
  dev::native_stream stream(std::size_t i) const { return streams_[i]; }
  std::size_t streams() const { return streams_.size(); }

  /// Enqueues one operation of kind `k` on stream `i` (the n-th on it: fence value n).
  std::error_code enqueue(op_kind k, std::size_t i, std::uint64_t n) {
    switch (k) {
      case op_kind::record_event: return sim_.record_event(event_, streams_[i]);
      case op_kind::write_fence: return sim_.write_fence(streams_[i], fences_.device_word(i), n);
      case op_kind::launch_host_func:
        return sim_.launch_host_func(streams_[i], &noop_host_func, nullptr);
      case op_kind::launch_kernel: return sim_.launch_kernel(streams_[i]);
    }
    return {};
  }

 private:
  sim::device sim_{sim::options{.devices = 1, .mode = sim::run_mode::threaded}};
  dev::native_event event_ = nullptr;
  dev::fence_block fences_;
  std::vector<dev::native_stream> streams_;
};

double seconds_since(bench_clock::time_point t0) {
  return std::chrono::duration<double>(bench_clock::now() - t0).count();
}

/// Enqueue on one stream, stalled or running; for a stalled stream also the completion of the
/// queue it built (resume, then synchronize). One fixture for every run of a kind, after an
/// unmeasured first pass: figures of a device in steady state (its queue's ring at full size,
/// the allocator warm), as in a long test, not of its first minutes.
void measure_one_stream(const sim_settings& o, op_kind k, sim_row& stalled, sim_row& running,
                        sim_row& complete) {
  const auto n = static_cast<std::uint64_t>(o.ops);
  fixture f(1);
  const dev::native_stream s = f.stream(0);
  std::uint64_t value = 0;
  auto stalled_pass = [&](bool measure) {
    f.sim().stall(s);
    auto t0 = bench_clock::now();
    for (std::uint64_t i = 0; i < n; ++i) check(f.enqueue(k, 0, ++value), name_of(k));
    const double enqueue_s = seconds_since(t0);
    if (f.sim().pending_operations(s) != n) throw std::runtime_error("a stalled stream ran");
    t0 = bench_clock::now();
    f.sim().resume(s);
    check(f.sim().synchronize_stream(s), "synchronize_stream");
    const double complete_s = seconds_since(t0);
    if (measure) {
      stalled.seconds.push_back(enqueue_s);
      complete.seconds.push_back(complete_s);
    }
  };
  auto running_pass = [&](bool measure) {
    const auto t0 = bench_clock::now();
    for (std::uint64_t i = 0; i < n; ++i) check(f.enqueue(k, 0, ++value), name_of(k));
    const double enqueue_s = seconds_since(t0);
    check(f.sim().synchronize_stream(s), "synchronize_stream");
    if (measure) running.seconds.push_back(enqueue_s);
  };
  stalled_pass(false);
  for (int i = 0; i < o.repeat; ++i) stalled_pass(true);
  running_pass(false);
  for (int i = 0; i < o.repeat; ++i) running_pass(true);
}

/// `o.streams` stalled streams share `o.ops` operations (every kind in turn); all are resumed at
/// once and run to the end. As above, after an unmeasured first pass.
void measure_many_streams(const sim_settings& o, sim_row& row) {
  fixture f(o.streams);
  const std::size_t s = f.streams();
  const auto per_stream = static_cast<std::uint64_t>(o.ops) / s;
  std::uint64_t value = 0;
  for (int pass = 0; pass <= o.repeat; ++pass) {
    for (std::size_t i = 0; i < s; ++i) f.sim().stall(f.stream(i));
    ++value;
    for (std::size_t i = 0; i < s; ++i) {
      for (std::uint64_t j = 0; j < per_stream; ++j) {
        const op_kind k = all_kinds[j % std::size(all_kinds)];
        check(f.enqueue(k, i, value * per_stream + j), name_of(k));
      }
    }
    const auto t0 = bench_clock::now();
    for (std::size_t i = 0; i < s; ++i) f.sim().resume(f.stream(i));
    for (std::size_t i = 0; i < s; ++i) check(f.sim().synchronize_stream(f.stream(i)), "sync");
    if (pass > 0) row.seconds.push_back(seconds_since(t0));
  }
  row.ops = per_stream * s;
}

strategy strategy_of(const std::string& name) {
  for (strategy s : {strategy::poll, strategy::fence, strategy::host_func, strategy::adaptive}) {
    if (name == to_string(s)) return s;
  }
  throw std::runtime_error("unknown strategy " + name);
}

/// `o.waits` on_complete waits from `o.threads` threads over `o.reactor_streams` streams; the
/// time from the first submission to the last callback. Returns the reactor's CPU time.
double measure_reactor(const sim_settings& o, strategy strat, sim_row& row) {
  sim::device sim{sim::options{.devices = 1, .mode = sim::run_mode::threaded}};
  std::vector<evr::stream> streams;
  for (int i = 0; i < o.reactor_streams; ++i) streams.emplace_back(sim, 0);
  reactor_options opts;
  opts.strategy = strat;
  evr::reactor r(sim, opts);

  const auto per_thread = static_cast<std::uint64_t>(o.waits / o.threads);
  const std::uint64_t total = per_thread * static_cast<std::uint64_t>(o.threads);
  std::atomic<std::uint64_t> done{0}, failed{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> submitters;
  for (int t = 0; t < o.threads; ++t) {
    submitters.emplace_back([&, t] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      std::size_t at = static_cast<std::size_t>(t);
      for (std::uint64_t i = 0; i < per_thread; ++i) {
        const std::error_code ec = on_complete(r, streams[at], [&](std::error_code e) {
          if (e) failed.fetch_add(1, std::memory_order_relaxed);
          done.fetch_add(1, std::memory_order_release);
        });
        if (ec) {
          failed.fetch_add(1, std::memory_order_relaxed);
          done.fetch_add(1, std::memory_order_release);
        }
        at = (at + 1) % streams.size();
      }
    });
  }
  const double cpu0 = static_cast<double>(r.cpu_time().count());
  const auto t0 = bench_clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : submitters) th.join();
  while (done.load(std::memory_order_acquire) < total)
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  row.seconds.push_back(seconds_since(t0));
  row.ops = total;
  const double cpu = static_cast<double>(r.cpu_time().count()) - cpu0;
  if (failed.load() != 0) {
    throw std::runtime_error(std::to_string(failed.load()) + " waits failed (" + to_string(strat) +
                             ")");
  }
  return cpu / static_cast<double>(total);
}

void print_row(const sim_row& r) {
  if (r.group == "reactor") {
    std::printf("  %-8s %-44s %10.0f completions/s  (%.0f ns each)\n", r.group.c_str(),
                r.name.c_str(), r.per_second(), r.ns_per_op());
  } else {
    std::printf("  %-8s %-44s %10.1f ns/op  (%llu ops)\n", r.group.c_str(), r.name.c_str(),
                r.ns_per_op(), static_cast<unsigned long long>(r.ops));
  }
  std::fflush(stdout);
}

bool write_json(const sim_settings& o, const std::string& describe,
                const std::vector<sim_row>& rows, const std::vector<double>& reactor_cpu_ns) {
  std::FILE* f = std::fopen(o.json.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "evr-bench sim: cannot write %s\n", o.json.c_str());
    return false;
  }
  json_writer w(f);
  w.raw("{\n  \"subcommand\": \"sim\",\n  \"device\": " + json_writer::quote(describe) +
        ",\n  \"backend\": \"sim\",\n");
  w.raw("  \"ops\": " + std::to_string(o.ops) + ",\n  \"streams\": " + std::to_string(o.streams) +
        ",\n  \"waits\": " + std::to_string(o.waits) + ",\n  \"reactor_streams\": " +
        std::to_string(o.reactor_streams) + ",\n  \"threads\": " + std::to_string(o.threads) +
        ",\n  \"repeat\": " + std::to_string(o.repeat) + ",\n  \"hardware_threads\": " +
        std::to_string(std::thread::hardware_concurrency()) + ",\n  \"rows\": [\n");
  std::size_t reactor_index = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const sim_row& r = rows[i];
    std::string line = "    {\"group\": " + json_writer::quote(r.group) +
                       ", \"name\": " + json_writer::quote(r.name) +
                       ", \"ops\": " + std::to_string(r.ops) +
                       ", \"ns_per_op\": " + json_writer::number(r.ns_per_op()) +
                       ", \"per_second\": " + json_writer::number(r.per_second()) +
                       ", \"seconds\": " + json_writer::array(r.seconds);
    if (r.group == "reactor") {
      line += ", \"completions_per_second\": " + json_writer::number(r.per_second()) +
              ", \"reactor_cpu_ns_per_completion\": " +
              json_writer::number(reactor_cpu_ns[reactor_index++]);
    }
    w.raw(line + (i + 1 < rows.size() ? "},\n" : "}\n"));
  }
  w.raw("  ]\n}\n");
  const bool ok = std::fclose(f) == 0;
  if (ok) std::printf("\nwrote %s\n", o.json.c_str());
  return ok;
}

}  // namespace
}  // namespace evr::bench

int evr_bench_sim(int argc, char** argv) {
  using namespace evr::bench;
  sim_settings o;
  CLI::App app{
      "What the simulated device costs: ns per enqueued operation (stalled and running stream), "
      "ns per completed operation (one stream, several streams), and end-to-end completions per "
      "second of evr::on_complete waits, per strategy. No timing claims: figures of this machine.",
      "evr-bench sim"};
  app.add_option("--ops", o.ops, "operations per enqueue/complete figure")
      ->check(CLI::Range(100, 100000000));
  app.add_option("--streams", o.streams, "streams of the several-streams completion figure")
      ->check(CLI::Range(1, 1024));
  app.add_option("--waits", o.waits, "waits per reactor figure")->check(CLI::Range(64, 100000000));
  app.add_option("--reactor-streams", o.reactor_streams, "streams the reactor's waits go to")
      ->check(CLI::Range(1, 4096));
  app.add_option("--threads", o.threads, "threads submitting the reactor's waits")
      ->check(CLI::Range(1, 64));
  app.add_option("--repeat", o.repeat, "runs per figure (the median is shown)")
      ->check(CLI::Range(1, 100));
  app.add_option("--strategies", o.strategies, "reactor strategies to measure")
      ->delimiter(',')
      ->check(CLI::IsMember({"poll", "fence", "host_func", "adaptive"}));
  app.add_option("--groups", o.groups, "which figures: enqueue, complete, reactor")
      ->delimiter(',')
      ->check(CLI::IsMember({"enqueue", "complete", "reactor"}));
  app.add_option("--kinds", o.kinds, "operations of the enqueue and one-stream complete figures")
      ->delimiter(',')
      ->check(CLI::IsMember({"record_event", "write_fence", "launch_host_func", "launch_kernel"}));
  app.add_option("--json", o.json, "also write every run's figures to FILE");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;

  std::vector<sim_row> rows;
  std::vector<double> reactor_cpu_ns;
  std::string describe;
  try {
    {
      fixture f(1);
      describe = f.sim().describe();
    }
    std::printf("evr-bench sim: %s, %d ops per figure, median of %d runs, %u hardware threads\n",
                describe.c_str(), o.ops, o.repeat, std::thread::hardware_concurrency());
    auto wanted = [](const std::vector<std::string>& list, const std::string& item) {
      return std::find(list.begin(), list.end(), item) != list.end();
    };
    const bool enqueue = wanted(o.groups, "enqueue"), complete = wanted(o.groups, "complete");
    for (op_kind k : all_kinds) {
      if (!(enqueue || complete) || !wanted(o.kinds, option_name_of(k))) continue;
      const std::string name = name_of(k);
      const auto ops = static_cast<std::uint64_t>(o.ops);
      sim_row stalled{"enqueue", name + ", stalled stream", ops, {}};
      sim_row running{"enqueue", name + ", running stream", ops, {}};
      sim_row one{"complete", name + ", one stream", ops, {}};
      measure_one_stream(o, k, stalled, running, one);
      for (sim_row* r : {&stalled, &running, &one}) {
        if (!wanted(o.groups, r->group)) continue;
        print_row(*r);
        rows.push_back(std::move(*r));
      }
    }
    if (complete) {
      sim_row many{"complete", "mixed, " + std::to_string(o.streams) + " streams at once", 0, {}};
      measure_many_streams(o, many);
      print_row(many);
      rows.push_back(std::move(many));
    }
    for (const std::string& name : o.strategies) {
      if (!wanted(o.groups, "reactor")) break;
      sim_row r{"reactor",
                "on_complete, " + std::to_string(o.reactor_streams) + " streams, " + name,
                0,
                {}};
      std::vector<double> cpu;
      for (int i = 0; i < o.repeat; ++i) cpu.push_back(measure_reactor(o, strategy_of(name), r));
      reactor_cpu_ns.push_back(percentile(cpu, 0.5));
      print_row(r);
      rows.push_back(std::move(r));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "evr-bench sim: %s\n", e.what());
    return 1;
  }
  if (!o.json.empty() && !write_json(o, describe, rows, reactor_cpu_ns)) return 1;
  return 0;
}
