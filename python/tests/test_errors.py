"""CUDA errors, sticky faults, bad input, shutdown."""

import asyncio
import re

import pytest

import evr
import evr.sim
from conftest import run
from fakes import ProtocolStream, TorchLikeEvent


def test_fault_raises_cuda_error(dev):
    s = dev.stream()

    async def main():
        dev.launch_kernel(s, 0.01)
        await evr.wait(s)
        dev.launch_faulting_kernel(s)
        with pytest.raises(evr.CudaError) as info:
            await evr.wait(s)
        return info.value

    err = run(main())
    assert err.code == 700 and err.name == "cudaErrorIllegalAddress"
    assert "cudaErrorIllegalAddress" in str(err) and isinstance(err, evr.EvrError)


def test_fault_code_is_kept(dev):
    s = dev.stream()

    async def main():
        dev.launch_faulting_kernel(s, 719)
        with pytest.raises(evr.CudaError) as info:
            await evr.wait(s)
        return info.value

    err = run(main())
    assert (err.code, err.name) == (719, "cudaErrorLaunchFailure")


def test_sticky_fault_fails_every_wait_of_the_device(dev):
    streams = [dev.stream() for _ in range(4)]
    other = evr.sim.Device()  # another device keeps working

    async def main():
        for s in streams:
            dev.launch_kernel(s, 0.05)
        futs = [evr.wait(s) for s in streams for _ in range(10)]
        dev.launch_faulting_kernel(streams[0])
        dev.inject_fault(0)
        results = await asyncio.gather(*futs, return_exceptions=True)
        assert all(isinstance(r, evr.CudaError) for r in results), results
        # later waits on the faulted device fail too
        with pytest.raises(evr.CudaError):
            await evr.wait(streams[1])
        s2 = other.stream()
        other.launch_kernel(s2, 0.001)
        await evr.wait(s2)

    try:
        run(main())
    finally:
        other.shutdown()
    assert dev.fault(0) == 700


def test_wait_future_error_and_result(dev):
    s = dev.stream()
    dev.launch_kernel(s, 0.01)
    assert evr.wait_future(s).result(10) is None
    dev.launch_faulting_kernel(s)
    f = evr.wait_future(s)
    with pytest.raises(evr.CudaError):
        f.result(10)


BAD = "evr.wait: expected a CUDA stream or event (an object with __cuda_stream__, .cuda_stream, " \
      ".cuda_event or .ptr, or an int handle), got "


@pytest.mark.parametrize("value,kind", [("stream", "str"), (None, "NoneType"), (1.5, "float"),
                                        (True, "bool"), (object(), "object")])
def test_bad_input_type(reactor, value, kind):
    async def main():
        with pytest.raises(TypeError, match=re.escape(BAD + kind)):
            evr.wait(value, reactor=reactor)

    run(main())


def test_bad_input_values(dev, reactor):
    class BadProto:
        def __cuda_stream__(self):
            return 42

    async def main():
        with pytest.raises(ValueError, match="negative"):
            evr.wait(-1, reactor=reactor)
        with pytest.raises(TypeError, match=r"__cuda_stream__ must return \(version, handle\)"):
            evr.wait(BadProto(), reactor=reactor)
        with pytest.raises(TypeError, match=r"__cuda_stream__\(\)\[1\] must be an int"):
            evr.wait(ProtocolStream("x"), reactor=reactor)
        with pytest.raises(evr.EvrValueError, match="never recorded"):
            evr.wait(dev.event())
        with pytest.raises(ValueError, match="never recorded"):
            evr.wait(TorchLikeEvent(0), reactor=reactor)
        with pytest.raises(TypeError, match="reactor must be an evr.Reactor"):
            evr.wait(dev.stream(), reactor="fence")
        other = evr.sim.Device()
        with pytest.raises(evr.EvrValueError, match="another device"):
            evr.wait(other.stream(), reactor=reactor)
        with pytest.raises(TypeError, match="evr.wait_future: expected a CUDA stream"):
            evr.wait_future("s", reactor=reactor)
        with pytest.raises(TypeError, match="evr.release_after: expected a CUDA stream"):
            evr.release_after(b"s", [], reactor=reactor)

    run(main())


def test_instances_of_one_class_are_read_each_as_it_is(reactor):
    # evr remembers how a class's targets are read; an instance that lacks that attribute is read
    # the slow way, and bad values are named as before.
    class Mixed:
        pass

    async def main():
        bad = Mixed()
        bad.cuda_stream = "x"
        with pytest.raises(TypeError, match=r"Mixed\.cuda_stream must be an int handle"):
            evr.wait(bad, reactor=reactor)
        event = Mixed()
        event.cuda_event = 0
        with pytest.raises(ValueError, match="never recorded"):
            evr.wait(event, reactor=reactor)
        negative = Mixed()
        negative.cuda_stream = -3
        with pytest.raises(ValueError, match=r"Mixed\.cuda_stream is negative"):
            evr.wait(negative, reactor=reactor)
        with pytest.raises(TypeError, match=re.escape(BAD + "Mixed")):
            evr.wait(Mixed(), reactor=reactor)

    run(main())


def test_wait_outside_a_loop(dev):
    with pytest.raises(RuntimeError, match="no running event loop"):
        evr.wait(dev.stream())


