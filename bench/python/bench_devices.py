"""The devices bench_await.py runs on: torch on a GPU (TorchDevice), or evr's simulated device
(SimDevice). Each launches a kernel of a given length on a stream, makes streams, queries and
synchronizes, and makes a `replayer`: the same kernel as a CUDA graph, optionally ending in evr's
signal node (SignalSlot.enqueue_signal; on the simulated device, a launch and an eager signal);
pick_device chooses (scripts/study/loop-placement.py uses it too)."""

from __future__ import annotations

import sys

import evr
import evr.sim


class SimDevice:
    name = "simulated device (no GPU)"

    def __init__(self):
        self.dev = evr.sim.Device()
        self.stream = self.dev.stream()
        self.reactor = self.dev.reactor

    def launch(self, seconds, stream=None):
        self.dev.launch_kernel(stream or self.stream, seconds)

    def new_stream(self):
        return self.dev.stream()

    def query(self, stream=None):
        return (stream or self.stream).query()

    def synchronize(self):
        self.stream.synchronize()

    def replayer(self, seconds, stream=None, slot=None):
        """A callable that queues the kernel (then the slot's signal, when given) on the stream."""
        s = stream or self.stream

        def replay():
            self.dev.launch_kernel(s, seconds)
            if slot is not None:
                slot.enqueue_signal(s)

        return replay


class TorchDevice:
    def __init__(self, torch, launch="context"):
        self.torch = torch
        # How a launch picks its stream: `with torch.cuda.stream(s)` (the usual idiom), or
        # torch.cuda.set_stream(s), which leaves s the thread's current stream and costs a
        # fraction of the context's entry and exit (docs/python.md, "Where a loop's core goes").
        if launch == "set_stream":
            self.launch = self._launch_set_stream
        self.name = f"CUDA: {torch.cuda.get_device_name()} (torch {torch.__version__})"
        self.stream = torch.cuda.Stream()
        self.reactor = None
        # Calibrate torch.cuda._sleep (cycles per second) after a warm-up: the first launch also
        # loads the kernel, and timing it would make every later kernel about half as long.
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.stream):
            torch.cuda._sleep(100_000)
            self.stream.synchronize()
            start.record()
            torch.cuda._sleep(20_000_000)
            end.record()
        end.synchronize()
        self.cycles_per_s = 20_000_000 / (start.elapsed_time(end) / 1e3)

    def launch(self, seconds, stream=None):
        with self.torch.cuda.stream(stream or self.stream):
            self.torch.cuda._sleep(max(1, int(seconds * self.cycles_per_s)))

    def _launch_set_stream(self, seconds, stream=None):
        self.torch.cuda.set_stream(stream or self.stream)
        self.torch.cuda._sleep(max(1, int(seconds * self.cycles_per_s)))

    def new_stream(self):
        return self.torch.cuda.Stream()

    def query(self, stream=None):
        return (stream or self.stream).query()

    def synchronize(self):
        self.stream.synchronize()

    def replayer(self, seconds, stream=None, slot=None):
        """A CUDA graph of the kernel (ending in evr's signal node when `slot` is given), captured
        on the stream; the callable replays it there."""
        torch, s = self.torch, stream or self.stream
        cycles = max(1, int(seconds * self.cycles_per_s))
        g = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            torch.cuda._sleep(cycles)
            if slot is not None:
                slot.enqueue_signal(s)

        def replay():
            with torch.cuda.stream(s):
                g.replay()

        return replay


def pick_device(which, torch_launch="context"):
    if which in ("auto", "cuda") and evr.cuda_available():
        try:
            import torch

            if torch.cuda.is_available():
                return TorchDevice(torch, torch_launch)
        except ImportError:
            pass
    if which == "cuda":
        sys.exit("bench_await: --device cuda but no GPU with torch here")
    return SimDevice()
