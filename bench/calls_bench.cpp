// evr-bench calls — the host's cost of each device call on a wait's path, and of a whole submit:
//
//   query-done      backend query_event on an event the GPU is past (the sweep's "retired" look)
//   query-pending   query_event on an event behind a held kernel (the sweep's usual answer)
//   query-stream    query_stream on an idle stream
//   record          record_event behind a held kernel (a pooled-event marker)
//   write-fence     write_fence behind a held kernel (a fence-word marker)
//   submit          evr::on_complete on a stream behind a held kernel: the front end's whole
//                   submission (operation, marker, push onto the reactor's queue, wake rule)
//   driver-query-done, driver-query-pending (CUDA only)
//                   cuEventQuery through an entry point fetched from the driver: the same query
//                   without the runtime's layer, what a backend on the driver API would pay
//
// Each row times batches of calls back to back (a gate kernel holds the stream while a batch is
// enqueued; a stream's queue has room for a few thousand operations, hence small batches) and
// reports the median and the 90th percentile of the batches' ns per call. What it is for: the
// same figure from two builds (a static and a shared CUDA runtime, say) in one run of the machine.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <evr/callbacks/on_complete.hpp>
#include <evr/device/backend.hpp>
#include <evr/device/stream.hpp>
#include <evr/reactor/reactor.hpp>

#if defined(EVR_WITH_CUDA)
#include <cuda.h>  // driver types only: the function comes from cudaGetDriverEntryPointByVersion
#include <cuda_runtime_api.h>
#endif

#include "bench_device.hpp"
#include "cli.hpp"
#include "stats.hpp"
#include "subcommands.hpp"

namespace evr::bench {
namespace {

namespace dev = evr::device;

struct calls_row {
  std::string call;
  std::vector<double> ns_per_call;  // one value per batch
};

/// Fails the run with a message naming the call: a bench that measures failing calls measures
/// nothing.
void require(std::error_code ec, const char* what) {
  if (ec) throw std::runtime_error(std::string(what) + " failed: " + ec.message());
}

/// Times `batches` batches of `per_batch` calls of `call(i)`, each batch with the stream held by a
/// gate kernel (when `hold`), the gate opened and the stream drained after each batch.
calls_row time_batches(bench_device& d, dev::native_stream stream, const std::string& name,
                       int batches, int per_batch, bool hold, const std::function<void(int)>& call,
                       const std::function<void()>& before_batch = {}) {
  calls_row row{name, {}};
  row.ns_per_call.reserve(static_cast<std::size_t>(batches));
  dev::backend& be = d.backend();
  for (int b = 0; b < batches; ++b) {
    if (hold) {
      d.close_gate(0);
      d.launch_gate(stream, false, 0);
    }
    if (before_batch) before_batch();
    const auto t0 = bench_clock::now();
    for (int i = 0; i < per_batch; ++i) call(i);
    const auto t1 = bench_clock::now();
    row.ns_per_call.push_back(ns_between(t0, t1) / per_batch);
    if (hold) d.open_gate(0);
    require(be.synchronize_stream(stream), "synchronize_stream");
  }
  return row;
}

/// The driver's cuEventQuery on the same event, done and pending (CUDA backend only).
void add_driver_query_rows(bench_device& d, dev::native_stream stream, dev::native_event event,
                           int batches, int per_batch, std::vector<calls_row>& rows) {
#if defined(EVR_WITH_CUDA)
  if (d.name() != "cuda") return;
  using query_fn = CUresult(CUDAAPI*)(CUevent);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuEventQuery", &fn, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    throw std::runtime_error("cudaGetDriverEntryPointByVersion(cuEventQuery) failed");
  }
  const auto query = reinterpret_cast<query_fn>(fn);
  const auto ev = static_cast<CUevent>(event);
  dev::backend& be = d.backend();
  require(be.record_event(event, stream), "record_event");
  require(be.synchronize_stream(stream), "synchronize_stream");
  rows.push_back(time_batches(d, stream, "driver-query-done", batches, per_batch, false,
                              [&](int) { (void)query(ev); }));
  rows.push_back(time_batches(
      d, stream, "driver-query-pending", batches, per_batch, true, [&](int) { (void)query(ev); },
      [&] { require(be.record_event(event, stream), "record_event"); }));
#else
  (void)d, (void)stream, (void)event, (void)batches, (void)per_batch, (void)rows;
#endif
}

std::vector<calls_row> measure(bench_device& d, int batches, int per_batch) {
  dev::backend& be = d.backend();
  const evr::stream owned(be, 0);  // what on_complete takes; the raw calls use its handle
  const dev::native_stream stream = owned.native();
  dev::native_event event = nullptr;
  require(be.create_event(0, dev::event_flags::none, event), "create_event");
  dev::fence_block fences;
  require(be.allocate_fence_block(0, 1, fences), "allocate_fence_block");
  std::vector<calls_row> rows;

  require(be.record_event(event, stream), "record_event");
  require(be.synchronize_stream(stream), "synchronize_stream");
  // Warm-up, not reported: the first calls of a process ran up to twice as long on the GPU
  // machine (seen in some runs, either runtime), which would charge it to whichever row came first.
  (void)time_batches(d, stream, "warm-up", batches, per_batch, true,
                     [&](int) { require(be.record_event(event, stream), "record_event"); });
  rows.push_back(time_batches(d, stream, "query-done", batches, per_batch, false,
                              [&](int) { (void)be.query_event(event); }));
  rows.push_back(time_batches(
      d, stream, "query-pending", batches, per_batch, true,
      [&](int) { (void)be.query_event(event); },
      [&] { require(be.record_event(event, stream), "record_event"); }));
  rows.push_back(time_batches(d, stream, "query-stream", batches, per_batch, false,
                              [&](int) { (void)be.query_stream(stream); }));
  rows.push_back(time_batches(d, stream, "record", batches, per_batch, true, [&](int) {
    require(be.record_event(event, stream), "record_event");
  }));
  std::uint64_t value = 0;
  rows.push_back(time_batches(d, stream, "write-fence", batches, per_batch, true, [&](int) {
    require(be.write_fence(stream, fences.device_address, ++value), "write_fence");
  }));
  add_driver_query_rows(d, stream, event, batches, per_batch, rows);
  {
    evr::reactor r(be);
    std::atomic<long> done{0};
    rows.push_back(time_batches(d, stream, "submit", batches, per_batch, true, [&](int) {
      require(
          evr::on_complete(
              r, owned, [&done](std::error_code) { done.fetch_add(1, std::memory_order_relaxed); }),
          "on_complete");
    }));
    // Every wait completes before the reactor goes (its destructor would abort what is left).
    while (done.load(std::memory_order_relaxed) < static_cast<long>(batches) * per_batch) {
      std::this_thread::yield();
    }
  }
  be.free_fence_block(fences);
  be.destroy_event(event);
  return rows;
}

bool write_json(const std::string& file, const std::string& device, int per_batch,
                const std::vector<calls_row>& rows) {
  std::FILE* f = std::fopen(file.c_str(), "w");
  if (f == nullptr) return false;
  json_writer w(f);
  w.raw("{\n  \"subcommand\": \"calls\",\n  \"device\": " + json_writer::quote(device) +
        ",\n  \"per_batch\": " + json_writer::number(per_batch) + ",\n  \"rows\": [\n");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const calls_row& r = rows[i];
    w.raw("    {\"call\": " + json_writer::quote(r.call) +
          ", \"p50_ns\": " + json_writer::number(percentile(r.ns_per_call, 0.5)) +
          ", \"p90_ns\": " + json_writer::number(percentile(r.ns_per_call, 0.9)) +
          ", \"ns_per_call\": " + json_writer::array(r.ns_per_call) + "}" +
          (i + 1 < rows.size() ? ",\n" : "\n"));
  }
  w.raw("  ]\n}\n");
  return std::fclose(f) == 0;
}

}  // namespace
}  // namespace evr::bench

