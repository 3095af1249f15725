"""evr: await GPU work from asyncio without blocking a thread.

::

    y = model(x.cuda(non_blocking=True))
    await evr.wait(torch.cuda.current_stream())   # the work queued so far on the stream is done
    return y.cpu()

``evr.wait(x)`` accepts a CUDA stream or a recorded CUDA event in any of these forms (evr never
imports torch or CuPy; it reads the attributes):

* an object with ``__cuda_stream__`` (returns ``(version, handle)``; the CUDA stream protocol),
* ``.cuda_stream`` (``torch.cuda.Stream``), ``.cuda_event`` (``torch.cuda.Event``, recorded),
* ``.ptr`` (``cupy.cuda.Stream``, or ``cupy.cuda.Event`` when the class is an event),
* an ``int``: a ``cudaStream_t`` handle (``evr.event_handle(ptr)`` for a ``cudaEvent_t``),
* ``evr.sim.Stream`` / ``evr.sim.Event`` of the simulated device,
* a signal ticket (``slot.arm(stream)``, :class:`SignalSlot`): the signal that evr's kernel,
  captured at the end of a CUDA graph, gives on each replay (a memory read, not a driver query).

Completion path: the reactor thread (C++) never takes the GIL. It pushes each completion onto a
lock-free queue of the waiting event loop and wakes the loop through an eventfd (only when the
queue was empty); the loop's reader resolves the whole batch. See docs/python.md.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import threading
import weakref
from typing import Any, NamedTuple, Optional

from . import _evr, _signals, _targets
from ._errors import CudaError, EvrError, EvrValueError, ReactorStopped, cuda_error_name
from ._loop import _GpuWait, _Wait, _sink_for, loop_stats, set_loop_spin
from ._signals import SignalSlot

# evr.sim is part of the API (`evr.sim.Device()` after a plain `import evr`, as the stub says):
# imported here. It needs nothing of this module at import time (only _evr), so the order is safe.
from . import sim as sim

__all__ = [
    "wait", "wait_future", "release_after", "Reactor", "shutdown", "default_reactor",
    "signal_slot", "SignalSlot", "SignalTicket",
    "set_default_reactor", "event_handle", "cuda_available", "cuda_status", "CudaStatus", "set_loop_spin", "loop_stats",
    "CudaError", "EvrError", "EvrValueError", "ReactorStopped", "cuda_error_name", "sim",
]

# The C++ library's version, compiled into the module (project(evr VERSION) in CMakeLists.txt);
# the wheel's metadata carries the same (setup.py reads that line).
__version__: str = _evr.__version__

_STREAM, _EVENT = _targets.STREAM, _targets.EVENT
SignalTicket = _evr.SignalTicket  # what SignalSlot.arm returns
_SIM_TYPES = (sim.Stream, sim.Event)


def cuda_available() -> bool:
    """True when this build has the CUDA backend and a GPU is usable (:func:`cuda_status` says
    why not)."""
    return _evr.cuda_device_available()


class CudaStatus(NamedTuple):
    """What :func:`cuda_status` found. Versions are CUDA's integers (13000 is CUDA 13.0);
    ``driver_version`` is 0 when no NVIDIA driver (``libcuda.so.1``) was found."""

    usable: bool
    reason: str
    runtime_version: int
    driver_version: int
    device_count: int
    compiled_in: bool


def cuda_status() -> CudaStatus:
    """Whether evr's CUDA backend can run on this machine, and if not, why: ``reason`` names
    what is missing (no driver, a driver older than the CUDA runtime evr was built with, no
    device), with the versions. The module needs no CUDA library to import: the simulated device
    (:mod:`evr.sim`) works either way."""
    s = _evr.cuda_status()
    return CudaStatus(s["usable"], s["reason"], s["runtime_version"], s["driver_version"],
                      s["device_count"], s["compiled_in"])


# --- reactors -------------------------------------------------------------------------------------
_all_reactors: "weakref.WeakSet[Reactor]" = weakref.WeakSet()
_default: Optional["Reactor"] = None
_default_lock = threading.Lock()
_shut_down = False


class Reactor:
    """A background reactor thread that watches GPU progress and completes waits.

    ``strategy``: ``"adaptive"`` (default), ``"fence"``, ``"poll"`` or ``"host_func"``.
    ``device``: an :class:`evr.sim.Device` for the simulated device; ``None`` for CUDA.
    ``options``: the fields of ``evr::reactor_options``; durations in seconds (``idle="spin"``,
    ``max_sleep=1e-3``, ``shutdown_drain=0.5``, ``max_streams=4096``, ...).

    Usable as a context manager (``shutdown()`` on exit).
    """

    def __init__(self, strategy: Optional[str] = None, *, device: Any = None, **options: Any):
        from . import sim as _sim

        if strategy is not None and not isinstance(strategy, str):
            raise TypeError(f"evr.Reactor: strategy must be a str, got {type(strategy).__name__}")
        if device is not None and not isinstance(device, _sim.Device):
            raise TypeError("evr.Reactor: device must be an evr.sim.Device or None (CUDA), got "
                            f"{type(device).__name__}")
        self.device = device
        self._impl = _evr.Reactor(strategy, device._impl if device is not None else None, options)
        _all_reactors.add(self)

    @property
    def strategy(self) -> str:
        return self._impl.strategy

    @property
    def backend(self) -> str:
        """``"cuda"`` or ``"sim"``."""
        return self._impl.backend

    def describe(self) -> str:
        """One line naming the device(s)."""
        return self._impl.describe()

    def metrics(self) -> dict:
        """What the reactor did since it started: waits ``submitted``, ``completed``,
        ``cancelled``, ``failed``, ``rejected``, ``in_flight``; its work: ``sweeps``,
        ``event_queries`` (``host_event_queries`` of them made on the io threads that host
        waits), ``stream_queries`` (fault probes), ``doorbells``, ``parks`` (sleeps),
        ``wakeups`` (a submission or doorbell woke it), ``prediction_misses``; time:
        ``reactor_cpu_seconds`` (its thread's CPU), ``busy_seconds`` (passes that delivered);
        log2 histograms (bucket i: [2**i, 2**(i+1)) ns) ``nap_overshoot_log2_ns`` (how late its
        timed sleeps ended) and ``detect_to_deliver_log2_ns``."""
        return self._impl.metrics()

    def shutdown(self) -> None:
        """Stops the reactor: pending waits complete for up to ``shutdown_drain`` (2 s), then
        fail with :class:`ReactorStopped`; later waits raise it at once. Idempotent."""
        self._impl.stop()

    def wait(self, x: Any) -> "asyncio.Future[None]":
        """``evr.wait(x, reactor=self)``."""
        return wait(x, reactor=self)

    def signal_slot(self, device: Optional[int] = None) -> SignalSlot:
        """A signal slot of this reactor's pool for ``device`` (None: the calling thread's
        current device; 0 on the simulated device): what evr's signal kernel writes, for waits
        on library work captured into CUDA graphs (:class:`SignalSlot`). Raises EvrError when
        the strategy or backend has no signal slots, CudaError when the device cannot make
        them."""
        return _signals.take_slot(self, device)

    def prepare_device(self, device: Optional[int] = None) -> None:
        """Makes ready on ``device`` (None: the calling thread's current device) what this
        reactor's waits there will use, so that neither a wait nor the first
        :meth:`signal_slot` has to: with the ``fence`` and ``adaptive`` strategies, the device's
        first batch of signal slots (64) and evr's signal kernel; with ``kernel_fences`` as well,
        evr's fence kernel (a reactor made while the process already used a device loaded that
        one there). Blocks until the device's running kernels have ended (CUDA's load waits for
        them), with the GIL released, so call it before launching kernels that wait for the
        host. Raises EvrError for a device that does not exist, and when the device cannot have
        the fence kernel (a GPU before compute capability 9.0; its waits then record events past
        the stream limit); CudaError when a slot or a kernel cannot be made (out of memory, a
        CUDA failure). With the ``poll`` and ``host_func`` strategies it only checks the index."""
        if device is not None and (not isinstance(device, int) or isinstance(device, bool)):
            raise TypeError(f"evr.Reactor.prepare_device: device must be an int or None, got "
                            f"{type(device).__name__}")
        if device is not None and device < 0:
            raise ValueError(f"evr.Reactor.prepare_device: device must be >= 0 or None, got {device}")
        self._impl.prepare_device(-1 if device is None else device)

    def __enter__(self) -> "Reactor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"<evr.Reactor strategy={self.strategy} backend={self.backend}>"


def signal_slot(device: Optional[int] = None, *, reactor: Optional[Reactor] = None) -> SignalSlot:
    """``(reactor or default_reactor()).signal_slot(device)``."""
    if reactor is not None and not isinstance(reactor, Reactor):
        raise TypeError(f"evr.signal_slot: reactor must be an evr.Reactor, got {type(reactor).__name__}")
    return (reactor or default_reactor()).signal_slot(device)


def set_default_reactor(reactor: Optional[Reactor]) -> None:
    """Makes ``reactor`` the one that waits without ``reactor=`` use (None: back to lazy)."""
    global _default, _shut_down
    if reactor is not None and not isinstance(reactor, Reactor):
        raise TypeError(f"evr.set_default_reactor: expected an evr.Reactor, got {type(reactor).__name__}")
    with _default_lock:
        _default = reactor
        _shut_down = False


def default_reactor() -> Reactor:
    """The process's default reactor, created on first use (CUDA backend, default options)."""
    global _default
    r = _default
    if r is not None:
        return r
    with _default_lock:
        if _default is None:
            if _shut_down:
                raise ReactorStopped("evr: evr.shutdown() was called; no new wait can start "
                                     "(evr.set_default_reactor(...) to start again)")
            if not _evr.cuda_compiled_in():
                raise EvrError("evr: this build has no CUDA backend (simulated device only): "
                               "pass reactor=evr.Reactor(device=evr.sim.Device()), wait on an "
                               "evr.sim stream, or call evr.set_default_reactor(...)")
            status = cuda_status()
            if not status.usable:
                raise EvrError(f"evr: the CUDA backend cannot run here: {status.reason}. The "
                               "simulated device needs no GPU: evr.Reactor(device=evr.sim.Device())")
            _default = Reactor()
        return _default


