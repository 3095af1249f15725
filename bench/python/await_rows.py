"""What bench_await.py measures, one row kind a function: one await by each method (`one`), a
method's latency over many awaits (`latency`), work that changes length in phases (`phased`),
many awaits pending at once (`many`) and N tasks on N streams back to back (`tasks`), with the
per-thread CPU and evr statistics they report. Each takes a device of bench_devices.py; the
command line, the printed tables and the goals are bench_await.py's.
"""
from __future__ import annotations

import asyncio
import os
import statistics
import threading
import time

import evr


GRAPH_METHODS = ("evr-graph", "evr-signal")  # the kernel as a CUDA graph (bench_devices.replayer)


def graph_lane(d, kernel, method, stream=None):
    """(replay, slot) for `method` on `stream`: a graph of `kernel`, ending in a signal of `slot`
    for evr-signal (slot None for evr-graph). Kept on `d` per (method, kernel, stream)."""
    cache = d.__dict__.setdefault("_graph_lanes", {})
    key = (method, kernel, id(stream or d.stream))
    if key not in cache:
        slot = None
        if method == "evr-signal":
            slot = (d.reactor or evr.default_reactor()).signal_slot()
        cache[key] = (d.replayer(kernel, stream, slot), slot)
    return cache[key]


async def one(method, d, kernel, loop, stages=None):
    target = d.stream
    if method in GRAPH_METHODS:
        replay, slot = graph_lane(d, kernel, method)
        if slot is not None:
            target = slot.arm(d.stream)
        replay()
    else:
        d.launch(kernel)
    t0 = time.perf_counter()
    if method.startswith("evr"):
        m0 = time.monotonic_ns()
        await evr.wait(target, reactor=d.reactor)
        elapsed = time.perf_counter() - t0  # before the bookkeeping below, which is not the wait's
        if stages is not None:
            # Where this await's time went: launch -> the reactor's push, push -> the loop's
            # drain, drain -> the coroutine running again (all CLOCK_MONOTONIC).
            resumed = time.monotonic_ns()
            _, pushed, drained = evr.loop_stats()["last_completion_ns"]
            stages.append((pushed - m0, drained - pushed, resumed - drained))
        return elapsed
    elif method == "executor":
        await loop.run_in_executor(None, d.synchronize)
    elif method == "query0":
        while not d.query():
            await asyncio.sleep(0)
    elif method == "sleep100":
        while not d.query():
            await asyncio.sleep(1e-4)
    elif method == "sync":
        d.synchronize()
    return time.perf_counter() - t0


