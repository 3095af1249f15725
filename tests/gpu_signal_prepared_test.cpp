// GPU only: signal slots made ahead (reactor::prepare_device). A device's first signal slots load
// evr's signal kernel, and a CUDA module load waits for the kernels running on the device; a
// kernel that waits for the host would then wait for a thread that waits for it. After
// prepare_device, taking a slot and queueing its signal while such a kernel runs must not wait for
// that kernel. The module is loaded once per process, so ctest runs the first case in a process
// of its own (evr_gpu_signal_prepared), where nothing loaded it before; in the full evr_gpu_tests
// run it still passes but shows less. The second case, skipped unless asked for, shows the hazard
// itself: the same steps without prepare_device.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <system_error>

#include <cuda_runtime_api.h>

#include <evr/evr.hpp>

#include "support/device_under_test.hpp"
#include "support/gpu_kernels.hpp"
#include "support/helpers.hpp"

namespace {

/// Two ints in mapped host memory on lines of their own: the gate's flag and its "timed out".
class gate_words {
 public:
  gate_words() {
    void* host = nullptr;
    REQUIRE(cudaHostAlloc(&host, 2 * line, cudaHostAllocMapped) == cudaSuccess);
    host_ = static_cast<volatile int*>(host);
    host_[0] = 0;
    host_[line / sizeof(int)] = 0;
    void* dev = nullptr;
    REQUIRE(cudaHostGetDevicePointer(&dev, host, 0) == cudaSuccess);
    device_ = static_cast<volatile int*>(dev);
  }
  ~gate_words() {
    open();  // no kernel may outlive the memory it spins on
    cudaDeviceSynchronize();
    cudaFreeHost(const_cast<int*>(host_));
  }
  gate_words(const gate_words&) = delete;
  gate_words& operator=(const gate_words&) = delete;

  void open() { host_[0] = 1; }
  bool timed_out() const { return host_[line / sizeof(int)] != 0; }
  volatile int* flag_on_device() const { return device_; }
  volatile int* timed_out_on_device() const { return device_ + line / sizeof(int); }

 private:
  static constexpr std::size_t line = 64;
  volatile int* host_ = nullptr;
  volatile int* device_ = nullptr;
};

constexpr unsigned gate_limit_ms = 5000;

/// While a kernel on one stream waits for the host: takes a slot, queues its signal on another
/// stream and waits for it, then opens the gate. Returns whether the gate had to give up (some
/// CUDA call above waited for it) and how long taking the slot took.
bool gate_gave_up(evr::reactor& r, std::chrono::milliseconds& acquire_took) {
  evr::device::backend& be = r.backend();
  gate_words gate;
  evr::stream held(be, 0), work(be, 0);
  REQUIRE(evr::test::gpu::launch_gate_with_limit(static_cast<cudaStream_t>(held.native()),
                                                 gate.flag_on_device(), gate_limit_ms,
                                                 gate.timed_out_on_device()) == cudaSuccess);
  const auto t0 = std::chrono::steady_clock::now();
  evr::signal_slot slot = r.pools().signals(0).acquire();
  acquire_took =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  const evr::signal_ticket ticket = slot.arm();
  slot.enqueue_signal(work.native());
  // Shared with the handler: a failed REQUIRE leaves this frame while the wait may still end.
  auto done = std::make_shared<std::atomic<int>>(0);
  REQUIRE_FALSE(evr::on_complete(r, evr::wait_target(work, ticket),
                                 [done](std::error_code ec) { *done += ec ? 1000 : 1; }));
  gate.open();
  REQUIRE(evr::test::wait_until([&] { return done->load() != 0; }));
  CHECK(done->load() == 1);
  REQUIRE(cudaStreamSynchronize(static_cast<cudaStream_t>(held.native())) == cudaSuccess);
  return gate.timed_out();
}

}  // namespace

TEST_CASE(
    "signal slots prepared ahead: taking one while a kernel waits for the host does not wait") {
  evr::reactor r(evr::test::dut().backend(), evr::test::quick_options(evr::strategy::fence));
  REQUIRE(r.prepare_device(0) == std::error_code{});
  std::chrono::milliseconds took{};
  CHECK_FALSE(gate_gave_up(r, took));
  MESSAGE("acquire took " << took.count() << " ms");
}

TEST_SUITE("shows_hazard") {
  TEST_CASE("signal slots not prepared: the first slot waits for a kernel that waits for the host" *
            doctest::skip()) {
    evr::reactor r(evr::test::dut().backend(), evr::test::quick_options(evr::strategy::fence));
    std::chrono::milliseconds took{};
    CHECK(gate_gave_up(r, took));  // true on the CUDA 13 driver: what prepare_device is for
    MESSAGE("acquire took " << took.count() << " ms (the gate's limit: " << gate_limit_ms << ")");
  }
}
