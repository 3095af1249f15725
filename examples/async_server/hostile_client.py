"""The client side of hostile_test.py's attacks: a server of evr-async-server's serve mode on an
ephemeral port (stopped with SIGTERM and checked for what it left), plain HTTP/1.1 requests on
fresh connections, the server's /metrics, and sockets opened, held, reset or closed in bulk.
Standard library only."""
import re
import resource
import signal
import socket
import struct
import subprocess
import threading
import time

DEVICE = ["--device", "sim"]  # which device the servers run on (hostile_test.py --device)


class Server:
    """A server in serve mode on an ephemeral port; stderr is collected."""

    def __init__(self, binary, args=(), nofile=None):
        def limit():
            if nofile:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        cmd = [binary, *DEVICE, "--port", "0", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, preexec_fn=limit)
        self.stdout, self.stderr = [], []
        self.port = None
        for line in self.proc.stdout:
            self.stdout.append(line)
            m = re.match(r"listening on http://[^ ]*:(\d+)/", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            raise RuntimeError("the server did not start: " + "".join(self.stdout) +
                               self.proc.stderr.read())
        self.readers = [threading.Thread(target=self._read, args=(self.proc.stdout, self.stdout)),
                        threading.Thread(target=self._read, args=(self.proc.stderr, self.stderr))]
        for t in self.readers:
            t.daemon = True
            t.start()

    @staticmethod
    def _read(stream, into):
        for line in stream:
            into.append(line)

    def line(self, prefix):
        return next((l for l in self.stdout if l.startswith(prefix)), "")

    def rss_mib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) / 1024

    def threads(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            return int(re.search(r"Threads:\s+(\d+)", f.read()).group(1))

    def stop(self, failures, within_s=60):
        """SIGTERM; the server must exit 0 within `within_s`, leaving nothing behind. Returns the
        seconds it took."""
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=within_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
            failures.append(f"the server did not exit within {within_s} s of SIGTERM")
        took = time.monotonic() - t0
        for t in self.readers:
            t.join(timeout=10)
        if rc != 0:
            failures.append(f"the server exited with status {rc}")
        left = self.line("shutdown: afterwards")
        if not re.search(r"afterwards 0 requests, 0 of \d+ lanes, 0 reactor waits left", left):
            failures.append("after SIGTERM: " + (left.strip() or "no 'shutdown: afterwards' line"))
        bad = [l for l in self.stderr if re.search(
            r"internal error|exception|Sanitizer|runtime error", l)]
        if bad:
            failures.append("stderr: " + bad[0].strip())
        return took

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def ask(port, raw, timeout=30, source="127.0.0.1"):
    """Sends `raw` on a fresh connection; returns (status, headers, body) or raises."""
    s = socket.socket()
    s.settimeout(timeout)
    try:
        s.bind((source, 0))
        s.connect(("127.0.0.1", port))
        s.sendall(raw)
        return read_response(s)
    finally:
        s.close()


def read_response(s):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed before a response head")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed inside a response body")
        body += chunk
    return status, headers, body[:length].decode("utf-8", "replace")


def get(path):
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


def metrics(port):
    """/metrics as {'name{labels}': value}; {} when the server does not serve it."""
    try:
        status, _, body = ask(port, get("/metrics"), timeout=30)
    except OSError:
        return {}
    if status != 200:
        return {}
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                pass
    return out


def wait_for(what, condition, within_s, failures):
    """Polls `condition` every 50 ms (a state the server reaches, not a time) for `within_s`."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    failures.append(f"{what}: not within {within_s} s")
    return False


def leaks(port, failures, reactor=True):
    """Once the attack's clients are gone: no request, lane, wait, buffer or connection left."""
    want = {"evr_server_requests_in_flight": 1,  # this /metrics request
            "evr_server_lanes_leased": 0,
            'evr_server_request_memory_bytes{of="used"}': 0,
            'evr_server_large_requests{state="running"}': 0,
            'evr_server_large_requests{state="waiting"}': 0,
            "evr_server_connections": 1}
    if reactor:
        want["evr_reactor_in_flight"] = 0
    last = {}

    def clean():
        nonlocal last
        last = metrics(port)
        return all(last.get(k) == v for k, v in want.items())
    if not wait_for("the server's counters back to rest", clean, 30, []):
        off = {k: last.get(k) for k, v in want.items() if last.get(k) != v}
        failures.append(f"left behind: {off}")


# --- sockets in bulk ----------------------------------------------------------------------------

def open_idle(port, n, sources):
    """n connections that never send a byte, from the given source addresses in turn."""
    socks = []
    for i in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.bind((sources[i % len(sources)], 0))
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        socks.append(s)
    return socks


def close_all(socks):
    for s in socks:
        s.close()


def still_open(socks):
    """Closes the sockets the server has closed (it evicted or refused them); returns the rest."""
    kept = []
    for s in socks:
        try:
            if s.recv(1) == b"":
                s.close()
                continue
        except BlockingIOError:
            pass
        except OSError:
            s.close()
            continue
        kept.append(s)
    return kept


def own_descriptor_room():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def send_requests(port, n, path):
    """n connections, each with one request sent; returns their sockets."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(get(path))
        socks.append(s)
    return socks


def reset_all(socks):
    """The clients give up: each connection reset (RST), its answer unread."""
    for s in socks:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
