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
* ``evr.sim.Stream`` / ``evr.sim.Event`` of the simulated device.

Completion path: the reactor thread (C++) never takes the GIL. It pushes each completion onto a
lock-free queue of the waiting event loop and wakes the loop through an eventfd (only when the
queue was empty); the loop's reader resolves the whole batch. See docs/python.md.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import threading
import time
import weakref
from typing import Any, NamedTuple, Optional

from . import _evr, _targets
from ._errors import CudaError, EvrError, EvrValueError, ReactorStopped, cuda_error_name

# evr.sim is part of the API (`evr.sim.Device()` after a plain `import evr`, as the stub says):
# imported here. It needs nothing of this module at import time (only _evr), so the order is safe.
from . import sim as sim

__all__ = [
    "wait", "wait_future", "release_after", "Reactor", "shutdown", "default_reactor",
    "set_default_reactor", "event_handle", "cuda_available", "cuda_status", "CudaStatus", "set_loop_spin", "loop_stats",
    "CudaError", "EvrError", "EvrValueError", "ReactorStopped", "cuda_error_name", "sim",
]

# The C++ library's version, compiled into the module (project(evr VERSION) in CMakeLists.txt);
# the wheel's metadata carries the same (setup.py reads that line).
__version__: str = _evr.__version__

_STREAM, _EVENT = _targets.STREAM, _targets.EVENT
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

    def __enter__(self) -> "Reactor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"<evr.Reactor strategy={self.strategy} backend={self.backend}>"


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


# --- event loops ------------------------------------------------------------------------------
_sinks: dict = {}  # loop -> _evr.LoopSink
_sinks_lock = threading.Lock()
_tls = threading.local()
_loop_spin = 200e-6  # seconds; see set_loop_spin
_loop_spin_waits = 4  # waits with a wake-up time at once, per loop; see set_loop_spin


def set_loop_spin(max_seconds: float, max_waits: int = 4) -> None:
    """How long a coroutine may poll for a predicted completion (default 200 us; 0: never), and
    for how many waits of a loop at once (default 4).

    A completion normally reaches a sleeping loop through an eventfd, and the loop's wake-up and
    the resume of the awaiting task cost tens of microseconds. For streams whose work takes a
    predictable time, evr wakes the awaiting coroutine on a precise timer just before the
    predicted end and lets it poll between yields (other tasks keep running) until the completion
    arrives or its window passes, at most ``max_seconds`` per window; one window is open per loop
    at a time. Only while fewer than ``max_waits`` waits of the loop are in flight (predicted or
    not) does a new one get a wake-up time: a loop with more in flight is busy with their
    completions and seldom asleep, and its windows would spin through time its other tasks need.
    Costs CPU on the loop thread
    during the windows only; waits on unpredictable streams, and futures nobody awaits (gathered),
    are not affected. Applies to every loop, now and later. See docs/python.md, "How it works".
    """
    global _loop_spin, _loop_spin_waits
    if isinstance(max_seconds, bool) or not isinstance(max_seconds, (int, float)):
        raise TypeError(f"evr.set_loop_spin: expected seconds (a float), got "
                        f"{type(max_seconds).__name__}")
    if not 0 <= max_seconds <= 0.1:
        raise ValueError(f"evr.set_loop_spin: expected 0 <= seconds <= 0.1, got {max_seconds}")
    if isinstance(max_waits, bool) or not isinstance(max_waits, int):
        raise TypeError(f"evr.set_loop_spin: max_waits must be an int, got "
                        f"{type(max_waits).__name__}")
    if not 1 <= max_waits <= 4096:
        raise ValueError(f"evr.set_loop_spin: expected 1 <= max_waits <= 4096, got {max_waits}")
    with _sinks_lock:
        _loop_spin, _loop_spin_waits = float(max_seconds), max_waits
        for sink in _sinks.values():
            if not sink.closed:
                sink.max_spin = _loop_spin
                sink.max_waits = _loop_spin_waits


