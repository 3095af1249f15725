#!/usr/bin/env python3
"""Load on the served model (served_model.py): for each mode (evr, executor, blocking) a server,
its answers checked against the CPU, then wrk at each connection count, POSTing rows to /predict.

  python3 served_model_load.py --out DIR [--duration 8] [--connections 16,64,256]
                               [--modes evr,executor,blocking] [--server-args "--hidden 8192"]

Each point records requests/s and wrk's latency percentiles (p50, p99), errors (non-2xx,
socket errors), the server process's CPU over the point (utime + stime of /proc/PID/stat, in
cores) split into the loop thread, evr's reactor thread and the rest (the executor's threads,
CUDA's, the simulated device's), and the mean rows per batch (from the server's /stats). Before
the points, 64 requests per server are checked against the float64 reference on the CPU; after
them, the server must report no failed request, and its shutdown (SIGTERM) must leave none.

Prints a table and the goals of the served model (at 64 and 256 connections: evr at least twice
the requests/s of `run_in_executor`, at most half its process CPU, a lower p99; the blocking
handler's numbers beside them) and writes them to DIR/served_model_load.md, beside
DIR/served_model_load.json and the servers' logs.

Time: per mode, the server's start (on a GPU: torch, CUDA and the weights, a few seconds), the
check, --warmup, then --duration + about 0.5 s per point: about 2 minutes with the defaults (3
modes x 3 counts x 8 s). Points that would end after --budget seconds are skipped (and said so).

wrk: from PATH, or staged by scripts/gpu/stage-tools.sh in .tools/ (copy .tools along to a machine
without a package registry). Exit status 0 when every point ran without errors and every check,
and the shutdowns, passed (the goals are reported, not enforced); 77 when there is no wrk.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime
import importlib.util
import json
import os
import platform
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import served_model  # noqa: E402  (beside this file)
import served_model_client  # noqa: E402

# wrk, its output and /proc's CPU figures, as scripts/study/server-study.py reads them.
_spec = importlib.util.spec_from_file_location("server_study",
                                               os.path.join(ROOT, "scripts", "study", "server-study.py"))
study = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(study)

LUA = """-- POST /predict with the bodies below in turn (each wrk thread keeps its own turn).
local bodies = {
%s
}
local i = 0
request = function()
  i = i %% #bodies + 1
  return wrk.format("POST", "/predict", {["Content-Type"] = "application/json"}, bodies[i])
end
"""


def log(msg):
    print(f"[served_model_load {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def thread_cpu(pid):
    """{group: CPU seconds} of the server's threads: its loop (the main thread), evr's reactor,
    everything else; and the process's total (threads that ended included)."""
    threads, total = study.thread_cpu(pid)
    groups = collections.Counter()
    for tid, (comm, cpu) in threads.items():
        groups["loop" if tid == pid else "reactor" if comm == "evr-reactor" else "other"] += cpu
    return groups, total


async def fetch_stats(url):
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/stats") as r:
            return await r.json()


async def check_answers(url, checker, count=64, concurrency=16):
    """`count` requests checked against the reference: a Counter of outcomes ("ok" when right)."""
    import aiohttp

    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession() as session:
        async def one(i):
            async with sem:
                return await served_model_client.post_row(session, url, checker, i % len(checker.bodies))

        return collections.Counter(await asyncio.gather(*(one(i) for i in range(count))))


def run_wrk(wrk, url, lua, connections, seconds, threads):
    exe, env = wrk[0], wrk[1]
    t = max(1, min(threads, connections))
    cmd = [exe, f"-t{t}", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s", "--latency",
           "-s", lua, url + "/predict"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=seconds + 60)
    return out.stdout + out.stderr