def thread_cpu_s():
    """CPU seconds per thread name of this process (/proc/self/task/*/schedstat: nanoseconds)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
        key = "loop" if int(tid) == threading.get_native_id() else name
        out[key] = out.get(key, 0.0) + ns * 1e-9
    return out


def reactor_of(d):
    return d.reactor or evr.default_reactor()


def delta_stats(before, after):
    if before is None:
        return after
    out = {}
    for k, v in after.items():
        if isinstance(v, list):
            out[k] = [a - b for a, b in zip(v, before[k])]
        elif not isinstance(v, tuple):
            out[k] = v - before[k]
    out["lead_seconds"], out["models"] = after["lead_seconds"], after["models"]  # levels
    return out


def hop_quantile_us(hist, q):
    total = sum(hist)
    if total == 0:
        return float("nan")
    seen = 0
    for i, n in enumerate(hist):
        seen += n
        if seen >= q * total:
            return 2**i / 1e3  # upper bound of the bucket
    return float("inf")


async def latency(method, d, kernel, samples, spin):
    """One coroutine launching `kernel` and waiting by `method`, back to back: the loop a user
    writes, with nothing of the bench's between two samples but a clock read (the timed pass, whose
    latency and CPU are the row's). The stage breakdown (evr methods) comes from a second, shorter
    pass: reading evr.loop_stats() after each await costs the loop thread microseconds of its own
    (a dict built, the thread's caches), which the CPU figure must not count."""
    loop = asyncio.get_running_loop()
    if method.startswith("evr"):
        set_loop_spin(0 if method == "evr-nospin" else spin)
    for _ in range(min(20, samples)):  # warm-up (thread pool, predictions)
        await one(method, d, kernel, loop)
    lat, stages = [], []
    s0 = evr.loop_stats() if method.startswith("evr") else None
    m0 = reactor_of(d).metrics() if method.startswith("evr") else None
    t0 = thread_cpu_s()
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(samples):
        lat.append(await one(method, d, kernel, loop))
    wall = time.perf_counter() - w0
    cpu = (time.process_time() - c0) / wall
    t1 = thread_cpu_s()
    lat.sort()
    row = {"p50_us": lat[len(lat) // 2] * 1e6, "p99_us": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e6,
           "cpu_cores": cpu,
           "threads_cores": {k: (v - t0.get(k, 0.0)) / wall for k, v in t1.items()
                             if (v - t0.get(k, 0.0)) / wall >= 0.002}}
    if method.startswith("evr"):
        m1 = reactor_of(d).metrics()
        row["reactor_cores"] = (m1["reactor_cpu_seconds"] - m0["reactor_cpu_seconds"]) / wall
        row["reactor"] = {k: m1[k] - m0[k] for k in ("prediction_misses", "parks", "wakeups", "sweeps")}
        # The reactor's buckets are [2**i, 2**(i+1)) ns, the loop's hop buckets < 2**i ns: the
        # same quantile walk, its upper bound one bucket higher.
        row["reactor"]["nap_overshoot_p99_us"] = hop_quantile_us(
            [a - b for a, b in zip(m1["nap_overshoot_log2_ns"], m0["nap_overshoot_log2_ns"])], 0.99) * 2
        st = delta_stats(s0, evr.loop_stats())
        row["loop"] = st
        row["hop_p50_us"] = hop_quantile_us(st["hop_log2_ns"], 0.5)
        row["hop_p99_us"] = hop_quantile_us(st["hop_log2_ns"], 0.99)
        for _ in range(min(samples, 300)):  # the stages' pass (see above)
            await one(method, d, kernel, loop, stages)
        for i, name in enumerate(("launch_to_push_us", "push_to_drain_us", "drain_to_resumed_us")):
            v = sorted(x[i] for x in stages)
            row[name] = {"p50": v[len(v) // 2] / 1e3, "p99": v[min(len(v) - 1, int(len(v) * 0.99))] / 1e3}
    set_loop_spin(spin)
    return row


async def phased(method, d, phases, samples, spin):
    """Work whose length changes in phases on one stream ([(us, n), ...]: n kernels of us each,
    then the next phase, again; a stream shared by two kinds of request): launch -> resumed over
    `samples` waits, whole cycles, after one cycle of warm-up. The mean shows the waits found
    late after a change of phase, which p50 hides."""
    loop = asyncio.get_running_loop()
    if method.startswith("evr"):
        set_loop_spin(0 if method == "evr-nospin" else spin)
    plan = [us / 1e6 for us, n in phases for _ in range(n)]
    for k in plan:
        await one(method, d, k, loop)
    lat = []
    c0, w0 = time.process_time(), time.perf_counter()
    while len(lat) < samples:
        for k in plan:
            lat.append(await one(method, d, k, loop))
            await asyncio.sleep(0)
    wall = time.perf_counter() - w0
    set_loop_spin(spin)
    mean = sum(lat) / len(lat)
    # Where the mean comes from: each phase's first waits after the change (the mean over the
    # cycles of the 1st, 2nd, ... wait of the phase) against the phase's median.
    after_change = {}
    first = 0
    for us, n in phases:
        rows = [lat[c + first:c + first + n] for c in range(0, len(lat) - len(plan) + 1, len(plan))]
        firsts = [statistics.mean(r[i] for r in rows) * 1e6 for i in range(min(n, 4))]
        median = statistics.median(x for r in rows for x in r) * 1e6
        after_change[f"{us:g}"] = {"first_waits_us": firsts, "median_us": median}
        first += n
    lat.sort()
    return {"mean_us": mean * 1e6, "p50_us": lat[len(lat) // 2] * 1e6,
            "p99_us": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e6,
            "cpu_cores": (time.process_time() - c0) / wall, "after_change": after_change}


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


async def many(d, n, kernel):
    resumed = [0] * n
    stamps = [0.0] * n

    async def waiter(i):
        await evr.wait(d.stream, reactor=d.reactor)
        resumed[i] += 1
        stamps[i] = time.perf_counter()

    m0 = rss_mb()
    d.launch(kernel)
    tasks = [asyncio.ensure_future(waiter(i)) for i in range(n)]
    await asyncio.sleep(0)  # every waiter submitted
    m1 = rss_mb()
    await asyncio.gather(*tasks)
    first, last = min(stamps), max(stamps)
    return {"n": n, "exactly_once": resumed == [1] * n,
            "resumes_per_s": (n - 1) / (last - first) if last > first else float("inf"),
            "resume_span_ms": (last - first) * 1e3, "rss_growth_mb": m1 - m0}


async def tasks(d, n, kernel_s, seconds, method="evr", warmed=None):
    """n tasks, each on its own stream: launch, await evr.wait (or poll s.query() between
    asyncio.sleep(0): method "query0"), again, for `seconds`. `warmed()`, if given, is called
    once the warm-up is over, just before the measured span (scripts/study/loop-placement.py
    pins threads there)."""
    streams = [d.new_stream() for _ in range(n)]
    done = [0] * n
    stop = False

    cycles = []  # launch -> resumed, seconds (recorded while `record` is set)
    record = False

    lanes = [graph_lane(d, kernel_s, method, s) if method in GRAPH_METHODS else (None, None)
             for s in streams]

    async def worker(i):
        s = streams[i]
        replay, slot = lanes[i]
        while not stop:
            t0 = time.perf_counter()
            target = s
            if replay is None:
                d.launch(kernel_s, s)
            else:
                if slot is not None:
                    target = slot.arm(s)
                replay()
            if method == "query0":
                while not d.query(s):
                    await asyncio.sleep(0)
            else:
                await evr.wait(target, reactor=d.reactor)
            if record:
                cycles.append(time.perf_counter() - t0)
            done[i] += 1

    workers = [asyncio.ensure_future(worker(i)) for i in range(n)]
    await asyncio.sleep(min(0.5, seconds / 2))  # warm-up: every stream's model learned
    if warmed is not None:
        warmed()
    waits = method != "query0"  # query0 never touches evr: no reactor is made for it
    s0, m0, t0 = evr.loop_stats(), reactor_of(d).metrics() if waits else None, thread_cpu_s()
    n0, c0, w0 = sum(done), time.process_time(), time.perf_counter()
    record = True
    await asyncio.sleep(seconds)
    record = False
    n1, c1, w1 = sum(done), time.process_time(), time.perf_counter()
    s1, m1, t1 = evr.loop_stats(), reactor_of(d).metrics() if waits else None, thread_cpu_s()
    stop = True
    await asyncio.gather(*workers)
    wall, completed = w1 - w0, n1 - n0
    cycles.sort()
    row = {"n": n, "method": method, "kernel_us": kernel_s * 1e6, "seconds": wall,
           "rps": completed / wall, "cpu_cores": (c1 - c0) / wall,
           "cycle_p50_us": cycles[len(cycles) // 2] * 1e6 if cycles else float("nan"),
           "cycle_p99_us": cycles[int(len(cycles) * 0.99)] * 1e6 if cycles else float("nan"),
           "threads_cores": {k: (v - t0.get(k, 0.0)) / wall for k, v in t1.items()
                             if (v - t0.get(k, 0.0)) / wall >= 0.002}}
    if not waits:
        return row
    loop = delta_stats(s0, s1)
    per_wait = {k: (m1[k] - m0[k]) / max(1, completed)
                for k in ("event_queries", "parks", "sweeps", "prediction_misses", "doorbells",
                          "wakeups")}
    row.update({"reactor_cores": (m1["reactor_cpu_seconds"] - m0["reactor_cpu_seconds"]) / wall,
                "reactor_per_wait": per_wait,
                "loop": {k: loop.get(k, 0) for k in ("predicted", "timer_fires", "spins",
                                                     "spin_hits", "spin_misses", "not_polled",
                                                     "spin_seconds", "model_restarts",
                                                     "late_looks")},
                "loop_spin_share": loop["spin_seconds"] / wall})
    return row


SPIN_WAITS = [4]  # evr.set_loop_spin's max_waits (--spin-waits)


def set_loop_spin(seconds):
    """evr.set_loop_spin with --spin-waits; an evr older than max_waits gets the seconds alone
    (the gate runs this script against its baseline's module too)."""
    try:
        evr.set_loop_spin(seconds, SPIN_WAITS[0])
    except TypeError:
        evr.set_loop_spin(seconds)
