"""Helpers of the tests of the loop's polling windows (test_loop_spin.py) and of its probes
(test_probe.py): a timed wait, the reactor's metrics once settled, and retries that outlast a
loaded machine's scattered timings."""

import time

import evr

REGULAR = 0.005  # seconds: the sim's kernels of one length, back to back


async def kernel_then_wait(dev, s, reactor, seconds):
    """Launches `seconds` of work on `s`, awaits it, and returns how long that took."""
    t0 = time.perf_counter()  # before the launch: on a loaded machine the launch may take long
    dev.launch_kernel(s, seconds)
    done = dev.event()
    done.record(s)
    await evr.wait(s, reactor=reactor)
    assert done.query(), "the wait finished before the stream's work"
    return time.perf_counter() - t0


def hop_total(st):
    """How many completions reached the loop by a hop (evr.loop_stats()["hop_log2_ns"])."""
    return sum(st["hop_log2_ns"])


def settled(reactor, seconds=5.0):
    """The reactor's metrics once every wait it took is finished there (or after `seconds`). A
    wait its loop resolved from its probe (the fence word, read while polling) is still the
    reactor's until the wait's window has closed: it then completes it too, and only frees its
    node."""
    deadline = time.monotonic() + seconds
    m = reactor.metrics()
    while m["in_flight"] != 0 and time.monotonic() < deadline:
        time.sleep(0.001)
        m = reactor.metrics()
    return m


def attempts(seconds=10.0, at_least=60):
    """0, 1, 2, ...: at least `at_least` numbers, and more until `seconds` have passed. How long a
    test waits for the loop's model to predict a stream. The model predicts only work whose
    service times (submission to the reactor's push) deviate by at most a quarter of their mean
    (loop_waker.cpp): a guarantee about what the loop observes, and a loaded machine scatters
    5 ms simulated kernels by more than that for stretches of a second or so (60 waits, 0.3 s,
    passed in vain now and then under load). The tests wait such stretches out; a machine whose
    scheduling never lets 5 ms of work look regular for 10 s fails them."""
    deadline = time.monotonic() + seconds
    i = 0
    while i < at_least or time.monotonic() < deadline:
        yield i
        i += 1