def measure(args, wrk, mode, out_dir, lua_path, deadline):
    """Starts a server in `mode`, checks it, runs its points; returns (points, server record)."""
    log_path = os.path.join(out_dir, f"server-{mode}.log")
    server_args = ["--mode", mode, "--device", args.device] + shlex.split(args.server_args)
    proc, url = served_model_client.start_server(server_args, log_path)
    record = {"mode": mode, "log": os.path.basename(log_path), "problems": []}
    points = []
    try:
        stats = asyncio.run(fetch_stats(url))
        record["config"] = config = stats["config"]
        checker = served_model_client.Checker.of(config["dims"], config["seed"], n=64)
        with open(lua_path, "w") as f:  # this server's rows
            f.write(LUA % ",\n".join(f"  [==[{b}]==]" for b in checker.bodies[:16]))
        got = asyncio.run(check_answers(url, checker))
        record["check"] = dict(got)
        if got != {"ok": 64}:
            record["problems"].append(f"answers checked against the CPU: {dict(got)}")
        with open(log_path) as f:
            head = [ln.strip() for ln in f if ln.startswith("served_model: ")]
        log(f"{mode}: {'; '.join(h[len('served_model: '):] for h in head[:2])}")
        log(f"{mode}: 64 answers checked against the float64 reference: {dict(got)}")
        if args.warmup > 0:
            run_wrk(wrk, url, lua_path, 64, args.warmup, args.threads)
        for c in args.connections:
            if time.monotonic() + args.duration + 2 > deadline:
                points.append({"mode": mode, "connections": c, "skipped": "budget"})
                log(f"{mode}, {c} connections: skipped (the --budget would be exceeded)")
                continue
            before = asyncio.run(fetch_stats(url))
            g0, cpu0 = thread_cpu(proc.pid)
            t0 = time.monotonic()
            text = run_wrk(wrk, url, lua_path, c, args.duration, args.threads)
            wall = time.monotonic() - t0
            g1, cpu1 = thread_cpu(proc.pid)
            after = asyncio.run(fetch_stats(url))
            r = study.parse_wrk(text)
            batches = after["batches"] - before["batches"]
            p = {"mode": mode, "connections": c, "seconds": round(wall, 3), "rps": r["rps"],
                 "requests": r["requests"], "p50_ms": ms(r["p50_us"]), "p90_ms": ms(r["p90_us"]),
                 "p99_ms": ms(r["p99_us"]), "non2xx": r["non2xx"],
                 "socket_errors": r["socket_errors"], "cpu_cores": round((cpu1 - cpu0) / wall, 3),
                 "cpu_cores_by_thread": {k: round((g1[k] - g0[k]) / wall, 3)
                                         for k in ("loop", "reactor", "other")},
                 "batches": batches,
                 "rows_per_batch": (round((after["rows"] - before["rows"]) / batches, 2)
                                    if batches else None),
                 "server_failed": after.get("failed", 0) - before.get("failed", 0)}
            if r["rps"] is None:
                p["wrk_output"] = text[-2000:]
            points.append(p)
            log(f"{mode}, {c} connections: {fmt(p['rps'], 0)} requests/s, "
                f"p50 {fmt(p['p50_ms'], 2)} ms, p99 {fmt(p['p99_ms'], 2)} ms, "
                f"CPU {p['cpu_cores']:.2f} cores, "
                f"{fmt(p['rows_per_batch'], 1)} rows per batch, errors {p['non2xx']} non-2xx "
                f"{p['socket_errors']} socket")
            if r["rps"] is None or p["non2xx"] or p["socket_errors"] or p["server_failed"]:
                record["problems"].append(f"{c} connections: rps {r['rps']}, "
                                          f"non-2xx {p['non2xx']}, "
                                          f"socket errors {p['socket_errors']}, "
                                          f"failed {p['server_failed']}")
    finally:
        rc, report = served_model_client.stop_server(proc, log_path)
        record["exit_status"], record["shutdown"] = rc, report
        if rc != 0 or report is None or report["left"] or report["failed"]:
            record["problems"].append(f"shutdown: exit status {rc}, report {report}")
    return points, record


def ms(us):
    return None if us is None else round(us / 1000.0, 3)


def fmt(v, digits):
    return "-" if v is None else f"{v:.{digits}f}"


def find(points, mode, c):
    return next((p for p in points if p["mode"] == mode and p["connections"] == c
                 and p.get("rps") is not None), None)


def goals(points):
    """The served model's goals at 64 and 256 connections: evr >= 2x executor's requests/s, at
    <= 1/2 of its process CPU, with a lower p99; the blocking handler's figures stated."""
    out = []
    for c in (64, 256):
        e, x, b = find(points, "evr", c), find(points, "executor", c), find(points, "blocking", c)
        if e and x:
            out.append({"connections": c, "goal": "evr requests/s >= 2x executor's",
                        "met": e["rps"] >= 2 * x["rps"], "value": round(e["rps"] / x["rps"], 2)})
            out.append({"connections": c, "goal": "evr CPU <= 1/2 of executor's",
                        "met": e["cpu_cores"] <= 0.5 * x["cpu_cores"],
                        "value": (round(e["cpu_cores"] / x["cpu_cores"], 2)
                                  if x["cpu_cores"] else None)})
            if e["p99_ms"] is not None and x["p99_ms"] is not None:
                out.append({"connections": c, "goal": "evr p99 < executor's",
                            "met": e["p99_ms"] < x["p99_ms"],
                            "value": f"{e['p99_ms']} vs {x['p99_ms']} ms"})
        if e and b:
            out.append({"connections": c, "goal": "stated: evr / blocking requests/s", "met": None,
                        "value": round(e["rps"] / b["rps"], 2)})
    return out


