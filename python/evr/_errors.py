"""evr's exceptions.

* :class:`EvrError` -- base of every evr error (a ``RuntimeError``).
* :class:`CudaError` -- the device failed: ``code`` is the ``cudaError_t`` value, ``name`` its
  CUDA name (``"cudaErrorIllegalAddress"``). Sticky faults fail every wait of that device.
* :class:`ReactorStopped` -- the reactor is shut down: the wait was refused, or it was still
  pending when the reactor stopped.
* :class:`EvrValueError` -- evr refused the arguments (a never-recorded event, a stream of another
  device backend, ...); also a ``ValueError``.
"""

from __future__ import annotations

from . import _evr

__all__ = ["EvrError", "CudaError", "ReactorStopped", "EvrValueError"]

# cudaError_t names of the values a wait can report (the CUDA runtime's enum; names of other
# values read "cudaError<value>").
_CUDA_NAMES = {
    0: "cudaSuccess",
    1: "cudaErrorInvalidValue",
    2: "cudaErrorMemoryAllocation",
    3: "cudaErrorInitializationError",
    4: "cudaErrorCudartUnloading",
    35: "cudaErrorInsufficientDriver",
    46: "cudaErrorDevicesUnavailable",
    100: "cudaErrorNoDevice",
    101: "cudaErrorInvalidDevice",
    209: "cudaErrorNoKernelImageForDevice",
    400: "cudaErrorInvalidResourceHandle",
    600: "cudaErrorNotReady",
    700: "cudaErrorIllegalAddress",
    701: "cudaErrorLaunchOutOfResources",
    702: "cudaErrorLaunchTimeout",
    709: "cudaErrorContextIsDestroyed",
    710: "cudaErrorAssert",
    714: "cudaErrorHardwareStackError",
    715: "cudaErrorIllegalInstruction",
    716: "cudaErrorMisalignedAddress",
    717: "cudaErrorInvalidAddressSpace",
    718: "cudaErrorInvalidPc",
    719: "cudaErrorLaunchFailure",
    900: "cudaErrorStreamCaptureUnsupported",
    901: "cudaErrorStreamCaptureInvalidated",
    906: "cudaErrorStreamCaptureImplicit",
    907: "cudaErrorCapturedEvent",
    999: "cudaErrorUnknown",
}


def cuda_error_name(code: int) -> str:
    """The CUDA name of a ``cudaError_t`` value (``700`` -> ``"cudaErrorIllegalAddress"``)."""
    return _CUDA_NAMES.get(code, f"cudaError{code}")


class EvrError(RuntimeError):
    """Base of evr's errors. ``category`` is ``"cuda"`` or ``"evr"``, ``code`` the value."""

    def __init__(self, message: str, *, category: str = "evr", code: int = 0) -> None:
        super().__init__(message)
        self.category = category
        self.code = code


class CudaError(EvrError):
    """The GPU reported an error: ``code`` (the ``cudaError_t`` value) and ``name``."""

    def __init__(self, code: int, name: str | None = None, message: str | None = None) -> None:
        self.name = name or cuda_error_name(code)
        text = message or _evr.error_message(_evr.CUDA_CATEGORY, code)
        if self.name not in text:
            text = f"{self.name} ({code}): {text}"
        super().__init__(text, category="cuda", code=code)

    def __reduce__(self):
        return (CudaError, (self.code, self.name))


class ReactorStopped(EvrError):
    """The reactor is shut down (evr.shutdown(), Reactor.shutdown(), interpreter exit)."""


class EvrValueError(EvrError, ValueError):
    """evr refused an argument (see the message)."""


_ERRC = {v: k for k, v in _evr.ERRC.items()}


def _from_error_code(category: str, value: int, message: str) -> EvrError:
    """Called by the C++ engine: the exception for a std::error_code."""
    if category == _evr.CUDA_CATEGORY:
        return CudaError(value, message=message)
    name = _ERRC.get(value, "")
    if name == "reactor_stopped":
        return ReactorStopped(
            "evr: the reactor is shut down (evr.shutdown() or Reactor.shutdown() was called, or "
            "the interpreter is exiting); no new wait can start", category="evr", code=value)
    if name == "operation_aborted":
        return ReactorStopped(
            "evr: the reactor shut down before the GPU work of this wait was done (the wait was "
            "aborted)", category="evr", code=value)
    if name in ("unsupported", "no_device"):
        return EvrError(f"evr: {message}", category="evr", code=value)
    if name in ("backend_mismatch", "device_mismatch", "event_never_recorded", "empty_handle",
                "per_thread_default_stream", "invalid_argument"):
        return EvrValueError(f"evr: {message}", category="evr", code=value)
    if category == "generic" or category == "system":
        return EvrError(f"evr: {message} ({category} {value})", category=category, code=value)
    return EvrError(f"evr: {message}", category=category, code=value)


_evr._set_error_factory(_from_error_code)
