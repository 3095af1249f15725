// evr-futures: GPU work on several streams, awaited as std::futures; then the same work awaited
// with plain callbacks (evr::on_complete), for code that does not use Asio at all.
//
//   evr-futures [--device auto|cuda|sim]     (no argument: the GPU if there is one; --help)
//
// What evr does here: for every wait, it puts a small marker on the stream behind the work queued
// so far. Its background thread (the reactor) notices when the GPU passes the marker and completes
// the wait: it makes the future ready, or calls the callback. No thread of ours blocks per stream.
#include <condition_variable>
#include <cstdio>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include <asio.hpp>

#include <evr/evr.hpp>

#include "example_device.hpp"
#include "example_device_cli.hpp"

namespace {

constexpr int lanes = 4;            // streams working side by side
constexpr std::size_t n = 1 << 16;  // floats per stream

// One stream and its buffers.
struct lane {
  evr::stream stream;
  examples::host_floats in, out;
  examples::device_floats on_device;
};

// Queues copy in -> kernel -> copy out on the lane's stream. Returns at once: the work is queued.
void enqueue_pipeline(examples::device& gpu, lane& l, float a, float b) {
  gpu.copy_to_device(l.stream, l.on_device, l.in);
  gpu.affine(l.stream, l.on_device, a, b);  // out = a * in + b
  gpu.copy_to_host(l.stream, l.out, l.on_device);
}

bool check(const lane& l, float a, float b) {
  for (std::size_t i = 0; i < n; ++i)
    if (l.out[i] != a * l.in[i] + b) return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string device = examples::device_from_cli(
      argc, argv,
      "GPU work on several streams awaited as std::futures, then with plain callbacks "
      "(evr::on_complete)",
      "evr-futures");

  examples::device gpu(device);

  // The reactor: evr's background thread that watches every stream with a pending wait.
  evr::reactor reactor(gpu.backend());

  // Asio completes futures through an io_context. It runs on a thread of its own here, so that
  // main is free to block on the futures (a server would run it on its own threads anyway).
  asio::io_context io;
  std::jthread io_thread;  // declared before the guard: leaving main (even by an exception)
                           // drops the guard first, so run() can return and the thread joins
  auto keep_running = asio::make_work_guard(io);  // run() would return at once with nothing to do
  io_thread = std::jthread([&io] { io.run(); });
  evr::gpu_waiter waiter(io.get_executor(), reactor);

  std::vector<lane> work;
  for (int i = 0; i < lanes; ++i) {
    lane l{evr::stream(gpu.backend(), 0), gpu.alloc_host(n), gpu.alloc_host(n),
           gpu.alloc_device(n)};
    for (std::size_t k = 0; k < n; ++k) l.in[k] = static_cast<float>(k % 100 + i);
    work.push_back(std::move(l));
  }
  bool ok = true;

  // --- 1. futures ------------------------------------------------------------------------------
  std::printf("\n1. std::future: %d streams, copy in -> kernel -> copy out on each\n", lanes);
  std::vector<std::future<void>> done;
  for (int i = 0; i < lanes; ++i) {
    enqueue_pipeline(gpu, work[i], 2.0f, static_cast<float>(i));
    // async_wait returns at once; the future becomes ready when the GPU has done everything
    // queued on this stream so far (an error would come out of get() as a std::system_error).
    done.push_back(waiter.async_wait(work[i].stream, asio::use_future));
  }
  std::printf("   %d pipelines queued; the CPU is free until it needs the results\n", lanes);
  for (int i = 0; i < lanes; ++i) {
    done[i].get();  // blocks this thread only, only until stream i is done
    const bool right = check(work[i], 2.0f, static_cast<float>(i));
    std::printf("   stream %d done, results %s\n", i, right ? "correct" : "WRONG");
    ok = ok && right;
  }

  // --- 2. plain callbacks ------------------------------------------------------------------------
  // evr::on_complete needs no Asio: the callback runs on the reactor thread as soon as the GPU is
  // done. It must be short and must never block (it holds up every other completion): here it
  // records the outcome and wakes main, the way you would hand off to your own event loop.
  std::printf("\n2. evr::on_complete: the same pipelines, plain callbacks\n");
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::error_code> outcome(lanes);
  int started = 0;
  int finished = 0;
  for (int i = 0; i < lanes; ++i) {
    enqueue_pipeline(gpu, work[i], 3.0f, 1.0f);
    std::error_code refused = evr::on_complete(reactor, work[i].stream, [&, i](std::error_code ec) {
      std::lock_guard lock(m);
      outcome[i] = ec;
      ++finished;
      cv.notify_one();  // under the lock: main cannot return and destroy cv before this ends
    });
    if (refused) {  // the wait did not start, and the callback will never run
      std::printf("   stream %d: on_complete refused: %s\n", i, refused.message().c_str());
      ok = false;
      break;
    }
    ++started;
  }
  std::printf("   %d callbacks registered; main waits on its own condition variable\n", started);
  {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return finished == started; });
  }
  for (int i = 0; i < started; ++i) {
    const bool right = !outcome[i] && check(work[i], 3.0f, 1.0f);
    std::printf("   stream %d: callback said \"%s\", results %s\n", i,
                outcome[i] ? outcome[i].message().c_str() : "done", right ? "correct" : "WRONG");
    ok = ok && right;
  }

  keep_running.reset();  // let io.run() return once nothing is pending
  io_thread.join();

  const evr::reactor_metrics stats = reactor.metrics();
  std::printf("\nreactor: %llu waits submitted, %llu completed, %llu failed\n",
              static_cast<unsigned long long>(stats.submitted),
              static_cast<unsigned long long>(stats.completed),
              static_cast<unsigned long long>(stats.failed));
  std::printf("result: %s on the %s\n", ok ? "OK" : "FAILED", gpu.kind());
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "evr-futures: %s\n", e.what());
  return 1;
}