def _is_shut_down() -> bool:
    return _shut_down


def shutdown() -> None:
    """Stops the default reactor (and the reactors of simulated devices made by evr.sim); later
    waits that need it raise :class:`ReactorStopped`. Reactors you made stay yours to stop."""
    global _default, _shut_down
    with _default_lock:
        r, _default, _shut_down = _default, None, True
    if r is not None:
        r.shutdown()
    from . import sim as _sim
    _sim._shutdown_all()


# --- targets ------------------------------------------------------------------------------------
class event_handle:
    """A raw ``cudaEvent_t`` (an int) to wait on: ``await evr.wait(evr.event_handle(ptr))``.
    ``device``: the event's device (-1: the calling thread's current device)."""

    __slots__ = ("cuda_event", "device")

    def __init__(self, ptr: int, device: int = -1) -> None:
        if isinstance(ptr, bool) or not isinstance(ptr, int):
            raise TypeError(f"evr.event_handle: expected an int, got {type(ptr).__name__}")
        self.cuda_event = ptr
        self.device = device


def _resolve_sim(x: Any, reactor: Optional[Reactor], what: str):
    r = reactor or x.device.reactor
    if r.device is not x.device:
        raise EvrValueError(f"{what}: this evr.sim.{type(x).__name__} belongs to another device "
                            "than the reactor's")
    if isinstance(x, sim.Stream):
        return r, _STREAM, x.handle, -1
    if not x.recorded:
        raise EvrValueError(f"{what}: the event was never recorded (record it on a stream "
                            "first)")
    return r, _EVENT, x.handle, x._impl.device_index


