#!/usr/bin/env python3
"""Does where the asyncio loop's thread and evr's reactor thread run decide a busy loop's rate?

    scripts/study/loop-placement.py [--device cuda|sim] [--tasks 64] [--kernel-us 500]
                                    [--rounds 2] [--seconds 2]

N tasks, each on a stream of its own, launch a kernel and `await evr.wait(stream)` in a loop
(bench/python/bench_devices.py: torch on a GPU, or evr's simulated device). Each run
pins the loop thread and the reactor thread (`evr-reactor`) with sched_setaffinity to
  * "hyperthreads": the two hardware threads of one core (when the machine has SMT),
  * "two cores": two different cores,
  * "unpinned": wherever the kernel puts them,
alternated over rounds, and prints completions a second and each thread's CPU. Why: with 64 tasks
at 500 us the loop thread is saturated and the rate of one build was 21 k or 37 k completions a
second from one process to the next on an H200 host (docs/notebook.md, "Windows only for a loop
with few waits in flight"); two busy threads on one core's hyperthreads would each run slower.
(Measured on an H200 host without SMT: either rate came pinned to two cores and unpinned alike.)
Linux only (sysfs topology, /proc task names). Bounded: rounds x placements x (seconds + 0.5 s).
"""

import argparse
import asyncio
import glob
import os
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "python"))

import await_rows  # noqa: E402  (after the path)
import evr  # noqa: E402
from bench_devices import pick_device  # noqa: E402


def cpu_list(text):
    """'0-3,8' -> [0, 1, 2, 3, 8] (sysfs's list format)."""
    out = []
    for part in filter(None, text.strip().split(",")):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def placements():
    """{name: (loop cpu, reactor cpu)} for the placements this machine allows, plus unpinned."""
    cpus = sorted(os.sched_getaffinity(0))
    siblings = {}
    for c in cpus:
        path = f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list"
        with open(path) as f:
            siblings[c] = [s for s in cpu_list(f.read()) if s != c and s in cpus]
    first = cpus[len(cpus) // 2]  # away from cpu 0, which takes more of the interrupts
    out = {}
    if siblings[first]:
        out["hyperthreads"] = (first, siblings[first][0])
    other = next((c for c in cpus if c != first and c not in siblings[first]), None)
    if other is not None:
        out["two cores"] = (first, other)
    out["unpinned"] = None
    return out


def reactor_tid():
    for path in glob.glob(f"/proc/{os.getpid()}/task/*/comm"):
        with open(path) as f:
            if f.read().strip() == "evr-reactor":
                return int(path.split("/")[-2])
    raise RuntimeError("no thread named evr-reactor in this process")


async def measure(device, tasks, kernel_s, seconds, pin):
    """bench_await's task row with the loop and reactor threads pinned to `pin` (None: not) for
    its measured span. Returns completions/s and the loop's and the reactor's cores."""
    loop_tid, everywhere, pinned = threading.get_native_id(), os.sched_getaffinity(0), []

    def pin_threads():  # after the warm-up: the reactor thread exists by then
        if pin is not None:
            pinned.extend([(loop_tid, pin[0]), (reactor_tid(), pin[1])])
            for tid, cpu in pinned:
                os.sched_setaffinity(tid, {cpu})

    try:
        row = await await_rows.tasks(device, tasks, kernel_s, seconds, warmed=pin_threads)
    finally:
        for tid, _ in pinned:
            os.sched_setaffinity(tid, everywhere)
    return row["rps"], row["threads_cores"].get("loop", 0.0), row.get("reactor_cores", 0.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cuda", "sim"], default="cuda")
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--kernel-us", type=float, default=500)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=2)
    args = ap.parse_args()
    if args.tasks < 1 or args.kernel_us <= 0 or args.rounds < 1 or not 0 < args.seconds <= 60:
        ap.error("expected --tasks >= 1, --kernel-us > 0, --rounds >= 1, 0 < --seconds <= 60")
    device = pick_device(args.device)
    where = placements()
    print(f"device: {device.name}; {args.tasks} tasks x {args.kernel_us:g} us; placements "
          "(loop cpu, reactor cpu): " + ", ".join(f"{k} {v}" for k, v in where.items()))
    for r in range(args.rounds):
        for name, pin in where.items():
            rate, loop_cores, reactor_cores = asyncio.run(
                measure(device, args.tasks, args.kernel_us * 1e-6, args.seconds, pin))
            print(f"round {r + 1}  {name:12s} {rate:8.0f} completions/s   loop {loop_cores:.2f}  "
                  f"reactor {reactor_cores:.2f} cores", flush=True)
    evr.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
