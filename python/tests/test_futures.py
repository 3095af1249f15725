"""evr.wait_future, evr.release_after, cancellation."""

import asyncio
import concurrent.futures
import gc
import sys
import time
import weakref

import pytest

import evr
from conftest import run


class Resource:
    pass


def _until(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.002)
    assert cond()


def test_wait_future(dev):
    s = dev.stream()
    dev.launch_kernel(s, 0.02)
    done = dev.event()
    done.record(s)
    f = evr.wait_future(s)
    assert isinstance(f, concurrent.futures.Future)
    assert f.result(10) is None
    assert done.query()


def test_wait_future_many_and_wrapped(dev):
    s = dev.stream()
    futs = []
    for _ in range(1000):
        dev.launch_kernel(s, 0.0)
        futs.append(evr.wait_future(s))
    for f in futs:
        assert f.result(10) is None

    async def main():
        dev.launch_kernel(s, 0.01)
        await asyncio.wrap_future(evr.wait_future(s))

    run(main())


def test_wait_future_cancelled_before_completion(dev):
    s = dev.stream()
    dev.stall(s)
    f = evr.wait_future(s)
    assert f.cancel()
    # The C++ wait is cancelled (evr::wait_handle) while the stream is still stalled.
    _until(lambda: dev.reactor.metrics()["cancelled"] == 1)
    m = dev.reactor.metrics()
    assert (m["cancelled"], m["completed"], m["in_flight"]) == (1, 0, 0)
    dev.resume(s)
    dev.wait_idle()
    time.sleep(0.05)
    assert f.cancelled()
    assert dev.reactor.metrics()["cancelled"] == 1


def test_release_after_keeps_the_object_until_the_gpu_is_past(dev):
    s = dev.stream()
    dev.stall(s)
    dev.launch_kernel(s, 0.0)
    obj = Resource()
    ref = weakref.ref(obj)
    evr.release_after(s, obj)
    del obj
    gc.collect()
    time.sleep(0.05)
    assert ref() is not None, "released before the GPU was past it"
    dev.resume(s)
    deadline = time.monotonic() + 10
    while ref() is not None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert ref() is None


def test_cancel_the_awaiting_task(dev):
    s = dev.stream()
    dev.stall(s)

    async def main():
        fut_refs = []

        async def waiter():
            f = evr.wait(s)
            fut_refs.append(weakref.ref(f))
            await f

        t = asyncio.ensure_future(waiter())
        await asyncio.sleep(0.01)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        # The C++ wait is aborted exactly once, while the GPU work is still pending.
        for _ in range(1000):
            if dev.reactor.metrics()["cancelled"] == 1:
                break
            await asyncio.sleep(0.002)
        m = dev.reactor.metrics()
        assert (m["cancelled"], m["completed"], m["in_flight"]) == (1, 0, 0), m
        dev.resume(s)
        dev.launch_kernel(s, 0.001)
        await evr.wait(s)
        await asyncio.sleep(0.01)
        return fut_refs

    refs = run(main())
    gc.collect()
    assert refs[0]() is None, "the cancelled future leaked"
    m = dev.reactor.metrics()
    assert (m["cancelled"], m["completed"], m["in_flight"]) == (1, 1, 0), m


async def _until_cancelled(dev, n):
    for _ in range(1000):  # the aborts arrive on the reactor thread
        if dev.reactor.metrics()["cancelled"] == n:
            break
        await asyncio.sleep(0.002)
    m = dev.reactor.metrics()
    assert (m["cancelled"], m["completed"], m["in_flight"]) == (n, 0, 0), m


def test_wait_for_timeout_cancels_the_wait(dev):
    """asyncio.wait_for cancels the future it gave up on: the C++ wait is cancelled once."""
    s = dev.stream()
    dev.stall(s)

    async def main():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(evr.wait(s), 0.01)
        await _until_cancelled(dev, 1)
        dev.resume(s)

    run(main())


def test_cancelled_gather_cancels_every_wait(dev):
    s = dev.stream()
    dev.stall(s)

    async def main():
        g = asyncio.gather(evr.wait(s), evr.wait(s), evr.wait(s))
        await asyncio.sleep(0.005)
        g.cancel()
        with pytest.raises(asyncio.CancelledError):
            await g
        await _until_cancelled(dev, 3)
        dev.resume(s)

    run(main())


def test_a_wait_adds_no_callback_to_its_future(dev):
    """Cancellation goes through the future's cancel(), not a done callback: a completion costs
    the loop one callback (the awaiting task's step), not two."""
    s = dev.stream()

    async def main():
        dev.launch_kernel(s, 0.001)
        f = evr.wait(s)
        assert not f._callbacks, f._callbacks
        await f
        assert not f.cancel()  # done: nothing to cancel, and no error

    run(main())
    m = dev.reactor.metrics()
    assert (m["cancelled"], m["completed"], m["in_flight"]) == (0, 1, 0), m


def test_cancel_many_while_others_complete(dev):
    streams = [dev.stream() for _ in range(4)]

    async def main():
        tasks = []
        for i in range(400):
            s = streams[i % 4]
            dev.launch_kernel(s, 0.0002)
            tasks.append(asyncio.ensure_future(evr.wait(s)))
        for t in tasks[::2]:
            t.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for i, r in enumerate(results):
            if i % 2:
                assert r is None
            else:
                assert isinstance(r, asyncio.CancelledError) or r is None
        for _ in range(1000):  # the cancellations' aborts arrive on the reactor thread
            if dev.reactor.metrics()["in_flight"] == 0:
                break
            await asyncio.sleep(0.002)
        return sum(isinstance(r, asyncio.CancelledError) for r in results)

    n_cancelled = run(main())
    m = dev.reactor.metrics()
    # every wait completed exactly once: cancelled in C++ or completed (a future cancelled after
    # its wait completed counts as completed)
    assert m["cancelled"] + m["completed"] == 400 and m["in_flight"] == 0, m
    assert m["cancelled"] <= n_cancelled


def test_interpreter_exits_with_waits_pending(tmp_path):
    import os
    import subprocess

    script = tmp_path / "exit_pending.py"
    script.write_text(
        """
import asyncio, threading, evr, evr.sim
dev = evr.sim.Device()
s = dev.stream()
dev.stall(s)                       # nothing on this stream ever finishes
dev.launch_kernel(s, 0.0)
r = evr.Reactor(device=dev, shutdown_drain=0.1)
f = evr.wait_future(s, reactor=r)
evr.release_after(s, [1, 2, 3], reactor=r)
async def forever():
    try:
        await evr.wait(s, reactor=r)
    except evr.ReactorStopped:   # at exit, once the reactor stops
        pass
    await asyncio.sleep(3600)
loop = asyncio.new_event_loop()
threading.Thread(target=loop.run_until_complete, args=(forever(),), daemon=True).start()
async def main():
    asyncio.ensure_future(evr.wait(s, reactor=r))   # left pending; asyncio.run cancels it
    await asyncio.sleep(0.01)
asyncio.run(main())
print("exiting")
""")
    env = dict(os.environ)
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                       timeout=60)
    took = time.monotonic() - t0
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "exiting"
    assert "Traceback" not in p.stderr and "Fatal" not in p.stderr, p.stderr
    assert took < 20
