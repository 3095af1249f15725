// bench/throughput_memory.cpp — `evr-bench throughput`'s memory per in-flight wait: many waits
// pending behind closed gates, with the poll strategy (an event per wait). Rows, each on streams
// of its own and all pending together until the end (freed memory would be reused by the next row
// and hide its cost): the device's own share measured alone (an event created and recorded per
// wait, no evr), evr's plain callbacks, gpu_waiter posting to an io_context (a one-pointer
// handler each; two executor types), and the device alone again. What evr adds is the difference
// to the device alone.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <evr/evr.hpp>

#include "throughput.hpp"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace evr::bench {
namespace {

long rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  return 0;
}

/// Bytes of heap in use (malloc's view, headers included); -1 where mallinfo2 is missing. Unlike
/// RSS it counts freed-and-reused memory right and is not rounded to pages.
long long heap_in_use() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  const struct mallinfo2 mi = mallinfo2();
  return static_cast<long long>(mi.uordblks + mi.hblkhd);  // small chunks + mapped large ones
#else
  return -1;
#endif
}

/// A one-pointer handler for gpu_waiter, run on this thread (io.run() once the gates open): the
/// operations' memory goes back to this thread's recycling cache, as in a server's steady state.
struct one_pointer_handler {
  std::uint64_t* done;
  void operator()(evr::asio_error_code) const { ++*done; }
};

/// Every row's streams and reactors, made before the first gate kernel is launched: on the H100,
/// creating them while other streams' gate kernels were held closed blocked the run (the first
/// version of these rows never finished there).
class memory_runner {
 public:
  explicit memory_runner(const tp_run& run);
  std::vector<memory_row> measure();

 private:
  std::vector<evr::stream> make_streams() const;
  std::vector<std::vector<evr::stream>> make_stream_sets(int n) const {
    std::vector<std::vector<evr::stream>> sets;
    for (int i = 0; i < n; ++i) sets.push_back(make_streams());
    return sets;
  }
  static reactor_options poll_options() {
    reactor_options opts;
    opts.strategy = strategy::poll;
    return opts;
  }
  /// Measures RSS and heap around `submit(i)` for i in [0, n), once `settled()` (everything
  /// submitted taken in).
  template <typename Submit, typename Settled>
  void row(const std::string& name, Submit&& submit, Settled&& settled);
  void device_alone(const std::string& name, std::size_t k);
  template <typename Waiter>
  void waiter_row(const std::string& name, Waiter& waiter, reactor& r,
                  std::vector<evr::stream>& ss);
  void finish();

  const tp_run& run_;
  const int n_;
  const std::uint64_t total_;
  std::vector<memory_row> rows_;
  // The device's own share, measured first and last (a device's tables that grow by doubling
  // charge their growth to whichever row crosses the boundary: the two bracket it).
  std::vector<std::vector<evr::stream>> raw_streams_;
  std::vector<std::vector<evr::device::native_event>> raw_events_;
  std::vector<evr::stream> cb_streams_;
  reactor cb_reactor_;
  std::atomic<std::uint64_t> cb_done_{0};
  // gpu_waiter with the io_context's own executor type, and with the default any_io_executor.
  asio::io_context io_;
  std::uint64_t waiter_done_ = 0;
  std::vector<evr::stream> io_waiter_streams_, any_waiter_streams_;
  reactor io_waiter_reactor_, any_waiter_reactor_;
  basic_gpu_waiter<asio::io_context::executor_type> io_waiter_;
  gpu_waiter any_waiter_;
};

memory_runner::memory_runner(const tp_run& run)
    : run_(run),
      n_(run.cfg.inflight_waits),
      total_(static_cast<std::uint64_t>(n_)),
      raw_streams_(make_stream_sets(2)),
      raw_events_(2, std::vector<evr::device::native_event>(static_cast<std::size_t>(n_))),
      cb_streams_(make_streams()),
      cb_reactor_(run.be, poll_options()),
      io_waiter_streams_(make_streams()),
      any_waiter_streams_(make_streams()),
      io_waiter_reactor_(run.be, poll_options()),
      any_waiter_reactor_(run.be, poll_options()),
      io_waiter_(io_.get_executor(), io_waiter_reactor_),
      any_waiter_(io_.get_executor(), any_waiter_reactor_) {}