def loop_stats(loop: Optional[asyncio.AbstractEventLoop] = None) -> Optional[dict]:
    """How completions reached ``loop`` (default: the running loop), or None if it never waited.

    ``completions``; ``probe_hits`` (completions a poll saw in the wait's fence word before the
    reactor handed them over); ``hop_log2_ns`` (bucket i counts completions that took < 2**i ns
    from the reactor's push to the loop's drain); the polling of :func:`set_loop_spin`: ``predicted``
    (waits given a wake-up time), ``timer_fires``, ``spins`` (windows a coroutine polled in),
    ``spin_hits`` (its completion came meanwhile), ``spin_misses`` (windows or due waits that
    passed without it: back to the eventfd), ``not_polled`` (due waits nobody awaited),
    ``window_open`` (a coroutine is polling now), ``in_flight`` (waits of the loop not yet
    drained),
    ``spin_seconds``, ``lead_seconds`` (how early a window opens), ``models`` (streams with a
    learned duration: at most 4096 per loop, then forgotten together); ``last_completion_ns``:
    the last completion drained, as CLOCK_MONOTONIC nanoseconds (``time.monotonic_ns()``'s clock)
    of its submission, the reactor's push and the loop's drain (zeros before the first)."""
    if loop is None:
        loop = asyncio.get_running_loop()
    with _sinks_lock:
        sink = _sinks.get(loop)
    return None if sink is None else sink.stats()


def _sink_for(loop: asyncio.AbstractEventLoop) -> "_evr.LoopSink":
    tls = _tls.__dict__
    if tls.get("loop") is loop:
        return tls["sink"]
    with _sinks_lock:
        sink = _sinks.get(loop)
        if sink is None:
            for old in [lp for lp in _sinks if lp.is_closed()]:
                _sinks.pop(old).close()  # its completions are dropped from now on
            sink = _evr.LoopSink(_loop_spin)
            sink.max_waits = _loop_spin_waits
            loop.add_reader(sink.fd, sink.drain)
            loop.add_reader(sink.timer_fd, sink.on_timer)
            _sinks[loop] = sink
    tls["loop"], tls["sink"] = loop, sink
    return sink


class _Wait(asyncio.Future):
    """The future :func:`wait` returns: an ``asyncio.Future`` whose ``cancel()`` also cancels the
    C++ wait (``_canceller``, set by the module once the wait started). Cancelling through
    ``cancel()`` rather than a done callback spares the loop a callback per completion: the
    awaiting task's step is then the only one. Asyncio cancels a future through its ``cancel()``
    method (a task's cancellation, ``gather``, ``wait_for``). Loop thread only.
    """

    __slots__ = ("_canceller",)

    def cancel(self, msg: Any = None) -> bool:
        if not super().cancel(msg):
            return False
        canceller = getattr(self, "_canceller", None)  # unset when the wait was refused
        if canceller is not None:
            self._canceller = None
            canceller.cancel()
        return True


