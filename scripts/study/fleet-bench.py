#!/usr/bin/env python3
"""The balancer's cost: one evr-async-server process against several behind HAProxy (sharing the
GPU, or with --per-gpu one GPU each), with the same io threads in all.

    scripts/study/fleet-bench.py [--processes 2] [--threads 2] [--route "/busy?us=1000"]
                           [--connections 256] [--seconds 6] [--rounds 2] [--device auto|cuda|sim]
                           [--haproxy-threads 0,4] [--per-gpu] [--wrk-threads 4] [--bin PATH]
                           [--out DIR]

Alternates, --rounds times: one server with --threads io threads, loaded by wrk directly; then
--processes servers with --threads / --processes io threads each behind HAProxy
(examples/deploy/fleet.py), loaded by wrk through HAProxy (a row per --haproxy-threads); then the
same servers on one port (--reuse-port), wrk straight at them: the processes' own cost, without
the balancer. Per point: requests/s, p50/p99, the
servers' CPU and HAProxy's (from /proc over the point), and HAProxy's CPU per request: what the
balancer costs. Prints the means and the ratio fleet / one process; JSON to DIR/fleet-bench.json.

wrk and the build as scripts/study/server-study.py finds and does them (wrk on PATH or staged in
.tools; HAProxy on PATH or EVR_HAPROXY, e.g. .tools/haproxy/haproxy from
scripts/gpu/stage-haproxy.sh). Exit status 0 when every point ran without errors.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples", "deploy"))
from fleet import Fleet, ServerProcess, default_haproxy_threads, free_port  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_net  # noqa: E402

_spec = importlib.util.spec_from_file_location("server_study",
                                               os.path.join(ROOT, "scripts", "study", "server-study.py"))
study = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(study)


def wrk_point(wrk, port, route, connections, seconds, pids, threads=4):
    """wrk against 127.0.0.1:port; the CPU seconds of each pid over the point."""
    cmd = [wrk[0], f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency", "--timeout", "10s",
           f"http://127.0.0.1:{port}{route}"]
    before = {p: study.cpu_seconds(p) for p in pids}
    counters = kernel_net.snapshot()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=wrk[1], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    # Each connection's answers between a fifth and four fifths of the point (all open by then).
    time.sleep(seconds * 0.2)
    first = kernel_net.received_per_connection(port)
    time.sleep(seconds * 0.6)
    fair = kernel_net.fairness(first, kernel_net.received_per_connection(port))
    stdout, _ = proc.communicate(timeout=seconds + 60)
    wall = time.monotonic() - t0
    cpu = {p: study.cpu_seconds(p) - before[p] for p in pids}
    r = study.parse_wrk(stdout)
    r["wall_s"] = wall
    # What gives a p99 of a second (docs/deploy.md): TCP's timers, or connections left waiting.
    r["kernel"] = kernel_net.since(counters)
    r["fairness"] = fair
    r["cores"] = {str(p): c / wall for p, c in cpu.items()}
    return r


def one_process(binary, args, wrk, workdir, _haproxy=None):
    port = free_port()
    s = ServerProcess("single", binary, port, server_args(args, args.threads), workdir)
    s.start()
    s.wait_listening()
    study.warm_up(port, args.route, connections=args.warm_connections)
    r = wrk_point(wrk, port, args.route, args.connections, args.seconds, [s.proc.pid],
                  args.wrk_threads)
    s.signal(signal.SIGTERM)
    r["exit"] = s.wait_exit(timeout=120)
    r["server_cores"] = sum(r["cores"].values())
    r["haproxy_cores"] = 0.0
    return r


def fleet_of(binary, args, wrk, workdir, haproxy):
    mode, haproxy_threads = haproxy
    threads = max(1, args.threads // args.processes)
    fleet = Fleet(binary, args.processes, server_args(args, threads), workdir,
                  per_server_args=per_gpu_args(args), haproxy_threads=haproxy_threads,
                  haproxy_mode=mode)
    fleet.start()
    study.warm_up(fleet.haproxy.port, args.route, connections=args.warm_connections)
    pids = [s.proc.pid for s in fleet.servers] + [fleet.haproxy.proc.pid]
    r = wrk_point(wrk, fleet.haproxy.port, args.route, args.connections, args.seconds, pids,
                  args.wrk_threads)
    r["exit"] = max(fleet.stop())
    r["haproxy_cores"] = r["cores"][str(fleet.haproxy.proc.pid)]
    r["server_cores"] = sum(r["cores"].values()) - r["haproxy_cores"]
    return r


def reuse_port_pair(binary, args, wrk, workdir, _haproxy=None):
    """The same processes as the fleet's, on one port (--reuse-port: the kernel spreads the
    connections), wrk straight at them: what two processes cost without the balancer (two CUDA
    contexts share the GPU by time slices unless MPS runs)."""
    threads = max(1, args.threads // args.processes)
    port = free_port()
    own = per_gpu_args(args) or (lambda i: [])
    servers = [ServerProcess(f"rp{i}", binary, port,
                             server_args(args, threads) + ["--reuse-port"] + own(i), workdir)
               for i in range(args.processes)]
    for s in servers:
        s.start()
        s.wait_output("listening on")
    study.warm_up(port, args.route, connections=args.warm_connections)
    r = wrk_point(wrk, port, args.route, args.connections, args.seconds,
                  [s.proc.pid for s in servers], args.wrk_threads)
    for s in servers:
        s.signal(signal.SIGTERM)
    r["exit"] = max(s.wait_exit(timeout=120) for s in servers)
    r["server_cores"] = sum(r["cores"].values())
    r["haproxy_cores"] = 0.0
    return r


def per_gpu_args(args):
    """--per-gpu: process i serves GPU i alone (--devices i); None: every process every GPU."""
    return (lambda i: ["--devices", str(i)]) if args.per_gpu else None


def server_args(args, threads):
    return ["--device", args.device, "--threads", str(threads)] + args.server_args.split()


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--threads", type=int, default=2, help="io threads in all (split over processes)")
    p.add_argument("--route", default="/busy?us=1000")
    p.add_argument("--connections", type=int, default=256)
    p.add_argument("--seconds", type=int, default=6)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "sim"])
    p.add_argument("--bin")
    p.add_argument("--server-args", default="")
    p.add_argument("--haproxy-threads", default="auto",
                   help="HAProxy's nbthread, a fleet row each, separated by commas (auto: a "
                        "quarter of the CPUs, fleet.py's default; 0: HAProxy's own, a thread per "
                        "CPU)")
    p.add_argument("--haproxy-modes", default="http",
                   help="http, tcp or both (http,tcp): a fleet row each with every thread count")
    p.add_argument("--per-gpu", action="store_true",
                   help="process i serves GPU i alone (--processes: the GPUs); the one process "
                        "serves them all")
    p.add_argument("--wrk-threads", type=int, default=4)
    p.add_argument("--warm-connections", type=int, default=32,
                   help="connections the warm-up opens one after another, 20 requests each: the "
                        "kernel (--reuse-port) or the balancer (mode tcp) picks a process per "
                        "connection, and each process must be warmed")
    p.add_argument("--out")
    a = p.parse_args()
    if a.warm_connections < 0:
        p.error(f"--warm-connections takes a count >= 0 (0: no warm-up), not {a.warm_connections}")
    try:
        a.haproxy_threads = [None if t == "auto" else int(t) for t in a.haproxy_threads.split(",")]
        if any(t is not None and t < 0 for t in a.haproxy_threads):
            raise ValueError
    except ValueError:
        p.error(f"--haproxy-threads takes auto or counts >= 0 separated by commas, like auto,0,8, "
                f"not {a.haproxy_threads!r}")
    a.haproxy_modes = a.haproxy_modes.split(",")
    if not a.haproxy_modes or set(a.haproxy_modes) - {"http", "tcp"}:
        p.error(f"--haproxy-modes takes http, tcp or http,tcp, not {','.join(a.haproxy_modes)!r}")
    for name in ("processes", "threads", "connections", "seconds", "rounds", "wrk_threads"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be at least 1, not {getattr(a, name)}")
    if a.threads % a.processes:
        p.error(f"--threads {a.threads} must split evenly over --processes {a.processes}")
    wrk = study.find_wrk()
    if wrk is None:
        p.error("wrk not found (PATH, or .tools/ from scripts/gpu/stage-tools.sh)")
    binary = a.bin or study.build(argparse.Namespace(bin=None, build_dir="build/study",
                                                     tiny=a.device == "sim"))
    out = a.out or tempfile.mkdtemp(prefix="evr-fleet-bench.")
    os.makedirs(out, exist_ok=True)
    def fleet_name(h):
        mode, t = h
        threads = f"{default_haproxy_threads()} thr" if t is None else \
            ("a thr/CPU" if t == 0 else f"{t} thr")
        return f"{a.processes} behind HAProxy {mode} {threads}"

    haproxies = [(m, t) for m in a.haproxy_modes for t in a.haproxy_threads]

    pair_name = f"{a.processes} on one port"
    variants = [("one process", one_process, None)] + \
        [(fleet_name(h), fleet_of, h) for h in haproxies] + \
        ([(pair_name, reuse_port_pair, None)] if a.processes > 1 else [])
    rows = {name: [] for name, _, _ in variants}
    for rnd in range(1, a.rounds + 1):
        for name, run, haproxy in variants:
            r = run(binary, a, wrk, out, haproxy)
            r["round"] = rnd
            rows[name].append(r)
            n = r.get("requests") or 0
            hp_us = r["haproxy_cores"] * r["wall_s"] / n * 1e6 if n else float("nan")
            sv_us = r["server_cores"] * r["wall_s"] / n * 1e6 if n else float("nan")
            print(f"round {rnd} {name:30} {r['rps'] or 0:9.0f} req/s  p50 "
                  f"{(r['p50_us'] or 0) / 1e3:6.2f} ms  p99 {(r['p99_us'] or 0) / 1e3:6.2f} ms  "
                  f"max {(r.get('max_us') or 0) / 1e3:7.1f} ms  "
                  f"servers {r['server_cores']:.2f} cores ({sv_us:.1f} us/req)  HAProxy "
                  f"{r['haproxy_cores']:.2f} cores ({hp_us:.1f} us/req)  errors {r['non2xx'] + r['socket_errors']}  exit "
                  f"{r['exit']}", flush=True)
            print(f"round {rnd} {name:30} kernel: {kernel_net.describe(r['kernel'])}; "
                  f"{kernel_net.describe_fairness(r['fairness'])}", flush=True)
    single = rows["one process"]
    summary = {}
    for h in haproxies:
        fleet_rows = rows[fleet_name(h)]
        ratio = (mean([r["rps"] for r in fleet_rows]) or 0) / (mean([r["rps"] for r in single]) or 1)
        hp = mean([r["haproxy_cores"] * r["wall_s"] / r["requests"] * 1e6
                   for r in fleet_rows if r.get("requests")])
        sv = mean([r["server_cores"] * r["wall_s"] / r["requests"] * 1e6
                   for r in fleet_rows if r.get("requests")])
        p99 = (mean([r["p99_us"] for r in fleet_rows]) or 0) / \
            (mean([r["p99_us"] for r in single]) or 1)
        summary[fleet_name(h)] = {"ratio": ratio, "haproxy_us_per_request": hp,
                                  "servers_us_per_request": sv, "p99_ratio": p99}
        print(f"fleet: {a.processes} processes x {a.threads // a.processes} io threads"
              f"{' (one GPU each)' if a.per_gpu else ''} behind HAProxy "
              f"({fleet_name(h).split('HAProxy ', 1)[1]}) reach {ratio:.2f}x the "
              f"requests/s of one process with {a.threads} io threads on {a.route} at "
              f"{a.connections} connections, p99 {p99:.2f}x (means of {a.rounds} alternating "
              f"rounds); HAProxy costs {hp:.1f} us of CPU per request, {hp / sv:.2f}x the "
              f"servers' {sv:.1f} us")
    if a.processes > 1:
        ratio = (mean([r["rps"] for r in rows[pair_name]]) or 0) / \
            (mean([r["rps"] for r in single]) or 1)
        summary[pair_name] = {"ratio": ratio}
        p99 = (mean([r["p99_us"] for r in rows[pair_name]]) or 0) / \
            (mean([r["p99_us"] for r in single]) or 1)
        summary[pair_name]["p99_ratio"] = p99
        print(f"without the balancer: {a.processes} processes on one port (--reuse-port) reach "
              f"{ratio:.2f}x the requests/s of one process, p99 {p99:.2f}x: the cost of the "
              f"processes themselves")
    with open(os.path.join(out, "fleet-bench.json"), "w") as f:
        json.dump({"args": vars(a), "rows": rows, "summary": summary}, f, indent=1)
    bad = [r for rs in rows.values() for r in rs if r["non2xx"] or r["socket_errors"] or r["exit"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
