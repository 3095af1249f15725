// bench/studies/launch_after_done.cu — what a stream's next launch costs the thread that makes
// it, by how the end of the stream's last work was seen: by a driver query (an event or the
// stream), or not at all (a memory read, as with a signal slot or a fence word).
//
//   CUDA_DEVICE_MAX_CONNECTIONS=8  evr-launch-after-done [--rounds 20] [--work-us 1000]
//   CUDA_DEVICE_MAX_CONNECTIONS=32 evr-launch-after-done
//
// Why: the example server's profile put each launch about 1.6 us dearer under evr than under
// the hand-written poll loop, also with the kernel signalling, where no query is made. If the
// driver does the bookkeeping of ended work on the first call that meets it, a wait whose look
// is a memory read leaves that work to the next launch instead of removing it.
//
// For N = 1, 16 and 128 streams, each round launches on every stream a one-thread kernel of
// --work-us that writes the round's number into a word of mapped host memory as it ends, and
// records an event behind it; the host then reads the words until every stream's has the round
// (no driver call) and lets 100 us more pass for the events' own completion. The next round
// launches again, each stream in one of three ways (rotating with the round), timing single calls
// (ns, p50 and p90 over the rounds):
//   after event query   cudaEventQuery of the stream's event (it finds the work done), then the
//                       launch
//   after stream query  cudaStreamQuery of the stream, then the launch
//   nothing seen        the launch alone: the driver has not been asked about this stream
// The round's first driver call (stream 0's query or launch) is the only one that no call made
// after the work ended precedes, so it is kept apart ("first call"): if the driver does its
// bookkeeping of ended work per context rather than per stream, that call pays it. The queries'
// own times are rows too. Each table runs twice: on an idle device, and with a one-thread kernel
// on another stream that spins until the host ends it after the rounds (a busy device throughout,
// as a server's, without a driver call of its own between the rounds).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "study_common.cuh"

namespace {

using study::check;
using study::streams_with_words;
using study::wait_words;
using study::work_then_write;
using clock_type = std::chrono::steady_clock;

using samples = study::call_times;

enum class seen { by_event_query, by_stream_query, nothing };
constexpr int kinds = 3;

/// One set of rows: the launches by what was asked before them, and the queries' own times.
struct calls {
  samples launch[kinds], event_query, stream_query;
};

struct table {
  calls first, later;  // the round's first driver call (stream 0), the other streams
  int queries_not_done = 0;
};

/// A query that must find the work done; a not-ready answer is counted, any other error ends
/// the study.
template <typename Query>
void counted_query(samples& s, int& not_done, Query&& query) {
  const cudaError_t e = s.time(std::forward<Query>(query));
  if (e == cudaErrorNotReady)
    ++not_done;
  else
    check(e, "query");
}

void print_rows(int n, bool busy_device, const char* which, calls& c) {
  const auto row = [&](const char* what, samples& s) {
    std::printf("%8d %-6s %-10s %-22s %9.0f %9.0f %8zu\n", n, busy_device ? "busy" : "idle", which,
                what, s.quantile(0.5), s.quantile(0.9), s.ns.size());
  };
  row("launch, nothing seen", c.launch[static_cast<int>(seen::nothing)]);
  row("launch, after event q.", c.launch[static_cast<int>(seen::by_event_query)]);
  row("launch, after stream q.", c.launch[static_cast<int>(seen::by_stream_query)]);
  row("event query (done)", c.event_query);
  row("stream query (done)", c.stream_query);
}

void run(int n, int rounds, double work_us, bool busy_device) {
  streams_with_words lanes(n, busy_device);
  const std::vector<cudaStream_t>& streams = lanes.streams;
  const std::vector<cudaEvent_t>& events = lanes.events;
  const auto work_ns = static_cast<unsigned long long>(work_us * 1000);
  table t;
  const int warm_up = 2;
  for (int r = 1; r <= rounds + warm_up; ++r) {
    for (int i = 0; i < n; ++i) {
      calls& c = i == 0 ? t.first : t.later;
      const auto how = static_cast<seen>((i + r) % kinds);
      if (r > 1 && how == seen::by_event_query)
        counted_query(c.event_query, t.queries_not_done, [&] { return cudaEventQuery(events[i]); });
      else if (r > 1 && how == seen::by_stream_query)
        counted_query(c.stream_query, t.queries_not_done,
                      [&] { return cudaStreamQuery(streams[i]); });
      c.launch[static_cast<int>(how)].time([&] {
        work_then_write<<<1, 1, 0, streams[i]>>>(work_ns, lanes.words.device + i,
                                                 static_cast<unsigned>(r));
        return 0;
      });
      check(cudaGetLastError(), "launch");
      check(cudaEventRecord(events[i], streams[i]), "record");
    }
    wait_words(lanes.words.host, n, static_cast<unsigned>(r));
    if (r <= warm_up) t = table{};
  }
  print_rows(n, busy_device, "first call", t.first);
  if (n > 1) print_rows(n, busy_device, "later", t.later);
  if (t.queries_not_done > 0)
    std::printf("%8d %-6s %d queries found the work not done (the rows above mean less)\n", n,
                busy_device ? "busy" : "idle", t.queries_not_done);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  study::options opt = study::parse(argc, argv, "evr-launch-after-done");
  check(cudaSetDevice(0), "cudaSetDevice");
  const char* conn = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  std::printf("launch-after-done: work %.0f us, %d rounds, CUDA_DEVICE_MAX_CONNECTIONS=%s\n",
              opt.work_us, opt.rounds, conn ? conn : "unset (8)");
  std::printf("%8s %-6s %-10s %-22s %9s %9s %8s\n", "streams", "device", "which", "call", "p50 ns",
              "p90 ns", "calls");
  for (bool busy : {false, true})
    for (int n : {1, 16, 128}) run(n, opt.rounds, opt.work_us, busy);
  return 0;
}