int evr_bench_calls(int argc, char** argv) {
  using namespace evr::bench;
  CLI::App app{
      "The host's cost of each device call on a wait's path (event query done/pending, stream "
      "query, event record, fence write) and of a whole submit (evr::on_complete), ns per call.",
      "evr-bench calls"};
  std::string device = "auto", json;
  int batches = 200, per_batch = 256;
  add_device_option(app, device);
  app.add_option("--batches", batches, "batches per row")->check(CLI::Range(5, 100000));
  app.add_option("--per-batch", per_batch,
                 "calls per batch (enqueued calls wait behind a held kernel: a stream holds a few "
                 "thousand)")
      ->check(CLI::Range(1, 1024));
  add_json_option(app, json);
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;

  auto d = make_bench_device(device);
  d->reserve_gates(1);
  std::printf("calls on %s\n%-14s %10s %10s\n", d->describe().c_str(), "call", "p50 ns", "p90 ns");
  // Every row twice, the second pass reported: on an H200 the first rows of a pass ran up to ten
  // times as long as the same calls later in it (a completed event's query 1488 ns first, 153 ns
  // last), which told a comparison of two rows by their order, not by the calls.
  (void)measure(*d, batches, per_batch);
  const std::vector<calls_row> rows = measure(*d, batches, per_batch);
  for (const calls_row& r : rows) {
    std::printf("%-14s %10.1f %10.1f\n", r.call.c_str(), percentile(r.ns_per_call, 0.5),
                percentile(r.ns_per_call, 0.9));
  }
  if (json.empty()) return 0;
  if (!write_json(json, d->name(), per_batch, rows)) {
    std::fprintf(stderr, "evr-bench calls: cannot write %s\n", json.c_str());
    return 1;
  }
  std::printf("\nwrote %s\n", json.c_str());
  return 0;
}
