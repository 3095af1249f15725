// bench/studies/event_queries.cu — what one look at an event marker costs the thread that makes
// it (a driver query), by the event's state and by the device's hardware queues.
//
//   CUDA_DEVICE_MAX_CONNECTIONS=8  evr-event-queries [--rounds 20] [--work-us 1000]
//   CUDA_DEVICE_MAX_CONNECTIONS=32 evr-event-queries
//
// For N = 16, 64 and 128 streams, each round launches a one-thread kernel of --work-us on every
// stream and records an event behind it, then times single calls (ns per call, p50 and p90 over
// the rounds' calls):
//   pending        cudaEventQuery of an event whose work still runs
//   done, first    the first cudaEventQuery of an event whose work has ended (the device idle)
//   done, again    the next query of the same event
//   done, busy     the first query of an ended event while every stream runs its next kernel
//   stream, first  the first cudaStreamQuery of a stream whose work has ended (no event asked)
//   record         the cudaEventRecord behind each kernel (what a marker costs to put down)
// The table runs for two kinds of event: as evr's pool makes them (cudaEventDisableTiming), and
// interprocess ones (cudaEventInterprocess), whose state other processes can read. Each query row
// also has a "cu:" twin, the same look through the driver's own entry point (cuEventQuery,
// fetched with cudaGetDriverEntryPointByVersion): what the runtime's layer adds to a look.
// Pending events are asked through both in turn; of the ended events, the even-numbered ones are
// asked through the runtime, the odd ones through the driver, so that every "first" is a first.
// A look that finds a wait done is a "done, first" (or "done, busy" on a loaded device); every
// look before it a "pending". The last column says how many calls found the work done: 0 % for
// "pending", 100 % for the rest; otherwise the streams' launches outlasted --work-us (about 3 us
// a stream) and the rows mean something else: raise it. docs/architecture.md, "Markers and
// hardware queues", has the figures and what they mean for evr's markers.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "study_common.cuh"

namespace {

using study::busy_kernel;
using study::check;

/// cuEventQuery's signature with the runtime's types (CUevent is cudaEvent_t; CUresult an enum
/// whose success is 0), so that no driver symbol is referenced at link time.
using driver_event_query_fn = int (*)(cudaEvent_t);

/// Samples of one kind of call, ns, and how many of the calls said "done".
struct samples : study::call_times {
  int done = 0;
  template <typename F>
  void time(F&& call) {
    // cudaSuccess and CUDA_SUCCESS are 0
    done += static_cast<int>(call_times::time(std::forward<F>(call))) == 0 ? 1 : 0;
  }
  void clear() {
    ns.clear();
    done = 0;
  }
};

struct lanes {
  std::vector<cudaStream_t> streams;
  std::vector<cudaEvent_t> events, next_events;
  samples* records = nullptr;  // times each cudaEventRecord when set
  lanes(int n, unsigned event_flags) : streams(n), events(n), next_events(n) {
    for (int i = 0; i < n; ++i) {
      check(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking), "stream");
      check(cudaEventCreateWithFlags(&events[i], event_flags), "event");
      check(cudaEventCreateWithFlags(&next_events[i], event_flags), "event");
    }
  }
  ~lanes() {
    for (std::size_t i = 0; i < streams.size(); ++i) {
      cudaEventDestroy(events[i]);
      cudaEventDestroy(next_events[i]);
      cudaStreamDestroy(streams[i]);
    }
  }
  /// A kernel of `work_ns` on every stream, an event of `ev` recorded behind it.
  void launch(std::vector<cudaEvent_t>& ev, unsigned long long work_ns) {
    for (std::size_t i = 0; i < streams.size(); ++i) {
      busy_kernel<<<1, 1, 0, streams[i]>>>(work_ns);
      if (records != nullptr) {
        records->time([&] {
          check(cudaEventRecord(ev[i], streams[i]), "record");
          return cudaErrorNotReady;  // counted as not done: the column says nothing here
        });
      } else {
        check(cudaEventRecord(ev[i], streams[i]), "record");
      }
    }
    check(cudaGetLastError(), "launch");
  }
};