def test_reactor_options_checked(dev):
    with pytest.raises(ValueError, match="unknown strategy 'nope'"):
        evr.Reactor("nope", device=dev)
    with pytest.raises(TypeError, match="unknown option 'bogus'"):
        evr.Reactor(device=dev, bogus=1)
    with pytest.raises(ValueError, match="max_sleep"):
        evr.Reactor(device=dev, max_sleep=-1.0)
    with pytest.raises(ValueError, match="unknown idle mode"):
        evr.Reactor(device=dev, idle="sometimes")
    with pytest.raises(TypeError, match="evr.sim.Device"):
        evr.Reactor(device="gpu0")
    with pytest.raises(ValueError, match="mode must be"):
        evr.sim.Device(mode="fast")
    with pytest.raises(ValueError, match="coalesce"):
        evr.Reactor(device=dev, coalesce=-1e-6)
    r = evr.Reactor("fence", device=dev, idle="spin", max_sleep=0.001, max_streams=64)
    r.shutdown()
    # Every duration option of evr::reactor_options is accepted, in seconds.
    r = evr.Reactor(device=dev, final_sleep=0.0005, coalesce=0.0001, prespin=1e-5)
    r.shutdown()
    # Counts must not be negative; fractions and counts of every kind are accepted.
    with pytest.raises(ValueError, match="pool_batch must be >= 0"):
        evr.Reactor(device=dev, pool_batch=-1)
    r = evr.Reactor(device=dev, spin_fraction=0.1, poll_budget=0.2, poll_looks_per_second=50000)
    r.shutdown()
    # Flags take True or False, nothing that merely converts to one.
    with pytest.raises(TypeError, match="kernel_fences must be True or False"):
        evr.Reactor(device=dev, kernel_fences=1)
    r = evr.Reactor(device=dev, kernel_fences=True, host_event_waits=False)
    # prepare_device names a bad device; the simulated device here runs no fence kernel (as a
    # GPU before compute capability 9.0), which it says; the reactor goes on working.
    with pytest.raises(TypeError, match="prepare_device: device must be an int"):
        r.prepare_device("0")
    with pytest.raises(ValueError, match="prepare_device: device must be >= 0"):
        r.prepare_device(-2)
    with pytest.raises(evr.EvrError, match="device"):
        r.prepare_device(7)
    with pytest.raises(evr.EvrError, match="not supported"):
        r.prepare_device(0)
    r.shutdown()
    r = evr.Reactor(device=dev, kernel_fences=False)
    r.prepare_device(0)  # nothing to load
    with pytest.raises(evr.EvrError, match="device"):
        r.prepare_device(7)  # the index is checked all the same
    r.shutdown()


def test_no_cuda_backend_is_explained():
    status = evr.cuda_status()
    if status.usable:
        pytest.skip("the CUDA backend runs here")
    # Built without CUDA, or with it on a machine without a driver or GPU: the default reactor
    # is refused with the reason, and nothing is left half made.
    match = "no CUDA backend" if not status.compiled_in else "cannot run here"
    for _ in range(2):
        with pytest.raises(evr.EvrError, match=match) as info:
            evr.wait_future(1)
        if status.compiled_in:
            assert status.reason in str(info.value)


def test_cuda_status_says_why():
    status = evr.cuda_status()
    assert status.compiled_in == evr._evr.cuda_compiled_in()
    assert status.usable == evr.cuda_available()
    if status.usable:
        assert status.reason == "" and status.device_count > 0
        assert status.driver_version // 1000 >= status.runtime_version // 1000
        return
    assert status.reason and status.device_count == 0
    if not status.compiled_in:
        assert "without the CUDA backend" in status.reason and status.runtime_version == 0
        return
    major, minor = divmod(status.runtime_version, 1000)
    assert f"CUDA {major}.{minor // 10}" in status.reason, status.reason
    if status.driver_version == 0:  # a machine without the NVIDIA driver (CI)
        assert "no NVIDIA driver" in status.reason and "libcuda.so.1" in status.reason


def test_shutdown_with_pending_waits(dev):
    r = evr.Reactor(device=dev, shutdown_drain=0.05)
    s = dev.stream()
    dev.stall(s)
    dev.launch_kernel(s, 0.0)

    async def main():
        futs = [evr.wait(s, reactor=r) for _ in range(100)]
        cf = evr.wait_future(s, reactor=r)
        await asyncio.get_running_loop().run_in_executor(None, r.shutdown)
        results = await asyncio.gather(*futs, return_exceptions=True)
        assert all(isinstance(x, evr.ReactorStopped) for x in results), results[:3]
        assert "shut down before the GPU work" in str(results[0])
        with pytest.raises(evr.ReactorStopped):
            cf.result(5)
        with pytest.raises(evr.ReactorStopped, match="is shut down"):
            evr.wait(s, reactor=r)
        with pytest.raises(evr.ReactorStopped):
            evr.wait_future(s, reactor=r)

    run(main())
    dev.resume(s)
    r.shutdown()  # idempotent


def test_evr_shutdown_stops_the_default_reactor(dev):
    r = evr.Reactor(device=dev, shutdown_drain=0.05)
    evr.set_default_reactor(r)
    s = dev.stream()
    try:
        assert evr.default_reactor() is r
        dev.launch_kernel(s, 0.001)
        evr.wait_future(s.handle).result(10)
        evr.shutdown()
        with pytest.raises(evr.ReactorStopped, match="evr.shutdown"):
            evr.wait_future(s.handle)
        with pytest.raises(evr.ReactorStopped):  # the sim device's own reactor too
            evr.wait_future(s)
    finally:
        evr.set_default_reactor(None)


def test_release_after_refused_after_shutdown(dev):
    r = evr.Reactor(device=dev, shutdown_drain=0.05)
    s = dev.stream()
    r.shutdown()
    dev.launch_kernel(s, 0.02)
    obj = [1]
    with pytest.raises(evr.ReactorStopped):
        evr.release_after(s, obj, reactor=r)
    assert s.query()  # synchronized before the refusal: never released early
