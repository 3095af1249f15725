#!/usr/bin/env python3
"""A fleet of evr-async-server processes behind HAProxy, on one host.

    python3 examples/deploy/fleet.py [--servers 2] [--port 8080] [--device auto|cuda|sim]
                                     [--per-gpu] [--bin build/release/examples/evr-async-server]
                                     [--server-args "--threads 2"] [--haproxy-mode http|tcp]
                                     [--haproxy-threads N]

starts the servers (each on a port of its own, 127.0.0.1), writes HAProxy's configuration from
haproxy.cfg.in beside this file (health checks on /readyz, retries with redispatch), starts
HAProxy in front of them on --port and serves until Ctrl-C; then stops HAProxy and SIGTERMs the
servers (each drains: docs/deploy.md). With --per-gpu, server i serves GPU i only (--devices i):
the topology of a process per GPU; without it every server uses every GPU.

The classes here are what the tests drive (rolling_restart_test.py): a server process that can be
stopped (SIGTERM: drains; SIGKILL) and started again on its port, HAProxy's view of each server
(its stats socket), and the fleet as a whole.
"""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DEFAULT_BIN = os.path.join(ROOT, "build", "release", "examples", "evr-async-server")


_started: list[subprocess.Popen] = []


@atexit.register
def _kill_leftovers() -> None:
    """A test that ends early (an exception) leaves no server or HAProxy running."""
    for p in _started:
        if p.poll() is None:
            p.kill()
            p.wait()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """One evr-async-server serving on a fixed port; its output goes to a log file."""

    def __init__(self, name: str, binary: str, port: int, args: list[str], workdir: str,
                 host: str = "127.0.0.1", netns: str | None = None):
        self.name, self.binary, self.port, self.args = name, binary, port, args
        # The address it listens on, and the network namespace it runs in (a "host" made with
        # `ip netns add`; None: this one).
        self.host, self.netns = host, netns
        self.log_path = os.path.join(workdir, f"{name}.log")
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = open(self.log_path, "a", encoding="utf-8")
        log.write(f"=== start {self.starts}\n")
        log.flush()
        cmd = [self.binary, "--port", str(self.port)] + self.args
        if self.host != "127.0.0.1":
            cmd += ["--address", self.host]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns] + cmd
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        _started.append(self.proc)
        log.close()

    def wait_listening(self, timeout: float = 60) -> None:
        """Until /readyz answers 200 on its own port (the reactor runs, lanes are free)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} while starting; "
                                   f"see {self.log_path}")
            if http_status(self.host, self.port, "/readyz") == 200:
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name}: /readyz not 200 within {timeout} s ({self.log_path})")

    def wait_output(self, text: str, timeout: float = 60) -> None:
        """Until the process has printed `text` since its last start (e.g. "listening on": with
        --reuse-port, /readyz on the shared port may be answered by another process)."""
        deadline = time.monotonic() + timeout
        while text not in self.last_run_output():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not print {text!r}: see {self.log_path}")
            time.sleep(0.05)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait_exit(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def last_run_output(self) -> str:
        """What the process printed since its last start."""
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        return text[text.rfind("=== start "):]


def http_status(host: str, port: int, path: str, timeout: float = 2.0) -> int | None:
    """The status of GET path (a fresh connection), or None when the server does not answer."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            head = s.recv(64).decode("latin-1")
        return int(head.split(" ", 2)[1]) if head.startswith("HTTP/1.1 ") else None
    except (OSError, ValueError, IndexError):
        return None


