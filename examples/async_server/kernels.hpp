// The server's GPU kernels, behind plain C++ functions: this header is all the host code sees, so
// the Asio/coroutine code is built by the host compiler in C++20 while nvcc builds kernels.cu in
// C++17 (see examples/CMakeLists.txt for why the two are kept apart).
#pragma once

#include <cstddef>

struct CUstream_st;

namespace server_kernels {

/// Enqueues y[i] = a * x[i] + y[i] over n floats (device pointers) on `stream`.
/// Returns a cudaError_t value (0: ok).
int launch_saxpy(CUstream_st* stream, float a, const float* x, float* y, std::size_t n);

/// Enqueues *sum += x[0] + ... + x[n-1] (in double) on `stream`; zero *sum first (cudaMemsetAsync).
/// Returns a cudaError_t value (0: ok).
int launch_sum(CUstream_st* stream, const float* x, double* sum, std::size_t n);

}  // namespace server_kernels
