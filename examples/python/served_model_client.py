"""The client side of the served model (served_model.py): start a server and stop it, the request
bodies with their float64 reference answers, one checked request, and the self-test that
`served_model.py --self-test` runs. served_model_load.py and ray_serve_model_check.py use the same
pieces, so every client checks answers the same way.

The self-test, per mode: 256 requests over 32 connections whose answers must match the
reference, 4 malformed bodies that must get 400, then a shutdown with requests in flight: every
request accepted before the SIGTERM must be answered, every later one refused with 503 or closed.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

import served_model  # beside this file

SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "served_model.py")
LISTENING = re.compile(r"served_model: listening on (http://\S+)")
SHUTDOWN = re.compile(r"served_model: shutdown (\{.*\})")


def start_server(server_args, log_path, timeout=120.0):
    """Starts served_model.py as a server (port 0 unless server_args name one) with its output in
    log_path; returns (process, base URL) once it listens."""
    cmd = [sys.executable, SERVER, "--port", "0"] + list(server_args)
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log.close()
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with open(log_path) as f:
            m = LISTENING.search(f.read())
        if m:
            return proc, m.group(1).rstrip("/")
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    with open(log_path) as f:
        tail = f.read()[-3000:]
    raise RuntimeError(f"the server did not start ({' '.join(cmd)}):\n{tail}")


def stop_server(proc, log_path, timeout=30.0, sigterm=True):
    """SIGTERM (unless `sigterm` is false: it stops by itself), then its exit status and its
    shutdown report (None if it printed none); killed after `timeout` seconds."""
    if sigterm and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
        rc = f"killed after {timeout:g} s"
    with open(log_path) as f:
        m = SHUTDOWN.search(f.read())
    return rc, (json.loads(m.group(1)) if m else None)


class Checker:
    """Request bodies and their float64 reference answers for a server of the given sizes
    (`Checker.of` keeps one per model: the reference of a large model takes seconds)."""

    _made = {}

    @classmethod
    def of(cls, dims, seed=0, n=128):
        key = (tuple(dims), seed, n)
        if key not in cls._made:
            cls._made[key] = cls(dims, seed, n)
        return cls._made[key]

    def __init__(self, dims, seed=0, n=256, input_seed=1):
        self.dims = dims
        self.x = served_model.input_rows(n, dims[0], input_seed)
        self.ref = served_model.forward_numpy(self.x, served_model.make_weights(dims, seed),
                                              np.float64)
        self.bodies = [json.dumps({"x": row.tolist()}) for row in self.x]


async def post_row(session, url, checker, k):
    """One /predict of row k: "ok" (a correct answer), "wrong", an HTTP status, or "closed" (the
    connection failed: the server had closed it)."""
    return (await post_row_answer(session, url, checker, k))[0]


async def post_row_answer(session, url, checker, k):
    """post_row's outcome, and what came back: the answer's JSON document when the status was
    200, the body's text for another status, None when the connection failed."""
    import aiohttp

    try:
        async with session.post(url + "/predict", data=checker.bodies[k],
                                headers={"Content-Type": "application/json"}) as r:
            if r.status != 200:
                return r.status, await r.text()
            doc = await r.json()
            ok = served_model.answers_match(doc.get("y"), checker.ref[k])
            return ("ok" if ok else "wrong"), doc
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return "closed", None


def malformed_bodies(d_in):
    """[(body, what is wrong with it)]: /predict bodies a server must refuse with 400."""
    return [(b"{", "not JSON"), (b'{"x": [1, 2]}', "a short row"),
            (json.dumps({"x": ["a"] * d_in}).encode(), "strings"),
            (b'{"x": [NaN' + b", 0" * (d_in - 1) + b"]}", "NaN")]


