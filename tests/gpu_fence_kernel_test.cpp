// GPU only: evr's fence kernel (reactor_options::kernel_fences), which past max_fence_streams
// writes a wait's fence word as a programmatic dependent launch (compute capability 9.0). A wait
// completes only once the work before it has ended and its writes are visible, also behind a
// kernel that itself overlaps the one before it. On an older GPU the reactor records events
// instead, and the same waits hold.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include <evr/evr.hpp>

#include "support/device_under_test.hpp"
#include "support/gpu_kernels.hpp"
#include "support/helpers.hpp"

namespace {

/// `n` counters in mapped host memory, one per 64-byte line: the kernels add to them, the
/// handlers read them.
class mapped_counts {
 public:
  explicit mapped_counts(std::size_t n) {
    void* host = nullptr;
    REQUIRE(cudaHostAlloc(&host, n * stride * sizeof(unsigned), cudaHostAllocMapped) ==
            cudaSuccess);
    host_ = static_cast<volatile unsigned*>(host);
    for (std::size_t i = 0; i < n * stride; ++i) host_[i] = 0;
    void* dev = nullptr;
    REQUIRE(cudaHostGetDevicePointer(&dev, host, 0) == cudaSuccess);
    device_ = static_cast<volatile unsigned*>(dev);
  }
  ~mapped_counts() { cudaFreeHost(const_cast<unsigned*>(host_)); }
  mapped_counts(const mapped_counts&) = delete;
  mapped_counts& operator=(const mapped_counts&) = delete;

  unsigned read(std::size_t i) const { return host_[i * stride]; }
  volatile unsigned* device(std::size_t i) const { return device_ + i * stride; }

 private:
  static constexpr std::size_t stride = 16;
  volatile unsigned* host_ = nullptr;
  volatile unsigned* device_ = nullptr;
};

evr::reactor_options past_the_limit() {
  auto opts = evr::test::quick_options(evr::strategy::fence);
  opts.max_fence_streams = 1;  // the second stream with waits is past it
  opts.kernel_fences = true;   // off by default
  return opts;
}

/// Makes `r` load the fence kernel on device 0 and checks the answer: ready on a GPU of compute
/// capability 9.0 or later, a named error before.
void load_on_device_0(evr::reactor& r) {
  int major = 0;
  REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess);
  const std::error_code ec = r.prepare_device(0);
  CHECK((ec == std::error_code{}) == (major >= 9));
  CHECK(r.backend().fence_kernels(0) == (major >= 9));
}

}  // namespace

TEST_CASE(
    "fence kernel: past max_fence_streams each wait completes after its work, read as a word") {
  evr::device::backend& be = evr::test::dut().backend();
  constexpr int n = 9;
  constexpr unsigned rounds = 3;
  mapped_counts counts(n);
  std::atomic<int> done{0}, early{0};  // before the reactor: its destructor completes waits
  evr::reactor r(be, past_the_limit());
  load_on_device_0(r);
  std::vector<std::unique_ptr<evr::stream>> streams;
  for (int i = 0; i < n; ++i) streams.push_back(std::make_unique<evr::stream>(be, 0));
  for (unsigned round = 1; round <= rounds; ++round) {
    for (int i = 0; i < n; ++i) {
      auto& st = *streams[static_cast<std::size_t>(i)];
      const auto k = static_cast<std::size_t>(i);
      REQUIRE(evr::test::gpu::launch_busy_then_count(static_cast<cudaStream_t>(st.native()),
                                                     200 + 300 * static_cast<unsigned>(i),
                                                     counts.device(k)) == cudaSuccess);
      REQUIRE_FALSE(evr::on_complete(r, st, [&, k, round](std::error_code ec) {
        if (ec || counts.read(k) != round) ++early;
        ++done;
      }));
    }
    REQUIRE(evr::test::wait_until([&] { return done.load() == n * static_cast<int>(round); }));
  }
  CHECK(early.load() == 0);
  const std::uint64_t queries = r.metrics().event_queries;
  if (be.fence_kernels(0)) {
    CHECK(queries == 0);  // loaded before the first wait: every look is a memory read
  } else {
    MESSAGE("this GPU runs no fence kernel (compute capability before 9.0): events instead");
    CHECK(queries > 0);
  }
}

TEST_CASE(
    "fence kernel: behind a kernel that overlaps the one before it, the wait waits for both") {
  // A library kernel launched as a programmatic dependent launch that never waits for its
  // predecessor may end before that predecessor does. The fence kernel behind it depends on it
  // directly; the wait must still not complete before the long kernel before both has ended.
  evr::device::backend& be = evr::test::dut().backend();
  mapped_counts counts(1);
  std::atomic<int> done{0}, early{0};
  evr::reactor r(be, past_the_limit());
  load_on_device_0(r);
  evr::stream first(be, 0), st(be, 0);
  REQUIRE_FALSE(evr::on_complete(r, first, [&](std::error_code) { ++done; }));  // the fence write
  REQUIRE_FALSE(evr::on_complete(r, st, [&](std::error_code) { ++done; }));     // past the limit
  REQUIRE(evr::test::wait_until([&] { return done.load() == 2; }));
  const auto s = static_cast<cudaStream_t>(st.native());
  constexpr unsigned rounds = 5;
  for (unsigned round = 1; round <= rounds; ++round) {
    REQUIRE(evr::test::gpu::launch_busy_then_count(s, 20'000, counts.device(0)) == cudaSuccess);
    REQUIRE(evr::test::gpu::launch_independent_dependent(s) == cudaSuccess);
    REQUIRE_FALSE(evr::on_complete(r, st, [&, round](std::error_code ec) {
      if (ec || counts.read(0) != round) ++early;
      ++done;
    }));
    REQUIRE(evr::test::wait_until([&] { return done.load() == 2 + static_cast<int>(round); }));
  }
  CHECK(early.load() == 0);
  MESSAGE("fence kernels on this GPU: " << std::string(be.fence_kernels(0) ? "yes" : "no"));
}

TEST_CASE("fence kernel: the devices in use, and prepare_device's refusals") {
  evr::device::backend& be = evr::test::dut().backend();
  int count = 0, before = 0;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  REQUIRE(cudaGetDevice(&before) == cudaSuccess);
  const int last = count - 1;
  REQUIRE(cudaSetDevice(last) == cudaSuccess);
  const cudaError_t used = cudaFree(nullptr);  // the process now uses the last device
  REQUIRE(cudaSetDevice(before) == cudaSuccess);
  REQUIRE(used == cudaSuccess);
  const std::vector<int> in_use = be.devices_in_use();
  CHECK(std::find(in_use.begin(), in_use.end(), last) != in_use.end());
  for (int d : in_use) CHECK((d >= 0 && d < count));
  evr::reactor r(be, past_the_limit());
  CHECK(r.prepare_device(count) == evr::errc::no_device);
  CHECK(r.prepare_device(-1) == evr::errc::no_device);
  auto polling = past_the_limit();
  polling.strategy = evr::strategy::poll;  // events only: nothing to load, the index checked
  evr::reactor p(be, polling);
  CHECK(p.prepare_device(0) == std::error_code{});
  CHECK(p.prepare_device(count) == evr::errc::no_device);
}
