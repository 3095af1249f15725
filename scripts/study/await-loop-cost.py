#!/usr/bin/env python3
"""What one `await evr.wait(stream)` costs the event loop's thread, piece by piece.

    scripts/study/await-loop-cost.py [--device cuda|sim] [--loops asyncio,uvloop]
                                     [--cases idle,launch,200,1000] [--seconds 1.5]

One coroutine on one stream (bench/python/bench_devices.py: torch on a GPU, or evr's simulated
device) repeats a case for about --seconds, once with the loop's polling windows (evr's default,
`set_loop_spin(200e-6)`) and once without them (`set_loop_spin(0)`), on each event loop:
  * idle:   `await evr.wait(stream)` on a stream with nothing queued (evr's path alone),
  * launch: the kernel launch alone, back to back, no wait (torch's `with torch.cuda.stream(s):
            torch.cuda._sleep(n)`; on the simulated device its launch_kernel),
  * N:      a kernel of N us, then the await (what bench_await.py's one-await rows measure).
For each it prints the loop thread's CPU per await (time.thread_time: this thread only), the
launch's share of it, the whole process's CPU, the wall time per await, and evr.loop_stats()'s
counters per await (windows, timer firings, probe hits). Why: issue 45 asks one await at 200 us
for at most 0.35 cores, and the gate's row counts the whole process; this says which part is
evr's, which torch's and which the loop's (docs/notebook.md, "Where one await's loop CPU goes").
Bounded: loops x cases x 2 x (--seconds + a 50-await warm-up).
"""

import argparse
import asyncio
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "python"))

import evr  # noqa: E402
from bench_devices import pick_device  # noqa: E402

COUNTERS = ("predicted", "timer_fires", "spins", "spin_hits", "spin_misses", "probe_hits")


async def one_case(d, case, spin, seconds):
    kernel_s = None if case in ("idle", "launch") else float(case) * 1e-6
    evr.set_loop_spin(spin)
    for _ in range(50):  # warm-up: the stream's model learns the work's length
        if kernel_s:
            d.launch(kernel_s)
        await evr.wait(d.stream, reactor=d.reactor)
    s0 = dict(evr.loop_stats())
    launch_s, n = 0.0, 0
    t0, p0, w0 = time.thread_time(), time.process_time(), time.perf_counter()
    while time.perf_counter() - w0 < seconds:
        if case != "idle":
            a = time.thread_time()
            d.launch(kernel_s or 1e-6)
            launch_s += time.thread_time() - a
        if case != "launch":
            await evr.wait(d.stream, reactor=d.reactor)
        n += 1
    wall = time.perf_counter() - w0
    loop_s, proc_s = time.thread_time() - t0, time.process_time() - p0
    if case == "launch":
        d.synchronize()
    s1 = evr.loop_stats()
    per = {k: round((s1[k] - s0[k]) / n, 2) for k in COUNTERS}
    print(f"  {case:>6} {'spin' if spin else 'no spin':8} loop {loop_s / n * 1e6:6.1f} us "
          f"(launch {launch_s / n * 1e6:5.1f}), {loop_s / wall:.2f} cores; process "
          f"{proc_s / n * 1e6:6.1f} us, {proc_s / wall:.2f} cores; wall {wall / n * 1e6:7.1f} us; "
          f"per await {per}", flush=True)


async def run(d, cases, seconds):
    for case in cases:
        for spin in (200e-6, 0.0):
            await one_case(d, case, spin, seconds)
    evr.set_loop_spin(200e-6)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["auto", "cuda", "sim"], default="auto")
    ap.add_argument("--loops", default="asyncio,uvloop")
    ap.add_argument("--cases", default="idle,launch,200,1000")
    ap.add_argument("--seconds", type=float, default=1.5)
    args = ap.parse_args()
    cases = args.cases.split(",")
    for c in cases:
        if c not in ("idle", "launch") and not c.replace(".", "", 1).isdigit():
            ap.error(f"--cases: {c!r} is not idle, launch or a kernel length in us")
    if not 0 < args.seconds <= 30:
        ap.error("--seconds: expected 0 < seconds <= 30")
    d = pick_device(args.device)
    print(f"device: {d.name}")
    for name in args.loops.split(","):
        if name == "uvloop":
            try:
                import uvloop
            except ImportError:
                print("loop uvloop: not installed, skipped")
                continue
            runner = uvloop.run
        elif name == "asyncio":
            runner = asyncio.run
        else:
            ap.error(f"--loops: unknown loop {name!r} (asyncio, uvloop)")
        print(f"loop {name}:")
        runner(run(d, cases, args.seconds))


if __name__ == "__main__":
    main()
