// The kernels evr_gpu_tests enqueue, behind plain C++ functions: test files (built by the host
// compiler) never see a kernel or a <<<>>> launch. Defined in gpu_kernels.cu.
//
// Each function launches on `stream`'s own device (it makes that device current for the launch
// and restores the caller's) and returns the launch status (cudaSuccess = 0).
#pragma once

#include <cuda_runtime_api.h>

#include <evr/device/signal_ref.h>

namespace evr::test::gpu {

/// A one-thread kernel that spins until `*flag != 0`. `flag` is a device address of mapped pinned
/// host memory (cudaHostAlloc(cudaHostAllocMapped)).
cudaError_t launch_gate(cudaStream_t stream, const volatile int* flag);

/// The same gate with a time limit: after about `milliseconds` still closed, it sets
/// `*timed_out` to 1 and ends (a test that waits for something the gate holds up fails rather
/// than hangs). Both pointers are device addresses of mapped pinned host memory.
cudaError_t launch_gate_with_limit(cudaStream_t stream, const volatile int* flag,
                                   unsigned milliseconds, volatile int* timed_out);

/// A kernel that traps: the device's context then fails with cudaErrorLaunchFailure (sticky).
cudaError_t launch_fault(cudaStream_t stream);

/// A one-thread kernel that spins for about `microseconds` (by %globaltimer).
cudaError_t launch_busy(cudaStream_t stream, unsigned microseconds);

/// `blocks` blocks of 64 threads, each spinning about `microseconds`, then every thread calls
/// evr::signal_from_last_block(done): the last block to finish signals the slot.
cudaError_t launch_signal(cudaStream_t stream, evr::signal_ref done, unsigned microseconds,
                          unsigned blocks);
/// The same kernel on the current device, without querying the stream (allowed while `stream` is
/// being captured into a graph).
cudaError_t launch_signal_captured(cudaStream_t stream, evr::signal_ref done, unsigned microseconds,
                                   unsigned blocks);

/// Work as a library queues it, with kernels that do not signal: `kernels` one-thread kernels of
/// about `microseconds` in a row, then one that adds 1 to `*count` (a device address of mapped
/// host memory). On the current device, without querying the stream (for a graph capture).
cudaError_t launch_chain_captured(cudaStream_t stream, unsigned microseconds, unsigned kernels,
                                  volatile unsigned* count);

/// A one-thread kernel that spins for about `microseconds`, then adds 1 to `*count` (a device
/// address of mapped host memory) and fences it system-wide: work whose end the host can read.
cudaError_t launch_busy_then_count(cudaStream_t stream, unsigned microseconds,
                                   volatile unsigned* count);

/// A one-thread kernel that does nothing, launched as a programmatic dependent launch that never
/// waits for the kernel before it (griddepcontrol.wait): a library kernel that declares it needs
/// nothing of its predecessor. On a GPU before compute capability 9.0 an ordinary launch.
cudaError_t launch_independent_dependent(cudaStream_t stream);

}  // namespace evr::test::gpu
