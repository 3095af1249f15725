// evr/device/error.hpp — the two error categories evr reports through std::error_code.
//
// * cuda_category(): the value is a cudaError_t (the simulated device reports the same values, so
//   a test written against the simulator sees exactly what the GPU would report).
// * evr_category(): misuse and life-cycle errors of evr itself (evr::errc). errc::operation_aborted
//   maps to the error condition std::errc::operation_canceled; every other value is its own.
//
// Thread safety: every function here is thread-safe and never allocates except when a message
// string is built (which happens only on failure paths).
#pragma once

#include <string>
#include <system_error>

namespace evr {

/// Errors raised by evr itself (as opposed to errors reported by the device).
enum class errc {
  reactor_stopped = 1,   ///< the reactor is stopping or stopped; the wait was not started
  backend_mismatch,      ///< a stream or event of one device backend given to another
  device_mismatch,       ///< an event or signal slot of one device used with another device
  event_never_recorded,  ///< awaiting / timing an event that was never recorded
  timing_disabled,       ///< elapsed_time on an event created without timing
  interprocess_requires_no_timing,  ///< interprocess events must be created without timing
  invalid_ipc_handle,               ///< an IPC handle that does not name a live exported event
  unknown_event_id,                 ///< a pool id that was never issued or was already released
  empty_handle,                     ///< an operation on a moved-from / default-constructed handle
  per_thread_default_stream,        ///< cudaStreamPerThread has no identity the reactor can track
  stream_table_full,                ///< the reactor tracks too many distinct streams
  called_from_host_func,            ///< evr called from inside a CUDA host function (not allowed)
  invalid_argument,                 ///< an argument out of its documented range
  no_device,                        ///< no device of that index (or none at all)
  unsupported,                      ///< the backend cannot do this (e.g. IPC on the simulator)
  /// The wait was cancelled, or the reactor aborted it at shutdown (on_complete callbacks, the
  /// reactor). Compares equal to std::errc::operation_canceled (its default_error_condition).
  /// The Asio front end hands its handlers the flavour's asio::error::operation_aborted instead.
  operation_aborted,
  /// A device-signalled wait (evr::signal_slot) whose stream got past the work that was to
  /// signal it without the signal: the kernel returned before calling evr::signal, or the slot
  /// was armed more often than it was signalled.
  not_signalled,
};

/// The category of evr::errc (name "evr").
const std::error_category& evr_category() noexcept;
/// The category of CUDA errors: values are cudaError_t (the simulator uses the same values).
const std::error_category& cuda_category() noexcept;

/// An error_code of evr_category() (what makes `ec == errc::...` work).
std::error_code make_error_code(errc e) noexcept;

/// Wraps a cudaError_t value (0 is success and yields an empty error_code).
std::error_code make_cuda_error(int cuda_error_value) noexcept;

/// The cudaError_t values evr reasons about. Named here so that code built without the CUDA
/// toolkit (the simulator-only build) can use them; they equal the CUDA runtime's values.
namespace cuda_value {
inline constexpr int success = 0;                    ///< cudaSuccess
inline constexpr int invalid_value = 1;              ///< cudaErrorInvalidValue
inline constexpr int no_device = 100;                ///< cudaErrorNoDevice
inline constexpr int invalid_device = 101;           ///< cudaErrorInvalidDevice
inline constexpr int invalid_resource_handle = 400;  ///< cudaErrorInvalidResourceHandle
inline constexpr int not_ready = 600;                ///< cudaErrorNotReady (pending)
inline constexpr int illegal_address = 700;          ///< cudaErrorIllegalAddress (sticky)
inline constexpr int launch_timeout = 702;           ///< cudaErrorLaunchTimeout (sticky)
inline constexpr int hardware_stack_error = 714;     ///< cudaErrorHardwareStackError (sticky)
inline constexpr int illegal_instruction = 715;      ///< cudaErrorIllegalInstruction (sticky)
inline constexpr int misaligned_address = 716;       ///< cudaErrorMisalignedAddress (sticky)
inline constexpr int invalid_address_space = 717;    ///< cudaErrorInvalidAddressSpace (sticky)
inline constexpr int invalid_pc = 718;               ///< cudaErrorInvalidPc (sticky)
inline constexpr int launch_failure = 719;           ///< cudaErrorLaunchFailure (sticky)
inline constexpr int captured_event = 907;           ///< cudaErrorCapturedEvent
inline constexpr int insufficient_driver = 35;       ///< cudaErrorInsufficientDriver
}  // namespace cuda_value

/// True for a CUDA "not ready" status (work still pending: not an error for a query).
bool is_not_ready(const std::error_code& ec) noexcept;

/// True for errors that poison a whole device context (CUDA's "sticky" errors): once one is seen,
/// every later call on that device returns it, so every wait on the device must fail with it.
bool is_sticky(const std::error_code& ec) noexcept;

/// Thrown by the throwing overloads. what() names the call and the objects involved, e.g.
/// "cudaEventRecord(event 0x55d0.., stream 0x55d1.., device 0): an illegal memory access was
/// encountered (cuda error 700)".
class error : public std::system_error {
 public:
  /// `context` names the call and its objects; what() adds the error's message.
  error(std::error_code ec, const std::string& context) : std::system_error(ec, context) {}
};

/// Throws evr::error(ec, context) if ec is set. `context` is only turned into a string on failure.
void throw_if(const std::error_code& ec, const char* context);

}  // namespace evr

template <>
struct std::is_error_code_enum<evr::errc> : std::true_type {};
