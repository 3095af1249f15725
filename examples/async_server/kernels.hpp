// The server's GPU work, behind plain C++ functions: this header is all the host code sees, so
// the Asio/coroutine code is built by the host compiler in C++20 while nvcc builds kernels.cu and
// mlp_kernels.cu in C++17 (see examples/CMakeLists.txt for why the two are kept apart).
#pragma once

#include <cstddef>
#include <cstdint>

#include <evr/device/signal_ref.h>

struct CUstream_st;
struct CUgraphExec_st;
struct CUgraphNode_st;

namespace server_kernels {

/// Enqueues y[i] = a * x[i] + y[i] over n floats (device pointers) on `stream`.
/// Returns a cudaError_t value (0: ok).
int launch_saxpy(CUstream_st* stream, float a, const float* x, float* y, std::size_t n);

/// Enqueues *sum += x[0] + ... + x[n-1] (in double) on `stream`; zero *sum first (cudaMemsetAsync).
/// Returns a cudaError_t value (0: ok).
int launch_sum(CUstream_st* stream, const float* x, double* sum, std::size_t n);

/// Enqueues the /busy kernel: one block of busy_math::threads threads computes
/// busy_math::reference(seed) into *result (the device's address of mapped pinned host memory,
/// written with a system-scope fence after it) and runs `us` microseconds in all, measured on the
/// GPU's clock (%globaltimer). With `done`, the kernel then signals that evr slot (a
/// device-signalled wait: evr/pool/signal_pool.hpp). Returns a cudaError_t value (0: ok).
int launch_busy(CUstream_st* stream, std::uint32_t us, std::uint32_t seed, std::uint32_t* result,
                const evr::signal_ref* done = nullptr);

/// Points `node` of `exec` at a request's arguments for the graph's next launch: `node` is a /busy
/// kernel that launch_busy captured without `done` into the graph `exec` was instantiated from.
/// The graph's launches already queued keep the arguments they had. Returns a cudaError_t value.
int set_busy_node_args(CUgraphExec_st* exec, CUgraphNode_st* node, std::uint32_t us,
                       std::uint32_t seed, std::uint32_t* result);

/// How many /busy kernels GPU `device` runs at once: its SMs times the busy kernel's resident
/// blocks per SM (cudaOccupancyMaxActiveBlocksPerMultiprocessor), at most the concurrent kernels a
/// device runs (128 since compute capability 7.0). 0 when the device cannot be queried. `detail`
/// gets a description ("132 SMs x 32 blocks, at most 128 kernels at once"). Makes `device` the
/// calling thread's current device.
int busy_concurrency(int device, char* detail, std::size_t detail_size);

// --- /mlp (mlp_kernels.cu) ---------------------------------------------------------------------

/// One layer's weights on the device: W (out x in, row-major: row i is output i) and the bias.
struct mlp_layer {
  float* w = nullptr;
  float* bias = nullptr;
  int in = 0;
  int out = 0;
};

/// Allocates and fills one layer on the current device: W = u0 v0^T + u1 v1^T (materialized by a
/// kernel from the factors, which are copied in), and the bias. Synchronous. Throws
/// std::runtime_error naming the CUDA call that failed.
mlp_layer mlp_upload_layer(const float* u0, const float* v0, const float* u1, const float* v1,
                           const float* bias, int in, int out);
void mlp_free_layer(mlp_layer& layer) noexcept;

/// A cuBLAS handle bound to `stream` (cublasHandle_t, opaque here). Throws std::runtime_error.
void* mlp_create_handle(CUstream_st* stream);
void mlp_destroy_handle(void* handle) noexcept;

/// Enqueues the forward pass of `rows` rows on the handle's stream: `in` (rows x layers[0].in,
/// row-major) through every layer — a cuBLAS SGEMM, then bias + ReLU (all but the last layer) —
/// alternating between the activation buffers a and b (rows x the widest layer each). Returns the
/// buffer holding the output (rows x layers[n-1].out). Throws std::runtime_error naming the step.
const float* mlp_enqueue_forward(void* handle, const mlp_layer* layers, int n_layers,
                                 const float* in, float* a, float* b, int rows);

}  // namespace server_kernels
