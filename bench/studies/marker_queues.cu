// bench/studies/marker_queues.cu — which marker behind a stream's work delays other streams when
// more streams are busy than the device has hardware queues (CUDA_DEVICE_MAX_CONNECTIONS).
//
//   CUDA_DEVICE_MAX_CONNECTIONS=8  evr-marker-queues [--work-us 1000] [--rounds 20] [--chain 1]
//                                  [--markers none,event,...] (default: all of them)
//   CUDA_DEVICE_MAX_CONNECTIONS=32 evr-marker-queues
//
// For N = 8, 16, 32, 64 and 128 streams (made afresh for each N: the driver assigns queues as
// streams are made), each round launches --work-us of work on every stream, as --chain one-thread
// kernels in a row (a library's work is a chain: cuBLAS, torch), then one marker behind it, and
// the host looks until every stream's marker is done:
//   none    no marker; the host asks cudaStreamQuery
//   event   cudaEventRecord of a pooled event; the host asks cudaEventQuery (evr's event marker)
//   ipc     the same with an interprocess event (cudaEventInterprocess)
//   write   cuStreamWriteValue64 of a word in mapped host memory; the host reads it (evr's fence)
//   kernel  a one-thread kernel that stores the word (a marker kernel); the host reads it
//   copy    cudaMemcpyAsync of 8 bytes from device memory into the word (pinned host memory): the
//           copy engines do it, not the compute queue; the host reads the word
//   graph-event   the work captured once as a CUDA graph, launched each round, an event behind
//                 the launch (a graph user's event marker)
//   graph-kernel  the same graph with the marker kernel as its last node (it counts the rounds
//                 in the word): a marker that is part of the user's graph
//   graph-marker  the work launched as it is, then a graph of the marker kernel alone
//   pdl-kernel    the marker kernel launched with programmatic stream serialization (compute
//                 capability 9.0): it may be scheduled before the work before it ends and waits
//                 for it on the GPU (griddepcontrol.wait), not in the queue
//   companion     an event recorded behind the work; a second stream of the greatest priority,
//                 one per stream and made after them, waits for it (cudaStreamWaitEvent) and
//                 writes the word: a fence write whose wait sits in another queue
//   companion-low the same with companion streams of the default priority
// Per (N, marker): the round's makespan (the last stream seen done, from the round's start) and
// the mean stream's, p50 over rounds, and the host's ns per marker enqueued (for the graphs, the
// graph's launch with its marker). A marker that holds its queue until the work before it ends
// makes the streams that share the queue wait: the makespan grows past one work length once N
// exceeds the queues. A chain's own kernels may hold the queue the same way, marker or not (none).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "study_common.cuh"

namespace {

using study::busy_kernel;
using study::check;

__global__ void marker_kernel(volatile unsigned long long* word, unsigned long long value) {
  __threadfence_system();  // the work before it (other kernels' writes) visible first
  *word = value;
}

/// The graph's marker: its parameters are fixed when the graph is made, so it counts the rounds.
/// The marker kernel of a programmatic dependent launch: it may start before the work before it
/// has ended, and waits on the GPU until that work is done and its memory visible.
__global__ void pdl_marker_kernel(volatile unsigned long long* word, unsigned long long value) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif  // before 9.0 the launch attribute is ignored: stream order alone holds the kernel back
  __threadfence_system();
  *word = value;
}

__global__ void counting_marker_kernel(volatile unsigned long long* word) {
  __threadfence_system();
  *word = *word + 1;
}

using write_value_fn = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// Every marker the study knows, in the order it measures them by default.
const std::vector<std::string> all_markers = {
    "none",        "event",        "ipc",          "write",      "kernel",    "copy",
    "graph-event", "graph-kernel", "graph-marker", "pdl-kernel", "companion", "companion-low"};

/// --markers, each checked against all_markers (exits with 2 naming an unknown one).
std::vector<std::string> markers_to_run(const study::options& opt) {
  if (opt.markers.empty()) return all_markers;
  for (const std::string& m : opt.markers) {
    if (std::find(all_markers.begin(), all_markers.end(), m) == all_markers.end()) {
      std::fprintf(stderr, "evr-marker-queues: unknown marker '%s' in --markers\n", m.c_str());
      std::exit(2);
    }
  }
  return opt.markers;
}

struct result {
  double makespan_us, mean_us, enqueue_ns;
};

/// What one (N, marker) point runs on: where the words are, the work's shape and the fence call.
struct setup {
  std::string marker;
  double work_us;
  int chain;
  write_value_fn write_value;
  volatile unsigned long long* words;  // host view; stream i's word is words[i * 8]
  unsigned long long* words_dev;       // the device's view of the same words
  unsigned long long* seq_dev;         // device memory the copy marker copies from
  bool graph() const { return marker.rfind("graph-", 0) == 0; }
  bool work_in_graph() const { return marker == "graph-event" || marker == "graph-kernel"; }
  bool event() const { return marker == "event" || marker == "ipc" || marker == "graph-event"; }
  bool companion() const { return marker.rfind("companion", 0) == 0; }
};

