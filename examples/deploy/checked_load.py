"""Clients whose every answer is checked, and checks of a server's exit: what the deployment tests
(rolling_restart_test.py, one_port_test.py, netns_fleet_test.py) drive their load and judge their
servers with; also the command line and the report those tests share.

A client keeps one keep-alive connection in a closed loop of `GET /busy?...&seed=S` and compares
each answer with the hash computed here (`busy_reference`); a `Tally` counts what all of them saw.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import tempfile
import time

from fleet import DEFAULT_BIN, ServerProcess

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


def busy_references() -> dict[int, int]:
    """The answers for the seeds the checked clients send (1..256), computed once."""
    return {s: busy_reference(s) for s in range(1, 257)}


class Tally:
    """What the clients saw, in total and per second of the run."""

    def __init__(self):
        self.ok = self.non2xx = self.socket_errors = self.wrong = 0
        self.by_backend: dict[str, int] = {}
        self.errors_at: list[float] = []  # monotonic time of each non-2xx / socket error
        # requests sent again (client(retries=...)) because their connection failed first: on a
        # connection that had answered before ("reused"), on a new one ("fresh"), or before a new
        # one was open ("connect": refused or reset during the handshake); the first error of each
        self.retried: dict[str, int] = {}
        self.first_retry: dict[str, str] = {}
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
    connecting = False
    attempt = 0
    answered_on_connection = 0
    while not stop.is_set():
        try:
            if writer is None:
                answered_on_connection = 0
                connecting = True
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                connecting = False
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
                where = ("connect" if connecting else
                         "reused" if answered_on_connection else "fresh")
                tally.retried[where] = tally.retried.get(where, 0) + 1
                tally.first_retry.setdefault(where, f"{type(e).__name__}: {e}")
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


def load_test_arguments(description: str) -> argparse.ArgumentParser:
    """The options every test of a server under a checked load takes (more may be added)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--bin", default=DEFAULT_BIN)
    p.add_argument("--device", default="sim", choices=["auto", "cuda", "sim"])
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--route", default="/busy?us=2000")
    p.add_argument("--drain-seconds", type=float, default=10)
    p.add_argument("--server-args", default="")
    p.add_argument("--out")
    return p


def parse_load_test_arguments(p: argparse.ArgumentParser) -> argparse.Namespace:
    """Parses and checks load_test_arguments' options (exits with a message naming a bad one)."""
    a = p.parse_args()
    if not os.access(a.bin, os.X_OK):
        p.error(f"--bin {a.bin}: not an executable")
    if not a.route.startswith("/busy"):
        p.error(f"--route must be a /busy route (its answers are checked here), not {a.route}")
    if a.connections < 1:
        p.error(f"--connections takes 1 or more, not {a.connections}")
    return a


def results_folder(out: str | None, prefix: str) -> str:
    """`out` (created if missing), or a new temporary folder named from `prefix`."""
    folder = out or tempfile.mkdtemp(prefix=prefix)
    os.makedirs(folder, exist_ok=True)
    return folder


def finish(test: str, workdir: str, report_name: str, report: dict, problems: list[str]) -> int:
    """Writes the report as workdir/report_name, prints each problem and the verdict; the exit
    status (0 passed, 1 failed)."""
    with open(os.path.join(workdir, report_name), "w") as f:
        json.dump(report, f, indent=1)
    for problem in problems:
        print(f"FAILED: {problem}")
    print(f"{test}: {'FAILED' if problems else 'passed'} (logs in {workdir})")
    return 1 if problems else 0
