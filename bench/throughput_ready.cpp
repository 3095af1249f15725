// bench/throughput_ready.cpp — `evr-bench throughput`'s ready drain: the reactor's own cost per
// completion, with the GPU out of the way. In the burst drain the GPU completes a round's markers
// one every ~1 us, and the reactor, keeping up, is awake for the whole drain: its CPU per
// completion is the GPU's pace, not its own work. Here the reactor is held (an inline handler
// blocks its thread), the waits are submitted on idle streams and the GPU finishes every marker,
// then the reactor is released: its CPU from the release to the last completion is taking the
// submissions, one sweep that retires each stream's run of done markers (one fence read, or two
// event queries), delivery, and the markers' return to their pools. Rounds of 1024 waits on 64
// streams (event markers) or 480 on 8 (fence markers: a device takes at most
// max_pending_fences, 512), after a warm-up round.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <asio/bind_executor.hpp>
#include <asio/post.hpp>
#include <evr/evr.hpp>

#include "io_thread.hpp"
#include "stats.hpp"
#include "throughput.hpp"

namespace evr::bench {
namespace {

/// An executor evr does not recognize as an io_context's (a plain forwarder to one): its
/// completions are posted one by one, as every completion was before batching. The ready drain's
/// "posted one each" rows measure that baseline in the same run.
struct forwarding_executor {
  asio::io_context::executor_type inner;
  asio::execution_context& query(asio::execution::context_t) const noexcept {
    return inner.context();
  }
  static constexpr asio::execution::blocking_t::never_t query(
      asio::execution::blocking_t) noexcept {
    return {};
  }
  template <typename F>
  void execute(F&& f) const {
    asio::post(inner, std::forward<F>(f));
  }
  // Asio's executor concept asks for == (!= is C++20's rewrite of it); unused here otherwise.
  [[maybe_unused]] friend bool operator==(const forwarding_executor& a,
                                          const forwarding_executor& b) noexcept {
    return a.inner == b.inner;
  }
};

/// What the holding handler blocks on (no CPU while it does).
struct reactor_hold {
  std::mutex m;
  std::condition_variable cv;
  bool held = false, released = false;
};

/// How the ready drain's completions are delivered: inline on the reactor thread; posted to an
/// io_context (one post per batch); or posted through an executor evr does not recognize (a
/// plain forwarder to the same io_context: one post per completion, as before batching).
enum class ready_delivery { inline_on_reactor, posted, posted_one_each };

/// One ready-drain row: a reactor, its streams and (posted rows) an io_context thread.
class ready_runner {
 public:
  ready_runner(const tp_run& run, const reactor_options& opts, int nstreams, ready_delivery how)
      : run_(run),
        how_(how),
        r_(run.be, opts),
        ss_(make_streams(run.be, nstreams)),
        holder_(run.be, 0) {
    if (posted()) {
      io_ = std::make_unique<io_thread>();
      waiter_ = std::make_unique<gpu_waiter>(io_->io().get_executor(), r_);
    }
  }
  /// Rounds of `per_stream` waits per stream after a warm-up round (not counted: a steady state).
  ready_row measure(const std::string& name, int per_stream, int rounds);

 private:
  static std::vector<evr::stream> make_streams(device::backend& be, int n) {
    std::vector<evr::stream> ss;
    for (int i = 0; i < n; ++i) ss.emplace_back(be, 0);
    return ss;
  }
  bool posted() const { return how_ != ready_delivery::inline_on_reactor; }
  std::shared_ptr<reactor_hold> hold_reactor();
  void submit(int stream, std::uint64_t target);
  void release_and_wait(reactor_hold& hold, std::uint64_t target);

