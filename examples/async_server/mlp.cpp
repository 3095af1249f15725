#include "mlp.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

namespace mlp {
namespace {

/// splitmix64's finalizer: a full-avalanche 64-bit mix.
std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// A number in [-1, 1) with 24 significant bits: exactly representable as a float.
float unit(std::uint64_t key) noexcept {
  const auto r = static_cast<std::int64_t>(mix64(key) >> 40);  // [0, 2^24)
  return static_cast<float>(r - (std::int64_t{1} << 23)) * (1.0f / static_cast<float>(1 << 23));
}

// Keys: what a number is (top byte), then layer, factor and index, so no two numbers share a key.
enum : std::uint64_t { key_u = 1, key_v = 2, key_bias = 3, key_input = 4 };
std::uint64_t key(std::uint64_t what, std::uint64_t layer, std::uint64_t k, std::uint64_t i) {
  return (what << 56) ^ (layer << 48) ^ (k << 44) ^ i;
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

/// v . h in double with 8 partial sums: one running sum would chain every add on the previous
/// one (the check runs on a server thread, so its speed matters).
double dot(const float* v, const double* h, std::size_t n) noexcept {
  double part[8] = {};
  std::size_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (std::size_t k = 0; k < 8; ++k) part[k] += static_cast<double>(v[j + k]) * h[j + k];
  for (; j < n; ++j) part[0] += static_cast<double>(v[j]) * h[j];
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

}  // namespace

std::uint64_t shape::weight_count() const noexcept {
  std::uint64_t n = 0;
  for (int l = 0; l < layers(); ++l)
    n += static_cast<std::uint64_t>(layer_in(l)) * static_cast<std::uint64_t>(layer_out(l));
  return n;
}

model::model(shape s) : shape_(s) {
  if (s.in < 1 || s.width < 1 || s.hidden < 0 || s.out < 1)
    throw std::invalid_argument("mlp: every dimension must be at least 1 (hidden layers 0)");
  layers_.resize(static_cast<std::size_t>(s.layers()));
  for (int l = 0; l < s.layers(); ++l) {
    layer& L = layers_[static_cast<std::size_t>(l)];
    const int n_in = s.layer_in(l), n_out = s.layer_out(l);
    // v scaled by 3/sqrt(n_in): v . x then has about the RMS of x, and after u (RMS 1/sqrt(3)),
    // two terms and a ReLU the activations keep roughly their size from layer to layer.
    const float v_scale = 3.0f / std::sqrt(static_cast<float>(n_in));
    for (int k = 0; k < rank; ++k) {
      L.u[k].resize(static_cast<std::size_t>(n_out));
      L.v[k].resize(static_cast<std::size_t>(n_in));
      for (int i = 0; i < n_out; ++i)
        L.u[k][static_cast<std::size_t>(i)] = unit(key(key_u, l, k, static_cast<unsigned>(i)));
      for (int j = 0; j < n_in; ++j)
        L.v[k][static_cast<std::size_t>(j)] =
            v_scale * unit(key(key_v, l, k, static_cast<unsigned>(j)));
    }
    L.bias.resize(static_cast<std::size_t>(n_out));
    for (int i = 0; i < n_out; ++i)
      L.bias[static_cast<std::size_t>(i)] =
          0.125f * unit(key(key_bias, l, 0, static_cast<unsigned>(i)));
  }
  input_limit_ = bound_inputs();
}

float model::bound_inputs() const noexcept {
  auto max_abs = [](const std::vector<float>& v) {
    double m = 0;
    for (float x : v) m = std::fmax(m, std::fabs(static_cast<double>(x)));
    return m;
  };
  // The bound after layer l is affine in the input bound X: a X + c.
  const double ceiling = static_cast<double>(std::numeric_limits<float>::max()) / 4;
  double a = 1, c = 0, limit = ceiling;
  for (const layer& L : layers_) {
    double gain = 0;
    for (int k = 0; k < rank; ++k) {
      double l1 = 0;
      for (float v : L.v[k]) l1 += std::fabs(static_cast<double>(v));
      gain += max_abs(L.u[k]) * l1;
    }
    a *= gain;
    c = gain * c + max_abs(L.bias);
    limit = std::fmin(limit, (ceiling - c) / a);
  }
  return static_cast<float>(std::nextafter(limit, 0.0));
}

void model::forward(const float* x, float* y) const {
  std::vector<double> h(x, x + shape_.in), next;
  for (int l = 0; l < shape_.layers(); ++l) {
    const layer& L = layers_[static_cast<std::size_t>(l)];
    const std::size_t n_in = static_cast<std::size_t>(shape_.layer_in(l));
    const std::size_t n_out = static_cast<std::size_t>(shape_.layer_out(l));
    double s[rank] = {};
    for (int k = 0; k < rank; ++k) s[k] = dot(L.v[k].data(), h.data(), n_in);
    next.resize(n_out);
    const bool relu = l < shape_.hidden;
    for (std::size_t i = 0; i < n_out; ++i) {
      double v = static_cast<double>(L.bias[i]);
      for (int k = 0; k < rank; ++k) v += static_cast<double>(L.u[k][i]) * s[k];
      next[i] = relu && v < 0 ? 0.0 : v;
    }
    h.swap(next);
  }
  for (int i = 0; i < shape_.out; ++i) y[i] = static_cast<float>(h[static_cast<std::size_t>(i)]);
}

void input_row(std::uint32_t seed, int in, float* x) noexcept {
  for (int j = 0; j < in; ++j)
    x[j] = unit(key(key_input, 0, 0, (std::uint64_t{seed} << 20) ^ static_cast<unsigned>(j)));
}

namespace {

double row_tolerance(const float* want, int n) noexcept {
  double power = 0;
  for (int i = 0; i < n; ++i) power += static_cast<double>(want[i]) * want[i];
  return 1e-3 * std::sqrt(power / n) + 1e-5;
}

}  // namespace

std::optional<std::string> compare_row(const float* got, const float* want, int n) {
  const double tol = row_tolerance(want, n);
  for (int i = 0; i < n; ++i) {
    if (!(std::fabs(static_cast<double>(got[i]) - want[i]) <= tol))  // NaN fails too
      return "output " + std::to_string(i) + ": got " + number(got[i]) + ", the CPU says " +
             number(want[i]) + " (tolerance " + number(tol) + ")";
  }
  return std::nullopt;
}

double checksum(const float* y, int n) noexcept {
  double s = 0;
  for (int i = 0; i < n; ++i) s += y[i];
  return s;
}

bool checksum_agrees(double got, const float* want, int n) noexcept {
  // Each output may be off by the row tolerance, so the sum by n times that.
  return std::fabs(got - checksum(want, n)) <= n * row_tolerance(want, n);
}

namespace {

std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

std::optional<refusal> too_many_rows(std::size_t rows, std::size_t max_rows) {
  return refusal{413, "a request may carry at most " + std::to_string(max_rows) +
                          " rows (one batch), not " + std::to_string(rows)};
}

std::optional<refusal> parse_csv(std::string_view body, const model& m, std::size_t max_rows,
                                 request& out) {
  const shape& s = m.dims();
  const std::size_t in = static_cast<std::size_t>(s.in);
  std::size_t line_no = 0;
  while (!body.empty()) {
    const std::size_t nl = body.find('\n');
    const std::string_view line = trim(body.substr(0, nl));
    body.remove_prefix(nl == std::string_view::npos ? body.size() : nl + 1);
    ++line_no;
    if (line.empty()) continue;
    if (out.rows == max_rows) {
      std::size_t rows = out.rows + 1;  // count the rest for the message
      for (std::string_view rest = body; !rest.empty();) {
        const std::size_t n2 = rest.find('\n');
        if (!trim(rest.substr(0, n2)).empty()) ++rows;
        rest.remove_prefix(n2 == std::string_view::npos ? rest.size() : n2 + 1);
      }
      return too_many_rows(rows, max_rows);
    }
    const std::size_t first = out.inputs.size();
    std::string_view rest = line;
    for (std::size_t col = 1;; ++col) {
      const std::size_t comma = rest.find(',');
      const std::string_view field = trim(rest.substr(0, comma));
      float v = 0;
      if (!params::parse_whole(field, v) || !std::isfinite(v))
        return refusal{400, "line " + std::to_string(line_no) + ", number " + std::to_string(col) +
                                ": " + params::quoted(field) + " is not a finite number"};
      if (std::fabs(v) > m.input_limit())
        return refusal{422, "line " + std::to_string(line_no) + ", number " + std::to_string(col) +
                                ": " + params::quoted(field) +
                                " is beyond what the model keeps finite (inputs of magnitude at "
                                "most " +
                                number(m.input_limit()) + ")"};
      if (out.inputs.size() - first == in)
        return refusal{400, "line " + std::to_string(line_no) + " has more than " +
                                std::to_string(in) + " numbers (the model takes " +
                                std::to_string(in) + " inputs per row)"};
      out.inputs.push_back(v);
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
    if (out.inputs.size() - first != in)
      return refusal{400, "line " + std::to_string(line_no) + " has " +
                              std::to_string(out.inputs.size() - first) +
                              " numbers; the model takes " + std::to_string(in) +
                              " inputs per row"};
    ++out.rows;
  }
  if (out.rows == 0)
    return refusal{400, "POST /mlp takes its input rows in the body as CSV (one row of " +
                            std::to_string(in) + " numbers per line); the body has none"};
  return std::nullopt;
}

}  // namespace

std::optional<refusal> parse(const params::list& query, std::string_view body, bool post,
                             const model& m, std::size_t max_rows, request& out) {
  out = request{};
  const shape& s = m.dims();
  if (post) {
    if (!query.empty())
      return refusal{400, "POST /mlp takes its rows in the body, not query parameters (" +
                              params::quoted(query.front().first) + ")"};
    return parse_csv(body, m, max_rows, out);
  }
  std::uint32_t seed = 1;
  std::size_t rows = 1;
  for (const auto& [key, value] : query) {
    if (key == "seed") {
      if (!params::parse_whole(value, seed))
        return refusal{
            400, "seed must be a whole number from 0 to 4294967295, not " + params::quoted(value)};
    } else if (key == "rows") {
      unsigned long long r = 0;
      if (!params::parse_whole(value, r) || r < 1)
        return refusal{400, "rows must be a whole number from 1 to " + std::to_string(max_rows) +
                                ", not " + params::quoted(value)};
      if (r > max_rows) return too_many_rows(static_cast<std::size_t>(r), max_rows);
      rows = static_cast<std::size_t>(r);
    } else {
      return refusal{400,
                     "unknown parameter " + params::quoted(key) + " for /mlp (takes seed, rows)"};
    }
  }
  out.rows = rows;
  out.seed = seed;
  const std::size_t in = static_cast<std::size_t>(s.in);
  out.inputs.resize(rows * in);
  for (std::size_t r = 0; r < rows; ++r)
    input_row(seed + static_cast<std::uint32_t>(r), s.in, out.inputs.data() + r * in);
  return std::nullopt;
}

}  // namespace mlp
