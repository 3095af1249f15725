"""The loop's hybrid polling (evr.set_loop_spin): predictable streams get a wake-up just before
their predicted end, missed predictions fall back to the eventfd, and nothing is lost either way.
"""

import asyncio
import time

import pytest

import evr
import evr.sim
from conftest import run
from loop_helpers import REGULAR, attempts, hop_total, kernel_then_wait, settled

def test_regular_work_is_predicted_and_polled(dev, reactor, spin_default):
    s = dev.stream()

    async def main():
        assert evr.loop_stats() is None  # this loop has not waited yet
        # 15 waits, more while none was predicted yet (see attempts)
        for i in attempts():
            assert await kernel_then_wait(dev, s, reactor, REGULAR) >= REGULAR * 0.8
            if i >= 14 and evr.loop_stats()["spins"] >= 1:
                break
        return evr.loop_stats()

    st = run(main())
    n = st["completions"]
    # Each completion reached the loop once: pushed by the reactor and drained, or seen in its
    # fence word by a poll (the sim's default strategy gives a lone stream fence words).
    assert n >= 15 and hop_total(st) + st["probe_hits"] == n, st
    assert st["probe_hits"] <= st["predicted"], st
    # The first three samples train the model; the later waits get a wake-up time.
    assert st["predicted"] >= 1, st
    assert st["timer_fires"] >= 1, st
    assert st["spins"] >= 1 and st["spins"] + st["not_polled"] <= st["timer_fires"], st
    assert st["spin_hits"] + st["spin_misses"] >= st["spins"], st
    assert st["spin_seconds"] >= 0 and st["lead_seconds"] > 0
    m = settled(reactor)
    assert m["completed"] == n and m["in_flight"] == 0


def test_stages_of_the_last_completion(dev, reactor, spin_default):
    """loop_stats()["last_completion_ns"]: submission <= the reactor's push <= the loop's drain,
    all on time.monotonic_ns()'s clock, and after the kernel's own length."""
    s = dev.stream()

    async def main():
        t0 = time.monotonic_ns()  # before the launch: the work takes 2 ms from here at least
        dev.launch_kernel(s, 0.002)
        await evr.wait(s, reactor=reactor)
        t1 = time.monotonic_ns()
        return t0, t1, evr.loop_stats()

    t0, t1, st = run(main())
    submitted, pushed, drained = st["last_completion_ns"]
    assert t0 <= submitted <= pushed <= drained <= t1, (t0, submitted, pushed, drained, t1)
    assert pushed - t0 >= 0.002 * 0.8e9  # the reactor pushed it after the work ran
    # The reactor counts its delivering pass after the push that resumed us: wait for it.
    deadline = time.monotonic() + 5
    while reactor.metrics()["busy_seconds"] == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    m = settled(reactor)
    for key in ("sweeps", "event_queries", "parks", "wakeups", "prediction_misses"):
        assert m[key] >= 0, key
    assert m["sweeps"] >= 1 and m["busy_seconds"] > 0
    assert sum(m["detect_to_deliver_log2_ns"]) == m["completed"] == 1
    assert len(m["nap_overshoot_log2_ns"]) == 40


def test_disabled_never_arms_the_timer(dev, reactor, spin_default):
    s = dev.stream()
    evr.set_loop_spin(0)

    async def main():
        for _ in range(10):
            await kernel_then_wait(dev, s, reactor, REGULAR)
        return evr.loop_stats()

    st = run(main())
    assert st["completions"] == 10
    assert st["predicted"] == 0 and st["timer_fires"] == 0 and st["spins"] == 0