def default_haproxy_threads() -> int:
    """HAProxy's threads beside servers on the same host: a quarter of the CPUs. HAProxy's own
    default, a thread per CPU, made it spend 1.7x the CPU per request on a 32-core host with two
    servers (docs/deploy.md); 4 threads there capped its throughput."""
    return max(1, (os.cpu_count() or 4) // 4)


class HAProxy:
    """HAProxy in front of the servers, in the foreground (-db), with an admin stats socket."""

    MODES = {"http": "haproxy.cfg.in", "tcp": "haproxy-tcp.cfg.in"}

    def __init__(self, port: int, servers: list[ServerProcess], workdir: str,
                 threads: int | None = None, bind: str = "127.0.0.1", netns: str | None = None,
                 mode: str = "http"):
        self.port, self.servers, self.workdir = port, servers, workdir
        self.bind, self.netns = bind, netns  # its address, and its network namespace (a "host")
        # nbthread: None a quarter of the CPUs (default_haproxy_threads), 0 HAProxy's own default
        # (a thread per CPU)
        self.threads = default_haproxy_threads() if threads is None else threads
        if mode not in self.MODES:
            raise ValueError(f"HAProxy mode {mode!r}: http or tcp")
        self.mode = mode  # http: per-request balancing and retries; tcp: per connection, lighter
        self.socket_path = os.path.join(workdir, "haproxy.sock")
        self.cfg_path = os.path.join(workdir, "haproxy.cfg")
        self.log_path = os.path.join(workdir, "haproxy.log")
        self.proc: subprocess.Popen | None = None

    def write_config(self) -> None:
        with open(os.path.join(HERE, self.MODES[self.mode]), encoding="utf-8") as f:
            text = f.read()
        lines = "\n".join(f"    server {s.name} {s.host}:{s.port}" for s in self.servers)
        text = (text.replace("@BIND@", self.bind).replace("@PORT@", str(self.port))
                .replace("@STATS_SOCKET@", self.socket_path).replace("@SERVERS@", lines))
        if self.threads:
            text = text.replace("global\n", f"global\n    nbthread {self.threads}\n", 1)
        with open(self.cfg_path, "w", encoding="utf-8") as f:
            f.write(text)

    def start(self) -> None:
        self.write_config()
        exe = os.environ.get("EVR_HAPROXY", "haproxy")
        check = subprocess.run([exe, "-c", "-f", self.cfg_path], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy -c refused {self.cfg_path}:\n{check.stdout}{check.stderr}")
        log = open(self.log_path, "w", encoding="utf-8")
        cmd = [exe, "-db", "-f", self.cfg_path]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns] + cmd
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        _started.append(self.proc)
        log.close()

    def states(self) -> dict[str, str]:
        """Each server's state as HAProxy sees it ("UP", "DOWN", "UP 1/2", ...)."""
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(2)
                s.connect(self.socket_path)
                s.sendall(b"show stat\n")
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
        except OSError:
            return {}
        rows = data.decode().splitlines()
        if not rows or not rows[0].startswith("# "):
            return {}
        header = rows[0][2:].split(",")
        out = {}
        for row in rows[1:]:
            f = dict(zip(header, row.split(",")))
            if f.get("pxname") == "evr_servers" and f.get("svname") not in ("BACKEND", "FRONTEND"):
                out[f["svname"]] = f.get("status", "")
        return out

    def wait_state(self, name: str, up: bool, timeout: float = 30) -> float:
        """Until HAProxy has server `name` up (or down); returns the seconds it took."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited with {self.proc.returncode}: {self.log_tail()}")
            state = self.states().get(name, "")
            if (state == "UP") if up else state.startswith(("DOWN", "MAINT")):
                return time.monotonic() - t0
            time.sleep(0.02)
        raise RuntimeError(f"haproxy: {name} not {'UP' if up else 'DOWN'} within {timeout} s "
                           f"({self.states()})")

    def log_tail(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()[-2000:]

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


class Fleet:
    """N servers, each on a port of its own, and HAProxy in front of them."""

    def __init__(self, binary: str, count: int, server_args: list[str], workdir: str,
                 port: int = 0, per_server_args=None, haproxy_threads: int | None = None,
                 haproxy_mode: str = "http"):
        self.workdir = workdir
        self.servers = [ServerProcess(f"s{i}", binary, free_port(),
                                      server_args + (per_server_args(i) if per_server_args else []),
                                      workdir) for i in range(count)]
        self.haproxy = HAProxy(port or free_port(), self.servers, workdir, haproxy_threads,
                               mode=haproxy_mode)

    def start(self) -> None:
        for s in self.servers:
            s.start()
        for s in self.servers:
            s.wait_listening()
        self.haproxy.start()
        for s in self.servers:
            self.haproxy.wait_state(s.name, up=True)

    def stop(self) -> list[int]:
        """Stops HAProxy, then SIGTERMs the servers still running; their exit statuses."""
        self.haproxy.stop()
        codes = []
        for s in self.servers:
            if s.proc and s.proc.poll() is None:
                s.signal(signal.SIGTERM)
        for s in self.servers:
            codes.append(s.wait_exit(timeout=120) if s.proc else 0)
        return codes


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--port", type=int, default=8080, help="HAProxy's port")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "sim"])
    p.add_argument("--per-gpu", action="store_true", help="server i on GPU i only (--devices i)")
    p.add_argument("--bin", default=DEFAULT_BIN)
    p.add_argument("--server-args", default="", help="more arguments of every server, one string")
    p.add_argument("--haproxy-mode", default="http", choices=sorted(HAProxy.MODES),
                   help="http: per-request balancing and retries (haproxy.cfg.in); tcp: per "
                        "connection, less CPU a request (haproxy-tcp.cfg.in)")
    p.add_argument("--haproxy-threads", type=int,
                   help="HAProxy's nbthread (default: a quarter of the CPUs; 0: HAProxy's own "
                        "default, a thread per CPU)")
    a = p.parse_args()
    if a.servers < 1:
        p.error(f"--servers must be at least 1, not {a.servers}")
    if a.haproxy_threads is not None and a.haproxy_threads < 0:
        p.error(f"--haproxy-threads must be 0 or more, not {a.haproxy_threads}")
    if not os.access(a.bin, os.X_OK):
        p.error(f"--bin {a.bin}: not an executable (build the examples: scripts/test.sh)")
    args = ["--device", a.device] + a.server_args.split()
    workdir = tempfile.mkdtemp(prefix="evr-fleet.")
    fleet = Fleet(a.bin, a.servers, args, workdir, port=a.port,
                  per_server_args=(lambda i: ["--devices", str(i)]) if a.per_gpu else None,
                  haproxy_threads=a.haproxy_threads, haproxy_mode=a.haproxy_mode)
    fleet.start()
    # Blocked only now: the servers and HAProxy started above must not inherit the mask.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    print(f"fleet: {a.servers} servers ({', '.join(f'{s.name} :{s.port}' for s in fleet.servers)})"
          f" behind HAProxy on http://127.0.0.1:{fleet.haproxy.port}/; logs in {workdir}; "
          "Ctrl-C stops", flush=True)
    signal.sigwait({signal.SIGINT, signal.SIGTERM})
    codes = fleet.stop()
    print(f"fleet: servers exited with {codes}")
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