/// The stream's work: --work-us as --chain kernels in a row.
void launch_work(const setup& s, cudaStream_t stream) {
  const auto ns = static_cast<unsigned long long>(s.work_us * 1000 / s.chain);
  for (int k = 0; k < s.chain; ++k) busy_kernel<<<1, 1, 0, stream>>>(ns);
}

/// N streams with an event each, and for the graph markers each stream's captured graph.
class streams_for {
 public:
  streams_for(const setup& s, int n) : streams_(n), events_(n), graphs_(n, nullptr) {
    const unsigned flags =
        cudaEventDisableTiming | (s.marker == "ipc" ? cudaEventInterprocess : 0u);
    for (int i = 0; i < n; ++i) {
      check(cudaStreamCreateWithFlags(&streams_[i], cudaStreamNonBlocking), "stream");
      check(cudaEventCreateWithFlags(&events_[i], flags), "event");
      if (s.graph()) graphs_[i] = capture(s, i);
    }
    if (s.companion()) make_companions(s, n);
  }
  ~streams_for() {
    for (std::size_t i = 0; i < streams_.size(); ++i) {
      if (graphs_[i] != nullptr) cudaGraphExecDestroy(graphs_[i]);
      cudaEventDestroy(events_[i]);
      cudaStreamDestroy(streams_[i]);
    }
    for (cudaStream_t c : companions_) cudaStreamDestroy(c);
  }
  streams_for(const streams_for&) = delete;
  streams_for& operator=(const streams_for&) = delete;

  cudaStream_t stream(int i) const { return streams_[i]; }
  cudaEvent_t event(int i) const { return events_[i]; }
  cudaGraphExec_t graph(int i) const { return graphs_[i]; }
  cudaStream_t companion(int i) const { return companions_[i]; }

 private:
  /// After every work stream, so that the queues are dealt out to those first.
  void make_companions(const setup& s, int n) {
    int least = 0, greatest = 0;
    check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "priority range");
    companions_.resize(n);
    for (int i = 0; i < n; ++i)
      check(cudaStreamCreateWithPriority(&companions_[i], cudaStreamNonBlocking,
                                         s.marker == "companion" ? greatest : least),
            "companion stream");
  }

  cudaGraphExec_t capture(const setup& s, int i) {
    check(cudaStreamBeginCapture(streams_[i], cudaStreamCaptureModeThreadLocal), "capture");
    if (s.work_in_graph()) launch_work(s, streams_[i]);
    if (s.marker == "graph-kernel" || s.marker == "graph-marker")
      counting_marker_kernel<<<1, 1, 0, streams_[i]>>>(s.words_dev + i * 8);
    cudaGraph_t g = nullptr;
    check(cudaStreamEndCapture(streams_[i], &g), "end capture");
    cudaGraphExec_t exec = nullptr;
    check(cudaGraphInstantiate(&exec, g, 0), "instantiate");
    cudaGraphDestroy(g);
    return exec;
  }

  std::vector<cudaStream_t> streams_;
  std::vector<cudaEvent_t> events_;
  std::vector<cudaGraphExec_t> graphs_;
  std::vector<cudaStream_t> companions_;
};

/// pdl_marker_kernel on `stream`, allowed to overlap the kernel before it.
void launch_pdl_marker(unsigned long long* word, unsigned long long value, cudaStream_t stream) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(1);
  config.blockDim = dim3(1);
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = 1;
  check(cudaLaunchKernelEx(&config, pdl_marker_kernel, word, value), "cudaLaunchKernelEx");
}

