#!/usr/bin/env python3
"""Several servers on one port without a balancer (--reuse-port): connections spread, and a rolling
restart that loses nothing.

    python3 examples/deploy/one_port_test.py --bin build/release/examples/evr-async-server
        [--device sim|cuda] [--seconds 20] [--connections 64] [--route "/busy?us=2000"] [--out DIR]

1. Two servers on one port (SO_REUSEPORT); 200 one-request connections; both must have answered
   some, and together all.
2. A rolling restart on one port: two servers with --reuse-port under --connections checked
   clients in closed loops (a quarter of them a connection per request; checked_load.py); each
   server in turn replaced (the new process listens first, then the old one drains). Asserted: 0
   wrong, 0 lost, no request failed on a kept-alive connection, both replacements answered. Run
   with this namespace's net.ipv4.tcp_migrate_req and, as root where a network namespace can be
   made, again in one of its own with it set to 1 (then no connection accepted into the old
   server's queue may fail either; a connect() reset as the listening socket closes may).

Exit status 0 when every assertion held; the figures go to stdout (and --out DIR/one-port.json).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checked_load import (busy_references, drained_cleanly, finish, load_test_arguments,  # noqa: E402
                          load_while, parse_load_test_arguments, results_folder)
from fleet import ServerProcess, free_port, http_status  # noqa: E402


async def reuse_port(args, binary, workdir, report) -> list[str]:
    port = free_port()
    servers = [ServerProcess(f"r{i}", binary, port, server_args(args) + ["--reuse-port"], workdir)
               for i in range(2)]
    for s in servers:
        s.start()
    for s in servers:  # each its own line: /readyz on the shared port may reach either
        s.wait_output("listening on")
    statuses = [http_status("127.0.0.1", port, "/healthz") for _ in range(200)]
    for s in servers:
        s.signal(signal.SIGTERM)
    codes = [s.wait_exit(timeout=args.drain_seconds + 30) for s in servers]
    counts = []
    for s in servers:
        m = re.search(r"server: (\d+) responses?", s.last_run_output())
        counts.append(int(m.group(1)) if m else 0)
    report["reuse_port"] = {"statuses_200": statuses.count(200), "per_server": counts,
                            "exit": codes}
    print(f"--reuse-port: two servers on port {port}: {statuses.count(200)} of 200 connections "
          f"answered, per server {counts} (each also answered its own /readyz probes), exit "
          f"{codes}")
    problems = []
    if statuses.count(200) != 200:
        problems.append(f"--reuse-port: {200 - statuses.count(200)} of 200 requests not answered")
    if min(counts) == 0:
        problems.append(f"--reuse-port: one server got no connection ({counts})")
    if any(codes):
        problems.append(f"--reuse-port: exit statuses {codes}")
    return problems


def migrate_setting() -> str:
    """net.ipv4.tcp_migrate_req of this network namespace ("absent" before Linux 5.14)."""
    try:
        with open("/proc/sys/net/ipv4/tcp_migrate_req", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return "absent"


async def reuse_port_rolling(args, binary, seeds, workdir, report) -> list[str]:
    """A rolling restart without a balancer: two servers on one port (--reuse-port), clients in
    closed loops (a quarter of them a connection per request) that resend an idempotent request
    whose connection failed before its answer. Each
    server in turn: its replacement starts on the port first, then it gets SIGTERM and drains.
    What the kernel does with the connections still in the draining server's accept queue when it
    closes its listening socket decides what the clients see: with net.ipv4.tcp_migrate_req=1 they
    move to another listener of the port; with 0 they are reset (the clients here resend them:
    "fresh"). Either way a connect() whose SYN the kernel handles as that socket closes may be
    reset (resent too: "connect"; more often with 0).
    Asserted: 0 wrong, 0 lost, both replacements answered, no request failed on a kept-alive
    connection (the drain answers each connection's last request with Connection: close), and with
    tcp_migrate_req=1 none on a new connection either."""
    port = free_port()
    # A grace longer than any closed-loop client's pause between requests on a loaded machine:
    # every connection's last request is answered with Connection: close, none is resent.
    extra = ["--reuse-port", "--drain-idle-grace", "2"]
    servers = [ServerProcess(f"p{i}", binary, port, server_args(args) + extra, workdir)
               for i in range(2)]
    for s in servers:
        s.start()
    for s in servers:
        s.wait_output("listening on")
    problems: list[str] = []
    replaced = []
    drains = []

    async def scenario(tally):
        loop = asyncio.get_running_loop()
        for i, old in enumerate(list(servers)):
            await asyncio.sleep(args.seconds * 0.15)
            new = ServerProcess(f"p{i}b", binary, port, server_args(args) + extra, workdir)
            new.start()
            await loop.run_in_executor(None, new.wait_output, "listening on")
            replaced.append(new)
            t0 = time.monotonic()
            old.signal(signal.SIGTERM)
            rc = await loop.run_in_executor(None, old.wait_exit, args.drain_seconds + 30)
            drains.append(time.monotonic() - t0)
            problems.extend(drained_cleanly(old, rc))
        await asyncio.sleep(args.seconds * 0.15)

    t0 = time.monotonic()
    # A quarter of the clients open a connection per request: there are connections in the
    # accept queues when a listening socket closes.
    tally = await load_while(port, args.route, args.connections, seeds, scenario, retries=3,
                             churn=args.connections // 4)
    elapsed = time.monotonic() - t0
    for s in replaced:
        s.signal(signal.SIGTERM)
    for s in replaced:
        problems.extend(drained_cleanly(s, s.wait_exit(timeout=args.drain_seconds + 30)))
    answered_by_new = []
    for s in replaced:
        m = re.search(r"server: (\d+) responses?", s.last_run_output())
        answered_by_new.append(int(m.group(1)) if m else 0)
    migrate = migrate_setting()
    report.setdefault("reuse_port_rolling", []).append({
        "tcp_migrate_req": migrate, "seconds": elapsed, "ok": tally.ok, "wrong": tally.wrong,
        "non2xx": tally.non2xx, "lost": tally.socket_errors, "retried": tally.retried,
        "first_retry": tally.first_retry,
        "drain_s": drains, "answered_by_replacements": answered_by_new,
        "first_problem": tally.first_problem})
    retried = ", ".join(f"{n} on {where} connections" for where, n in sorted(tally.retried.items()))
    print(f"rolling restart on one port (--reuse-port, no balancer, tcp_migrate_req={migrate}): "
          f"{tally.ok} answers right in {elapsed:.1f} s over {args.connections} connections; "
          f"{tally.wrong} wrong, {tally.non2xx} non-2xx, {tally.socket_errors} lost; resent: "
          f"{retried or 'none'}; drains {', '.join(f'{d:.2f}' for d in drains)} s; the "
          f"replacements answered {answered_by_new}")
    if tally.wrong or tally.non2xx or tally.socket_errors:
        problems.append(f"reuse-port rolling restart: {tally.wrong} wrong, {tally.non2xx} non-2xx, "
                        f"{tally.socket_errors} lost (first: {tally.first_problem})")
    if min(answered_by_new, default=0) <= 0:
        problems.append(f"reuse-port rolling restart: a replacement answered nothing "
                        f"({answered_by_new})")
    if tally.retried.get("reused", 0):
        problems.append(f"reuse-port rolling restart: {tally.retried['reused']} requests failed on "
                        f"kept-alive connections that the drain closed before their last answer "
                        f"(first: {tally.first_retry['reused']})")
    # (Not "connect": a SYN that the kernel handles while the listening socket closes is reset
    # with tcp_migrate_req=1 too, if more rarely; only what sat in the accept queue moves.)
    if migrate == "1" and tally.retried.get("fresh", 0):
        problems.append(f"reuse-port rolling restart: {tally.retried['fresh']} new connections "
                        f"failed although tcp_migrate_req=1 moves the accept queue (first: "
                        f"{tally.first_retry['fresh']})")
    return problems


def reuse_port_rolling_migrating(args, workdir, report) -> list[str]:
    """reuse_port_rolling again with net.ipv4.tcp_migrate_req=1, set in a network namespace of its
    own (unshare --net: nothing of this host's settings changes); needs root, unshare and ip."""
    if migrate_setting() == "1":
        return []  # the run in this namespace was that one
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip") or \
            migrate_setting() == "absent" or \
            subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode != 0:
        print("rolling restart on one port with tcp_migrate_req=1: skipped (needs root allowed to "
              "make a network namespace, unshare, ip and Linux >= 5.14)")
        return []
    sub_out = os.path.join(workdir, "migrate")
    inner = [sys.executable, os.path.abspath(__file__), "--only-ambient",
             "--bin", os.path.abspath(args.bin), "--device", args.device,
             "--seconds", str(args.seconds), "--connections", str(args.connections),
             "--route", args.route, "--drain-seconds", str(args.drain_seconds),
             "--server-args", args.server_args, "--out", sub_out]
    script = ("ip link set lo up && echo 1 >/proc/sys/net/ipv4/tcp_migrate_req && exec " +
              " ".join(shlex.quote(x) for x in inner))
    rc = subprocess.run(["unshare", "--net", "sh", "-c", script], timeout=args.seconds * 4 + 300).returncode
    try:
        with open(os.path.join(sub_out, "one-port.json"), encoding="utf-8") as f:
            report.setdefault("reuse_port_rolling", []).extend(json.load(f)["reuse_port_rolling"])
    except (OSError, KeyError, ValueError):
        pass
    return [] if rc == 0 else [f"reuse-port rolling restart with tcp_migrate_req=1 failed ({rc})"]


def server_args(args) -> list[str]:
    return ["--device", args.device, "--drain-seconds", str(args.drain_seconds)] + \
        args.server_args.split()


def main() -> int:
    p = load_test_arguments(__doc__.split("\n\n")[0])
    p.add_argument("--only-ambient", action="store_true",
                   help="only the rolling restart, with this namespace's tcp_migrate_req")
    a = parse_load_test_arguments(p)
    seeds = busy_references()
    workdir = results_folder(a.out, "evr-one-port.")
    report: dict = {"args": vars(a)}
    problems = [] if a.only_ambient else asyncio.run(reuse_port(a, a.bin, workdir, report))
    problems += asyncio.run(reuse_port_rolling(a, a.bin, seeds, workdir, report))
    if not a.only_ambient:
        problems += reuse_port_rolling_migrating(a, workdir, report)
    return finish("one-port-test", workdir, "one-port.json", report, problems)

if __name__ == "__main__":
    sys.exit(main())
