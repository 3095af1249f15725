"""Fixtures of evr's Python tests. They run on the simulated device (evr.sim) and need neither
a GPU nor pytest-asyncio: each async test body runs in its own loop through `run()`."""

import asyncio
import gc

import pytest

import evr
import evr.sim


def run(coro, timeout=30.0):
    """Runs `coro` to completion in a fresh asyncio loop, failing after `timeout` seconds."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


@pytest.fixture
def dev():
    """A fresh simulated device (threaded); its reactor is stopped at the end of the test."""
    d = evr.sim.Device()
    yield d
    d.shutdown()
    gc.collect()


@pytest.fixture
def reactor(dev):
    """A reactor on `dev` with a short shutdown drain."""
    r = evr.Reactor(device=dev, shutdown_drain=0.2)
    yield r
    r.shutdown()


@pytest.fixture
def spin_default():
    """The loop's polling windows at their default (set_loop_spin(200 us)), before and after."""
    evr.set_loop_spin(200e-6)
    yield
    evr.set_loop_spin(200e-6)
