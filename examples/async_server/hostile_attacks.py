"""The attacks of hostile_test.py, one a function: each starts a server of its own, attacks it
while normal clients probe it, and appends what the server got wrong to `failures` and what it
saw to `notes` (hostile_test.py's docstring says what each does and checks). Standard library
only."""
import json
import os
import random
import re
import resource
import socket
import threading
import time

from hostile_client import (Server, ask, close_all, get, leaks, metrics, open_idle,
                            own_descriptor_room, reset_all, send_requests, still_open, wait_for)
from hostile_probes import ABANDON_BUSY_BOUND_MS, NORMAL, Prober, check_probes

IDLE_TARGET = 20000  # the fd attack's idle sockets (fewer if this process may not open that many)


def attack_fd(binary, failures, notes):
    room = own_descriptor_room()
    n = min(IDLE_TARGET, room - 600)
    server_limit = min(1024, max(256, n // 4))
    srv = Server(binary, nofile=server_limit)
    try:
        cap = int(re.search(r"limits: (\d+) connections", srv.line("limits:")).group(1)) \
            if srv.line("limits:") else 0
        probe = Prober(srv.port, NORMAL)
        taken = lambda want: lambda: sum(metrics(srv.port).get(k, 0) for k in (
            "evr_server_connections_accepted_total",
            'evr_server_connections_refused_total{reason="descriptors"}')) >= want
        t_open = time.monotonic()
        idle = open_idle(srv.port, n, ["127.0.0.2", "127.0.0.3"])
        wait_for(f"the server took all {n} idle connections", taken(n), 60, failures)
        held = [time.monotonic()]
        time.sleep(1.5)  # the interval over which the held sockets must not deny service
        held.append(time.monotonic())
        # EMFILE: the limit lowered below what the server holds, and more sockets.
        idle = still_open(idle)  # room in this process for the next 2000
        fds = len(os.listdir(f"/proc/{srv.proc.pid}/fd"))
        _, hard = resource.prlimit(srv.proc.pid, resource.RLIMIT_NOFILE)
        lower = min(fds, hard) - 64  # never above its hard limit: raising one needs a privilege
        resource.prlimit(srv.proc.pid, resource.RLIMIT_NOFILE, (lower, lower))
        t_emfile = time.monotonic()
        more = open_idle(srv.port, 2000, ["127.0.0.1"])
        wait_for("the server took the 2000 more", taken(n + 2000), 60, failures)
        held.append(time.monotonic())
        time.sleep(1.5)
        held.append(time.monotonic())
        samples = probe.stop()
        m = metrics(srv.port)
        windows = [(held[0], held[1]), (held[2], held[3])]
        summary = check_probes(samples, NORMAL, failures, windows=windows)
        bursts = check_probes(samples, {p: float("inf") for p in NORMAL}, [], label="",
                              windows=[(t_open, held[0]), (held[1], held[2])])
        open_now = m.get("evr_server_connections", -1)
        if not 0 < open_now <= cap + 64:
            failures.append(f"{open_now} connections open, above --max-connections {cap}")
        evicted = m.get("evr_server_connections_evicted_total", 0)
        refused = sum(v for k, v in m.items() if k.startswith("evr_server_connections_refused"))
        if evicted + refused == 0:
            failures.append("no connection was refused or closed to make room")
        reports = [l for l in srv.stderr if "accept:" in l]
        if len(reports) > time.monotonic() - t_emfile + 2:  # at most one a second
            failures.append(f"{len(reports)} accept error reports in "
                            f"{time.monotonic() - t_emfile:.0f} s: the accept loop spins")
        close_all(idle + more)
        leaks(srv.port, failures)
        notes.append(f"{n} idle sockets against RLIMIT_NOFILE {server_limit} (cap {cap}), then "
                     f"2000 more at EMFILE; while held: {summary}; {int(evicted)} evicted, "
                     f"{int(refused)} refused, {len(reports)} accept reports; while they "
                     f"connected: {bursts}")
    finally:
        srv.stop(failures)
        srv.kill()


def attack_storm(binary, failures, notes, sanitized):
    srv = Server(binary)
    try:
        before = srv.rss_mib()
        statuses, errors = {}, []
        lock = threading.Lock()

        def big(i):
            try:
                status, headers, body = ask(srv.port, get(f"/saxpy?n=4194304&seed={i}"), 120)
                ok = status == 200 or (status == 503 and headers.get("retry-after"))
                with lock:
                    statuses[status] = statuses.get(status, 0) + 1
                    if not ok:
                        errors.append(f"{status}: {body[:100]}")
            except OSError as e:
                with lock:
                    errors.append(str(e))
        probe = Prober(srv.port, NORMAL)
        t0 = time.monotonic()
        threads = [threading.Thread(target=big, args=(i,)) for i in range(64)]
        for t in threads:
            t.start()
        peak = before
        while any(t.is_alive() for t in threads):
            peak = max(peak, srv.rss_mib())
            time.sleep(0.01)
        took = time.monotonic() - t0
        samples = probe.stop()
        summary = check_probes(samples, NORMAL, failures, since=t0)
        if errors:
            failures.append(f"{len(errors)} large requests not answered 200 or 503 with "
                            f"Retry-After: {errors[0]}")
        if not statuses.get(200):
            failures.append("no large request was served")
        leaks(srv.port, failures)
        after = srv.rss_mib()
        # The allocator of a sanitizer keeps freed memory in quarantine: only Release is held to it.
        if not sanitized and after > before + 64:
            failures.append(f"RSS {before:.0f} MiB before, {after:.0f} MiB after: the buffers "
                            f"were not given back")
        notes.append(f"64 x /saxpy?n=4194304 in {took:.2f} s: {statuses}; RSS {before:.0f} -> "
                     f"peak {peak:.0f} -> {after:.0f} MiB; {summary}")
    finally:
        srv.stop(failures)
        srv.kill()


def no_constants(name):
    raise ValueError(f"{name} is not JSON")


def attack_mlp(binary, failures, notes):
    srv = Server(binary, ["--check-every", "1"])
    try:
        inputs = int(re.search(r"mlp (\d+)-", srv.line("server:")).group(1))
        row = lambda v: (",".join([v] * inputs) + "\n").encode()
        post = lambda body: (f"POST /mlp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/csv"
                             f"\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
        refusals, limit = {}, None
        for _ in range(32):
            status, _, body = ask(srv.port, post(row("3e38")))
            refusals[status] = refusals.get(status, 0) + 1
            m = re.search(r"at most ([0-9.e+]+)", body)
            if status != 422 or "'3e38'" not in body or not m:
                failures.append(f"a row of 3e38: status {status}, want 422 naming the number: "
                                f"{body[:160]}")
                break
            limit = float(m.group(1))
        answers = 0
        for v in ([f"{limit / 2:.6g}", f"{-limit / 2:.6g}"] if limit else []):
            status, _, body = ask(srv.port, post(row(v)))
            try:
                doc = json.loads(body, parse_constant=no_constants)
                finite = all(abs(x) < float("inf") for x in doc["checksums"] + doc["first"])
            except (ValueError, KeyError) as e:
                doc, finite = None, False
                failures.append(f"a row of {v}: not valid JSON ({e}): {body[:160]}")
            if status != 200 or not finite or (doc and not doc.get("checked")):
                failures.append(f"a row of {v}: status {status}: {body[:160]}")
            answers += 1
        wrong = metrics(srv.port).get('evr_server_checks_total{result="wrong"}')
        if wrong != 0:
            failures.append(f"evr_server_checks_total{{result=\"wrong\"}} is {wrong}: a client's "
                            f"input counted as the device's fault")
        leaks(srv.port, failures)
        notes.append(f"32 rows of 3e38: {refusals} (limit {limit}); {answers} rows at half the "
                     f"limit answered as valid JSON")
    finally:
        srv.stop(failures)
        srv.kill()


def queue_then_abandon(srv, n, failures):
    """n GET /busy?us=100000 in the server (read, running or queued for a lane), then every
    client gone. Returns the moment they were reset."""
    socks = send_requests(srv.port, n, "/busy?us=100000")
    # Read by the server: answered (a round of kernels takes 100 ms) or in flight.
    read = lambda: sum(v for k, v in metrics(srv.port).items() if k in (
        "evr_server_requests_in_flight", 'evr_server_requests_total{path="/busy",status="200"}'))
    wait_for(f"the server reading the {n} requests", lambda: read() >= n, 60, failures)
    t = time.monotonic()
    reset_all(socks)
    return t


def attack_abandon(binary, failures, notes):
    srv = Server(binary)
    try:
        lanes = int(re.search(r"lanes: (\d+)", srv.line("lanes:")).group(1))
        probe = Prober(srv.port, NORMAL)
        t_reset = queue_then_abandon(srv, 3000, failures)
        t_answered = time.monotonic()
        answered = metrics(srv.port).get('evr_server_requests_total{path="/busy",status="200"}', 0)
        ended = lambda m: sum(m.get(k, 0) for k in (
            'evr_server_requests_abandoned_total{stage="queued"}',
            'evr_server_requests_abandoned_total{stage="running"}',
            'evr_server_requests_total{path="/busy",status="200"}'))
        # The burst: until every request whose client left is dropped (or answered into a reset).
        wait_for("the abandoned requests dropped", lambda: ended(metrics(srv.port)) >= 3000, 30,
                 failures)
        t_dropped = time.monotonic()

        def at_rest():  # nothing but probes left in flight
            m = metrics(srv.port)
            return (m.get("evr_server_requests_in_flight", 99) <= 3 and
                    m.get("evr_server_lanes_leased", 99) <= 2)
        wait_for("the server through the abandoned requests", at_rest, 30, failures)
        time.sleep(max(0.0, t_reset + 1.0 - time.monotonic()))  # observed for a second at least
        samples = probe.stop()
        burst_ms = (t_dropped - t_reset) * 1000
        # Every one accounted for within a second: the kernels on the GPU when the clients left and
        # one more round (200 ms), and 3 000 drops of at most 20 us of io-thread work each (60 ms,
        # 600 ms with a tenth of a core).
        if burst_ms > 1000:
            failures.append(f"the abandoned requests took {burst_ms:.0f} ms to be dropped or "
                            f"run (bound 1000 ms)")
        # A request sent during the burst may wait for the drop of those ahead of it (io-thread
        # work in proportion to them, about 12 us each in Release): the bound plus the burst.
        after = {p: ABANDON_BUSY_BOUND_MS if p.startswith("/busy") else b for p, b in NORMAL.items()}
        during = {p: b + burst_ms for p, b in after.items()}
        # (A short burst may see no probe sent: one sent before it can still be waiting.)
        summary = check_probes(samples, during, failures, windows=[(t_reset, t_dropped)],
                               required=False)
        summary_after = check_probes(samples, after, failures, since=t_dropped)
        m = metrics(srv.port)
        queued = m.get('evr_server_requests_abandoned_total{stage="queued"}', 0)
        # The probes' own answers since `answered` was read, by when they came back: one sent
        # before the reset may still have been in flight then (counted as a kernel for a client
        # that left, it failed a loaded CI run with 193 against 192).
        probes_ok = sum(1 for t, ms, status in samples["/busy?us=100"]
                        if status == 200 and t + ms / 1000 >= t_answered) \
            if "/busy?us=100" in samples else 0
        # Kernels run after the clients left: answered into a reset, or abandoned while running.
        ran = ended(m) - queued - answered - probes_ok
        # The round on the GPU when they left, and one more that may start before the requests
        # queued behind it are found gone (they are watched already: they waited), one to spare.
        if ran > 3 * lanes or queued == 0:
            failures.append(f"{ran:.0f} kernels ran for requests whose clients had left, "
                            f"{queued:.0f} were dropped; want at most {3 * lanes} ({lanes} lanes)")
        leaks(srv.port, failures)
        notes.append(f"3000 in the server ({answered:.0f} answered), then their clients gone: "
                     f"{queued:.0f} dropped in {burst_ms:.0f} ms, {ran:.0f} ran ({lanes} lanes); "
                     f"during the drop: {summary}; after it: {summary_after}")
    finally:
        srv.stop(failures)
        srv.kill()


def attack_shutdown(binary, failures, notes):
    srv = Server(binary)
    try:
        queue_then_abandon(srv, 5000, failures)
        # 100 ms for the kernels on the GPU, then the teardown of up to 5000 connections.
        took = srv.stop(failures, within_s=60)
        if took > 2.0:
            failures.append(f"SIGTERM with 5000 abandoned requests queued: exit took {took:.1f} s "
                            f"(bound 2 s: the longest kernel, 0.1 s, and the teardown)")
        notes.append(f"SIGTERM with 5000 abandoned requests queued: exit in {took:.2f} s")
    finally:
        srv.kill()


def fuzz_requests(rng, n):
    valid = [get("/busy?us=50&seed=3"), get("/sum?n=100"), get("/mlp?seed=2&rows=2"),
             get("/healthz"), get("/metrics"),
             b"POST /sum HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nn=100",
             b"GET /saxpy?n=64&a=1.5 HTTP/1.0\r\n\r\n"]
    tokens = [b"\r\n", b"\n", b" ", b":", b"%", b"?", b"&", b"=", b"\x00", b"\xff", b"9" * 30,
              b"Content-Length: 99999999999999999999\r\n", b"Transfer-Encoding: chunked\r\n",
              b"Host: a\r\n", b"HTTP/1.1", b"HTTP/2.0", b"/" * 100]
    for _ in range(n):
        kind = rng.random()
        if kind < 0.15:
            yield bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300)))
            continue
        m = bytearray(rng.choice(valid))
        for _ in range(rng.randint(1, 6)):
            at = rng.randrange(len(m) + 1)
            op = rng.random()
            if op < 0.3 and m:
                del m[at:at + rng.randint(1, 8)]
            elif op < 0.6:
                m[at:at] = rng.choice(tokens)
            elif m:
                m[min(at, len(m) - 1)] = rng.getrandbits(8)
        yield bytes(m)


