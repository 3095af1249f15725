"""await evr.wait(x) for every accepted stream/event type, many waits, strategies, loops."""

import asyncio
import threading
import time

import pytest

import evr
import evr.sim
from conftest import run
from fakes import (CupyLikeEvent, CupyLikeStream, ProtocolStream, TorchLikeEvent,
                   TorchLikeStream)

KERNEL = 0.03  # seconds


async def _timed_wait(dev, stream, target, reactor=None):
    # Before the launch: the simulated kernel runs KERNEL from when it starts, after the launch,
    # so the wait cannot end sooner than KERNEL after t0 (same clock: CLOCK_MONOTONIC) whatever
    # the scheduling. (Taken after the launch, as it was, a loaded machine that paused this
    # thread between the launch and t0 made the wait look short: 23.7 ms of 30.)
    t0 = time.perf_counter()
    dev.launch_kernel(stream, KERNEL)
    # An event after the kernel says whether it is done (the stream itself may still be running
    # a marker the reactor put after it, e.g. a host function).
    done = dev.event()
    done.record(stream)
    await evr.wait(target, reactor=reactor)
    elapsed = time.perf_counter() - t0
    assert done.query(), "the wait finished before the stream's work"
    assert elapsed >= KERNEL
    return elapsed


def test_sim_stream(dev):
    s = dev.stream()
    run(_timed_wait(dev, s, s))


def test_sim_event(dev):
    s = dev.stream()

    async def main():
        dev.launch_kernel(s, KERNEL)
        e = dev.event()
        e.record(s)
        dev.launch_kernel(s, 10.0)  # work after the record: not waited for
        await evr.wait(e)
        assert e.query()
        assert not s.query()

    run(main())


@pytest.mark.parametrize("make", [int, ProtocolStream, TorchLikeStream, CupyLikeStream],
                         ids=["int", "__cuda_stream__", "cuda_stream", "cupy_ptr"])
def test_stream_protocols(dev, reactor, make):
    s = dev.stream()
    run(_timed_wait(dev, s, make(s.handle), reactor=reactor))


@pytest.mark.parametrize("make", [TorchLikeEvent, CupyLikeEvent, evr.event_handle],
                         ids=["cuda_event", "cupy_event_ptr", "event_handle"])
def test_event_protocols(dev, reactor, make):
    s = dev.stream()

    async def main():
        dev.launch_kernel(s, KERNEL)
        e = dev.event()
        e.record(s)
        dev.launch_kernel(s, 10.0)
        await evr.wait(make(e.handle), reactor=reactor)
        assert e.query() and not s.query()

    run(main())


def test_reactor_wait_method(dev, reactor):
    s = dev.stream()

    async def main():
        await _timed_wait(dev, s, s, reactor=reactor)

    run(main())


@pytest.mark.parametrize("strategy", ["adaptive", "fence", "poll", "host_func"])
def test_strategies(dev, strategy):
    with evr.Reactor(strategy, device=dev, shutdown_drain=0.2) as r:
        assert r.strategy == strategy and r.backend == "sim"
        streams = [dev.stream() for _ in range(4)]

        async def main():
            futs, marks = [], []
            for i in range(200):
                s = streams[i % 4]
                dev.launch_kernel(s, 0.0005 * (i % 3))
                e = dev.event()
                e.record(s)
                marks.append(e)
                futs.append(evr.wait(s, reactor=r))
            await asyncio.gather(*futs)
            assert all(e.query() for e in marks)

        run(main())
        assert r.metrics()["completed"] == 200


def test_many_concurrent_waits_exactly_once(dev, reactor):
    streams = [dev.stream() for _ in range(8)]
    n = 5000
    resumed = [0] * n

    async def one(i):
        s = streams[i % len(streams)]
        dev.launch_kernel(s, 0.00001 if i % 7 == 0 else 0.0)
        await evr.wait(s, reactor=reactor)
        resumed[i] += 1

    async def main():
        await asyncio.gather(*(one(i) for i in range(n)))

    run(main())
    assert resumed == [1] * n
    m = reactor.metrics()
    assert m["submitted"] == n and m["completed"] == n and m["in_flight"] == 0


def test_uvloop(dev, reactor):
    uvloop = pytest.importorskip("uvloop")
    s = dev.stream()

    async def main():
        futs = []
        for _ in range(500):
            dev.launch_kernel(s, 0.0)
            futs.append(evr.wait(s, reactor=reactor))
        await asyncio.gather(*futs)
        await _timed_wait(dev, s, s, reactor=reactor)

    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(main(), 30))
    finally:
        loop.close()


def test_two_loops_in_two_threads(dev, reactor):
    results = {}

    def worker(name):
        s = dev.stream()

        async def main():
            for _ in range(200):
                dev.launch_kernel(s, 0.0001)
                await evr.wait(s, reactor=reactor)
            futs = []
            for _ in range(300):
                dev.launch_kernel(s, 0.0)
                futs.append(evr.wait(s, reactor=reactor))
            await asyncio.gather(*futs)
            return threading.get_ident()

        try:
            results[name] = run(main())
        except BaseException as e:  # noqa: BLE001 - reported below
            results[name] = e

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 2
    for v in results.values():
        assert isinstance(v, int), v
    assert results[0] != results[1]


def test_loop_reused_after_another_loop(dev, reactor):
    """A loop that is stopped and run again still gets its completions; a closed loop's
    pending completions are dropped without harm."""
    s = dev.stream()
    loop = asyncio.new_event_loop()
    try:
        dev.launch_kernel(s, 0.01)
        loop.run_until_complete(loop.create_task(_wait_in(s, reactor)))
        dev.launch_kernel(s, 0.01)
        loop.run_until_complete(loop.create_task(_wait_in(s, reactor)))
    finally:
        loop.close()
    run(_timed_wait(dev, s, s, reactor=reactor))


async def _wait_in(s, reactor):
    await evr.wait(s, reactor=reactor)


def test_waits_the_loop_does_not_poll_for_are_not_spun_for():
    """A wait the loop does not poll for (here every wait: set_loop_spin(0)) reaches the loop
    through its eventfd, tens of us after the reactor hands it over: the reactor looks at its
    stream on the poll tick (wait_target::unhurried) instead of spinning through its window."""
    dev = evr.sim.Device()
    tick, work = 100e-6, 0.002  # the reactor's poll tick (set: the bound below follows from it)
    r = evr.Reactor(device=dev, shutdown_drain=0.2, poll_period=tick)
    s = dev.stream()
    n, warm = 40, 10
    evr.set_loop_spin(0)
    try:
        async def main():
            for i in range(n):
                if i == warm:  # the stream's model has learned the steady work by now
                    before, start = r.metrics()["sweeps"], time.monotonic()
                dev.launch_kernel(s, work)
                await evr.wait(s, reactor=r)
            return r.metrics()["sweeps"] - before, time.monotonic() - start

        sweeps, elapsed = run(main())
        per_wait, ticks_per_wait = sweeps / (n - warm), elapsed / tick / (n - warm)
        print(f"{per_wait:.1f} sweeps a wait over {ticks_per_wait:.1f} ticks")
        # On the tick: at most one sweep a tick however long the window (a loaded machine makes
        # the work look irregular and the window as long as the wait), and a few around the
        # submission and the completion. Counted against the ticks the waits took, not the work's
        # length: a loaded machine makes a wait last longer than its 2 ms. Spun for, it was
        # hundreds of sweeps a wait.
        assert per_wait <= ticks_per_wait + 8
        assert r.metrics()["completed"] == n
    finally:
        evr.set_loop_spin(200e-6)
        r.shutdown()
        dev.shutdown()