def table(points):
    rows = ["| mode | connections | requests/s | p50 ms | p99 ms "
            "| CPU cores (loop, reactor, other) | rows per batch |",
            "|---|---:|---:|---:|---:|---|---:|"]
    for p in points:
        if p.get("rps") is None:
            state = p.get("skipped", "failed")
            rows.append(f"| {p['mode']} | {p['connections']} | {state} | | | | |")
            continue
        t = p["cpu_cores_by_thread"]
        rows.append(f"| {p['mode']} | {p['connections']} | {p['rps']:.0f} | "
                    f"{fmt(p['p50_ms'], 2)} | "
                    f"{fmt(p['p99_ms'], 2)} | {p['cpu_cores']:.2f} ({t['loop']:.2f}, "
                    f"{t['reactor']:.2f}, {t['other']:.2f}) | {fmt(p['rows_per_batch'], 1)} |")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "served-model-load"))
    ap.add_argument("--duration", type=int, default=8,
                    help="seconds per point (wrk: whole seconds)")
    ap.add_argument("--warmup", type=int, default=2, help="seconds of wrk before a server's points")
    ap.add_argument("--connections", default="16,64,256")
    ap.add_argument("--modes", default=",".join(served_model.MODES))
    ap.add_argument("--threads", type=int, default=4, help="wrk threads")
    ap.add_argument("--device", choices=("auto", "cuda", "sim"), default="auto")
    ap.add_argument("--server-args", default="", help="more arguments for served_model.py")
    ap.add_argument("--budget", type=float, default=280.0,
                    help="seconds from the start after which no point starts")
    args = ap.parse_args()
    start = time.monotonic()
    deadline = start + args.budget
    args.connections = [int(c) for c in args.connections.split(",") if c]
    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - set(served_model.MODES):
        ap.error(f"--modes: choose from {served_model.MODES}")
    if args.device == "auto":
        args.device = served_model.detect_device()
    wrk = study.find_wrk()
    if wrk is None:
        log("wrk not found (PATH, .tools/): apt-get install wrk, or stage it with "
            "scripts/gpu/stage-tools.sh and copy .tools along")
        return 77  # ctest: skipped
    os.makedirs(args.out, exist_ok=True)
    out_dir = os.path.abspath(args.out)
    lua_path = os.path.join(out_dir, "predict.lua")
    log(f"{wrk[2]}; device {args.device}; modes {', '.join(modes)}; connections "
        f"{args.connections}; {args.duration} s per point; server args '{args.server_args}'")
    points, servers = [], []
    for mode in modes:
        if time.monotonic() + args.duration + 15 > deadline:  # a server's start and check too
            points += [{"mode": mode, "connections": c, "skipped": "budget"}
                       for c in args.connections]
            log(f"{mode}: skipped (the --budget would be exceeded)")
            continue
        p, record = measure(args, wrk, mode, out_dir, lua_path, deadline)
        points += p
        servers.append(record)
        for problem in record["problems"]:
            log(f"{mode}: PROBLEM: {problem}")
    doc = {"when": datetime.datetime.now().isoformat(timespec="seconds"),
           "host": {"python": platform.python_version(), "machine": platform.node(),
                    "cpus": os.cpu_count(), "wrk": wrk[2]},
           "args": {k: v for k, v in vars(args).items()}, "servers": servers, "points": points,
           "goals": goals(points), "seconds": round(time.monotonic() - start, 1)}
    path = os.path.join(out_dir, "served_model_load.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    config = servers[0].get("config", {}) if servers else {}
    gpu_ms = config.get("gpu_ms_full_batch")
    problems = sum(len(s["problems"]) for s in servers)
    lines = [f"served model {'-'.join(map(str, config.get('dims', [])))} on {args.device}, "
             f"{config.get('streams')} streams, batches of up to {config.get('max_batch')} rows, "
             f"{config.get('window_ms')} ms window, {config.get('loop')} loop"
             + ("" if gpu_ms is None else f"; a full batch {gpu_ms} ms on the GPU"),
             "", table(points), ""]
    for g in doc["goals"]:
        state = "" if g["met"] is None else (" (met)" if g["met"] else " (MISSED)")
        lines.append(f"* {g['connections']} connections: {g['goal']}: {g['value']}{state}")
    lines.append(f"served_model_load: {'OK' if problems == 0 else f'{problems} PROBLEMS'} "
                 f"({doc['seconds']} s); {path}")
    with open(os.path.join(out_dir, "served_model_load.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print()
    print("\n".join(lines))
    return 0 if problems == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
