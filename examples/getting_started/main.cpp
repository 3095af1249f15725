// A first program with evr: a coroutine launches GPU work and co_awaits it on an Asio io_context,
// so the thread serves other work meanwhile. Runs on the GPU when there is one, else on evr's
// simulated device. The README's "Use it in your project" shows this file and its CMakeLists.txt.
#include <chrono>
#include <cstdio>

#include <asio.hpp>
#include <evr/evr.hpp>
#include <evr/sim/device.hpp>
#if defined(EVR_WITH_CUDA)
#include <cuda_runtime.h>
#endif

// Puts some GPU work on `stream`: your kernel launch, cuBLAS call or torch op goes here. On the
// GPU, a memset of 64 MiB; on the simulated device, a kernel of 2 ms.
void launch_work(evr::sim::device* sim, const evr::stream& stream, void* buffer) {
  if (sim != nullptr) {
    sim->launch_kernel(stream.native(), std::chrono::milliseconds(2));
    return;
  }
#if defined(EVR_WITH_CUDA)
  cudaMemsetAsync(buffer, 1, 64 << 20, static_cast<cudaStream_t>(stream.native()));
#else
  (void)buffer;
#endif
}

asio::awaitable<void> serve(evr::gpu_waiter& waiter, evr::sim::device* sim,
                            const evr::stream& stream, void* buffer) {
  for (int request = 1; request <= 3; ++request) {
    const auto start = std::chrono::steady_clock::now();
    launch_work(sim, stream, buffer);
    // Suspends this coroutine until the GPU has done the work queued on `stream` so far; the
    // io_context's thread runs other handlers meanwhile. A GPU fault throws std::system_error.
    co_await waiter.async_wait(stream, asio::use_awaitable);
    const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
    std::printf("request %d: GPU work done after %.0f us\n", request, took.count());
  }
}

int main() {
  const bool gpu = evr::device::cuda_device_available();
  evr::sim::device sim;  // evr's simulated GPU: tests, CI, machines without a GPU
  evr::device::backend& device = gpu ? evr::device::cuda_backend() : sim;
  std::printf("running on %s\n", gpu ? "the GPU" : "the simulated device (no GPU found)");

  void* buffer = nullptr;
#if defined(EVR_WITH_CUDA)
  if (gpu && cudaMalloc(&buffer, 64 << 20) != cudaSuccess) return 1;
#endif
  {
    asio::io_context io;
    evr::reactor reactor(device);                        // the thread that watches the GPU
    evr::gpu_waiter waiter(io.get_executor(), reactor);  // completes waits on `io`
    evr::stream stream(device, 0);                       // a stream on GPU 0
    asio::co_spawn(io, serve(waiter, gpu ? nullptr : &sim, stream, buffer), asio::detached);
    io.run();  // returns when the coroutine is done
  }
#if defined(EVR_WITH_CUDA)
  if (buffer != nullptr) cudaFree(buffer);
#endif
  return 0;
}
