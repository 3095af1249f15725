"""What a wait is on: reads a CUDA stream or event handle from the objects evr.wait accepts.

evr never imports torch or CuPy; it reads attributes, in this order: ``__cuda_stream__`` (the CUDA
stream protocol: ``(version, handle)``), ``.cuda_stream`` (``torch.cuda.Stream``), ``.cuda_event``
(``torch.cuda.Event``), ``.ptr`` (CuPy's streams and events), or an ``int`` stream handle. The
simulated device's streams and events are evr's own and handled by the package (evr/__init__.py).

How a class's objects are read is remembered per class, so that a wait on a torch or CuPy stream
reads one attribute instead of trying each in turn (a few microseconds of the loop thread per
wait). A class whose instances differ (an attribute set on some instances only) is read the slow
way whenever the remembered reader fails.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

from ._errors import EvrValueError

STREAM = 0
EVENT = 1

ACCEPTED = ("a CUDA stream or event (an object with __cuda_stream__, .cuda_stream, .cuda_event "
            "or .ptr, or an int handle)")

Target = Tuple[int, int, int]  # (STREAM or EVENT, handle, device: -1 for the current one)
Reader = Callable[[Any, str], Target]


def handle(value: Any, what: str, source: str) -> int:
    """`value` as a handle, or the error that names `source` and what is wrong with it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what}: {source} must be an int handle, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{what}: {source} is negative ({value}); expected a CUDA handle")
    return value


def _attribute(x: Any, what: str, attr: str, value: Any) -> int:
    # The common case inline (an int handle); anything else gets handle()'s checks and message.
    if type(value) is int and value >= 0:
        return value
    return handle(value, what, f"{type(x).__name__}.{attr}")


def _read_protocol(x: Any, what: str) -> Target:
    proto = x.__cuda_stream__
    proto = proto() if callable(proto) else proto
    if not (isinstance(proto, tuple) and len(proto) == 2):
        raise TypeError(f"{what}: {type(x).__name__}.__cuda_stream__ must return (version, "
                        f"handle), got {proto!r}")
    return STREAM, _attribute(x, what, "__cuda_stream__()[1]", proto[1]), -1


def _read_cuda_stream(x: Any, what: str) -> Target:
    return STREAM, _attribute(x, what, "cuda_stream", x.cuda_stream), -1


def _read_cuda_event(x: Any, what: str) -> Target:
    device = getattr(x, "device", -1)
    device = device if isinstance(device, int) and not isinstance(device, bool) else -1
    return EVENT, _attribute(x, what, "cuda_event", x.cuda_event), device


def _read_ptr_stream(x: Any, what: str) -> Target:
    return STREAM, _attribute(x, what, "ptr", x.ptr), -1


def _read_ptr_event(x: Any, what: str) -> Target:
    return EVENT, _attribute(x, what, "ptr", x.ptr), -1


def _read_int(x: Any, what: str) -> Target:
    return STREAM, handle(x, what, "the stream handle"), -1


def _reader_for(x: Any) -> Optional[Reader]:
    """How to read `x`, found from its attributes in the documented order (None: not a target)."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return _read_int
    if hasattr(x, "__cuda_stream__"):
        return _read_protocol
    if hasattr(x, "cuda_stream"):
        return _read_cuda_stream
    if hasattr(x, "cuda_event"):
        return _read_cuda_event
    if hasattr(x, "ptr"):
        # CuPy: cupy.cuda.Stream / ExternalStream and cupy.cuda.Event both have .ptr.
        is_event = "event" in type(x).__name__.lower() and not hasattr(x, "wait_event")
        return _read_ptr_event if is_event else _read_ptr_stream
    return None


_readers: Dict[type, Reader] = {}
_MAX_CLASSES = 256  # bounded: classes made on the fly are not kept forever


def read(x: Any, what: str) -> Target:
    """(kind, handle, device) of a wait on `x` (not a simulated stream or event). Raises TypeError
    or ValueError naming what is wrong, EvrValueError for an event never recorded."""
    cls = type(x)
    reader = _readers.get(cls)
    target = None
    if reader is not None:
        try:
            target = reader(x, what)
        except AttributeError:
            reader = None
    if reader is None:
        reader = _reader_for(x)
        if reader is None:
            raise TypeError(f"{what}: expected {ACCEPTED}, got {cls.__name__}")
        target = reader(x, what)
        if len(_readers) < _MAX_CLASSES:
            _readers[cls] = reader
    if target[0] == EVENT and target[1] == 0:
        raise EvrValueError(f"{what}: the event was never recorded (its handle is 0); record it "
                            "on a stream first")
    return target
