// /mlp on the GPU: the weights (materialized from their rank-2 factors, see mlp.hpp), the
// bias + activation kernel, and the forward pass as cuBLAS SGEMMs on a lane's stream.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernels.hpp"

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + ": " + cublasGetStatusName(s));
}

// W[i][j] = u0[i] v0[j] + u1[i] v1[j]; one thread per element, row i contiguous.
__global__ void materialize(float* w, const float* u0, const float* v0, const float* u1,
                            const float* v1, int in, int out) {
  const std::size_t n = static_cast<std::size_t>(in) * static_cast<std::size_t>(out);
  for (std::size_t e = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(e / in), j = static_cast<int>(e % in);
    w[e] = fmaf(u0[i], v0[j], u1[i] * v1[j]);
  }
}

// y[r][i] = act(y[r][i] + bias[i]) over rows x out (row-major, out per row).
__global__ void bias_activation(float* y, const float* bias, int out, std::size_t n, bool relu) {
  for (std::size_t e = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float v = y[e] + bias[e % out];
    y[e] = relu ? fmaxf(v, 0.0f) : v;
  }
}

unsigned blocks_for(std::size_t n) {
  const std::size_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks < 4096 ? (blocks == 0 ? 1 : blocks) : 4096);
}

}  // namespace

namespace server_kernels {

mlp_layer mlp_upload_layer(const float* u0, const float* v0, const float* u1, const float* v1,
                           const float* bias, int in, int out) {
  mlp_layer layer;
  layer.in = in;
  layer.out = out;
  float* factors = nullptr;  // u0 | u1 | v0 | v1, freed once W is made
  const std::size_t n_w = static_cast<std::size_t>(in) * static_cast<std::size_t>(out);
  try {
    check(cudaMalloc(&layer.w, n_w * sizeof(float)), "cudaMalloc (mlp weights)");
    check(cudaMalloc(&layer.bias, static_cast<std::size_t>(out) * sizeof(float)),
          "cudaMalloc (mlp bias)");
    check(cudaMalloc(&factors, (2 * static_cast<std::size_t>(out) + 2 * in) * sizeof(float)),
          "cudaMalloc (mlp factors)");
    float* du0 = factors;
    float* du1 = du0 + out;
    float* dv0 = du1 + out;
    float* dv1 = dv0 + in;
    const auto copy = [](float* dst, const float* src, int n) {
      check(
          cudaMemcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float), cudaMemcpyHostToDevice),
          "cudaMemcpy (mlp factors)");
    };
    copy(du0, u0, out);
    copy(du1, u1, out);
    copy(dv0, v0, in);
    copy(dv1, v1, in);
    copy(layer.bias, bias, out);
    materialize<<<blocks_for(n_w), 256>>>(layer.w, du0, dv0, du1, dv1, in, out);
    check(cudaGetLastError(), "mlp weight kernel");
    check(cudaDeviceSynchronize(), "mlp weight kernel");
    cudaFree(factors);
  } catch (...) {
    cudaFree(factors);
    mlp_free_layer(layer);
    throw;
  }
  return layer;
}

void mlp_free_layer(mlp_layer& layer) noexcept {
  cudaFree(layer.w);
  cudaFree(layer.bias);
  layer.w = layer.bias = nullptr;
}

void* mlp_create_handle(CUstream_st* stream) {
  cublasHandle_t h = nullptr;
  check(cublasCreate(&h), "cublasCreate");
  // FP32 math (no TF32): the answers are checked against a double-precision reference.
  if (cublasStatus_t s = cublasSetStream(h, stream); s != CUBLAS_STATUS_SUCCESS) {
    cublasDestroy(h);
    check(s, "cublasSetStream");
  }
  return h;
}

void mlp_destroy_handle(void* handle) noexcept {
  if (handle != nullptr) cublasDestroy(static_cast<cublasHandle_t>(handle));
}

const float* mlp_enqueue_forward(void* handle, const mlp_layer* layers, int n_layers,
                                 const float* in, float* a, float* b, int rows) {
  auto h = static_cast<cublasHandle_t>(handle);
  cudaStream_t stream = nullptr;
  check(cublasGetStream(h, &stream), "cublasGetStream");
  const float one = 1.0f, zero = 0.0f;
  const float* x = in;
  float* y = a;
  for (int l = 0; l < n_layers; ++l) {
    const mlp_layer& L = layers[l];
    // cuBLAS is column-major. W, row-major out x in, read column-major is the in x out matrix
    // A = W^T (lda = in); the rows of x (rows x in) are the columns of the in x rows matrix X
    // (ldb = in); the wanted y (rows x out, row-major) is the out x rows column-major matrix
    // W X = A^T X (ldc = out). Hence SGEMM(op(A) = T, op(X) = N, m = out, n = rows, k = in).
    check(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, L.out, rows, L.in, &one, L.w, L.in, x, L.in,
                      &zero, y, L.out),
          "cublasSgemm (mlp layer)");
    const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(L.out);
    bias_activation<<<blocks_for(n), 256, 0, stream>>>(y, L.bias, L.out, n, l + 1 < n_layers);
    check(cudaGetLastError(), "mlp bias/activation kernel");
    x = y;
    y = (y == a) ? b : a;
  }
  return x;
}

}  // namespace server_kernels