std::vector<evr::stream> memory_runner::make_streams() const {
  std::vector<evr::stream> ss;
  for (int i = 0; i < run_.cfg.inflight_streams; ++i) ss.emplace_back(run_.be, 0);
  return ss;
}

template <typename Submit, typename Settled>
void memory_runner::row(const std::string& name, Submit&& submit, Settled&& settled) {
  const long before = rss_kib();
  const long long heap_before = heap_in_use();
  for (int i = 0; i < n_; ++i) submit(i);
  while (!settled()) std::this_thread::yield();
  const long after = rss_kib();
  const long long heap_after = heap_in_use();
  memory_row row{name, static_cast<double>(after - before) * 1024.0 / n_, -1};
  if (heap_before >= 0 && heap_after >= 0)
    row.heap_bytes = static_cast<double>(heap_after - heap_before) / n_;
  std::fprintf(stderr, "  memory %-40s RSS %6.0f B, heap %6.0f B per in-flight wait\n",
               name.c_str(), row.rss_bytes, row.heap_bytes);
  rows_.push_back(row);
}

void memory_runner::device_alone(const std::string& name, std::size_t k) {
  auto& ss = raw_streams_[k];
  auto& evs = raw_events_[k];
  device::backend& be = run_.be;
  row(
      name + " (event created + recorded)",
      [&](int i) {
        auto& e = evs[static_cast<std::size_t>(i)];
        evr::throw_if(be.create_event(0, evr::device::event_flags::none, e), "create_event");
        evr::throw_if(be.record_event(e, ss[static_cast<std::size_t>(i) % ss.size()].native()),
                      "record_event");
      },
      [] { return true; });
}

template <typename Waiter>
void memory_runner::waiter_row(const std::string& name, Waiter& waiter, reactor& r,
                               std::vector<evr::stream>& ss) {
  row(
      name,
      [&](int i) {
        waiter.async_wait(ss[static_cast<std::size_t>(i) % ss.size()],
                          one_pointer_handler{&waiter_done_});
      },
      [&] { return r.metrics().submitted >= total_; });
}

std::vector<memory_row> memory_runner::measure() {
  run_.dev.close_gate();
  for (auto* ss : {&raw_streams_[0], &raw_streams_[1], &cb_streams_, &io_waiter_streams_,
                   &any_waiter_streams_}) {
    for (auto& st : *ss) run_.dev.launch_gate(st.native(), false);
  }
  device_alone("device alone, before", 0);
  auto cb = [this](std::error_code) { cb_done_.fetch_add(1); };
  row(
      "evr on_complete",
      [&](int i) {
        evr::throw_if(
            on_complete(cb_reactor_, cb_streams_[static_cast<std::size_t>(i) % cb_streams_.size()],
                        cb),
            "on_complete");
      },
      [&] { return cb_reactor_.metrics().submitted >= total_; });
  waiter_row("evr gpu_waiter (io_context executor)", io_waiter_, io_waiter_reactor_,
             io_waiter_streams_);
  waiter_row("evr gpu_waiter (any_io_executor)", any_waiter_, any_waiter_reactor_,
             any_waiter_streams_);
  device_alone("device alone, after", 1);
  finish();
  return rows_;
}

void memory_runner::finish() {
  run_.dev.open_gate();
  for (auto& ss : raw_streams_) {
    for (auto& st : ss) evr::throw_if(run_.be.synchronize_stream(st.native()), "synchronize");
  }
  for (auto& evs : raw_events_) {
    for (auto e : evs) run_.be.destroy_event(e);
  }
  while (cb_done_.load() < total_) std::this_thread::yield();
  while (waiter_done_ < 2 * total_) {
    io_.restart();
    io_.run_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

std::vector<memory_row> measure_memory(const tp_run& run) {
  memory_runner runner(run);
  return runner.measure();
}

}  // namespace evr::bench
