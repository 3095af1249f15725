// evr-release-after: buffers freed only once the GPU is done with them, without waiting for it.
//
//   evr-release-after [--device auto|cuda|sim]     (no argument: the GPU if there is one; --help)
//
// A buffer the GPU still reads must not be freed. The usual fixes block a thread
// (cudaStreamSynchronize, then free) or keep buffers in a list checked now and then.
// evr::release_after(reactor, stream, std::move(buffer), executor) hands the buffer to evr instead:
// evr puts a marker on the stream, and once the GPU passes it the buffer's destructor runs on the
// executor. The counters show buffers staying alive after release_after returned, and going away
// one by one as the GPU finishes each one's work.
#include <atomic>
#include <cstdio>
#include <span>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include <asio.hpp>

#include <evr/evr.hpp>

#include "example_device.hpp"
#include "example_device_cli.hpp"

#if defined(EVR_EXAMPLES_HAVE_KERNELS)
#include <cuda_runtime.h>
#endif

namespace {

using namespace std::chrono_literals;

constexpr int buffers = 6;
constexpr std::size_t n = 1 << 20;  // floats per buffer

std::atomic<int> live{0};  // buffers allocated and not yet freed
const std::thread::id main_thread = std::this_thread::get_id();

// Scratch memory for one piece of GPU work. On the GPU: device memory, cudaFree'd by the
// destructor. On the simulated device: a std::vector. Either way the destructor says when it runs.
class scratch_buffer {
 public:
  scratch_buffer(bool on_gpu, int id) : id_(id) {
#if defined(EVR_EXAMPLES_HAVE_KERNELS)
    if (on_gpu) {
      if (cudaMalloc(&device_, n * sizeof(float)) != cudaSuccess)
        throw std::runtime_error("cudaMalloc failed");
      ++live;
      return;
    }
#endif
    (void)on_gpu;
    host_.resize(n);
    ++live;
  }
  scratch_buffer(scratch_buffer&& other) noexcept
      : id_(other.id_),
        device_(std::exchange(other.device_, nullptr)),
        host_(std::move(other.host_)),
        owner_(std::exchange(other.owner_, false)) {}
  scratch_buffer& operator=(scratch_buffer&&) = delete;

  ~scratch_buffer() {
    if (!owner_) return;  // moved from: the memory went with the move
    std::printf(
        "   %7.1f ms  buffer %d: the GPU is done with it; freed on the %s; %d left\n",
        examples::ms_since_start(), id_,
        std::this_thread::get_id() == main_thread ? "main thread (in io.run())" : "WRONG thread",
        live - 1);
#if defined(EVR_EXAMPLES_HAVE_KERNELS)
    // cudaFree may wait for the device to finish its queued work: it must never run on evr's
    // reactor thread, where it would hold up every other completion. release_after runs it on the
    // executor we give it. (It also means that on the GPU the later frees bunch up behind the
    // first one; servers usually cache buffers or use cudaFreeAsync for that reason.)
    if (device_ != nullptr) cudaFree(device_);
#endif
    --live;
  }

  std::span<float> span() {
    return device_ != nullptr ? std::span<float>(device_, n) : std::span<float>(host_);
  }

 private:
  int id_;
  float* device_ = nullptr;  // GPU
  std::vector<float> host_;  // simulated device
  bool owner_ = true;
};

// What we hand to release_after: the buffer, and a work guard that keeps io.run() from returning
// while a release is still to come (release_after does not count as work on the io_context by
// itself; a server whose io_context runs for good would not need the guard).
struct release_later {
  scratch_buffer buffer;
  asio::executor_work_guard<asio::io_context::executor_type> keep_io_running;
};

}  // namespace

int main(int argc, char** argv) try {
  const std::string device = examples::device_from_cli(
      argc, argv,
      "Buffers freed once the GPU is done with them (evr::release_after), without waiting "
      "for it",
      "evr-release-after");

  examples::ms_since_start();  // t = 0
  examples::device gpu(device);

  // strategy::poll: the reactor marks each wait with an event taken from its pool, so the pool's
  // stats at the end have something to show (the default strategy marks the stream with a fence
  // write and needs no event).
  evr::reactor_options options;
  options.strategy = evr::strategy::poll;
  evr::reactor reactor(gpu.backend(), options);
  asio::io_context io;  // where the buffers' destructors run (main thread, in io.run() below)
  evr::stream stream(gpu.backend(), 0);

  std::printf("\nbuffers live before: %d\n", live.load());
  for (int i = 0; i < buffers; ++i) {
    scratch_buffer scratch(gpu.on_gpu(), i);
    gpu.busy(stream, 30ms);                          // work that takes a while...
    gpu.affine(stream, scratch.span(), 2.0f, 1.0f);  // ...and then uses the buffer
    // "Free it once the GPU is past this point", and go on at once. The buffer moves into evr.
    std::error_code refused = evr::release_after(
        reactor, stream, release_later{std::move(scratch), asio::make_work_guard(io)},
        io.get_executor());
    if (refused) {  // the reactor could not watch the stream: it waited here, then freed the buffer
      std::printf("   release_after refused: %s\n", refused.message().c_str());
    }
  }
  std::printf(
      "   %7.1f ms  %d buffers handed to release_after; still live: %d (the GPU uses them)\n",
      examples::ms_since_start(), buffers, live.load());

  io.run();  // runs each destructor as the GPU gets past its buffer's work; returns when all ran
  const int after = live.load();
  std::printf("buffers live after io.run(): %d\n", after);

  // Stop the reactor (it joins its thread) so that the counts below are final: it returns a wait's
  // marker event to the pool just after delivering the wait, which may be after io.run() returned.
  reactor.stop();
  const evr::reactor_metrics m = reactor.metrics();
  std::printf(
      "\nreactor: %llu waits submitted, %llu completed, %llu event queries, %llu sweeps\n",
      static_cast<unsigned long long>(m.submitted), static_cast<unsigned long long>(m.completed),
      static_cast<unsigned long long>(m.event_queries), static_cast<unsigned long long>(m.sweeps));
  const evr::pool_stats p = reactor.pools().stats();
  std::printf("event pool: %llu created, %llu acquired, %llu in use, %llu cached for reuse\n",
              static_cast<unsigned long long>(p.created),
              static_cast<unsigned long long>(p.acquires),
              static_cast<unsigned long long>(p.in_use), static_cast<unsigned long long>(p.cached));

  const bool ok = after == 0 && m.completed == static_cast<std::uint64_t>(buffers) && p.in_use == 0;
  std::printf("result: %s on the %s\n", ok ? "OK" : "FAILED", gpu.kind());
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "evr-release-after: %s\n", e.what());
  return 1;
}
