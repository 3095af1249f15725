// bench/studies/marker_queues.cu — which marker behind a stream's work delays other streams when
// more streams are busy than the device has hardware queues (CUDA_DEVICE_MAX_CONNECTIONS).
//
//   CUDA_DEVICE_MAX_CONNECTIONS=8  evr-marker-queues [--work-us 1000] [--rounds 20]
//   CUDA_DEVICE_MAX_CONNECTIONS=32 evr-marker-queues
//
// For N = 8, 16, 32, 64 and 128 streams (made afresh for each N: the driver assigns queues as
// streams are made), each round launches a one-thread kernel of --work-us on every stream, then
// one marker behind it, and the host looks until every stream's marker is done:
//   none    no marker; the host asks cudaStreamQuery
//   event   cudaEventRecord of a pooled event; the host asks cudaEventQuery (evr's event marker)
//   ipc     the same with an interprocess event (cudaEventInterprocess)
//   write   cuStreamWriteValue64 of a word in mapped host memory; the host reads it (evr's fence)
//   kernel  a one-thread kernel that stores the word (a marker kernel); the host reads it
//   copy    cudaMemcpyAsync of 8 bytes from device memory into the word (pinned host memory): the
//           copy engines do it, not the compute queue; the host reads the word
// Per (N, marker): the round's makespan (the last stream seen done, from the round's start) and
// the mean stream's, p50 over rounds, and the host's ns per marker enqueued. A marker that holds
// its queue until the work before it ends makes the streams that share the queue wait: the
// makespan grows past one work length once N exceeds the queues.
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

using write_value_fn = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct result {
  double makespan_us, mean_us, enqueue_ns;
};

result run(int n, const std::string& marker, double work_us, int rounds, write_value_fn write_value,
           volatile unsigned long long* words, unsigned long long* words_dev,
           unsigned long long* seq_dev) {
  std::vector<cudaStream_t> streams(n);
  std::vector<cudaEvent_t> events(n);
  const unsigned event_flags =
      cudaEventDisableTiming | (marker == "ipc" ? cudaEventInterprocess : 0u);
  for (int i = 0; i < n; ++i) {
    check(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking), "stream");
    check(cudaEventCreateWithFlags(&events[i], event_flags), "event");
  }
  std::vector<double> makespans, means;
  double enqueue_total = 0;
  unsigned long long seq = 0;
  for (int r = 0; r < rounds + 2; ++r) {  // two warm-up rounds
    ++seq;
    if (marker == "copy") {  // the value each copy carries: this round's sequence number
      std::vector<unsigned long long> values(n, seq);
      check(cudaMemcpy(seq_dev, values.data(), n * sizeof(seq), cudaMemcpyHostToDevice), "values");
    }
    const double t0 = now_us();
    double enqueue = 0;
    for (int i = 0; i < n; ++i) {
      busy_kernel<<<1, 1, 0, streams[i]>>>(static_cast<unsigned long long>(work_us * 1000));
      const double e0 = now_us();
      if (marker == "event" || marker == "ipc") {
        check(cudaEventRecord(events[i], streams[i]), "record");
      } else if (marker == "write") {
        if (write_value(streams[i], reinterpret_cast<CUdeviceptr>(words_dev + i * 8), seq, 0) != 0)
          check(cudaErrorUnknown, "cuStreamWriteValue64");
      } else if (marker == "kernel") {
        marker_kernel<<<1, 1, 0, streams[i]>>>(words_dev + i * 8, seq);
      } else if (marker == "copy") {
        check(cudaMemcpyAsync(const_cast<unsigned long long*>(words + i * 8), seq_dev + i,
                              sizeof(seq), cudaMemcpyDeviceToHost, streams[i]),
              "cudaMemcpyAsync");
      }
      enqueue += now_us() - e0;
    }
    check(cudaGetLastError(), "launch");
    std::vector<double> seen(n, 0);
    int left = n;
    while (left > 0) {
      for (int i = 0; i < n; ++i) {
        if (seen[i] != 0) continue;
        bool done = false;
        if (marker == "none") {
          done = cudaStreamQuery(streams[i]) == cudaSuccess;
        } else if (marker == "event" || marker == "ipc") {
          done = cudaEventQuery(events[i]) == cudaSuccess;
        } else {
          done = words[i * 8] >= seq;
        }
        if (done) {
          seen[i] = now_us() - t0;
          --left;
        }
      }
    }
    check(cudaDeviceSynchronize(), "synchronize");
    if (r < 2) continue;
    double sum = 0, mx = 0;
    for (double s : seen) {
      sum += s;
      mx = std::max(mx, s);
    }
    makespans.push_back(mx);
    means.push_back(sum / n);
    enqueue_total += enqueue;
  }
  for (int i = 0; i < n; ++i) {
    cudaStreamDestroy(streams[i]);
    cudaEventDestroy(events[i]);
  }
  std::sort(makespans.begin(), makespans.end());
  std::sort(means.begin(), means.end());
  return {makespans[makespans.size() / 2], means[means.size() / 2],
          marker == "none" ? 0 : enqueue_total * 1000 / (rounds * n)};
}

}  // namespace

int main(int argc, char** argv) {
  const study::options opt = study::parse(argc, argv, "evr-marker-queues");
  const double work_us = opt.work_us;
  const int rounds = opt.rounds;
  check(cudaSetDevice(0), "cudaSetDevice");
  auto write_value =
      reinterpret_cast<write_value_fn>(study::driver_entry_point("cuStreamWriteValue64"));
  void* host = nullptr;
  const int max_streams = 128;
  check(cudaHostAlloc(&host, max_streams * 64, cudaHostAllocMapped), "cudaHostAlloc");
  std::memset(host, 0, max_streams * 64);
  void* dev = nullptr;
  check(cudaHostGetDevicePointer(&dev, host, 0), "device pointer");
  unsigned long long* seq_dev = nullptr;
  check(cudaMalloc(&seq_dev, max_streams * sizeof(unsigned long long)), "cudaMalloc");
  const char* conn = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  std::printf("marker-queues: work %.0f us, %d rounds, CUDA_DEVICE_MAX_CONNECTIONS=%s\n", work_us,
              rounds, conn ? conn : "unset (8)");
  std::printf("%8s %-7s %12s %12s %12s\n", "streams", "marker", "makespan us", "mean us",
              "enqueue ns");
  for (int n : {8, 16, 32, 64, 128}) {
    for (const char* m : {"none", "event", "ipc", "write", "kernel", "copy"}) {
      // Every marker kind starts from words already past this run's sequence numbers.
      std::memset(host, 0, max_streams * 64);
      const result r =
          run(n, m, work_us, rounds, write_value, static_cast<volatile unsigned long long*>(host),
              static_cast<unsigned long long*>(dev), seq_dev);
      std::printf("%8d %-7s %12.1f %12.1f %12.0f\n", n, m, r.makespan_us, r.mean_us, r.enqueue_ns);
      std::fflush(stdout);
    }
  }
  cudaFree(seq_dev);
  cudaFreeHost(host);
  return 0;
}
