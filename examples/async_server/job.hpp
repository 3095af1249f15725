// What a request asks the GPU to do, and the CPU's answer to check it against.
//
//   /saxpy?n=N[&a=A][&seed=S]   out[i] = a * x[i] + y[i] over N floats; the reply carries the
//                               checksum (sum of out, in double)
//   /sum?n=N[&seed=S]           the sum of N floats (a reduction); the reply carries the sum
//
// Inputs are a pure function of (seed, i), so the load generator can recompute every answer
// without seeing the inputs. x and y hold small whole numbers: a reduction of them in double is
// exact in any order (GPU atomics included), and so is saxpy for a in multiples of 1/4 — other
// values of `a` are checked with a relative tolerance (the GPU may fuse a*x+y into one FMA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace job {

enum class kind { saxpy, sum };

const char* to_string(kind k) noexcept;

struct spec {
  job::kind kind = kind::saxpy;
  std::size_t n = 0;
  float a = 2.0f;
  std::uint32_t seed = 1;
};

/// Reads n, a and seed for `k` from decoded query parameters. On bad input returns a message
/// fit for a 400 response ("n must be a whole number from 1 to 4194304, not 'abc'").
std::optional<std::string> parse(kind k,
                                 const std::vector<std::pair<std::string, std::string>>& params,
                                 std::size_t max_n, spec& out);

// 32-bit arithmetic and power-of-two moduli: the compiler vectorizes the loops that fill a
// request's inputs (this runs on the server's io thread, once per request).
inline float input_x(std::uint32_t seed, std::size_t i) noexcept {
  return static_cast<float>((static_cast<std::uint32_t>(i) * 7u + seed) & 15u);
}
inline float input_y(std::uint32_t seed, std::size_t i) noexcept {
  return static_cast<float>((static_cast<std::uint32_t>(i) * 13u + seed) & 7u) * 0.5f;
}

/// Writes the inputs of `s` (y only for saxpy; y may be null for sum).
void fill_inputs(const spec& s, float* x, float* y) noexcept;

/// The CPU's answer: saxpy's checksum or the sum, in double.
double reference(const spec& s) noexcept;

/// Checks a device result against the CPU. saxpy: `out` (n floats, for inputs x, y); sum:
/// `device_sum`. On success stores the value the reply carries in `value` and returns nothing;
/// otherwise returns what was wrong (for a 500 response).
std::optional<std::string> check(const spec& s, const float* x, const float* y, const float* out,
                                 double device_sum, double& value);

/// The sum of n floats in double, fast (vectorized blocks) and exact for whole numbers. The
/// simulated kernel uses it too, as a GPU reduction would sum in some tree order.
double sum(const float* v, std::size_t n) noexcept;

/// True when two answers agree (exact for the default inputs, relative 1e-6 otherwise).
bool close_enough(double got, double want) noexcept;

}  // namespace job
