#!/usr/bin/env python3
"""Servers restarted under load behind HAProxy lose nothing (SIGTERM), and what SIGKILL costs.

    python3 examples/deploy/rolling_restart_test.py --bin build/release/examples/evr-async-server
        [--device sim|cuda] [--seconds 20] [--connections 64] [--route "/busy?us=2000"]
        [--skip-kill] [--skip-reuse-port] [--out DIR]

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
3. --reuse-port (unless --skip-reuse-port): two servers on one port (SO_REUSEPORT); 200 one-request
   connections; both must have answered some, and together all.
4. A rolling restart on one port, no balancer (unless --skip-reuse-port): two servers with
   --reuse-port under the closed-loop load (a quarter of the clients a connection per request);
   each in turn replaced (the new process listens first, then the old one drains). Asserted: 0
   wrong, 0 lost, no request failed on a kept-alive connection, both replacements answered. Run
   with this namespace's net.ipv4.tcp_migrate_req and, as root, again in a network namespace of
   its own with it set to 1 (then no new connection may fail either). --only-reuse-port-rolling
   runs this one alone.

Exit status 0 when every assertion held; the figures go to stdout (and --out DIR/deploy.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fleet import DEFAULT_BIN, Fleet, ServerProcess, free_port, http_status  # noqa: E402

M32 = 0xFFFFFFFF


def busy_reference(seed: int) -> int:
    """What /busy answers for `seed` (examples/async_server/busy_math.hpp, bit for bit)."""
    def mix(h):
        h ^= h >> 16
        h = (h * 0x7FEB352D) & M32
        h ^= h >> 15
        h = (h * 0x846CA68B) & M32
        h ^= h >> 16
        return h

    total = 0
    for t in range(32):
        h = (seed ^ ((t * 0x9E3779B9) & M32)) & M32
        for r in range(64):
            h = mix((h + r) & M32)
        total = (total + h) & M32
    return total


class Tally:
    """What the clients saw, in total and per second of the run."""

    def __init__(self):
        self.ok = self.non2xx = self.socket_errors = self.wrong = 0
        self.by_backend: dict[str, int] = {}
        self.errors_at: list[float] = []  # monotonic time of each non-2xx / socket error
        # requests sent again (client(retries=...)) because their connection failed first: on a
        # connection that had answered before ("reused") or on a new one ("fresh")
        self.retried: dict[str, int] = {}
        self.first_problem = ""

    def problem(self, what: str) -> None:
        self.errors_at.append(time.monotonic())
        if not self.first_problem:
            self.first_problem = what


async def read_response(reader) -> tuple[int, dict, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


async def client(port: int, route: str, seeds: dict, stop: asyncio.Event, tally: Tally, idx: int,
                 retries: int = 0, one_request_per_connection: bool = False):
    """One keep-alive connection in a closed loop; a fresh one after an error or a close. With
    `retries`, a request whose connection failed before its answer is sent again on a fresh
    connection, up to that many times, as HTTP clients do for idempotent requests (RFC 9110,
    9.2.2); each such resend is counted, by where the connection failed. With
    `one_request_per_connection`, every request asks for `Connection: close`."""
    close = "Connection: close\r\n" if one_request_per_connection else ""
    keys = list(seeds)
    n = idx
    writer = None
    attempt = 0
    answered_on_connection = 0
    while not stop.is_set():
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                answered_on_connection = 0
            seed = keys[n % len(keys)]
            sep = "&" if "?" in route else "?"
            writer.write(f"GET {route}{sep}seed={seed} HTTP/1.1\r\nHost: fleet\r\n{close}\r\n"
                         .encode())
            status, headers, body = await read_response(reader)
            n += 7
            attempt = 0
            answered_on_connection += 1
            if status != 200:
                tally.non2xx += 1
                tally.problem(f"{status} {body[:200]!r}")
            else:
                answer = json.loads(body)
                if answer.get("result") != seeds[seed]:
                    tally.wrong += 1
                    tally.problem(f"wrong answer for seed {seed}: {answer}")
                else:
                    tally.ok += 1
                b = headers.get("x-evr-backend", "?")
                tally.by_backend[b] = tally.by_backend.get(b, 0) + 1
            if headers.get("connection", "").lower() == "close":
                writer.close()
                writer = None
        except (OSError, asyncio.IncompleteReadError, ValueError) as e:
            if writer is not None:
                writer.close()
            writer = None
            if attempt < retries and not isinstance(e, ValueError):
                attempt += 1
                where = "reused" if answered_on_connection else "fresh"
                tally.retried[where] = tally.retried.get(where, 0) + 1
                continue
            attempt = 0
            n += 7
            tally.socket_errors += 1
            tally.problem(f"{type(e).__name__}: {e}")
            await asyncio.sleep(0.01)
    if writer is not None:
        writer.close()


async def load_while(port, route, connections, seeds, scenario, retries=0, churn=0):
    """Runs the clients until `scenario` (a coroutine function taking the tally) returns; the
    first `churn` of them open a connection per request."""
    tally = Tally()
    stop = asyncio.Event()
    tasks = [asyncio.create_task(client(port, route, seeds, stop, tally, i, retries, i < churn))
             for i in range(connections)]
    try:
        await scenario(tally)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    return tally


def drained_cleanly(server: ServerProcess, rc: int, deadline_expected: bool = False) -> list[str]:
    """What is wrong with a server's SIGTERM exit (nothing: []). A drain that needed its
    deadline to end is not clean unless `deadline_expected`."""
    out = server.last_run_output()
    problems = []
    if "drain: the deadline" in out and not deadline_expected:
        problems.append(f"{server.name}: the drain ended at its deadline, not by itself")
    if rc != 0:
        problems.append(f"{server.name} exited with {rc}")
    m = re.search(r"afterwards (\d+) requests, (\d+) of \d+ lanes, (\d+) reactor waits left", out)
    if not m or m.groups() != ("0", "0", "0"):
        problems.append(f"{server.name}: left something behind: {m.group(0) if m else 'no summary'}")
    if "draining" not in out:
        problems.append(f"{server.name}: did not say it was draining")
    return problems


def request_on(sock, path: str) -> tuple[int, dict, bytes]:
    """GET path on an open socket (keep-alive); the status, headers and body of the answer."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: drain\r\n\r\n".encode())
    return request_on_sent(sock, path)


