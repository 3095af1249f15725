// evr/device/signal.cuh — device functions that signal an evr::signal_slot from a kernel: the
// wait on the slot completes when the reactor reads the new count in host memory (a memory read,
// no driver call, no operation added to the stream). Include from CUDA sources (.cu).
//
//   __global__ void work(..., evr::signal_ref done) {
//     ...                                   // the work
//     evr::signal_from_last_block(done);    // every thread, at the end: the last block signals
//   }
//   evr::signal_slot slot = reactor.pools().signals(device).acquire();   // host, once per lane
//   evr::signal_ticket t = slot.arm();                                  // host, once per launch
//   work<<<grid, block, 0, stream>>>(..., slot.ref());
//   co_await waiter.async_wait(evr::wait_target(stream, t), asio::use_awaitable);
//
// Work whose kernels cannot call evr::signal (cuBLAS, cuDNN, any library's kernels): capture it
// into a CUDA graph and end the capture with slot.enqueue_signal(stream) (signal_pool.hpp), evr's
// own signal kernel as the graph's last node.
//
// Contract: one signal per arm(), in launch order: launches that signal one slot must not run at
// the same time (one stream, or ordered streams). A launch that ends without signalling fails its
// wait with errc::not_signalled once the reactor sees the stream idle (its fault probe).
#pragma once

#include <evr/device/signal_ref.h>

namespace evr {

/// Signals `s` once. Call it from one thread, after the work the wait covers is done: every
/// write that work made and that the host will read must be visible by then (the function's
/// system-wide fence makes this thread's own writes visible before the count).
__device__ inline void signal(signal_ref s) {
  const unsigned long long n = atomicAdd(s.counter, 1ULL) + 1ULL;
  __threadfence_system();  // what this thread wrote, and the count, before the word
  *reinterpret_cast<volatile unsigned long long*>(s.word) = n;
}

/// For a kernel of several blocks: called by every thread of every block, at the end of the
/// kernel (it contains a __syncthreads(): no thread may skip it). Each thread's writes are made
/// visible system-wide, then the block counts itself, and the last block to arrive signals `s`:
/// the host sees every write of the launch once the wait completes. The block counter resets
/// itself (atomicInc wraps), so the next launch starts from zero.
__device__ inline void signal_from_last_block(signal_ref s) {
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x != 0 || threadIdx.y != 0 || threadIdx.z != 0) return;
  const unsigned int total = gridDim.x * gridDim.y * gridDim.z;
  // atomicInc wraps to 0 after `total - 1`: the last block sees total - 1 and leaves it at 0.
  if (atomicInc(s.blocks, total - 1) == total - 1) signal(s);
}

}  // namespace evr
