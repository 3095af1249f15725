// /mlp: a small multi-layer perceptron, the inference-shaped route of the server.
//
//   GET  /mlp?seed=S[&rows=R]   R input rows (default 1) generated from seeds S, S+1, ...
//   POST /mlp                   the input rows in the body as CSV: one row per line, `in` numbers
//
// The model: `hidden` layers of `width` units with ReLU, then a linear layer of `out` units:
// in -> width -> ... -> width -> out. Each layer is y = W x + b with a dense weight matrix W.
//
// Why the weights have rank 2: each W is the dense matrix u0 v0^T + u1 v1^T (u, v and b generated
// from a fixed seed at start-up). The GPU materializes W and runs full dense GEMMs (cuBLAS) on it —
// it does not know about the structure, so its work is that of any dense layer — while the CPU can
// compute the exact answer in O(width) per layer (s_k = v_k . x, y = u0 s0 + u1 s1 + b) instead of
// O(width^2). That is what lets the server and the client check answers without a second GPU.
//
// Checking: a row agrees with the reference when every output is within 1e-3 of the row's RMS
// (plus 1e-5): the GPU sums thousands of float products in its own order, the reference in double.
//
// Thread safety: a model is immutable after construction; share it freely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "params.hpp"

namespace mlp {

inline constexpr int rank = 2;  ///< terms u_k v_k^T per weight matrix

struct shape {
  int in = 1024;     ///< inputs per row
  int width = 8192;  ///< units per hidden layer
  int hidden = 3;    ///< hidden layers (ReLU); the model has hidden + 1 weight matrices
  int out = 128;     ///< outputs per row

  int layers() const noexcept { return hidden + 1; }
  int layer_in(int l) const noexcept { return l == 0 ? in : width; }
  int layer_out(int l) const noexcept { return l == hidden ? out : width; }
  /// Dense weights of all layers (what the GPU stores and reads per forward pass).
  std::uint64_t weight_count() const noexcept;
  /// The widest layer output (what one activation buffer row must hold).
  int widest() const noexcept { return width > out ? width : out; }
};

class model {
 public:
  /// Generates the factors and biases (deterministic: the same shape gives the same model in
  /// every process, so the load generator can check answers too). Throws std::invalid_argument
  /// for a shape with a dimension below 1.
  explicit model(shape s);

  const shape& dims() const noexcept { return shape_; }
  /// Factor u_k of layer l: layer_out(l) floats.
  const float* u(int l, int k) const noexcept { return layers_[l].u[k].data(); }
  /// Factor v_k of layer l: layer_in(l) floats.
  const float* v(int l, int k) const noexcept { return layers_[l].v[k].data(); }
  /// Bias of layer l: layer_out(l) floats.
  const float* bias(int l) const noexcept { return layers_[l].bias.data(); }

  /// The reference answer for one row: x has dims().in floats, y receives dims().out floats.
  /// Computed through the factors in double: O(layers * width).
  void forward(const float* x, float* y) const;

  /// The largest input magnitude for which every activation stays within a quarter of the float
  /// range, however the inputs are signed and however a GPU orders its sums: each layer maps
  /// |x| <= H to |y| <= G H + max|b|, with G = sum_k max|u_k| * ||v_k||_1 (|W_ij| <= sum_k
  /// |u_ki| |v_kj|; a float partial sum of W x stays within sum_j |W_ij| |x_j| up to rounding,
  /// which the quarter covers). Inputs beyond it could overflow to inf and NaN.
  float input_limit() const noexcept { return input_limit_; }

 private:
  struct layer {
    std::vector<float> u[rank], v[rank], bias;
  };
  float bound_inputs() const noexcept;

  shape shape_;
  std::vector<layer> layers_;
  float input_limit_ = 0;
};

/// Input row number `seed`: `in` numbers in [-1, 1).
void input_row(std::uint32_t seed, int in, float* x) noexcept;

/// Checks one row of outputs against the reference row. Returns what is wrong, or nothing.
std::optional<std::string> compare_row(const float* got, const float* want, int n);

/// The checksum a reply carries per row: the sum of its outputs, in double.
double checksum(const float* y, int n) noexcept;
/// True when a checksum from a reply agrees with the checksum of a reference row.
bool checksum_agrees(double got, const float* want, int n) noexcept;

/// A parsed /mlp request: its rows, ready to be copied into a batch.
struct request {
  std::size_t rows = 0;
  std::optional<std::uint32_t> seed;  ///< GET: the first row's seed
  std::vector<float> inputs;          ///< rows * in floats
};

struct refusal {
  /// 400 malformed, 413 more rows than a batch holds, 422 an input beyond model::input_limit()
  int status = 400;
  std::string message;
};

/// Reads a request for model `m`. GET: `seed` (default 1) and `rows` (1..max_rows) from the query.
/// POST: no query parameters; the body holds the rows as CSV (one row of `in` numbers per line;
/// blank lines are ignored). A request with more rows than max_rows is refused with 413 (it
/// cannot fit one batch); a number beyond m.input_limit() with 422, naming it (its answer would
/// not be finite).
std::optional<refusal> parse(const params::list& query, std::string_view body, bool post,
                             const model& m, std::size_t max_rows, request& out);

}  // namespace mlp