  const tp_run& run_;
  ready_delivery how_;
  reactor r_;
  std::vector<evr::stream> ss_;
  evr::stream holder_;
  std::unique_ptr<io_thread> io_;
  std::unique_ptr<gpu_waiter> waiter_;
  std::atomic<std::uint64_t> done_{0};  // posted: counted by the io_context's thread
  struct {
    alignas(64) std::uint64_t count = 0;  // inline: the reactor thread's alone
    alignas(64) std::atomic<std::uint64_t> reached{0};
  } reactor_side_;
};

std::shared_ptr<reactor_hold> ready_runner::hold_reactor() {
  auto hold = std::make_shared<reactor_hold>();
  evr::throw_if(on_complete(r_, holder_,
                            [hold](std::error_code) {
                              std::unique_lock<std::mutex> l(hold->m);
                              hold->held = true;
                              hold->cv.notify_all();
                              hold->cv.wait(l, [&] { return hold->released; });
                            }),
                "on_complete");
  std::unique_lock<std::mutex> l(hold->m);
  hold->cv.wait(l, [&] { return hold->held; });
  return hold;
}

void ready_runner::submit(int k, std::uint64_t target) {
  evr::stream& st = ss_[static_cast<std::size_t>(k)];
  if (posted()) {
    auto count = [this](std::error_code) { done_.fetch_add(1, std::memory_order_release); };
    if (how_ == ready_delivery::posted_one_each) {
      waiter_->async_wait(
          st, asio::bind_executor(forwarding_executor{io_->io().get_executor()}, count));
    } else {
      waiter_->async_wait(st, count);
    }
    return;
  }
  // Counted on the reactor's own cache line; the waiting thread reads another one, written once
  // per round (a shared counter bounced between the two cores on every completion, and the row
  // measured that instead of the reactor).
  evr::throw_if(on_complete(r_, st,
                            [this, target](std::error_code) {
                              if (++reactor_side_.count == target)
                                reactor_side_.reached.store(target, std::memory_order_release);
                            }),
                "on_complete");
}

void ready_runner::release_and_wait(reactor_hold& hold, std::uint64_t target) {
  {
    std::lock_guard<std::mutex> l(hold.m);
    hold.released = true;
  }
  hold.cv.notify_all();
  if (posted()) {
    while (done_.load(std::memory_order_acquire) < target) std::this_thread::yield();
  } else {
    while (reactor_side_.reached.load(std::memory_order_acquire) < target)
      std::this_thread::yield();
  }
}

ready_row ready_runner::measure(const std::string& name, int per_stream, int rounds) {
  const int nstreams = static_cast<int>(ss_.size());
  const int n = nstreams * per_stream;
  double cpu = 0, queries = 0, seconds = 0;
  for (int round = 0; round <= rounds; ++round) {
    auto hold = hold_reactor();
    const std::uint64_t target =
        (posted() ? done_.load() : reactor_side_.count) + static_cast<std::uint64_t>(n);
    for (int i = 0; i < per_stream; ++i) {
      for (int k = 0; k < nstreams; ++k) submit(k, target);
    }
    for (auto& st : ss_) evr::throw_if(run_.be.synchronize_stream(st.native()), "synchronize");
    const double c0 = static_cast<double>(r_.cpu_time().count());
    const reactor_metrics m0 = r_.metrics();
    const auto t0 = bench_clock::now();
    release_and_wait(*hold, target);
    if (round == 0) continue;
    seconds += std::chrono::duration<double>(bench_clock::now() - t0).count();
    cpu += static_cast<double>(r_.cpu_time().count()) - c0;
    queries += static_cast<double>(r_.metrics().event_queries - m0.event_queries);
  }
  const double total = static_cast<double>(n) * rounds;
  ready_row row{name, nstreams, n, cpu / total, queries / total, total / seconds};
  std::fprintf(stderr,
               "  ready %-44s %10.0f completions/s  %8.1f ns reactor CPU each, %.3f queries "
               "each\n",
               name.c_str(), row.completions_per_second, row.cpu_ns_per_completion,
               row.queries_per_completion);
  return row;
}

}  // namespace

std::vector<ready_row> measure_ready_drain(const tp_run& run) {
  const tp_settings& cfg = run.cfg;
  std::vector<ready_row> rows;
  auto row = [&](const std::string& name, const reactor_options& opts, int nstreams, int per_stream,
                 int rounds, ready_delivery how) {
    ready_runner runner(run, opts, nstreams, how);
    rows.push_back(runner.measure(name, per_stream, rounds));
  };
  // Rounds of 16 waits per stream (1024 on 64 streams) for events; 480 fences on 8 streams.
  const int per_stream = 16;
  const int rounds = std::max(1, cfg.ops / 4 / (cfg.streams * per_stream));
  const int fence_streams = std::min(cfg.streams, 8);
  const int fence_per_stream = 480 / fence_streams;
  const int fence_rounds = std::max(1, cfg.ops / 4 / (fence_streams * fence_per_stream));
  reactor_options fence_opts = run.evr_options(strategy::fence);
  if (fence_opts.max_fence_streams == 0 || fence_opts.max_fence_streams > 8)
    fence_opts.max_fence_streams = 8;
  const reactor_options poll_opts = run.evr_options(strategy::poll);
  using rd = ready_delivery;
  row("evr fence (fence words), inline", fence_opts, fence_streams, fence_per_stream, fence_rounds,
      rd::inline_on_reactor);
  row("evr fence (fence words), posted", fence_opts, fence_streams, fence_per_stream, fence_rounds,
      rd::posted);
  row("evr fence (fence words), posted one each", fence_opts, fence_streams, fence_per_stream,
      fence_rounds, rd::posted_one_each);
  row("evr poll (events), inline", poll_opts, cfg.streams, per_stream, rounds,
      rd::inline_on_reactor);
  row("evr poll (events), posted", poll_opts, cfg.streams, per_stream, rounds, rd::posted);
  row("evr poll (events), posted one each", poll_opts, cfg.streams, per_stream, rounds,
      rd::posted_one_each);
  row("evr adaptive, inline", run.evr_options(strategy::adaptive), cfg.streams, per_stream, rounds,
      rd::inline_on_reactor);
  return rows;
}

}  // namespace evr::bench