def test_missed_prediction_falls_back(dev, reactor, spin_default):
    s = dev.stream()

    async def main():
        n = 0
        for _ in range(20):  # retried while the long wait was not predicted (a loaded machine)
            for _ in attempts():  # regular waits until one is predicted
                n += 1
                before = evr.loop_stats() or {"predicted": 0}
                await kernel_then_wait(dev, s, reactor, REGULAR)
                if evr.loop_stats()["predicted"] > before["predicted"]:
                    break
            # Ten times longer than the model learned: the window near 5 ms passes in vain, and
            # the completion comes later through the eventfd.
            long = 10 * REGULAR
            t0 = time.perf_counter()
            dev.launch_kernel(s, long)
            fut = evr.wait(s, reactor=reactor)
            predicted = getattr(fut, "_wake_at", 0)
            await fut
            n += 1
            assert time.perf_counter() - t0 >= long * 0.8
            if predicted:
                return n, evr.loop_stats()
        pytest.fail("the long wait was never predicted")

    n, st = run(main(), timeout=120)
    assert st["completions"] == n
    assert st["spin_misses"] >= 1, st


def test_cancelling_a_predicted_wait(dev, reactor, spin_default):
    s = dev.stream()

    async def main():
        for _ in range(8):
            await kernel_then_wait(dev, s, reactor, REGULAR)
        dev.launch_kernel(s, 10 * REGULAR)
        task = asyncio.ensure_future(evr.wait(s, reactor=reactor))
        await asyncio.sleep(REGULAR / 2)  # the wait is scheduled for a wake-up at ~5 ms
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await kernel_then_wait(dev, s, reactor, REGULAR)  # the loop still works
        return evr.loop_stats()

    st = run(main())
    assert st["completions"] == 10  # the cancelled wait completed once (aborted), and drained
    m = settled(reactor)
    assert m["cancelled"] == 1 and m["in_flight"] == 0


def test_cancelled_while_polling(dev, reactor, spin_default):
    """A task cancelled while its wait's window is open: the wait is cancelled (completes once,
    aborted), the window closes at once, and the loop goes on."""
    s = dev.stream()

    async def awaiting(fut):
        await fut

    async def main():
        # Retried when the window came and went unseen (a loaded machine may not run this
        # task during it) or the wait was not predicted: each attempt ends its long kernel.
        for _ in range(20):
            for _ in attempts():  # until the model predicts (a loaded machine scatters kernels)
                before = evr.loop_stats() or {"predicted": 0}
                await kernel_then_wait(dev, s, reactor, REGULAR)
                if evr.loop_stats()["predicted"] > before["predicted"]:
                    break
            dev.launch_kernel(s, 10 * REGULAR)  # 50 ms: the window (near 5 ms) passes in vain
            fut = evr.wait(s, reactor=reactor)
            task = asyncio.create_task(awaiting(fut))
            if not getattr(fut, "_wake_at", 0):  # not predicted after all
                await task
                continue
            # Its own window (the timer stays disarmed while an earlier one is open).
            while not fut._number and not task.done():
                await asyncio.sleep(0)
            if task.done():
                continue
            # No await between seeing the window open and the cancel: it is still open.
            st = evr.loop_stats()
            assert st["window_open"]
            polls_before = st["spins"]
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert fut.cancelled()
            st = evr.loop_stats()
            assert not st["window_open"] and st["spins"] == polls_before + 1, st
            await asyncio.sleep(10 * REGULAR)  # the long kernel ends
            await kernel_then_wait(dev, s, reactor, REGULAR)  # the loop goes on
            return True
        return False

    assert run(main(), timeout=120), "no attempt saw the predicted wait's window open"
    m = settled(reactor)
    assert m["cancelled"] == 1 and m["in_flight"] == 0, m


def test_two_coroutines_awaiting_one_predicted_wait(dev, reactor, spin_default):
    """The first awaiter sleeps until the window and polls; a second one on the same future
    awaits it as usual: both resume, once each."""
    s = dev.stream()

    async def main():
        fut = await _predicted_wait(dev, s, reactor, None)
        resumed = []

        async def awaiting(name):
            await fut
            resumed.append(name)

        await asyncio.gather(awaiting("a"), awaiting("b"))
        return sorted(resumed)

    assert run(main()) == ["a", "b"]
    m = settled(reactor)
    assert m["in_flight"] == 0


