"""The event-loop half of evr's Python binding: each loop's completion sink (C++ ``LoopSink``:
its eventfd, its polling timer, the queue the reactor pushes completions onto), the futures
:func:`evr.wait` returns, and the loop's polling windows (:func:`set_loop_spin`). Loop thread
only, except :func:`set_loop_spin` and :func:`loop_stats` (any thread)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Optional

from . import _evr

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
    reactor handed them over), ``late_looks`` (of those, found by a look that came late: they teach
    the stream's model nothing, unless three come in a row), ``model_restarts`` (how often a
    stream's model started again because its work got shorter); ``hop_log2_ns`` (bucket i counts
    completions that took < 2**i ns from the reactor's push to the loop's drain); the polling of
    :func:`set_loop_spin`: ``predicted`` (waits given a wake-up time), ``timer_fires``, ``spins``
    (windows a coroutine polled in), ``spin_hits`` (its completion came meanwhile), ``spin_misses``
    (windows or due waits that passed without it: back to the eventfd), ``not_polled`` (due waits
    nobody awaited), ``window_open`` (a coroutine is polling now), ``in_flight`` (waits of the loop
    not yet drained), ``spin_seconds``, ``lead_seconds`` (how early a window opens), ``models``
    (streams with a learned duration: at most 4096 per loop, then forgotten together);
    ``last_completion_ns``: the last completion drained, as CLOCK_MONOTONIC nanoseconds
    (``time.monotonic_ns()``'s clock) of its submission, the reactor's push and the loop's drain
    (zeros before the first)."""
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
