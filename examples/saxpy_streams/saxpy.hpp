// The example's GPU work: y[i] = a * x[i] + y[i] over n floats, on a CUDA stream.
#pragma once

#include <cstddef>

struct CUstream_st;

namespace saxpy_streams {
/// Enqueues the kernel on `stream` (device pointers). Returns a cudaError_t value (0: ok).
int launch_saxpy(CUstream_st* stream, float a, const float* x, float* y, std::size_t n);
}  // namespace saxpy_streams
