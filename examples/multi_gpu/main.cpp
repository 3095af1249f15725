// evr-multi-gpu: one reactor serves every device. Each device gets a stream and its own work,
// awaited per device; then an NCCL all-reduce across the devices, awaited through evr as one
// future per device.
//
//   evr-multi-gpu [--device auto|cuda|sim]     (no argument: the GPUs if there are any; --help)
//
// evr keeps per-stream state (which device the stream belongs to, its pending waits), so a
// single reactor thread can watch streams of any number of devices. On the simulated device
// (2 devices) the all-reduce is skipped: NCCL needs real GPUs.
#include <chrono>
#include <cstdio>
#include <future>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <asio.hpp>

#include <evr/evr.hpp>

#include "example_device.hpp"
#include "example_device_cli.hpp"

#if defined(EVR_EXAMPLES_HAVE_NCCL)
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace {

constexpr std::size_t n = 1 << 18;  // floats per device

// What each device owns: a stream, memory on the device, a host buffer for the results.
struct per_device {
  int index;
  evr::stream stream;
  examples::device_floats data;
  examples::host_floats host;
};

// Every element of `h` equals `expected`.
bool all_equal(const examples::host_floats& h, float expected) {
  for (float x : h)
    if (x != expected) return false;
  return true;
}

// Waits (one std::future per device) for the work queued so far on every device's stream.
// Returns false and says which when a device failed.
bool wait_all(evr::gpu_waiter& waiter, std::vector<per_device>& devices) {
  std::vector<std::future<void>> done;
  for (auto& d : devices) done.push_back(waiter.async_wait(d.stream, asio::use_future));
  bool ok = true;
  for (std::size_t i = 0; i < done.size(); ++i) {
    try {
      done[i].get();
      std::printf("   %7.1f ms  device %d done\n", examples::ms_since_start(), devices[i].index);
    } catch (const std::system_error& e) {
      std::printf("   device %d failed: %s\n", devices[i].index, e.what());
      ok = false;
    }
  }
  return ok;
}

#if defined(EVR_EXAMPLES_HAVE_NCCL)
void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r));
}

// Sums `data` element-wise across all devices, in place, on each device's stream. NCCL only
// queues the work (like a kernel launch); evr then tells us when each device is done.
bool all_reduce(examples::device& gpu, evr::gpu_waiter& waiter, std::vector<per_device>& devices) {
  const int count = static_cast<int>(devices.size());
  std::vector<ncclComm_t> comms(devices.size());
  std::vector<int> ids;
  for (auto& d : devices) ids.push_back(d.index);
  // One communicator per device, all in this process (ncclCommInitAll; one device works too).
  check_nccl(ncclCommInitAll(comms.data(), count, ids.data()), "ncclCommInitAll");

  // Inside a group, NCCL queues every device's part before any of them must start.
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  for (std::size_t i = 0; i < devices.size(); ++i) {
    check_nccl(ncclAllReduce(devices[i].data.data(), devices[i].data.data(), n, ncclFloat, ncclSum,
                             comms[i], static_cast<cudaStream_t>(devices[i].stream.native())),
               "ncclAllReduce");
  }
  check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  // Copy each device's result back behind its part of the all-reduce, on the same stream.
  for (auto& d : devices) gpu.copy_to_host(d.stream, d.host, d.data);
  std::printf("   all-reduce queued on %d device(s); one future per device:\n", count);
  const bool ok = wait_all(waiter, devices);  // no thread sits in cudaStreamSynchronize per device

  for (ncclComm_t c : comms) ncclCommDestroy(c);
  return ok;
}
#endif

}  // namespace

int main(int argc, char** argv) try {
  const std::string device = examples::device_from_cli(
      argc, argv,
      "One reactor serves every device: work awaited per device, then an NCCL all-reduce "
      "awaited as one future per device (two simulated devices without a GPU)",
      "evr-multi-gpu");

  examples::ms_since_start();  // t = 0
  examples::device gpu(device, /*sim_devices=*/2);
  const int count = gpu.count();
  std::printf("devices: %d\n", count);

  evr::reactor reactor(gpu.backend());  // one reactor thread for all of them
  asio::io_context io;  // completes the futures, on a background thread (as in evr-futures)
  std::jthread io_thread;
  auto keep_running = asio::make_work_guard(io);
  io_thread = std::jthread([&io] { io.run(); });
  evr::gpu_waiter waiter(io.get_executor(), reactor);

  std::vector<per_device> devices;
  for (int d = 0; d < count; ++d)
    devices.push_back(
        {d, evr::stream(gpu.backend(), d), gpu.alloc_device(n, d), gpu.alloc_host(n)});

  // --- 1. independent work on every device ----------------------------------------------------
  // Device d fills its memory with d + 1 and multiplies it by 10: each device ends with 10(d + 1).
  std::printf("\n1. work on each device, awaited per device\n");
  for (auto& d : devices) {
    for (float& x : d.host) x = static_cast<float>(d.index + 1);
    gpu.copy_to_device(d.stream, d.data, d.host);
    gpu.busy(d.stream, std::chrono::milliseconds(20 * (d.index + 1)));  // devices finish in turn
    gpu.affine(d.stream, d.data, 10.0f, 0.0f);
    gpu.copy_to_host(d.stream, d.host, d.data);
  }
  bool ok = wait_all(waiter, devices);
  for (auto& d : devices) {
    const bool right = all_equal(d.host, 10.0f * static_cast<float>(d.index + 1));
    std::printf("   device %d results %s\n", d.index, right ? "correct" : "WRONG");
    ok = ok && right;
  }

  // --- 2. an NCCL all-reduce across the devices --------------------------------------------------
  std::printf("\n2. NCCL all-reduce (sum) across the devices\n");
  if (!gpu.on_gpu()) {
    std::printf("   skipped: the simulated device has no NCCL (it needs real GPUs)\n");
  } else {
#if defined(EVR_EXAMPLES_HAVE_NCCL)
    ok = all_reduce(gpu, waiter, devices) && ok;
    // Every device held 10(d + 1); the sum over d = 0..count-1 is 10 * count(count + 1) / 2.
    const float expected = 10.0f * static_cast<float>(count * (count + 1) / 2);
    for (auto& d : devices) {
      const bool right = all_equal(d.host, expected);
      std::printf("   device %d holds the sum %s\n", d.index, right ? "(correct)" : "WRONG");
      ok = ok && right;
    }
#else
    std::printf("   skipped: built without NCCL (nccl.h / libnccl not found at configure time)\n");
#endif
  }

  keep_running.reset();
  io_thread.join();
  std::printf("\nreactor: %llu waits completed over %llu streams\n",
              static_cast<unsigned long long>(reactor.metrics().completed),
              static_cast<unsigned long long>(reactor.metrics().streams));
  std::printf("result: %s on the %s (%d device%s)\n", ok ? "OK" : "FAILED", gpu.kind(), count,
              count == 1 ? "" : "s");
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "evr-multi-gpu: %s\n", e.what());
  return 1;
}
