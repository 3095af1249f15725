"""The simulated device: evr without a GPU (tests, CI, laptops).

::

    dev = evr.sim.Device()              # one simulated GPU, threaded
    s = dev.stream()
    dev.launch_kernel(s, 0.002)         # a kernel of 2 ms
    await evr.wait(s)                   # through dev.reactor, made on first use
    dev.launch_faulting_kernel(s)       # the device becomes sticky-failed (700)
    await evr.wait(s)                   # raises evr.CudaError (cudaErrorIllegalAddress)

It models what evr relies on from CUDA: in-order streams, events, sticky faults, stalls.
"""

from __future__ import annotations

import threading
import weakref

from . import _evr

__all__ = ["Device", "Stream", "Event"]

_devices: "weakref.WeakSet[Device]" = weakref.WeakSet()

ILLEGAL_ADDRESS = 700


class Device:
    """A simulated GPU (``devices`` devices, ``mode`` ``"threaded"`` or ``"manual"``)."""

    def __init__(self, devices: int = 1, mode: str = "threaded") -> None:
        if isinstance(devices, bool) or not isinstance(devices, int):
            raise TypeError(f"evr.sim.Device: devices must be an int, got {type(devices).__name__}")
        self._impl = _evr.SimDevice(devices, mode)
        self.devices = devices
        self.mode = mode
        self._reactor = None
        self._lock = threading.Lock()
        _devices.add(self)

    @property
    def reactor(self):
        """This device's default evr.Reactor (default options), made on first use."""
        r = self._reactor
        if r is None:
            from . import Reactor, ReactorStopped, _is_shut_down
            with self._lock:
                if self._reactor is None:
                    if _is_shut_down():
                        raise ReactorStopped("evr: evr.shutdown() was called; no new wait can "
                                             "start (evr.set_default_reactor(...) to start again)")
                    self._reactor = Reactor(device=self)
                r = self._reactor
        return r

    def stream(self, index: int = 0, priority: int = 0) -> "Stream":
        """A new stream on device ``index``."""
        return Stream(self, index, priority)

    def event(self) -> "Event":
        """A new event (created on its first record)."""
        return Event(self)

    def launch_kernel(self, stream: "Stream", seconds: float = 0.0) -> None:
        """Enqueues a kernel that occupies ``stream`` for ``seconds``."""
        self._impl.launch_kernel(_stream_impl(stream), float(seconds))

    def launch_faulting_kernel(self, stream: "Stream", code: int = ILLEGAL_ADDRESS) -> None:
        """Enqueues a kernel that faults when it runs: the device becomes sticky-failed with the
        ``cudaError_t`` ``code`` and every wait on it fails with evr.CudaError."""
        self._impl.launch_faulting_kernel(_stream_impl(stream), int(code))

    def inject_fault(self, index: int = 0, code: int = ILLEGAL_ADDRESS) -> None:
        """Makes device ``index`` sticky-failed now."""
        self._impl.inject_fault(index, int(code))

    def inject_fault_after(self, operations: int, index: int = 0, code: int = ILLEGAL_ADDRESS) -> None:
        """Makes device ``index`` fault when it starts its ``operations``-th operation from now."""
        self._impl.inject_fault_after(index, operations, int(code))

    def fault(self, index: int = 0) -> int:
        """The sticky fault of device ``index`` (a cudaError_t value), or 0."""
        return self._impl.fault(index)

    def stall(self, stream: "Stream") -> None:
        """The stream runs nothing until resume()."""
        self._impl.stall(_stream_impl(stream))

    def resume(self, stream: "Stream") -> None:
        self._impl.resume(_stream_impl(stream))

    def step(self, stream: "Stream", n: int = 1) -> int:
        """Manual mode: runs up to ``n`` operations of ``stream``; returns how many ran."""
        return self._impl.step(_stream_impl(stream), n)

    def run_until_blocked(self) -> int:
        """Manual mode: runs every stream until empty or blocked."""
        return self._impl.run_until_blocked()

    def wait_idle(self) -> None:
        """Threaded mode: blocks until every stream is empty (or stalled/faulted)."""
        self._impl.wait_idle()

    def counters(self) -> dict:
        return self._impl.counters()

    def describe(self) -> str:
        return self._impl.describe()

    def shutdown(self) -> None:
        """Stops this device's default reactor (if made)."""
        r = self._reactor
        if r is not None:
            r.shutdown()

    def __repr__(self) -> str:
        return f"<evr.sim.Device devices={self.devices} mode={self.mode}>"


class Stream:
    """A stream of a simulated device. ``handle`` is its native handle (an int)."""

    def __init__(self, device: Device, index: int = 0, priority: int = 0) -> None:
        self.device = device
        self._impl = _evr.SimStream(device._impl, index, priority)
        self.handle: int = self._impl.handle

    def launch_kernel(self, seconds: float = 0.0) -> None:
        """``device.launch_kernel(self, seconds)``."""
        self.device.launch_kernel(self, seconds)

    def query(self) -> bool:
        """True when the work queued so far is done; raises evr.CudaError on a fault."""
        return self._impl.query()

    def synchronize(self) -> None:
        """Blocks (GIL released) until the work queued so far is done."""
        self._impl.synchronize()

    def __repr__(self) -> str:
        return f"<evr.sim.Stream handle={self.handle:#x}>"


class Event:
    """An event of a simulated device; ``record(stream)`` captures the stream's work so far."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self._impl = _evr.SimEvent(device._impl)

    def record(self, stream: Stream) -> None:
        self._impl.record(_stream_impl(stream))

    @property
    def recorded(self) -> bool:
        return self._impl.recorded

    @property
    def handle(self) -> int:
        """The native handle (0 before the first record)."""
        return self._impl.handle

    def query(self) -> bool:
        return self._impl.query()

    def synchronize(self) -> None:
        self._impl.synchronize()

    def __repr__(self) -> str:
        return f"<evr.sim.Event handle={self.handle:#x} recorded={self.recorded}>"


def _stream_impl(stream: Stream):
    if not isinstance(stream, Stream):
        raise TypeError(f"evr.sim: expected an evr.sim.Stream, got {type(stream).__name__}")
    return stream._impl


def _shutdown_all() -> None:
    for d in list(_devices):
        d.shutdown()
