"""Signal slots from Python (evr.SignalSlot): a wait on a ticket completes after the work queued
before its signal, once and in order; faults, cancellation and a signal that never comes are
reported; bad input is refused with an error that names it. On the simulated device, whose
enqueue_signal is a zero-length kernel that signals (CUDA graph capture needs the GPU:
test_gpu.py)."""

import asyncio
import concurrent.futures
import gc

import pytest

import evr
import evr.sim
from conftest import run


async def _until(predicate, what, timeout=20.0):
    """Yields to the loop until `predicate()` holds (bounded): the reactor works on its own thread."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        assert loop.time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


def test_a_ticket_completes_only_after_the_work_before_its_signal():
    dev = evr.sim.Device(mode="manual")
    r = evr.Reactor(device=dev, shutdown_drain=0.2)
    try:
        s = dev.stream()
        slot = r.signal_slot()
        assert slot.device == 0 and slot.armed == 0 and slot.signalled == 0

        async def main():
            dev.launch_kernel(s, 0.0)  # library work: knows nothing of the slot
            slot.enqueue_signal(s)
            fut = evr.wait(slot.arm(s), reactor=r)
            sweeps = r.metrics()["sweeps"]
            # The reactor looks several times while only the work has run: no completion.
            assert dev.step(s, 1) == 1
            await _until(lambda: r.metrics()["sweeps"] >= sweeps + 3, "the reactor's sweeps")
            assert not fut.done(), "the wait completed before its signal"
            assert slot.signalled == 0
            assert dev.step(s, 1) == 1  # the signal
            await fut
            assert slot.signalled == 1 and slot.armed == 1

        run(main())
    finally:
        r.shutdown()


def test_many_tickets_complete_once_each_in_order(dev, reactor):
    streams = [dev.stream() for _ in range(4)]
    slots = [reactor.signal_slot() for _ in streams]

    async def lane(i, order):
        s, slot = streams[i], slots[i]
        for k in range(25):
            dev.launch_kernel(s, 0.0005)
            slot.enqueue_signal(s)
            t = slot.arm(s)
            assert t.value == k + 1 and t.stream == s.handle
            await evr.wait(t)  # through the slot's own reactor
            order.append((i, k))

    async def main():
        order = []
        await asyncio.gather(*(lane(i, order) for i in range(4)))
        return order

    order = run(main())
    assert sorted(order) == [(i, k) for i in range(4) for k in range(25)]  # each exactly once
    for i in range(4):
        assert [k for j, k in order if j == i] == list(range(25))
    assert all(slot.signalled == 25 for slot in slots)
    assert dev.counters()["event_records"] == 0  # nothing of evr's on the streams


def test_waits_queued_ahead_of_their_signals_complete_in_order(dev, reactor):
    s = dev.stream()
    slot = reactor.signal_slot()

    async def main():
        done = []
        futs = []
        dev.stall(s)
        for i in range(10):
            dev.launch_kernel(s, 0.0)
            slot.enqueue_signal(s)
            f = evr.wait(slot.arm(s))
            f.add_done_callback(lambda _f, i=i: done.append(i))
            futs.append(f)
        assert not any(f.done() for f in futs)
        dev.resume(s)
        await asyncio.gather(*futs)
        return done

    assert run(main()) == list(range(10))


def test_wait_future_and_release_after_take_tickets(dev, reactor):
    s = dev.stream()
    slot = reactor.signal_slot()
    dev.launch_kernel(s, 0.005)
    slot.enqueue_signal(s)
    fut = evr.wait_future(slot.arm(s))
    assert isinstance(fut, concurrent.futures.Future)
    fut.result(timeout=20)
    assert slot.signalled == 1

    class Buffer:
        pass

    buf = Buffer()
    released = concurrent.futures.Future()
    import weakref
    ref = weakref.finalize(buf, lambda: released.set_result(True))
    dev.launch_kernel(s, 0.005)
    slot.enqueue_signal(s)
    evr.release_after(slot.arm(s), buf)
    del buf
    assert released.result(timeout=20)
    assert slot.signalled == 2 and not ref.alive


def test_a_fault_before_the_signal_fails_the_wait(dev, reactor):
    s = dev.stream()
    slot = reactor.signal_slot()

    async def main():
        dev.launch_faulting_kernel(s, 700)
        with pytest.raises(evr.CudaError) as e:
            # The device runs by itself: a fault that already happened is sticky, and the signal's
            # launch reports it (as CUDA's next call does on a GPU); else the wait does.
            slot.enqueue_signal(s)
            await evr.wait(slot.arm(s))
        assert e.value.code == 700

    run(main())


def test_a_signal_that_never_comes_fails_the_wait(dev):
    r = evr.Reactor(device=dev, shutdown_drain=0.2, fault_probe_interval=0.005)
    try:
        s = dev.stream()
        slot = r.signal_slot()

        async def main():
            dev.launch_kernel(s, 0.001)  # work without the signal (a graph that lacks its node)
            with pytest.raises(evr.EvrError, match="signal"):
                await evr.wait(slot.arm(s))

        run(main())
    finally:
        r.shutdown()


def test_cancelling_a_wait_on_a_ticket_leaves_the_slot_usable(dev, reactor):
    s = dev.stream()
    slot = reactor.signal_slot()

    async def main():
        dev.stall(s)
        dev.launch_kernel(s, 0.0)
        slot.enqueue_signal(s)
        task = asyncio.ensure_future(evr.wait(slot.arm(s)))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        dev.resume(s)
        dev.launch_kernel(s, 0.0)
        slot.enqueue_signal(s)
        await evr.wait(slot.arm(s))
        assert slot.signalled == 2

    run(main())
    m = reactor.metrics()
    assert m["cancelled"] == 1 and m["completed"] == 1


def test_bad_input_is_refused_with_an_error_that_names_it(dev, reactor):
    s = dev.stream()
    slot = reactor.signal_slot()
    with pytest.raises(TypeError, match="expected a stream"):
        e = dev.event()
        e.record(s)
        slot.arm(evr.event_handle(e.handle))
    with pytest.raises(TypeError, match="SignalSlot.enqueue_signal"):
        slot.enqueue_signal("not a stream")
    other = evr.sim.Device()
    try:
        with pytest.raises(evr.EvrValueError, match="another device"):
            slot.enqueue_signal(other.stream())
        other_slot = other.reactor.signal_slot()
        ticket = other_slot.arm(other.stream())

        async def main():
            with pytest.raises(evr.EvrValueError, match="another evr.Reactor"):
                evr.wait(ticket, reactor=reactor)
            with pytest.raises(TypeError, match="reactor must be an evr.Reactor"):
                evr.wait(ticket, reactor="r")

        run(main())
    finally:
        other.shutdown()
    with pytest.raises(TypeError, match="device must be"):
        reactor.signal_slot(device="0")
    with pytest.raises(evr.EvrError):
        reactor.signal_slot(device=7)  # one simulated device
    slot.release()
    slot.release()  # idempotent
    assert slot.device == -1
    with pytest.raises(evr.EvrValueError):
        slot.enqueue_signal(s)
    with pytest.raises(evr.EvrValueError):
        slot.arm(s)
    assert dev.counters()["event_records"] == 1  # only the test's own event


def test_a_second_device_signals_its_own_slots():
    dev = evr.sim.Device(devices=2)
    r = evr.Reactor(device=dev, shutdown_drain=0.2)
    try:
        s0, s1 = dev.stream(0), dev.stream(1)
        slot1 = r.signal_slot(1)
        assert slot1.device == 1
        with pytest.raises(evr.EvrValueError, match="device"):
            slot1.enqueue_signal(s0)
        with pytest.raises(evr.EvrValueError, match="device"):
            slot1.arm(s0)  # the reactor would watch the wrong stream for the signal
        assert slot1.armed == 0

        async def main():
            dev.launch_kernel(s1, 0.001)
            slot1.enqueue_signal(s1)
            await evr.wait(slot1.arm(s1))

        run(main())
        assert slot1.signalled == 1
    finally:
        r.shutdown()


@pytest.mark.parametrize("strategy", ["poll", "host_func"])
def test_strategies_without_fence_words_refuse_ticket_waits(dev, strategy):
    r = evr.Reactor(strategy, device=dev, shutdown_drain=0.2)
    try:
        s = dev.stream()
        slot = r.signal_slot()
        slot.enqueue_signal(s)

        async def main():
            with pytest.raises(evr.EvrError, match="not supported|unsupported"):
                await evr.wait(slot.arm(s), reactor=r)

        run(main())
    finally:
        r.shutdown()


def test_the_last_ticket_frees_its_slot_before_its_device():
    """A ticket that outlives every other object of its simulated device gives its slot back
    while the device still exists (the slot's memory is the device's)."""
    dev = evr.sim.Device()
    r = evr.Reactor(device=dev, shutdown_drain=0.2)
    s = dev.stream()
    slot = r.signal_slot()
    ticket = slot.arm(s)
    r.shutdown()
    del slot, r, dev, s
    gc.collect()
    assert ticket.value == 1
    del ticket
    gc.collect()


def test_a_ticket_keeps_its_slot_and_reactor_alive(dev):
    r = evr.Reactor(device=dev, shutdown_drain=0.2)
    s = dev.stream()
    slot = r.signal_slot()
    dev.launch_kernel(s, 0.001)
    slot.enqueue_signal(s)
    ticket = slot.arm(s)
    del slot, r
    gc.collect()
    assert ticket.reactor.backend == "sim"

    async def main():
        await evr.wait(ticket)

    run(main())
    ticket.reactor.shutdown()


def test_shutdown_with_ticket_waits_pending(dev):
    """A shutdown while ticket waits are pending fails each once with ReactorStopped; later
    ticket waits are refused with it; the slot outlives the reactor's stop."""
    r = evr.Reactor(device=dev, shutdown_drain=0.05)
    s = dev.stream()
    slot = r.signal_slot()
    dev.stall(s)
    dev.launch_kernel(s, 0.0)
    slot.enqueue_signal(s)

    async def main():
        tickets = [slot.arm(s) for _ in range(20)]  # one signal queued: 19 would never come
        futs = [evr.wait(t) for t in tickets]
        cf = evr.wait_future(tickets[0])
        await asyncio.get_running_loop().run_in_executor(None, r.shutdown)
        results = await asyncio.gather(*futs, return_exceptions=True)
        assert all(isinstance(x, evr.ReactorStopped) for x in results), results[:3]
        with pytest.raises(evr.ReactorStopped):
            cf.result(5)
        with pytest.raises(evr.ReactorStopped):
            evr.wait(slot.arm(s))

    run(main())
    dev.resume(s)
    dev.wait_idle()
    assert slot.signalled == 1
    m = r.metrics()
    assert m["in_flight"] == 0 and m["completed"] == 0, m
