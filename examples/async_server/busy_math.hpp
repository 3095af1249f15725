// What a /busy request computes, in one place for the CUDA kernel (kernels.cu) and the CPU (the
// reference, the simulated kernel). C++17 and free of host-only headers, so nvcc can include it.
//
// 32 threads each start from (seed, thread) and apply `rounds` rounds of an integer mix; the
// answer is the wrapping 32-bit sum of the 32 values. Integer arithmetic: the GPU and the CPU agree
// bit for bit, so a /busy answer is checked for equality.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define EVR_SERVER_HOST_DEVICE __host__ __device__
#else
#define EVR_SERVER_HOST_DEVICE
#endif

namespace busy_math {

inline constexpr unsigned threads = 32;  ///< one warp: the kernel is one block of this size
inline constexpr unsigned rounds = 64;

/// A 32-bit integer mix (xorshift-multiply; full avalanche).
EVR_SERVER_HOST_DEVICE inline std::uint32_t mix(std::uint32_t h) {
  h ^= h >> 16;
  h *= 0x7feb352du;
  h ^= h >> 15;
  h *= 0x846ca68bu;
  h ^= h >> 16;
  return h;
}

/// The value thread `t` of the kernel computes for `seed`.
EVR_SERVER_HOST_DEVICE inline std::uint32_t thread_value(std::uint32_t seed, unsigned t) {
  std::uint32_t h = seed ^ (t * 0x9e3779b9u);
  for (unsigned r = 0; r < rounds; ++r) h = mix(h + r);
  return h;
}

/// The answer of a /busy request with `seed`: what the kernel writes.
inline std::uint32_t reference(std::uint32_t seed) {
  std::uint32_t sum = 0;
  for (unsigned t = 0; t < threads; ++t) sum += thread_value(seed, t);
  return sum;
}

}  // namespace busy_math
