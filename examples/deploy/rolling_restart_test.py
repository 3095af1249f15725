#!/usr/bin/env python3
"""Servers restarted under load behind HAProxy lose nothing (SIGTERM), and what SIGKILL costs.

    python3 examples/deploy/rolling_restart_test.py --bin build/release/examples/evr-async-server
        [--device sim|cuda] [--seconds 20] [--connections 64] [--route "/busy?us=2000"]
        [--haproxy-mode http|tcp] [--skip-kill] [--out DIR]

0. Drain, no balancer: one server, a /busy request of 400 ms in flight and an idle keep-alive
   connection when it gets SIGTERM: the idle connection is closed (once the drain's idle grace,
   0.25 s, has passed without a request on it), a new connection is refused,
   a request head trickling in is served once whole, the request in flight gets its right answer
   (both with `Connection: close`), exit 0, nothing left.
   Then --drain-seconds 0.3 with a 1.5 s request in flight: it is cut off (no answer), the server
   says so, and it exits 0 with nothing left once the GPU work is done.
1. Rolling restart: two servers behind HAProxy (fleet.py), --connections clients in closed loops
   through it for --seconds, every answer checked (a /busy answer is an integer hash of its seed,
   computed here too). A quarter of the way in, s0 is SIGTERMed: it must stop accepting, answer
   /readyz with 503, finish what it accepted and exit 0 with nothing left (its summary: 0 requests,
   0 lanes, 0 reactor waits left; 0 failures), within its --drain-seconds; it is started again on
   its port and must be back in HAProxy's rotation; then the same for s1. Asserted: 0 non-2xx
   answers, 0 socket errors, 0 wrong answers at the clients, both servers answered after their
   restart.
2. SIGKILL (unless --skip-kill): the same load for a few seconds, s1 killed with SIGKILL in the
   middle, started again once HAProxy has taken it out. Reported: what the clients lost (requests
   in flight on s1 that HAProxy could not send again: it retries a request whose server closed
   the connection without an answer, on another server). Asserted: no wrong answer, nothing lost
   once HAProxy had s1 out (half a second of grace), no more losses than client connections,
   and s1 serves again.
Several servers on one port without a balancer: one_port_test.py. The clients and the checks of
a server's exit: checked_load.py.

Exit status 0 when every assertion held; the figures go to stdout (and --out DIR/deploy.json).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checked_load import (busy_answered, busy_reference, busy_references, drained_cleanly,  # noqa: E402
                          finish, gauge, load_test_arguments, load_while,
                          parse_load_test_arguments, request_on, request_on_sent, results_folder)
from fleet import Fleet, ServerProcess, free_port  # noqa: E402

def drain_direct(args, binary, workdir, report) -> list[str]:
    """SIGTERM with a request in flight and an idle keep-alive connection, no balancer: the idle
    connection is closed, new connections are refused, the request in flight is answered (right,
    with Connection: close), the server exits 0 with nothing left."""
    server = ServerProcess("d0", binary, free_port(),
                           server_args(args) + ["--max-busy-us", "400000"], workdir)
    server.start()
    server.wait_listening()
    problems = []
    seed = 77
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as busy, \
            socket.create_connection(("127.0.0.1", server.port), timeout=30) as idle, \
            socket.create_connection(("127.0.0.1", server.port), timeout=30) as slow:
        request_on(idle, "/healthz")  # accepted, now waiting for its next request
        request_on(slow, "/healthz")
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHo")  # a head trickling in
        # 400 ms of GPU work in flight when the signal comes (seen in the server's gauge, whose
        # own /metrics request counts one).
        busy.sendall(f"GET /busy?us=400000&seed={seed} HTTP/1.1\r\nHost: d\r\n\r\n".encode())
        deadline = time.monotonic() + 30
        while gauge(server.port, "evr_server_requests_in_flight") < 2:
            if time.monotonic() > deadline:
                raise RuntimeError("the long request never showed in flight")
        server.signal(signal.SIGTERM)
        # The idle connection: closed by the server (EOF), without an answer, after the idle
        # grace (well before the drain's deadline, which would close it too).
        idle.settimeout(args.drain_seconds / 2)
        try:
            idle_closed = idle.recv(1) == b""
        except TimeoutError:
            idle_closed = False
        # A new connection: refused once the listening socket is closed.
        refused = False
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not refused:
            try:
                socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
            except ConnectionRefusedError:
                refused = True
        # The head trickling in: served once it is whole, with Connection: close.
        slow.sendall(b"st: d\r\n\r\n")
        slow_status, slow_headers, _ = request_on_sent(slow)
        slow_ok = slow_status == 200 and slow_headers.get("connection", "").lower() == "close"
        # The request in flight: answered in full, with Connection: close.
        data = b""
        while chunk := busy.recv(4096):
            data += chunk
    rc = server.wait_exit(timeout=args.drain_seconds + 30)
    head, _, body = data.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    answer_ok = status_line.endswith(" 200 OK") and b"connection: close" in head.lower() and \
        body and json.loads(body).get("result") == busy_reference(seed)
    report["drain_direct"] = {"idle_closed": idle_closed, "refused": refused,
                              "trickling_head_served": slow_ok,
                              "in_flight_answer": status_line, "exit": rc}
    print(f"drain (no balancer): idle keep-alive connection closed: {idle_closed}; a new "
          f"connection refused: {refused}; a head trickling in served with Connection: close: "
          f"{slow_ok}; the request in flight answered: {status_line!r}"
          f"{', right, Connection: close' if answer_ok else ' (NOT right or kept alive)'}; "
          f"exit {rc}")
    if not idle_closed:
        problems.append("drain: the idle keep-alive connection was not closed")
    if not refused:
        problems.append("drain: new connections were still accepted")
    if not slow_ok:
        problems.append(f"drain: the head trickling in got {slow_status} {slow_headers}")
    if not answer_ok:
        problems.append(f"drain: the request in flight got {data[:300]!r}")
    problems.extend(drained_cleanly(server, rc))
    problems.extend(drain_deadline(args, binary, workdir, report))
    return problems


def drain_deadline(args, binary, workdir, report) -> list[str]:
    """--drain-seconds 0.3 with a 1.5 s request in flight: the deadline cuts it off (no answer; the
    server says so), its GPU work still finishes, and the server exits 0 with nothing left."""
    server = ServerProcess("d1", binary, free_port(), server_args(args)[:2] +
                           ["--drain-seconds", "0.3", "--max-busy-us", "1500000"], workdir)
    server.start()
    server.wait_listening()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as busy:
        busy.sendall(b"GET /busy?us=1500000&seed=5 HTTP/1.1\r\nHost: d\r\n\r\n")
        deadline = time.monotonic() + 30
        while gauge(server.port, "evr_server_requests_in_flight") < 2:
            if time.monotonic() > deadline:
                raise RuntimeError("the long request never showed in flight")
        server.signal(signal.SIGTERM)
        unanswered = busy.recv(4096) == b""
    rc = server.wait_exit(timeout=60)
    out = server.last_run_output()
    said = re.search(r"drain: the deadline \(0\.3 s\) passed with (\d+) requests in flight", out)
    report["drain_deadline"] = {"unanswered": unanswered, "said": said.group(0) if said else None,
                                "exit": rc}
    print(f"drain deadline: the 1.5 s request cut off at 0.3 s: {unanswered}; the server said "
          f"{said.group(0) if said else 'nothing'!r}; exit {rc}")
    problems = []
    if not unanswered:
        problems.append("drain deadline: the request past the deadline was answered")
    if not said or said.group(1) != "1":
        problems.append("drain deadline: the server did not say it cut off 1 request")
    problems.extend(drained_cleanly(server, rc, deadline_expected=True))
    return problems


async def rolling_restart(args, binary, seeds, workdir, report) -> list[str]:
    fleet = Fleet(binary, 2, server_args(args), workdir, haproxy_mode=args.haproxy_mode)
    fleet.start()
    problems: list[str] = []
    restarts = {}

    async def scenario(tally):
        loop = asyncio.get_running_loop()
        for i, server in enumerate(fleet.servers):
            await asyncio.sleep(args.seconds * (0.25 if i == 0 else 0.35))
            t0 = time.monotonic()
            server.signal(signal.SIGTERM)
            rc = await loop.run_in_executor(None, server.wait_exit, args.drain_seconds + 30)
            drained_s = time.monotonic() - t0
            problems.extend(drained_cleanly(server, rc))
            server.start()
            await loop.run_in_executor(None, server.wait_listening)
            back_s = await loop.run_in_executor(None, fleet.haproxy.wait_state, server.name, True)
            # From here on every answer under this name is the new process's (the old one exited).
            restarts[server.name] = {"drain_s": drained_s, "back_in_rotation_s": back_s,
                                     "answered_before": tally.by_backend.get(server.name, 0)}
        await asyncio.sleep(args.seconds * 0.25)
        restarts["after"] = dict(tally.by_backend)

    t0 = time.monotonic()
    tally = await load_while(fleet.haproxy.port, args.route, args.connections, seeds, scenario)
    elapsed = time.monotonic() - t0
    if args.haproxy_mode == "tcp":  # no X-Evr-Backend: each restarted process's own count
        answered_after = {s.name: busy_answered(s) for s in fleet.servers}
    else:
        answered_after = {s.name: tally.by_backend.get(s.name, 0) -
                          restarts[s.name]["answered_before"] for s in fleet.servers}
    codes = fleet.stop()
    for s, rc in zip(fleet.servers, codes):
        problems.extend(drained_cleanly(s, rc))
    report["rolling_restart"] = {
        "seconds": elapsed, "ok": tally.ok, "non2xx": tally.non2xx,
        "socket_errors": tally.socket_errors, "wrong": tally.wrong,
        "by_backend": tally.by_backend, "restarts": restarts, "first_problem": tally.first_problem}
    print(f"rolling restart (HAProxy mode {args.haproxy_mode}): {tally.ok} answers right in "
          f"{elapsed:.1f} s ({tally.ok / elapsed:.0f}/s) over {args.connections} connections; "
          f"{tally.non2xx} non-2xx, {tally.socket_errors} socket errors, {tally.wrong} wrong; per "
          f"server {tally.by_backend}; after their restarts {answered_after}")
    for name in ("s0", "s1"):
        r = restarts[name]
        print(f"  {name}: SIGTERM -> exited 0 after {r['drain_s']:.2f} s (drained), started again, "
              f"back in HAProxy's rotation {r['back_in_rotation_s']:.2f} s later")
    if tally.non2xx or tally.socket_errors or tally.wrong:
        problems.append(f"rolling restart: the clients saw {tally.non2xx} non-2xx, "
                        f"{tally.socket_errors} socket errors, {tally.wrong} wrong answers "
                        f"(first: {tally.first_problem})")
    for name, n in answered_after.items():
        if n <= 0:
            problems.append(f"rolling restart: {name} answered nothing after its restart")
    return problems


async def sigkill(args, binary, seeds, workdir, report) -> list[str]:
    fleet = Fleet(binary, 2, server_args(args), workdir, haproxy_mode=args.haproxy_mode)
    fleet.start()
    problems: list[str] = []
    marks = {}

    async def scenario(tally):
        loop = asyncio.get_running_loop()
        victim = fleet.servers[1]
        await asyncio.sleep(2)
        marks["killed"] = time.monotonic()
        victim.signal(signal.SIGKILL)
        await loop.run_in_executor(None, victim.wait_exit, 10)
        marks["out_after_s"] = await loop.run_in_executor(
            None, fleet.haproxy.wait_state, victim.name, False)
        marks["out"] = time.monotonic()
        victim.start()
        await loop.run_in_executor(None, victim.wait_listening)
        await loop.run_in_executor(None, fleet.haproxy.wait_state, victim.name, True)
        marks["before_back"] = tally.by_backend.get(victim.name, 0)
        await asyncio.sleep(2)

    tally = await load_while(fleet.haproxy.port, args.route, args.connections, seeds, scenario)
    if args.haproxy_mode == "tcp":
        served_again = busy_answered(fleet.servers[1])
    else:
        served_again = tally.by_backend.get("s1", 0) - marks["before_back"]
    fleet.stop()
    lost = tally.non2xx + tally.socket_errors
    # A loss is stamped when its client task runs, which on a loaded machine can be a little after
    # HAProxy took s1 out although the request was lost before: half a second of grace.
    late = [t for t in tally.errors_at if t > marks["out"] + 0.5]
    report["sigkill"] = {"ok": tally.ok, "lost": lost, "non2xx": tally.non2xx,
                         "socket_errors": tally.socket_errors, "wrong": tally.wrong,
                         "out_of_rotation_s": marks["out_after_s"], "errors_after_out": len(late),
                         "served_after_restart": served_again, "first_problem": tally.first_problem}
    print(f"SIGKILL (HAProxy mode {args.haproxy_mode}): s1 killed under load; HAProxy took it out {marks['out_after_s']:.2f} s later; "
          f"the clients lost {lost} requests ({tally.non2xx} non-2xx, {tally.socket_errors} socket "
          f"errors{': ' + tally.first_problem if tally.first_problem else ''}) of {tally.ok + lost}; "
          f"{len(late)} after it was out; s1 answered {served_again} after its restart")
    if tally.wrong:
        problems.append(f"SIGKILL: {tally.wrong} wrong answers")
    if late:
        problems.append(f"SIGKILL: {len(late)} requests lost after HAProxy took s1 out")
    if lost > args.connections:
        problems.append(f"SIGKILL: {lost} lost, more than the {args.connections} in flight")
    if served_again <= 0:
        problems.append("SIGKILL: s1 served nothing after its restart")
    return problems


def server_args(args) -> list[str]:
    # Behind a balancer of connections (HAProxy in mode tcp) a restarted server gets only new
    # connections: the clients reconnect every 100 requests so that it gets its share.
    spread = ["--max-connection-requests", "100"] if args.haproxy_mode == "tcp" else []
    return ["--device", args.device, "--drain-seconds", str(args.drain_seconds)] + spread + \
        args.server_args.split()


def main() -> int:
    p = load_test_arguments(__doc__.split("\n\n")[0])
    p.add_argument("--skip-kill", action="store_true")
    p.add_argument("--haproxy-mode", default="http", choices=["http", "tcp"],
                   help="HAProxy per request (http) or per connection (tcp) in scenarios 1 and 2")
    a = parse_load_test_arguments(p)
    seeds = busy_references()
    workdir = results_folder(a.out, "evr-deploy.")
    report: dict = {"args": vars(a)}
    problems = drain_direct(a, a.bin, workdir, report)
    problems += asyncio.run(rolling_restart(a, a.bin, seeds, workdir, report))
    if not a.skip_kill:
        problems += asyncio.run(sigkill(a, a.bin, seeds, workdir, report))
    return finish("rolling-restart-test", workdir, "deploy.json", report, problems)

if __name__ == "__main__":
    sys.exit(main())