void run(int n, int rounds, double work_us, driver_event_query_fn cu_query, unsigned event_flags) {
  lanes l(n, event_flags);
  const auto work_ns = static_cast<unsigned long long>(work_us * 1000);
  samples pending, first, again, busy, stream_first;
  samples cu_pending, cu_first, cu_again, cu_busy, record;
  l.records = &record;
  // Ended events: even-numbered ones asked through the runtime, odd ones through the driver.
  const auto split = [&](std::vector<cudaEvent_t>& ev, samples& rt, samples& cu) {
    for (std::size_t i = 0; i < ev.size(); ++i) {
      if (i % 2 == 0)
        rt.time([&] { return cudaEventQuery(ev[i]); });
      else
        cu.time([&] { return cu_query(ev[i]); });
    }
  };
  for (int r = 0; r < rounds + 2; ++r) {  // two warm-up rounds
    const bool keep = r >= 2;
    // pending, then done first and again on an idle device
    l.launch(l.events, work_ns);
    for (cudaEvent_t e : l.events) pending.time([&] { return cudaEventQuery(e); });
    for (cudaEvent_t e : l.events) cu_pending.time([&] { return cu_query(e); });
    check(cudaDeviceSynchronize(), "synchronize");
    split(l.events, first, cu_first);
    split(l.events, again, cu_again);
    // done first while the device runs the next kernel of every stream
    l.launch(l.next_events, work_ns / 4);
    check(cudaDeviceSynchronize(), "synchronize");
    l.launch(l.events, work_ns);
    split(l.next_events, busy, cu_busy);
    check(cudaDeviceSynchronize(), "synchronize");
    // a stream's first query after its work ended
    l.launch(l.next_events, work_ns / 4);
    check(cudaDeviceSynchronize(), "synchronize");
    for (cudaStream_t s : l.streams) stream_first.time([&] { return cudaStreamQuery(s); });
    if (!keep) {
      for (samples* s : {&pending, &first, &again, &busy, &stream_first, &cu_pending, &cu_first,
                         &cu_again, &cu_busy, &record})
        s->clear();
    }
  }
  const auto row = [n](const char* what, samples& s) {
    const double done_pct = s.ns.empty() ? 0 : 100.0 * s.done / static_cast<double>(s.ns.size());
    std::printf("%8d %-17s %10.0f %10.0f %8.0f%%\n", n, what, s.quantile(0.5), s.quantile(0.9),
                done_pct);
  };
  row("record", record);
  row("pending", pending);
  row("done, first", first);
  row("done, again", again);
  row("done, busy", busy);
  row("stream, first", stream_first);
  row("cu: pending", cu_pending);
  row("cu: done, first", cu_first);
  row("cu: done, again", cu_again);
  row("cu: done, busy", cu_busy);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const study::options opt = study::parse(argc, argv, "evr-event-queries");
  const double work_us = opt.work_us;
  const int rounds = opt.rounds;
  check(cudaSetDevice(0), "cudaSetDevice");
  const char* conn = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  std::printf("event-queries: work %.0f us, %d rounds, CUDA_DEVICE_MAX_CONNECTIONS=%s\n", work_us,
              rounds, conn ? conn : "unset (8)");
  std::printf("%8s %-17s %10s %10s %9s\n", "streams", "call", "p50 ns", "p90 ns", "done");
  const auto cu_query =
      reinterpret_cast<driver_event_query_fn>(study::driver_entry_point("cuEventQuery"));
  // evr's pooled events (no timing), then interprocess ones (their state is shared with other
  // processes: is a look at them cheaper?).
  const struct {
    const char* name;
    unsigned flags;
  } kinds[] = {{"cudaEventDisableTiming", cudaEventDisableTiming},
               {"cudaEventDisableTiming | cudaEventInterprocess",
                cudaEventDisableTiming | cudaEventInterprocess}};
  for (const auto& kind : kinds) {
    std::printf("events: %s\n", kind.name);
    for (int n : {16, 64, 128}) run(n, rounds, work_us, cu_query, kind.flags);
  }
  return 0;
}
