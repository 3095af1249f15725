"""On a real GPU: torch and CuPy streams and events through the default (CUDA) reactor.
Skipped without a GPU, without the CUDA backend, or without torch / CuPy."""

import asyncio
import time

import pytest

import evr
from conftest import run

pytestmark = pytest.mark.skipif(not evr.cuda_available(), reason="no usable GPU / CUDA backend")


def _sleep_kernel_torch(torch, ms):
    # torch.cuda._sleep spins the GPU for a number of cycles (about 1-2 GHz).
    torch.cuda._sleep(int(ms * 1.5e6))


def test_torch_stream_event_and_current_stream():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")

    async def main():
        x = torch.randn(1024, 1024, device="cuda")
        y = x @ x
        await evr.wait(torch.cuda.current_stream())
        assert torch.allclose(y.cpu(), (x.cpu() @ x.cpu()), rtol=1e-2, atol=1e-1)
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            _sleep_kernel_torch(torch, 20)
            e = torch.cuda.Event()
            e.record(s)
        t0 = time.perf_counter()
        await evr.wait(e)
        assert e.query() and time.perf_counter() - t0 > 0.005
        with torch.cuda.stream(s):
            _sleep_kernel_torch(torch, 5)
        await evr.wait(s)
        assert s.query()
        await evr.wait(s.cuda_stream)  # the raw handle
        await asyncio.gather(*(evr.wait(s) for _ in range(1000)))
        f = evr.wait_future(s)
        f.result(10)
        evr.release_after(s, torch.empty(1 << 20, device="cuda"))

    run(main())


def test_torch_task_cancellation():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")

    async def main():
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            _sleep_kernel_torch(torch, 50)
        t = asyncio.ensure_future(evr.wait(s))
        await asyncio.sleep(0.001)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        await evr.wait(s)

    run(main())


def test_cupy_stream_and_event():
    cp = pytest.importorskip("cupy")

    async def main():
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            a = cp.arange(1 << 20, dtype=cp.float32)
            b = (a * 2).sum()
            e = cp.cuda.Event()
            e.record(s)
        await evr.wait(e)
        await evr.wait(s)
        assert float(b) == float((1 << 20) * ((1 << 20) - 1))

    run(main())


def test_torch_graph_ending_in_evr_signal():
    """Library work captured into a CUDA graph with evr's signal as its last node: each replay's
    wait completes after that replay's work (a pinned counter the graph copies out says which
    replay ran), through the slot's word (no event query), on several streams at once."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")
    r = evr.Reactor()
    replays = 20

    def lane():
        s = torch.cuda.Stream()
        slot = r.signal_slot()
        x = torch.zeros(1, device="cuda")
        host = torch.zeros(1, pin_memory=True)
        with torch.cuda.stream(s):  # warm-up outside the capture, as torch asks
            x.add_(1)
            host.copy_(x, non_blocking=True)
        s.synchronize()
        x.zero_()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            _sleep_kernel_torch(torch, 1)
            x.add_(1)
            host.copy_(x, non_blocking=True)
            slot.enqueue_signal(s)
        return s, slot, g, host, x  # x too: the graph names its memory, which must stay its

    lanes = [lane() for _ in range(4)]

    async def replay_all(s, slot, g, host, _x):
        for i in range(1, replays + 1):
            ticket = slot.arm(s)
            with torch.cuda.stream(s):
                g.replay()
            await evr.wait(ticket, reactor=r)
            assert host[0].item() == i, "the wait completed before its replay's work"
        assert slot.signalled == replays

    async def main():
        await asyncio.gather(*(replay_all(*lane) for lane in lanes))

    try:
        m0 = r.metrics()
        run(main())
        m1 = r.metrics()
        assert m1["completed"] - m0["completed"] == 4 * replays
        assert m1["event_queries"] == m0["event_queries"]  # the word, not the driver
    finally:
        r.shutdown()


def test_torch_many_streams_past_the_queues_are_read_not_queried():
    # 40 torch streams (torch hands out at most 32 distinct ones from its pool) on the driver's
    # 8 queues, or CUDA_DEVICE_MAX_CONNECTIONS: past them, a wait's marker is evr's fence kernel
    # on a GPU of compute capability 9.0 (loaded by prepare_device here), else an event. Every
    # wait completes after its own work either way; with the kernel, no event is queried.
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")
    torch.cuda.init()
    r = evr.Reactor("adaptive", kernel_fences=True)
    major, _ = torch.cuda.get_device_capability()
    if major >= 9:
        r.prepare_device()
    else:
        with pytest.raises((evr.EvrError, evr.CudaError)):
            r.prepare_device()
    streams = [torch.cuda.Stream() for _ in range(40)]

    async def main():
        for s in streams:
            with torch.cuda.stream(s):
                _sleep_kernel_torch(torch, 2)
        await asyncio.gather(*(r.wait(s) for s in streams))
        assert all(s.query() for s in streams)

    try:
        run(main())
        m = r.metrics()
        assert m["completed"] == len(streams) and m["failed"] == 0
        if major >= 9:
            assert m["event_queries"] == 0
    finally:
        r.shutdown()
