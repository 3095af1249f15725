"""Signal slots: a wait on library work (torch, cuBLAS, CuPy) that is a memory read.

A wait on a stream puts a marker behind the work; with more busy streams than the GPU has
hardware queues, that marker is an event and every look at it is a driver query. A slot is a word
in host memory that evr's own one-thread kernel writes: captured as the last node of a CUDA
graph, it signals on every replay, holds no hardware queue, and a wait on it is a read of the
word (docs/python.md, "Library work in a CUDA graph")::

    slot = reactor.signal_slot()                 # once per stream (or lane)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        y = model(x)
        slot.enqueue_signal(s)                   # captured: the graph's last node
    ...
    ticket = slot.arm(s)                         # per replay
    with torch.cuda.stream(s):
        g.replay()
    await evr.wait(ticket)                       # after the replay is queued, never before

Outside a capture, enqueue_signal queues the kernel behind the stream's work at once; that
kernel waits on the GPU for the work before it and holds a shared hardware queue as it does (as a
fence write would): there, wait on the stream instead.
"""

from __future__ import annotations

from typing import Any

from . import _evr, _targets
from ._errors import EvrValueError


class SignalSlot:
    """One signal slot of a reactor's pool, of one device (take it with Reactor.signal_slot or
    evr.signal_slot). Each ``arm(stream)`` names the next signal; ``enqueue_signal(stream)`` queues
    (or, in a capture, records) one signal. Arm once per signal, in the order the signals are
    given. Given back to the pool by ``release()`` or the end of a ``with`` block; a graph that
    names the slot must not run after that. Not for use from several threads at once."""

    __slots__ = ("_impl", "reactor", "__weakref__")

    def __init__(self, impl: Any, reactor: Any) -> None:
        self._impl = impl
        self.reactor = reactor

    @property
    def device(self) -> int:
        """The device whose kernels signal it (-1 once released)."""
        return self._impl.device

    @property
    def armed(self) -> int:
        """Signals armed so far, over the slot's life (its owners before this one included)."""
        return self._impl.armed

    @property
    def signalled(self) -> int:
        """Signals that have landed so far."""
        return self._impl.signalled

    def enqueue_signal(self, stream: Any) -> None:
        """Queues a signal of this slot on ``stream`` (a stream that evr.wait accepts), behind
        the work queued there: while ``stream`` is captured into a CUDA graph, the graph's node
        that signals on every replay. Raises EvrValueError for a stream of another device than
        the slot's or a released slot, CudaError when CUDA refuses the launch."""
        self._impl.enqueue_signal(self._stream(stream, "SignalSlot.enqueue_signal"))

    def arm(self, stream: Any) -> "_evr.SignalTicket":
        """The next signal of this slot, given by work on ``stream``: what ``evr.wait``,
        ``evr.wait_future`` and ``evr.release_after`` take, once the launch that gives the signal
        is queued on ``stream`` (a wait started before it finds the stream without the signal).
        ``stream`` is probed for faults; when it is idle and the signal never came (a graph
        replayed without its signal node), the wait fails with EvrError (not_signalled). Raises
        EvrValueError for a stream of another device than the slot's or a released slot."""
        return self._impl.arm(self._stream(stream, "SignalSlot.arm"))

    def release(self) -> None:
        """Gives the slot back (held from reuse until every armed signal landed). Idempotent."""
        self._impl.release()

    def __enter__(self) -> "SignalSlot":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __repr__(self) -> str:
        return (f"<evr.SignalSlot device={self.device} armed={self.armed} "
                f"signalled={self.signalled}>")

    def _stream(self, stream: Any, what: str) -> int:
        from . import sim

        if isinstance(stream, sim.Stream):
            if stream.device is not self.reactor.device:
                raise EvrValueError(f"{what}: this evr.sim.Stream belongs to another device than "
                                    "the slot's reactor")
            return stream.handle
        kind, handle, _ = _targets.read(stream, what)
        if kind != _targets.STREAM:
            raise TypeError(f"{what}: expected a stream, got an event ({type(stream).__name__})")
        return handle


def take_slot(reactor: Any, device: Any) -> SignalSlot:
    """reactor.signal_slot(device): a slot of `reactor`'s pool."""
    if device is None:
        device = -1
    elif isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise TypeError(f"evr.signal_slot: device must be an int >= 0 or None (the current "
                        f"device), got {device!r}")
    return SignalSlot(reactor._impl.signal_slot(reactor, device), reactor)


def reactor_of(ticket: Any, reactor: Any, what: str) -> Any:
    """The reactor a wait on `ticket` goes to: its slot's; EvrValueError if `reactor` is another."""
    own = ticket.reactor
    if reactor is None:
        return own
    from . import Reactor  # only when given: not on every wait's path

    if not isinstance(reactor, Reactor):
        raise TypeError(f"{what}: reactor must be an evr.Reactor, got {type(reactor).__name__}")
    if reactor is not own:
        raise EvrValueError(f"{what}: this signal ticket's slot belongs to another evr.Reactor; "
                            "wait on it through the reactor the slot was taken from")
    return own
