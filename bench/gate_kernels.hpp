// Kernels of the benchmarks (gate_kernels.cu), called from C++ without CUDA headers.
#pragma once

#include <evr/device/signal_ref.h>

struct CUstream_st;

namespace evr::bench {
/// One-thread kernel: spins while *gate == 0, then (if ack) writes *ack = 1 and exits.
int launch_gate_kernel(CUstream_st* stream, volatile int* gate_device, volatile int* ack_device);
/// One-thread kernel: spins while *gate == 0, then signals `done` (evr::signal) and exits.
int launch_gate_signal_kernel(CUstream_st* stream, volatile int* gate, const evr::signal_ref& done);
/// Spins about `microseconds` on the GPU's global timer.
int launch_busy_kernel(CUstream_st* stream, unsigned microseconds);
/// An empty kernel.
int launch_tiny_kernel(CUstream_st* stream);
}  // namespace evr::bench
