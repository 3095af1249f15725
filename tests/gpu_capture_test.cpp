// GPU only: a CUDA graph captured on one thread, in the strict (global) capture mode, while the
// reactor polls events on another stream. The reactor's thread switches itself to the relaxed
// capture mode, so its cudaEventQuery calls do not invalidate the capture.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <cuda_runtime_api.h>

#include <evr/evr.hpp>

#include "support/device_under_test.hpp"
#include "support/helpers.hpp"

TEST_CASE("graph capture on another thread is not invalidated by the reactor's polling") {
  evr::device::backend& be = evr::test::dut().backend();
  auto opts = evr::test::quick_options(evr::strategy::poll);
  opts.spin_window = std::chrono::seconds(5);  // poll continuously during the capture
  evr::reactor r(be, opts);
  evr::stream polled(be, 0), captured(be, 0);
  auto gate = evr::test::dut().make_gate();
  gate->launch(polled.native());
  std::atomic<int> done{0};
  for (int i = 0; i < 50; ++i)
    REQUIRE_FALSE(evr::on_complete(r, polled, [&](std::error_code ec) { done += !ec; }));
  // The reactor is now querying pending events on `polled` in a loop.
  REQUIRE(evr::test::wait_until([&] { return r.metrics().event_queries > 100; }));

  auto cs = static_cast<cudaStream_t>(captured.native());
  void* buffer = nullptr;
  REQUIRE(cudaMalloc(&buffer, 1 << 20) == cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaError_t begin = cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal);
  REQUIRE(begin == cudaSuccess);
  const auto q0 = r.metrics().event_queries;
  for (int k = 0; k < 20; ++k) {
    // Plain stream work (the kernel helpers query the stream's device, which a capture forbids).
    CHECK(cudaMemsetAsync(buffer, k, 1 << 20, cs) == cudaSuccess);
    std::this_thread::sleep_for(std::chrono::microseconds(500));  // let the reactor poll meanwhile
  }
  const auto q1 = r.metrics().event_queries;
  cudaError_t end = cudaStreamEndCapture(cs, &graph);
  CHECK(q1 > q0);  // the reactor did query during the capture
  CHECK_MESSAGE(end == cudaSuccess, "capture ended with " << cudaGetErrorString(end));
  REQUIRE(graph != nullptr);
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, cs) == cudaSuccess);
  std::atomic<bool> graph_done{false};
  REQUIRE_FALSE(evr::on_complete(r, captured, [&](std::error_code ec) { graph_done = !ec; }));
  CHECK(evr::test::wait_until([&] { return graph_done.load(); }));
  gate->open();
  CHECK(evr::test::wait_until([&] { return done.load() == 50; }));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(buffer);
  MESSAGE("captured 20 memsets while the reactor made " << (q1 - q0) << " event queries");
}
