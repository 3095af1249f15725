// GPU only: CUDA graphs and evr. A graph captured on one thread, in the strict (global) capture
// mode, while the reactor polls events on another stream (the reactor's thread switches itself to
// the relaxed capture mode, so its cudaEventQuery calls do not invalidate the capture); graphs
// whose last node signals a slot, replayed and waited on.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

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

TEST_CASE("library work captured in a CUDA graph, ended by enqueue_signal, is waited on") {
  // The graph's kernels do not signal (as cuBLAS's do not); signal_slot::enqueue_signal adds
  // evr's signal kernel as the graph's last node. Each wait must complete after its replay's
  // work, in order, on two streams whose replays interleave.
  evr::device::backend& be = evr::test::dut().backend();
  constexpr int streams = 2, replays = 30;
  void* mapped = nullptr;
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  REQUIRE(cudaHostAlloc(&mapped, 256, cudaHostAllocMapped) == cudaSuccess);
  auto* counts = static_cast<volatile unsigned*>(mapped);  // stream s counts at counts[s * 16]
  for (int s = 0; s < streams; ++s) counts[s * 16] = 0;
  void* counts_dev = nullptr;
  REQUIRE(cudaHostGetDevicePointer(&counts_dev, mapped, 0) == cudaSuccess);
  std::atomic<int> done{0}, early{0}, out_of_order{0}, failed{0};
  std::atomic<int> last[streams] = {0, 0};
  {
    evr::reactor r(be, evr::test::quick_options(evr::strategy::adaptive));
    std::vector<evr::stream> st;
    std::vector<evr::signal_slot> slots;
    std::vector<cudaGraphExec_t> execs(streams, nullptr);
    for (int s = 0; s < streams; ++s) {
      st.emplace_back(be, 0);
      slots.push_back(r.pools().signals(0).acquire());
      auto cs = static_cast<cudaStream_t>(st[s].native());
      cudaGraph_t graph = nullptr;
      REQUIRE(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal) == cudaSuccess);
      CHECK(evr::test::gpu::launch_chain_captured(
                cs, 50, 4, static_cast<volatile unsigned*>(counts_dev) + s * 16) == cudaSuccess);
      std::error_code signal_error;
      slots[s].enqueue_signal(cs, signal_error);
      CHECK_FALSE(signal_error);
      REQUIRE(cudaStreamEndCapture(cs, &graph) == cudaSuccess);
      REQUIRE(cudaGraphInstantiate(&execs[s], graph, 0) == cudaSuccess);
      cudaGraphDestroy(graph);
    }
    for (int i = 1; i <= replays; ++i) {
      for (int s = 0; s < streams; ++s) {
        const evr::signal_ticket t = slots[s].arm();
        REQUIRE(cudaGraphLaunch(execs[s], static_cast<cudaStream_t>(st[s].native())) ==
                cudaSuccess);
        REQUIRE_FALSE(
            evr::on_complete(r, evr::wait_target(st[s], t), [&, s, i](std::error_code ec) {
              if (ec) failed.fetch_add(1);
              if (counts[s * 16] < static_cast<unsigned>(i)) early.fetch_add(1);
              if (last[s].exchange(i) != i - 1) out_of_order.fetch_add(1);
              done.fetch_add(1);
            }));
      }
    }
    CHECK(evr::test::wait_until([&] { return done == streams * replays; }));
    for (int s = 0; s < streams; ++s)
      CHECK(slots[s].signalled() == static_cast<std::uint64_t>(replays));
    for (cudaGraphExec_t e : execs) cudaGraphExecDestroy(e);
  }
  CHECK(failed.load() == 0);
  CHECK(early.load() == 0);
  CHECK(out_of_order.load() == 0);
  cudaFreeHost(mapped);
}