def fuzz_one(port, raw):
    """Sends `raw` and ends the connection's sending side: the server must answer and close, or
    close (what is incomplete stays so; a request it is still serving when it sees the end may be
    dropped as abandoned). Returns what went wrong."""
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(raw)
        s.shutdown(socket.SHUT_WR)
        while s.recv(65536):
            pass
        return None
    except socket.timeout:
        return f"neither answered nor closed: {raw[:60]!r}"
    except OSError:
        return None  # reset: a refusal may reset
    finally:
        s.close()


def attack_fuzz(binary, failures, notes):
    seed = int(os.environ.get("EVR_HOSTILE_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    srv = Server(binary, ["--timeout", "1"])
    try:
        probe = Prober(srv.port, NORMAL)
        t0 = time.monotonic()
        problems = []
        requests = list(fuzz_requests(rng, 2000))
        lock = threading.Lock()

        def worker(part):
            for raw in part:
                why = fuzz_one(srv.port, raw)
                if why:
                    with lock:
                        problems.append(why)
        threads = [threading.Thread(target=worker, args=(requests[i::16],)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        samples = probe.stop()
        summary = check_probes(samples, NORMAL, failures, since=t0)
        if srv.proc.poll() is not None:
            failures.append(f"the server died (status {srv.proc.returncode})")
        if problems:
            failures.append(f"{len(problems)} of {len(requests)} requests neither answered nor "
                            f"closed within 2 s: {problems[0]}")
        leaks(srv.port, failures)
        notes.append(f"{len(requests)} fuzzed requests (EVR_HOSTILE_SEED={seed}) in "
                     f"{time.monotonic() - t0:.1f} s; {summary}")
    finally:
        srv.stop(failures)
        srv.kill()


def attack_thread(binary, failures, notes):
    own_descriptor_room()
    srv = Server(binary, ["--mode", "thread", "--max-connections", "256"])
    try:
        base = srv.threads()
        probe = Prober(srv.port, NORMAL)
        idle = open_idle(srv.port, 3000, ["127.0.0.2", "127.0.0.3"])
        accepted = lambda: metrics(srv.port).get("evr_server_connections_accepted_total", 0) >= 3000
        wait_for("the server took all 3000 idle connections", accepted, 60, failures)
        t_held = time.monotonic()
        threads = srv.threads()
        time.sleep(1)
        samples = probe.stop()
        summary = check_probes(samples, NORMAL, failures, since=t_held)
        if threads > base + 256 + 64:
            failures.append(f"{threads} threads with 3000 idle sockets (started with {base}, "
                            f"--max-connections 256)")
        close_all(idle)
        leaks(srv.port, failures, reactor=False)
        notes.append(f"--mode thread, 3000 idle sockets: {threads} threads (from {base}); "
                     f"{summary}")
    finally:
        srv.stop(failures)
        srv.kill()
