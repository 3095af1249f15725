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
#include "support/gpu_kernels.hpp"
#include "support/helpers.hpp"

TEST_CASE("graph capture on another thread is not invalidated by the reactor's polling") {
  evr::device::backend& be = evr::test::dut().backend();
  auto opts = evr::test::quick_options(evr::strategy::poll);
  opts.spin_window = std::chrono::seconds(5);  // poll continuously during the capture
  // Before the reactor: its destructor completes pending waits into these.
  std::atomic<int> done{0};
  std::atomic<bool> graph_done{false};
  evr::reactor r(be, opts);
  evr::stream polled(be, 0), captured(be, 0);
  auto gate = evr::test::dut().make_gate();
  gate->launch(polled.native());
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
  REQUIRE_FALSE(evr::on_complete(r, captured, [&](std::error_code ec) { graph_done = !ec; }));
  CHECK(evr::test::wait_until([&] { return graph_done.load(); }));
  gate->open();
  CHECK(evr::test::wait_until([&] { return done.load() == 50; }));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(buffer);
  MESSAGE("captured 20 memsets while the reactor made " << (q1 - q0) << " event queries");
}

TEST_CASE("a kernel captured in a CUDA graph signals its slot on every replay") {
  // What the kernel is given (signal_ref) never changes, so the graph is captured once and each
  // replay is one more signal: arm() once per launch of the graph.
  evr::device::backend& be = evr::test::dut().backend();
  std::atomic<int> ok{0}, bad{0};  // before the reactor: its destructor completes pending waits
  evr::reactor r(be, evr::test::quick_options(evr::strategy::adaptive));
  evr::stream st(be, 0);
  evr::signal_slot slot = r.pools().signals(0).acquire();
  auto cs = static_cast<cudaStream_t>(st.native());
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK(evr::test::gpu::launch_signal_captured(cs, slot.ref(), 30, 16) == cudaSuccess);
  REQUIRE(cudaStreamEndCapture(cs, &graph) == cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  constexpr int replays = 40;
  for (int i = 0; i < replays; ++i) {
    const evr::signal_ticket t = slot.arm();
    REQUIRE(cudaGraphLaunch(exec, cs) == cudaSuccess);
    REQUIRE_FALSE(evr::on_complete(r, evr::wait_target(st, t),
                                   [&](std::error_code ec) { (ec ? bad : ok).fetch_add(1); }));
  }
  CHECK(evr::test::wait_until([&] { return ok + bad == replays; }));
  CHECK(bad.load() == 0);
  CHECK(slot.signalled() == static_cast<std::uint64_t>(replays));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}