async def self_test_mode(mode, device, extra, workdir):
    """One mode: checked answers, bad input, then a shutdown with requests in flight. Returns the
    number of failures (each printed)."""
    import aiohttp

    checked, wave1, wave2 = 256, 48, 16
    log = os.path.join(workdir, f"server-{mode}.log")
    # Simulated batches of 50 ms: long enough that a loop that is free (evr, executor) takes the
    # SIGTERM while the first wave's batches are still on the device.
    args = (["--mode", mode, "--device", device, "--sigterm-after", str(checked + wave1),
             "--sim-batch-us", "50000"] + extra)
    proc, url = start_server(args, log)
    failures = []
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/stats") as r:
                config = (await r.json())["config"]
            checker = Checker.of(config["dims"], config["seed"])
            sem = asyncio.Semaphore(32)

            async def limited(k):
                async with sem:
                    return await post_row(session, url, checker, k)

            t0 = time.perf_counter()
            got = collections.Counter(await asyncio.gather(
                *(limited(i % len(checker.bodies)) for i in range(checked))))
            took = time.perf_counter() - t0
            if got != {"ok": checked}:
                failures.append(f"{checked} requests: {dict(got)} (all 'ok' expected)")
            for body, what in malformed_bodies(config["d_in"]):
                async with session.post(url + "/predict", data=body) as r:
                    if r.status != 400:
                        failures.append(f"{what}: status {r.status}, expected 400")
            async with session.get(url + "/stats") as r:
                stats = await r.json()
            print(f"  {mode}: {checked} requests over 32 connections in {took:.3f} s "
                  f"({checked / took:.0f}/s), {stats['batches']} batches (mean "
                  f"{stats['rows'] / max(1, stats['batches']):.1f} rows), {got['ok']} answers "
                  f"right; 4 malformed requests refused with 400")

        # The shutdown. Wave 1: `wave1` requests at once, each on its own connection; the server
        # sends itself SIGTERM when the last of them is queued, so every one of them was accepted
        # and must be answered. Wave 2, once the server says it is closing (or is gone): refused
        # with 503, or closed.
        conn = aiohttp.TCPConnector(limit=wave1 + wave2 + 1, force_close=True)
        async with aiohttp.ClientSession(connector=conn) as session:
            first = [asyncio.ensure_future(post_row(session, url, checker, i))
                     for i in range(wave1)]
            closing, deadline = False, time.monotonic() + 20
            while not closing and time.monotonic() < deadline:
                try:
                    async with session.get(url + "/stats") as r:
                        closing = (await r.json())["closing"]
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    closing = True  # already gone
                if not closing:
                    await asyncio.sleep(0.002)
            second = await asyncio.gather(*(post_row(session, url, checker, i)
                                            for i in range(wave2)))
            first = await asyncio.gather(*first)
        rc, report = stop_server(proc, log, sigterm=False)
        first, second = collections.Counter(first), collections.Counter(second)
        if first != {"ok": wave1}:
            failures.append(f"shutdown: wave 1 (accepted before SIGTERM) got {dict(first)}")
        if set(second) - {503, "closed"}:
            failures.append(f"shutdown: wave 2 (after SIGTERM) got {dict(second)}")
        if report is None:
            failures.append(f"shutdown: no report (exit status {rc})")
        else:
            if rc != 0:
                failures.append(f"shutdown: exit status {rc}")
            # A loop blocked in synchronize() takes the signal only between batches, when its
            # requests may all be answered already; a free loop takes it at once, while the
            # simulated device's 50 ms batches run (a GPU may have finished them by then).
            if report["in_flight"] < 1 and mode != "blocking" and device == "sim":
                failures.append("shutdown: no request was in flight at SIGTERM")
            if report["answered"] != report["in_flight"] or report["left"] or report["failed"]:
                failures.append(f"shutdown: not every request in flight was answered: {report}")
            if report["refused_since"] != second[503]:
                failures.append(f"shutdown: the server refused {report['refused_since']}, the "
                                f"client saw {second[503]} 503s")
            print(f"  {mode}: SIGTERM with {report['in_flight']} requests in flight "
                  f"({report['queued']} queued, {report['on_gpu']} on the device in "
                  f"{report['batches_on_gpu']} batches): {report['answered']} answered in "
                  f"{report['seconds'] * 1e3:.1f} ms, {report['left']} left; wave 1: "
                  f"{first['ok']} of {wave1} right; wave 2: {second[503]} refused (503), "
                  f"{second['closed']} closed; exit status {rc}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for f in failures:
        print(f"  {mode}: FAILED: {f}")
    if failures:
        with open(log) as f:
            print(f"  {mode}: the server's output:\n" + f.read()[-3000:])
    return len(failures)


def self_test(args, extra):
    """served_model.py --self-test: self_test_mode for each of args.modes; 0 when all passed."""
    device = args.device if args.device != "auto" else served_model.detect_device()
    print(f"served_model self-test: device {device}, modes {', '.join(args.modes)}")
    failures = 0
    with tempfile.TemporaryDirectory(prefix="served-model-") as workdir:
        for mode in args.modes:
            failures += asyncio.run(self_test_mode(mode, device, extra, workdir))
    print("result:", "OK" if failures == 0 else f"FAILED ({failures})")
    return 0 if failures == 0 else 1
