// The examples' GPU kernels, behind plain C++ functions so that the examples' .cpp files (C++20,
// Asio, coroutines) never go through nvcc. Built only when nvcc is found (kernels.cu).
#pragma once

#include <cstddef>

struct CUstream_st;

namespace examples::kernels {
/// Enqueues data[i] = a * data[i] + b over n floats (device memory). Returns a cudaError_t value.
int launch_affine(CUstream_st* stream, float* data, std::size_t n, float a, float b);
/// Enqueues a kernel that does nothing but keep the stream busy for `ns` nanoseconds.
int launch_busy(CUstream_st* stream, unsigned long long ns);
}  // namespace examples::kernels