/// Stream i's work and marker for round `seq`; returns the ns the marker took to enqueue (with
/// the graph markers: the graph's launch and its marker).
double enqueue(const setup& s, const streams_for& st, int i, unsigned long long seq) {
  const cudaStream_t stream = st.stream(i);
  if (!s.work_in_graph()) launch_work(s, stream);
  const double e0 = now_us();
  if (s.graph()) check(cudaGraphLaunch(st.graph(i), stream), "cudaGraphLaunch");
  if (s.companion()) {
    check(cudaEventRecord(st.event(i), stream), "record");
    check(cudaStreamWaitEvent(st.companion(i), st.event(i), 0), "cudaStreamWaitEvent");
    if (s.write_value(st.companion(i), reinterpret_cast<CUdeviceptr>(s.words_dev + i * 8), seq,
                      0) != 0)
      check(cudaErrorUnknown, "cuStreamWriteValue64");
  } else if (s.event()) {
    check(cudaEventRecord(st.event(i), stream), "record");
  } else if (s.marker == "write") {
    if (s.write_value(stream, reinterpret_cast<CUdeviceptr>(s.words_dev + i * 8), seq, 0) != 0)
      check(cudaErrorUnknown, "cuStreamWriteValue64");
  } else if (s.marker == "kernel") {
    marker_kernel<<<1, 1, 0, stream>>>(s.words_dev + i * 8, seq);
  } else if (s.marker == "pdl-kernel") {
    launch_pdl_marker(s.words_dev + i * 8, seq, stream);
  } else if (s.marker == "copy") {
    check(cudaMemcpyAsync(const_cast<unsigned long long*>(s.words + i * 8), s.seq_dev + i,
                          sizeof(seq), cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync");
  }
  return (now_us() - e0) * 1000;
}

bool marker_done(const setup& s, const streams_for& st, int i, unsigned long long seq) {
  if (s.marker == "none") return cudaStreamQuery(st.stream(i)) == cudaSuccess;
  if (s.event()) return cudaEventQuery(st.event(i)) == cudaSuccess;
  return s.words[i * 8] >= seq;
}

result run(const setup& s, int n, int rounds) {
  streams_for st(s, n);
  std::vector<double> makespans, means;
  double enqueue_total_ns = 0;
  unsigned long long seq = 0;
  for (int r = 0; r < rounds + 2; ++r) {  // two warm-up rounds
    ++seq;
    if (s.marker == "copy") {  // the value each copy carries: this round's sequence number
      std::vector<unsigned long long> values(n, seq);
      check(cudaMemcpy(s.seq_dev, values.data(), n * sizeof(seq), cudaMemcpyHostToDevice),
            "values");
    }
    const double t0 = now_us();
    double enqueue_ns = 0;
    for (int i = 0; i < n; ++i) enqueue_ns += enqueue(s, st, i, seq);
    check(cudaGetLastError(), "launch");
    std::vector<double> seen(n, 0);
    for (int left = n; left > 0;) {
      for (int i = 0; i < n; ++i) {
        if (seen[i] != 0 || !marker_done(s, st, i, seq)) continue;
        seen[i] = now_us() - t0;
        --left;
      }
    }
    check(cudaDeviceSynchronize(), "synchronize");
    if (r < 2) continue;
    makespans.push_back(*std::max_element(seen.begin(), seen.end()));
    double sum = 0;
    for (double x : seen) sum += x;
    means.push_back(sum / n);
    enqueue_total_ns += enqueue_ns;
  }
  std::sort(makespans.begin(), makespans.end());
  std::sort(means.begin(), means.end());
  return {makespans[makespans.size() / 2], means[means.size() / 2],
          s.marker == "none" ? 0 : enqueue_total_ns / (rounds * n)};
}

}  // namespace

int main(int argc, char** argv) {
  const study::options opt = study::parse(argc, argv, "evr-marker-queues");
  const std::vector<std::string> markers = markers_to_run(opt);
  check(cudaSetDevice(0), "cudaSetDevice");
  auto write_value =
      reinterpret_cast<write_value_fn>(study::driver_entry_point("cuStreamWriteValue64"));
  void* host = nullptr;
  const int max_streams = 128;
  check(cudaHostAlloc(&host, max_streams * 64, cudaHostAllocMapped), "cudaHostAlloc");
  void* dev = nullptr;
  check(cudaHostGetDevicePointer(&dev, host, 0), "device pointer");
  unsigned long long* seq_dev = nullptr;
  check(cudaMalloc(&seq_dev, max_streams * sizeof(unsigned long long)), "cudaMalloc");
  const char* conn = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  std::printf(
      "marker-queues: work %.0f us as %d kernel%s, %d rounds, CUDA_DEVICE_MAX_CONNECTIONS=%s\n",
      opt.work_us, opt.chain, opt.chain == 1 ? "" : "s", opt.rounds, conn ? conn : "unset (8)");
  std::printf("%8s %-12s %12s %12s %12s\n", "streams", "marker", "makespan us", "mean us",
              "enqueue ns");
  for (int n : {8, 16, 32, 64, 128}) {
    for (const std::string& m : markers) {
      // Every marker kind starts from words at 0, below this run's sequence numbers.
      std::memset(host, 0, max_streams * 64);
      const setup s{m,
                    opt.work_us,
                    opt.chain,
                    write_value,
                    static_cast<volatile unsigned long long*>(host),
                    static_cast<unsigned long long*>(dev),
                    seq_dev};
      const result r = run(s, n, opt.rounds);
      std::printf("%8d %-12s %12.1f %12.1f %12.0f\n", n, m.c_str(), r.makespan_us, r.mean_us,
                  r.enqueue_ns);
      std::fflush(stdout);
    }
  }
  cudaFree(seq_dev);
  cudaFreeHost(host);
  return 0;
}
