// Fence words and signal slots on the CUDA backend, internal to it (cuda_backend.cpp): the host
// memory the device writes and the host reads, and the three ways work writes it: a stream
// memory operation (cuStreamWriteValue64), evr's fence kernel and evr's signal kernel
// (cuda_kernels.hpp). Each function is the backend member of the same name (backend.hpp states
// the contracts); errors as make_cuda_error or evr::errc, the runtime's last error cleared. Any
// thread.
#pragma once
#if defined(EVR_WITH_CUDA)

#include <cstddef>
#include <cstdint>
#include <system_error>

#include <evr/device/backend.hpp>

namespace evr::device::cuda_fences {

std::error_code allocate_fence_block(int device, std::size_t words, fence_block& out) noexcept;
void free_fence_block(fence_block& block) noexcept;

std::error_code allocate_signal_block(int device, std::size_t slots, signal_block& out) noexcept;
void free_signal_block(signal_block& block) noexcept;
std::error_code enqueue_signal(int device, native_stream stream, const signal_ref& s) noexcept;

std::error_code write_fence(native_stream stream, std::uint64_t device_address,
                            std::uint64_t value) noexcept;
std::error_code write_fence_by_kernel(int device, native_stream stream,
                                      std::uint64_t device_address, std::uint64_t value) noexcept;

}  // namespace evr::device::cuda_fences

#endif  // EVR_WITH_CUDA