def test_at_most_max_waits_of_a_loop_are_predicted_at_once(dev, reactor, spin_default):
    """With many predicted waits in flight a loop is busy with their completions: only the first
    max_waits of them get a wake-up time, the others come through the eventfd, all exactly once."""
    streams = [dev.stream() for _ in range(8)]

    async def main():
        for _ in attempts():  # every stream's model learned (see attempts)
            for s in streams:
                dev.launch_kernel(s, REGULAR)
            futs = [evr.wait(s, reactor=reactor) for s in streams]
            predicted = sum(1 for f in futs if getattr(f, "_wake_at", 0))
            await asyncio.gather(*futs)
            if predicted:
                break
        # The models hold now: 8 waits submitted together, the first 4 predicted.
        for s in streams:
            dev.launch_kernel(s, REGULAR)
        futs = [evr.wait(s, reactor=reactor) for s in streams]
        predicted = [bool(getattr(f, "_wake_at", 0)) for f in futs]
        assert await asyncio.gather(*futs) == [None] * len(streams)
        evr.set_loop_spin(200e-6, max_waits=2)
        for s in streams:
            dev.launch_kernel(s, REGULAR)
        futs = [evr.wait(s, reactor=reactor) for s in streams]
        predicted_two = [bool(getattr(f, "_wake_at", 0)) for f in futs]
        assert await asyncio.gather(*futs) == [None] * len(streams)
        return predicted, predicted_two

    predicted, predicted_two = run(main())
    # Without the limit all 8 (each stream has a model and nothing scheduled) would be.
    assert 1 <= sum(predicted) <= 4, predicted
    assert sum(predicted_two) <= 2, predicted_two
    m = settled(reactor)
    assert m["in_flight"] == 0


def test_waits_in_flight_without_a_wake_up_time_count_against_max_waits(dev, reactor, spin_default):
    """A loop with max_waits waits in flight gives no window to the next, even when none of those
    has a wake-up time (streams without a model): it is busy with their completions. Once they
    have drained, the same stream's next wait gets one again."""
    learned = dev.stream()
    others = [dev.stream() for _ in range(4)]  # fresh streams: no model, so never predicted

    async def main():
        for _ in attempts():  # `learned` gets a model (see attempts)
            dev.launch_kernel(learned, REGULAR)
            fut = evr.wait(learned, reactor=reactor)
            await fut
            if getattr(fut, "_wake_at", 0):
                break
        else:
            pytest.fail("the stream was never predicted")
        for s in others:
            dev.launch_kernel(s, 20 * REGULAR)  # in flight while `learned` is waited on
        busy = [evr.wait(s, reactor=reactor) for s in others]
        assert not any(getattr(f, "_wake_at", 0) for f in busy)
        assert evr.loop_stats()["in_flight"] == 4
        dev.launch_kernel(learned, REGULAR)
        crowded = evr.wait(learned, reactor=reactor)
        crowded_predicted = bool(getattr(crowded, "_wake_at", 0))
        assert await asyncio.gather(crowded, *busy) == [None] * 5
        assert evr.loop_stats()["in_flight"] == 0
        for _ in attempts():  # alone again: predicted (unless a loaded machine scattered it)
            dev.launch_kernel(learned, REGULAR)
            fut = evr.wait(learned, reactor=reactor)
            await fut
            if getattr(fut, "_wake_at", 0):
                return crowded_predicted, True
        return crowded_predicted, False

    crowded_predicted, predicted_again = run(main())
    assert not crowded_predicted
    assert predicted_again
    assert settled(reactor)["in_flight"] == 0


def test_loop_spin_arguments_checked():
    with pytest.raises(ValueError, match="max_waits"):
        evr.set_loop_spin(200e-6, max_waits=0)
    with pytest.raises(TypeError, match="max_waits must be an int"):
        evr.set_loop_spin(200e-6, max_waits=2.5)


async def _predicted_wait(dev, s, reactor, seconds):
    """Regular waits until one is predicted; returns that one's future (its kernel of `seconds`
    launched), or fails (see attempts)."""
    for _ in attempts():
        dev.launch_kernel(s, REGULAR if seconds is None else seconds)
        fut = evr.wait(s, reactor=reactor)
        if getattr(fut, "_wake_at", 0):  # a polling future: predicted
            return fut
        await fut
    pytest.fail("no wait was predicted in 10 s of regular ones")


