#include "job.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "params.hpp"

namespace job {

const char* to_string(kind k) noexcept { return k == kind::saxpy ? "saxpy" : "sum"; }

using params::parse_whole;
using params::quoted;

std::optional<std::string> parse(kind k,
                                 const std::vector<std::pair<std::string, std::string>>& params,
                                 std::size_t max_n, spec& out) {
  out = spec{};
  out.kind = k;
  bool have_n = false;
  for (const auto& [key, value] : params) {
    if (key == "n") {
      unsigned long long n = 0;
      if (!parse_whole(value, n) || n < 1 || n > max_n)
        return "n must be a whole number from 1 to " + std::to_string(max_n) + ", not " +
               quoted(value);
      out.n = static_cast<std::size_t>(n);
      have_n = true;
    } else if (key == "seed") {
      if (!parse_whole(value, out.seed))
        return "seed must be a whole number from 0 to 4294967295, not " + quoted(value);
    } else if (key == "a" && k == kind::saxpy) {
      // from_chars for float is in libstdc++ 11+; strtof would accept leading spaces and hex.
      float a = 0;
      if (!parse_whole(value, a) || !std::isfinite(a) || std::fabs(a) > 1e6f)
        return "a must be a finite number of magnitude at most 1e6, not " + quoted(value);
      out.a = a;
    } else {
      return "unknown parameter " + quoted(key) + " for /" + to_string(k) +
             (k == kind::saxpy ? " (takes n, a, seed)" : " (takes n, seed)");
    }
  }
  if (!have_n)
    return std::string("missing parameter n (the number of elements), e.g. /") + to_string(k) +
           "?n=65536";
  return std::nullopt;
}

void fill_inputs(const spec& s, float* x, float* y) noexcept {
  for (std::size_t i = 0; i < s.n; ++i) x[i] = input_x(s.seed, i);
  if (s.kind == kind::saxpy && y != nullptr)
    for (std::size_t i = 0; i < s.n; ++i) y[i] = input_y(s.seed, i);
}

namespace {

/// Sums element(0..n-1), fast enough for the io thread: blocks of 256 summed in 8 float lanes (the
/// compiler vectorizes that; one double accumulator would chain every add on the previous one),
/// blocks added in double. Exact for the default inputs (multiples of 1/4, a block's sum far below
/// 2^21); otherwise within close_enough of the plain sum. Identical input gives an identical sum,
/// so the server's and the client's checksums of the same values agree bit for bit.
template <typename Element>
double sum_of(std::size_t n, Element&& element) noexcept {
  constexpr std::size_t block = 256, lanes = 8;
  double total = 0;
  for (std::size_t b = 0; b < n; b += block) {
    const std::size_t e = b + block < n ? b + block : n;
    float part[lanes] = {};
    std::size_t i = b;
    for (; i + lanes <= e; i += lanes)
      for (std::size_t k = 0; k < lanes; ++k) part[k] += element(i + k);
    for (; i < e; ++i) part[0] += element(i);
    double block_sum = 0;
    for (float p : part) block_sum += p;
    total += block_sum;
  }
  return total;
}

}  // namespace

double sum(const float* v, std::size_t n) noexcept {
  return sum_of(n, [v](std::size_t i) { return v[i]; });
}

double reference(const spec& s) noexcept {
  if (s.kind == kind::sum) return sum_of(s.n, [&](std::size_t i) { return input_x(s.seed, i); });
  return sum_of(s.n, [&](std::size_t i) { return s.a * input_x(s.seed, i) + input_y(s.seed, i); });
}

bool close_enough(double got, double want) noexcept {
  return got == want || std::fabs(got - want) <= 1e-6 * std::fmax(std::fabs(want), 1.0);
}

std::optional<std::string> check(const spec& s, const float* x, const float* y, const float* out,
                                 double device_sum, double& value) {
  char msg[160];
  if (s.kind == kind::sum) {
    const double want = sum(x, s.n);
    if (!close_enough(device_sum, want)) {
      std::snprintf(msg, sizeof msg, "wrong sum from the device: got %.17g, the CPU says %.17g",
                    device_sum, want);
      return std::string(msg);
    }
    value = device_sum;
    return std::nullopt;
  }
  // Every element, not a sample. The tolerance allows for a fused multiply-add on the GPU. No early
  // exit in the common loop (so it vectorizes); the first bad element is looked up only on failure.
  auto wrong = [&](std::size_t i) {
    const float want = s.a * x[i] + y[i];
    return std::fabs(out[i] - want) > 1e-5f * std::fabs(want) + 1e-6f;
  };
  std::size_t wrong_count = 0;  // a count, not a bool: GCC vectorizes this reduction
  for (std::size_t i = 0; i < s.n; ++i) wrong_count += wrong(i);
  if (wrong_count != 0) {
    std::size_t i = 0;
    while (!wrong(i)) ++i;
    std::snprintf(msg, sizeof msg,
                  "wrong saxpy element %zu from the device: got %.9g, the CPU says %.9g", i,
                  static_cast<double>(out[i]), static_cast<double>(s.a * x[i] + y[i]));
    return std::string(msg);
  }
  value = sum(out, s.n);
  return std::nullopt;
}

}  // namespace job