def _resolve(x: Any, reactor: Optional[Reactor], what: str):
    """(reactor, kind, handle, device) for a wait on `x`."""
    if reactor is not None and not isinstance(reactor, Reactor):
        raise TypeError(f"{what}: reactor must be an evr.Reactor, got {type(reactor).__name__}")
    if isinstance(x, _SIM_TYPES):
        return _resolve_sim(x, reactor, what)
    kind, handle, device = _targets.read(x, what)
    return (reactor or default_reactor()), kind, handle, device


# --- the API -----------------------------------------------------------------------------------
def wait(x: Any, *, reactor: Optional[Reactor] = None) -> "asyncio.Future[None]":
    """Returns an asyncio future done when the GPU work before ``x`` is done.

    ``await evr.wait(stream)``: the work queued on ``stream`` so far is done; ``await
    evr.wait(event)``: the work the (recorded) event captured is done. Raises
    :class:`CudaError` when the device failed (also when it had failed before the call: the
    future then fails at once), :class:`ReactorStopped` when the reactor is stopped (raised by
    the call) or shuts down while the wait is pending (raised by the await). Cancelling the awaiting task cancels the wait (evr::wait_handle: the C++ wait completes
    once, aborted; the GPU work goes on). Must be called
    from a coroutine running in an event loop (any loop: asyncio's, uvloop's; any thread).
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError("evr.wait: no running event loop (call it from a coroutine; outside "
                           "asyncio use evr.wait_future)") from None
    sink = _sink_for(loop)
    if type(x) is SignalTicket:
        r = _signals.reactor_of(x, reactor, "evr.wait")
        handle = x.stream
    else:
        r, kind, handle, device = _resolve(x, reactor, "evr.wait")
    # Only a wait that will get a wake-up time needs the polling future; the others (irregular
    # work, waits queued behind a scheduled one) are as cheap as asyncio's own futures.
    fut = _GpuWait(loop, sink) if sink.predictable(handle) else _Wait(loop=loop)
    try:
        if type(x) is SignalTicket:
            wake_at = r._impl.wait_signal_async(sink, fut, x)
        else:
            wake_at = r._impl.wait_async(sink, fut, kind, handle, device)
        if wake_at:
            fut._wake_at = wake_at
    except CudaError as e:  # the device had already failed: the wait fails, the call does not
        fut.set_exception(e)
    return fut


def wait_future(x: Any, *, reactor: Optional[Reactor] = None) -> "concurrent.futures.Future[None]":
    """Like :func:`wait`, for code without an event loop: a ``concurrent.futures.Future``
    (resolved by evr's resolver thread; ``f.result(timeout)``, ``asyncio.wrap_future``)."""
    fut: concurrent.futures.Future = concurrent.futures.Future()
    try:
        if type(x) is SignalTicket:
            _signals.reactor_of(x, reactor, "evr.wait_future")._impl.wait_signal_future(fut, x)
        else:
            r, kind, handle, device = _resolve(x, reactor, "evr.wait_future")
            r._impl.wait_future(fut, kind, handle, device)
    except CudaError as e:  # the device had already failed: the wait fails, the call does not
        fut.set_running_or_notify_cancel()
        fut.set_exception(e)
    return fut


def release_after(x: Any, obj: Any, *, reactor: Optional[Reactor] = None) -> None:
    """Keeps ``obj`` alive until the GPU is past the work queued on ``x`` so far (or the event,
    or the signal a ticket names: call it once that signal's launch is queued), then drops evr's
    reference (on the resolver thread, under the GIL). Never early: if the reactor refuses the
    wait, this synchronizes ``x`` (a ticket's stream) first and then raises the refusal; a
    ticket whose signal never came keeps ``obj`` for the process."""
    if type(x) is SignalTicket:
        _signals.reactor_of(x, reactor, "evr.release_after")._impl.release_after_signal(obj, x)
        return
    r, kind, handle, device = _resolve(x, reactor, "evr.release_after")
    r._impl.release_after(obj, kind, handle, device)


# --- interpreter exit -----------------------------------------------------------------------------
def _at_exit() -> None:
    # Stop every reactor (GIL released inside): pending waits are drained or aborted and their
    # completions queued; those of loops that no longer run are never resolved (and their
    # references are leaked, harmlessly, at exit). Then the resolver serves its last batch.
    for r in list(_all_reactors):
        try:
            r._impl.stop()
        except Exception:  # noqa: BLE001 - exit must go on
            pass
    _evr.stop_resolver()


atexit.register(_at_exit)