def test_future_cancelled_while_its_coroutine_sleeps(dev, reactor, spin_default):
    """fut.cancel() from elsewhere while the awaiting coroutine sleeps until its window: the
    coroutine raises CancelledError, and the C++ wait is cancelled once."""
    s = dev.stream()

    async def main():
        fut = await _predicted_wait(dev, s, reactor, 10 * REGULAR)

        async def awaiting():
            await fut

        task = asyncio.create_task(awaiting())
        while fut._window is None:  # the coroutine sleeps on its window
            await asyncio.sleep(0)
        fut.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(10 * REGULAR)  # the long kernel ends

    run(main())
    m = settled(reactor)
    assert m["cancelled"] == 1 and m["in_flight"] == 0, m


def test_polling_switched_off_and_on_mid_window(dev, reactor, spin_default):
    """set_loop_spin(0) while a window is open forgets it; switched on again, the next predicted
    waits are polled as before, and the old window's close does not close a new one."""
    s = dev.stream()

    async def _await(fut):
        await fut

    async def scenario():
        fut = await _predicted_wait(dev, s, reactor, 10 * REGULAR)
        task = asyncio.create_task(_await(fut))
        deadline = time.monotonic() + 5
        while not fut._number and not task.done():
            assert time.monotonic() < deadline
            await asyncio.sleep(0)
        evr.set_loop_spin(0)  # forgets the open window; its poller ends at its window's end
        assert not evr.loop_stats()["window_open"]
        evr.set_loop_spin(200e-6)
        await task
        spins = evr.loop_stats()["spins"]
        for _ in attempts():  # polled again once predicted again
            await kernel_then_wait(dev, s, reactor, REGULAR)
            if evr.loop_stats()["spins"] > spins:
                break
        st = evr.loop_stats()
        assert st["spins"] > spins and not st["window_open"], st

    run(scenario(), timeout=60)
    m = settled(reactor)
    assert m["in_flight"] == 0 and m["completed"] >= 1


def test_uvloop_polls_too(dev, reactor, spin_default):
    uvloop = pytest.importorskip("uvloop")
    s = dev.stream()

    async def main():
        # 12 waits, more while no wait was predicted yet: on a loaded machine the simulated
        # kernels scatter, and the model waits for a few regular ones before it predicts.
        for i in attempts():
            await kernel_then_wait(dev, s, reactor, REGULAR)
            if i >= 11 and evr.loop_stats()["spins"] >= 1:
                break
        return evr.loop_stats()

    loop = uvloop.new_event_loop()
    try:
        st = loop.run_until_complete(asyncio.wait_for(main(), 30))
    finally:
        loop.close()
    assert st["completions"] >= 12 and st["predicted"] >= 1 and st["spins"] >= 1, st


def test_models_stay_bounded_with_ever_new_handles(dev, reactor, spin_default):
    # A program that records a new event per request: one model per distinct handle, capped.
    s = dev.stream()

    async def main():
        events = []
        for _ in range(4200):
            e = dev.event()
            e.record(s)
            events.append(e)  # alive, so every handle is distinct
        await asyncio.gather(*(evr.wait(e, reactor=reactor) for e in events))
        for e in events[:300]:
            await evr.wait(e, reactor=reactor)  # learned from these: the table is full by now
        return evr.loop_stats()

    st = run(main())
    assert st["completions"] == 4500
    assert 0 < st["models"] <= 4096, st


def test_set_loop_spin_rejects_bad_input():
    with pytest.raises(TypeError, match="set_loop_spin"):
        evr.set_loop_spin("200us")
    with pytest.raises(TypeError, match="set_loop_spin"):
        evr.set_loop_spin(True)
    with pytest.raises(ValueError, match="0 <= seconds <= 0.1"):
        evr.set_loop_spin(-1e-6)
    with pytest.raises(ValueError, match="0 <= seconds <= 0.1"):
        evr.set_loop_spin(1.0)
