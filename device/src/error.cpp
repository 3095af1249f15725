// Error categories: cuda_category (values are cudaError_t) and evr_category (evr::errc).
#include <evr/device/error.hpp>

#include <cstdio>

#if defined(EVR_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace evr {
namespace {

class evr_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "evr"; }
  std::string message(int value) const override {
    switch (static_cast<errc>(value)) {
      case errc::reactor_stopped: return "the reactor is stopped: the wait was not started";
      case errc::backend_mismatch:
        return "the stream or event belongs to another device backend than the reactor or pool";
      case errc::device_mismatch:
        return "the event or signal slot belongs to another device than the stream";
      case errc::event_never_recorded: return "the event was never recorded";
      case errc::timing_disabled:
        return "the event was created without timing (elapsed_time needs event_flags::timing)";
      case errc::interprocess_requires_no_timing:
        return "an interprocess event must be created without timing";
      case errc::invalid_ipc_handle: return "the IPC handle does not name a live exported event";
      case errc::unknown_event_id: return "unknown event id (never issued, or already released)";
      case errc::empty_handle: return "the handle is empty (default-constructed or moved from)";
      case errc::per_thread_default_stream:
        return "cudaStreamPerThread is not supported: it names a different stream on every thread";
      case errc::stream_table_full: return "the reactor tracks too many distinct streams";
      case errc::called_from_host_func:
        return "evr was called from inside a CUDA host function, where device calls are not "
               "allowed";
      case errc::invalid_argument: return "invalid argument";
      case errc::no_device: return "no such device";
      case errc::unsupported: return "not supported by this device backend";
      case errc::operation_aborted:
        return "the wait was aborted: cancelled, or the reactor stopped before the work was done";
      case errc::not_signalled:
        return "the stream got past the work without its signal: the kernel did not call "
               "evr::signal for the slot, or the slot was armed more often than signalled";
    }
    return "unknown evr error " + std::to_string(value);
  }
  // So that `ec == std::errc::operation_canceled` holds for an aborted wait whichever front end
  // delivered it (Asio's operation_aborted maps to the same condition).
  std::error_condition default_error_condition(int value) const noexcept override {
    if (static_cast<errc>(value) == errc::operation_aborted) return std::errc::operation_canceled;
    return {value, *this};
  }
};

[[maybe_unused]] const char* cuda_error_name(int value) noexcept {
  switch (value) {
    case cuda_value::success: return "cudaSuccess";
    case cuda_value::invalid_value: return "cudaErrorInvalidValue";
    case cuda_value::no_device: return "cudaErrorNoDevice";
    case cuda_value::invalid_device: return "cudaErrorInvalidDevice";
    case cuda_value::insufficient_driver: return "cudaErrorInsufficientDriver";
    case cuda_value::invalid_resource_handle: return "cudaErrorInvalidResourceHandle";
    case cuda_value::not_ready: return "cudaErrorNotReady";
    case cuda_value::illegal_address: return "cudaErrorIllegalAddress";
    case cuda_value::launch_timeout: return "cudaErrorLaunchTimeout";
    case cuda_value::hardware_stack_error: return "cudaErrorHardwareStackError";
    case cuda_value::illegal_instruction: return "cudaErrorIllegalInstruction";
    case cuda_value::misaligned_address: return "cudaErrorMisalignedAddress";
    case cuda_value::invalid_address_space: return "cudaErrorInvalidAddressSpace";
    case cuda_value::invalid_pc: return "cudaErrorInvalidPc";
    case cuda_value::launch_failure: return "cudaErrorLaunchFailure";
    case cuda_value::captured_event: return "cudaErrorCapturedEvent";
    default: return nullptr;
  }
}

class cuda_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "cuda"; }
  std::string message(int value) const override {
    std::string text;
#if defined(EVR_WITH_CUDA)
    text = cudaGetErrorString(static_cast<cudaError_t>(value));
    const char* name = cudaGetErrorName(static_cast<cudaError_t>(value));
#else
    const char* name = cuda_error_name(value);
    text = name ? name : "CUDA error";
#endif
    text += " (";
    text += name ? name : "cuda error";
    text += ' ';
    text += std::to_string(value);
    text += ')';
    // The runtime gives this answer also where no driver is installed at all (a machine without a
    // GPU): the code cannot tell the two apart, the probe can.
    if (value == cuda_value::insufficient_driver)
      text +=
          "; CUDA says this also when no NVIDIA driver is installed: "
          "evr::device::probe_cuda() (Python: evr.cuda_status()) says which";
    return text;
  }
};

}  // namespace

const std::error_category& evr_category() noexcept {
  static const evr_category_impl instance;
  return instance;
}

const std::error_category& cuda_category() noexcept {
  static const cuda_category_impl instance;
  return instance;
}

std::error_code make_error_code(errc e) noexcept { return {static_cast<int>(e), evr_category()}; }

std::error_code make_cuda_error(int value) noexcept {
  if (value == cuda_value::success) return {};
  return {value, cuda_category()};
}

bool is_not_ready(const std::error_code& ec) noexcept {
  return ec.value() == cuda_value::not_ready && ec.category() == cuda_category();
}

bool is_sticky(const std::error_code& ec) noexcept {
  if (ec.category() != cuda_category()) return false;
  switch (ec.value()) {
    case cuda_value::illegal_address:
    case cuda_value::launch_timeout:
    case cuda_value::hardware_stack_error:
    case cuda_value::illegal_instruction:
    case cuda_value::misaligned_address:
    case cuda_value::invalid_address_space:
    case cuda_value::invalid_pc:
    case cuda_value::launch_failure:
    case 710:  // cudaErrorAssert
    case 214:  // cudaErrorECCUncorrectable
      return true;
    default: return false;
  }
}

void throw_if(const std::error_code& ec, const char* context) {
  if (ec) throw error(ec, context);
}

}  // namespace evr
