// Kernels of the benchmarks (gate_kernels.cu), called from C++ without CUDA headers.
#pragma once

struct CUstream_st;

namespace evr::bench {
/// One-thread kernel: spins while *gate == 0, then (if ack) writes *ack = 1 and exits.
int launch_gate_kernel(CUstream_st* stream, volatile int* gate_device, volatile int* ack_device);
/// Spins about `microseconds` on the GPU's global timer.
int launch_busy_kernel(CUstream_st* stream, unsigned microseconds);
/// An empty kernel.
int launch_tiny_kernel(CUstream_st* stream);
}  // namespace evr::bench