class _GpuWait(_Wait):
    """The future :func:`wait` returns for a wait with a wake-up time: a :class:`_Wait` that, when
    awaited, may poll for its completion near the predicted end (docs/python.md, "How it works").

    Awaited on a predictable stream (``_wake_at`` set), the coroutine first sleeps on a private
    future, ``_window``, which the loop's timer resolves when this wait's window opens
    (``_open_window``) and which the drain resolves if the completion comes first
    (``_wake_sleeper``). In the window it polls the loop's completion queue between bare
    ``yield``s (the loop runs its other callbacks in between, as with ``asyncio.sleep(0)``); its
    completion found, it returns without another trip through the loop. The window closed
    (``sink.window_closed``, exactly once, also when the task is cancelled or destroyed
    meanwhile), it awaits the future as usual. Loop thread only.
    """

    __slots__ = ("_sink", "_wake_at", "_until", "_number", "_window")

    def __init__(self, loop: asyncio.AbstractEventLoop, sink: "_evr.LoopSink") -> None:
        super().__init__(loop=loop)
        self._sink = sink
        self._wake_at = 0  # the wait's wake-up time (monotonic ns); 0: no prediction
        self._until = 0  # the end of its window, once open
        self._number = 0  # the open window's number (sink.window_closed); 0: none is open
        self._window: Optional[asyncio.Future] = None  # what its coroutine sleeps on till then

    # Called by the loop's timer (C++, loop_sink::on_timer): True when someone will poll. A
    # probed wait (its fence word is read by the polls) that nobody awaits (a gathered future) is
    # polled by a callback instead: the reactor leaves it to this loop until the window ends.
    def _open_window(self, until_ns: int, number: int, probed: bool = False) -> bool:
        if self.done():
            return False
        w = self._window
        if w is None and probed:
            self.get_loop().call_soon(self._poll_unawaited, until_ns, number, time.monotonic_ns())
            return True
        if w is None or w.done():
            return False
        self._until, self._number = until_ns, number
        w.set_result(None)
        return True

    # The window of a probed wait nobody awaits: one poll a round of the loop, as _near_the_end's.
    def _poll_unawaited(self, until_ns: int, number: int, opened_ns: int) -> None:
        sink = self._sink
        sink.poll()
        now = time.monotonic_ns()
        if self.done() or now >= until_ns or self.get_loop().is_closed():
            sink.window_closed(number, self.done() and not self.cancelled(), opened_ns, now, True)
            return
        self.get_loop().call_soon(self._poll_unawaited, until_ns, number, opened_ns)

    # Called by the drain (C++, resolve_all) after resolving a wait that got a wake-up time: a
    # completion (or a cancellation's aborted one) before the window ends the sleep.
    def _wake_sleeper(self) -> None:
        w = self._window
        if w is not None and not w.done():
            w.set_result(None)

    # Cancelled by someone else (fut.cancel(), a gather's cancellation) while its coroutine sleeps
    # on the window: it wakes now, not when the reactor's aborted completion is drained.
    def cancel(self, msg: Any = None) -> bool:
        cancelled = super().cancel(msg)
        if cancelled:
            self._wake_sleeper()
        return cancelled

    def _near_the_end(self):
        sink, opened = self._sink, 0
        try:
            # Sleep until the window opens (or the wait ends first).
            self._window = self.get_loop().create_future()
            yield from self._window
            if not self._number or self.done():
                return
            opened, until = time.monotonic_ns(), self._until
            while True:
                sink.poll()  # drains what came: resolves this future and any other
                if self.done():
                    return
                if time.monotonic_ns() >= until:
                    return  # the prediction missed: the eventfd brings the completion
                yield  # one round of the loop's other callbacks
        finally:
            self._window = None
            if self._number:
                # A hit when the completion came while the window was open, however found. On a
                # hit, the timerfd's rearming (a system call) waits for the loop's next round:
                # the coroutine resumes first.
                hit = self.done() and not self.cancelled()
                closed, loop = time.monotonic_ns(), self.get_loop()
                defer = hit and not loop.is_closed()
                sink.window_closed(self._number, hit, opened or closed, closed, not defer)
                self._number = 0
                if defer:
                    loop.call_soon(sink.rearm_timer)

    def __await__(self):
        # One coroutine sleeps and polls per wait; another awaiting the same future meanwhile
        # awaits it as usual.
        if self._wake_at and not self.done() and self._window is None and not self._number:
            try:
                yield from self._near_the_end()
            except asyncio.CancelledError:
                self.cancel()  # the task was cancelled: so is the wait (as when awaiting it)
                raise
        return (yield from super().__await__())

    __iter__ = __await__


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
    r, kind, handle, device = _resolve(x, reactor, "evr.wait")
    sink = _sink_for(loop)
    # Only a wait that will get a wake-up time needs the polling future; the others (irregular
    # work, waits queued behind a scheduled one) are as cheap as asyncio's own futures.
    fut = _GpuWait(loop, sink) if sink.predictable(handle) else _Wait(loop=loop)
    try:
        wake_at = r._impl.wait_async(sink, fut, kind, handle, device)
        if wake_at:
            fut._wake_at = wake_at
    except CudaError as e:  # the device had already failed: the wait fails, the call does not
        fut.set_exception(e)
    return fut


def wait_future(x: Any, *, reactor: Optional[Reactor] = None) -> "concurrent.futures.Future[None]":
    """Like :func:`wait`, for code without an event loop: a ``concurrent.futures.Future``
    (resolved by evr's resolver thread; ``f.result(timeout)``, ``asyncio.wrap_future``)."""
    r, kind, handle, device = _resolve(x, reactor, "evr.wait_future")
    fut: concurrent.futures.Future = concurrent.futures.Future()
    try:
        r._impl.wait_future(fut, kind, handle, device)
    except CudaError as e:  # the device had already failed: the wait fails, the call does not
        fut.set_running_or_notify_cancel()
        fut.set_exception(e)
    return fut


def release_after(x: Any, obj: Any, *, reactor: Optional[Reactor] = None) -> None:
    """Keeps ``obj`` alive until the GPU is past the work queued on ``x`` so far (or the event),
    then drops evr's reference (on the resolver thread, under the GIL). Never early: if the
    reactor refuses the wait, this synchronizes ``x`` first and then raises the refusal."""
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