def request_on_sent(sock, path: str = "the request") -> tuple[int, dict, bytes]:
    """The answer to the request already sent on `sock`: status, headers, body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError(f"closed before the answer to {path}")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in
               (line.split(":", 1) for line in lines[1:] if ":" in line)}
    while len(body) < int(headers.get("content-length", "0")):
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError(f"closed in the body of the answer to {path}")
        body += chunk
    return int(lines[0].split(" ", 2)[1]), headers, body


def busy_answered(server: ServerProcess) -> int:
    """The /busy requests that the server's running process answered with 200 (its /metrics)."""
    with socket.create_connection((server.host, server.port), timeout=5) as s:
        _, _, body = request_on(s, "/metrics")
    m = re.search(r'^evr_server_requests_total\{path="/busy",status="200"\} (\d+)$',
                  body.decode(), re.M)
    return int(m.group(1)) if m else 0


def gauge(port: int, name: str) -> float:
    """A gauge's value from the server's /metrics."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        _, _, body = request_on(s, "/metrics")
    m = re.search(rf"^{name} (\S+)$", body.decode(), re.M)
    if not m:
        raise RuntimeError(f"/metrics has no {name}")
    return float(m.group(1))


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
    move to another listener of the port; with 0 they are reset (the clients here resend them).
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
                        f"kept-alive connections that the drain closed before their last answer")
    if migrate == "1" and tally.retried.get("fresh", 0):
        problems.append(f"reuse-port rolling restart: {tally.retried['fresh']} new connections "
                        f"failed although tcp_migrate_req=1 moves the accept queue")
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
    inner = [sys.executable, os.path.abspath(__file__), "--only-reuse-port-rolling",
             "--bin", os.path.abspath(args.bin), "--device", args.device,
             "--seconds", str(args.seconds), "--connections", str(args.connections),
             "--route", args.route, "--drain-seconds", str(args.drain_seconds),
             "--server-args", args.server_args, "--out", sub_out]
    script = ("ip link set lo up && echo 1 >/proc/sys/net/ipv4/tcp_migrate_req && exec " +
              " ".join(shlex.quote(x) for x in inner))
    rc = subprocess.run(["unshare", "--net", "sh", "-c", script], timeout=args.seconds * 4 + 300).returncode
    try:
        with open(os.path.join(sub_out, "deploy.json"), encoding="utf-8") as f:
            report.setdefault("reuse_port_rolling", []).extend(json.load(f)["reuse_port_rolling"])
    except (OSError, KeyError, ValueError):
        pass
    return [] if rc == 0 else [f"reuse-port rolling restart with tcp_migrate_req=1 failed ({rc})"]


def server_args(args) -> list[str]:
    # Behind a balancer of connections (HAProxy in mode tcp) a restarted server gets only new
    # connections: the clients reconnect every 100 requests so that it gets its share.
    spread = ["--max-connection-requests", "100"] if args.haproxy_mode == "tcp" else []
    return ["--device", args.device, "--drain-seconds", str(args.drain_seconds)] + spread + \
        args.server_args.split()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", default=DEFAULT_BIN)
    p.add_argument("--device", default="sim", choices=["auto", "cuda", "sim"])
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--route", default="/busy?us=2000")
    p.add_argument("--drain-seconds", type=float, default=10)
    p.add_argument("--server-args", default="")
    p.add_argument("--skip-kill", action="store_true")
    p.add_argument("--skip-reuse-port", action="store_true")
    p.add_argument("--haproxy-mode", default="http", choices=["http", "tcp"],
                   help="HAProxy per request (http) or per connection (tcp) in scenarios 1 and 2")
    p.add_argument("--only-reuse-port-rolling", action="store_true",
                   help="only the rolling restart on one port without a balancer")
    p.add_argument("--out")
    a = p.parse_args()
    if not os.access(a.bin, os.X_OK):
        p.error(f"--bin {a.bin}: not an executable")
    if not a.route.startswith("/busy"):
        p.error(f"--route must be a /busy route (its answers are checked here), not {a.route}")
    seeds = {s: busy_reference(s) for s in range(1, 257)}
    workdir = a.out or tempfile.mkdtemp(prefix="evr-deploy.")
    os.makedirs(workdir, exist_ok=True)
    report: dict = {"args": vars(a)}
    if a.only_reuse_port_rolling:
        problems = asyncio.run(reuse_port_rolling(a, a.bin, seeds, workdir, report))
    else:
        problems = drain_direct(a, a.bin, workdir, report)
        problems += asyncio.run(rolling_restart(a, a.bin, seeds, workdir, report))
        if not a.skip_kill:
            problems += asyncio.run(sigkill(a, a.bin, seeds, workdir, report))
        if not a.skip_reuse_port:
            problems += asyncio.run(reuse_port(a, a.bin, workdir, report))
            problems += asyncio.run(reuse_port_rolling(a, a.bin, seeds, workdir, report))
            problems += reuse_port_rolling_migrating(a, workdir, report)
    with open(os.path.join(workdir, "deploy.json"), "w") as f:
        json.dump(report, f, indent=1)
    for problem in problems:
        print(f"FAILED: {problem}")
    print(f"rolling-restart-test: {'FAILED' if problems else 'passed'} (logs in {workdir})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
