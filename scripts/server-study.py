#!/usr/bin/python3
"""The async server study: evr against blocking servers on GPU-bound routes, one matrix per run.

    scripts/server-study.py run [--out DIR] [--budget S] [--tiny] [...]   build, measure, write JSON
    scripts/server-study.py plot DIR                                      JSON -> PNG plots
    scripts/server-study.py table DIR                                     JSON -> markdown tables

`run` builds evr-async-server (build/study: Release, CUDA when nvcc is found, headers from
.deps/include when staged), then for each server configuration starts one server and loads it
with wrk (--latency) on every route and connection count:

  routes       /busy?us=200  /busy?us=1000  /busy?us=5000  /mlp?seed=1
  servers      evr N=1, N=2, N=4 (one io_context per thread), pool spin N=4,
               thread-per-connection spin and blocking-sync (--servers adds pool blocking-sync
               N=4, pool spin N=1, pool blocking-sync N=1)
  connections  256 1024
  lanes sweep  evr N=1 on /busy?us=1000 at 1024 connections, --streams 32 64 128 256, and 128
               streams with CUDA_DEVICE_MAX_CONNECTIONS=8 (the driver's default)
The lanes of the main matrix are the server's default (--lanes 0): as many as the GPU runs /busy
kernels at once (its "lanes:" line, recorded per server).

Each point records requests/s, latency percentiles (wrk's), errors (non-2xx, socket errors),
the server's CPU: in cores and in microseconds per request, all threads of the server process
(utime+stime from /proc over the point), and per thread group (io threads evr-io-N, the reactor
evr-reactor, thread-per-connection threads evr-conn, CUDA's own threads, the simulated device,
threads that exited during the point) from /proc/PID/task/*/stat, and the GPU's utilization
(nvidia-smi sampling, when present). The servers check answers against the CPU (every 16th on
/busy and /mlp), and a server that reports a failure marks its points. JSON goes to
DIR/server-study.json; the goals of docs/benchmarks.md are evaluated at the end (met / not met,
with the numbers).

Budget: the whole run, build included, must fit one device call (8 minutes). Each point runs
--seconds (wrk takes whole seconds; default 2) plus ~0.4 s; the default matrix is 48 points + 5
sweep points + 11 server starts (a few seconds each on a GPU: CUDA, the /mlp weights, the lanes
warmed up): about 3-4 minutes of measuring plus the build (1-2 minutes on 16 cores). The run
stops starting points when the budget (--budget, default 450 s from the script's start) would be
exceeded, records the rest as skipped, and still writes the JSON.

wrk: from PATH, or staged by scripts/stage-tools.sh in .tools/ (the GPU machine has no package
registry: carry ".tools" with ".deps"). Without wrk, --builtin uses the server's own load
generator (one process per point, its CPU figure then includes the client's).

--tiny: the simulated device, a small matrix (16 and 64 connections): a test of this script
(about a minute here).

Exit status: 0 when every point ran without errors and every server reported 0 failures.
"""
import argparse
import datetime
import json
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T0 = time.monotonic()

ROUTES = ["/busy?us=200", "/busy?us=1000", "/busy?us=5000", "/mlp?seed=1"]
# (label, mode, sync, threads): the order puts what the goals need first, in case the budget runs
# out before the end.
SERVERS = [
    ("evr N=1", "evr", None, 1),
    ("evr N=2", "evr", None, 2),
    ("evr N=4", "evr", None, 4),
    ("pool spin N=4", "pool", "spin", 4),
    ("thread blocking-sync", "thread", "blocking-sync", None),
    ("thread spin", "thread", "spin", None),
]
# Not in the default matrix (--servers names them).
EXTRA_SERVERS = [
    ("pool blocking-sync N=4", "pool", "blocking-sync", 4),
    ("pool spin N=1", "pool", "spin", 1),
    ("pool blocking-sync N=1", "pool", "blocking-sync", 1),
]
CONNECTIONS = [256, 1024]
LANES_SWEEP_ROUTE = "/busy?us=1000"
LANES_SWEEP = [(32, 32), (64, 32), (128, 32), (256, 32), (128, 8)]


def log(msg):
    print(f"[server-study {time.monotonic() - T0:6.1f} s] {msg}", flush=True)


def elapsed():
    return time.monotonic() - T0


# --- build -----------------------------------------------------------------------------------------

def build(args):
    if args.bin:
        return os.path.abspath(args.bin)
    build_dir = os.path.join(ROOT, args.build_dir)
    nvcc = shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    env = dict(os.environ)
    if nvcc and os.path.dirname(nvcc) not in env.get("PATH", ""):
        env["PATH"] = os.path.dirname(nvcc) + ":" + env.get("PATH", "")
    if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
        cmd = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
               "-DEVR_BUILD_TESTS=OFF", "-DEVR_BUILD_BENCH=OFF"]
        if shutil.which("ninja"):
            cmd += ["-G", "Ninja"]
        deps = os.path.join(ROOT, ".deps", "include")
        if os.path.exists(os.path.join(deps, "asio.hpp")):
            cmd.append(f"-DEVR_THIRD_PARTY_INCLUDE_DIR={deps}")
        if nvcc and not args.tiny:
            cmd += ["-DEVR_WITH_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90"]
        log("configure: " + " ".join(cmd))
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    cmd = ["cmake", "--build", build_dir, "--target", "evr-async-server", "-j", str(os.cpu_count())]
    log("build: " + " ".join(cmd))
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return os.path.join(build_dir, "examples", "evr-async-server")


# --- wrk -------------------------------------------------------------------------------------------

def find_wrk():
    """(argv0, env) for wrk, or None."""
    staged = os.path.join(ROOT, ".tools", "usr", "bin", "wrk")
    candidates = []
    if shutil.which("wrk"):
        candidates.append((shutil.which("wrk"), dict(os.environ)))
    if os.path.exists(staged):
        lib = os.path.join(ROOT, ".tools", "usr", "lib", "x86_64-linux-gnu")
        fallback = os.path.join(ROOT, ".tools", "fallback", "usr", "lib", "x86_64-linux-gnu")
        for extra in ([lib], [lib, fallback]):
            env = dict(os.environ)
            env["LD_LIBRARY_PATH"] = ":".join(extra + [env.get("LD_LIBRARY_PATH", "")]).rstrip(":")
            candidates.append((staged, env))
    for exe, env in candidates:
        try:
            out = subprocess.run([exe, "--version"], env=env, capture_output=True, text=True,
                                 timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.startswith("wrk "):
            return exe, env, out.splitlines()[0]
    return None


def to_us(v):
    m = re.fullmatch(r"([0-9.]+)(us|ms|s|m)", v)
    if not m:
        return None
    scale = {"us": 1, "ms": 1e3, "s": 1e6, "m": 60e6}[m.group(2)]
    return float(m.group(1)) * scale


def parse_wrk(text):
    r = {}
    m = re.search(r"^Requests/sec:\s+([0-9.]+)", text, re.M)
    r["rps"] = float(m.group(1)) if m else None
    m = re.search(r"^\s*(\d+) requests in ([0-9.]+)(\w+)", text, re.M)
    r["requests"] = int(m.group(1)) if m else None
    for q in ("50", "75", "90", "99"):
        m = re.search(rf"^\s+{q}%\s+(\S+)", text, re.M)
        r[f"p{q}_us"] = to_us(m.group(1)) if m else None
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    r["non2xx"] = int(m.group(1)) if m else 0
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    r["socket_errors"] = sum(int(g) for g in m.groups()) if m else 0
    return r


# --- the server process ------------------------------------------------------------------------------

def cpu_seconds(pid):
    """utime + stime of a process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2:].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # fields 14 and 15 of the whole line


def thread_cpu(pid):
    """({tid: (comm, cpu seconds)} of the live threads, the process's own total: dead threads
    included)."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        tids = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(tid)] = (comm, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    return out, cpu_seconds(pid)


THREAD_GROUPS = ["io", "reactor", "conn", "cuda", "sim", "other", "exited"]


def thread_group(comm):
    """The group a server thread's CPU is counted under (its name: the server names its own)."""
    if comm.startswith("evr-io"):
        return "io"
    if comm == "evr-reactor":
        return "reactor"
    if comm.startswith("evr-conn"):
        return "conn"
    if comm.startswith("evr-sim"):
        return "sim"
    if comm.lower().startswith("cuda"):
        return "cuda"
    return "other"


def cpu_by_group(before, after):
    """CPU seconds per thread group between two thread_cpu() samples; 'exited': the process's
    total minus its live threads' (threads that ended in between, e.g. thread per connection)."""
    (t0, p0), (t1, p1) = before, after
    groups = {}
    live = 0.0
    for tid, (comm, cpu) in t1.items():
        d = cpu - (t0[tid][1] if tid in t0 else 0.0)
        live += d
        g = thread_group(comm)
        groups[g] = groups.get(g, 0.0) + d
    groups["exited"] = max(0.0, (p1 - p0) - live)
    return groups, p1 - p0


class gpu_sampler:
    """nvidia-smi utilization.gpu every 100 ms while a point runs (None without nvidia-smi)."""

    def __init__(self, enabled):
        self.enabled = enabled and shutil.which("nvidia-smi") is not None
        self.values = []
        self.proc = None

    def __enter__(self):
        if self.enabled:
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                 "-lms", "100"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self.thread = threading.Thread(target=self._read, daemon=True)
            self.thread.start()
        return self

    def _read(self):
        for line in self.proc.stdout:
            try:
                self.values.append(float(line.strip().split(",")[0]))
            except ValueError:
                pass

    def __exit__(self, *exc):
        if self.proc:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.thread.join(timeout=5)

    def mean(self):
        # The first sample or two predate the load; use the rest when there are enough.
        v = self.values[2:] if len(self.values) > 4 else self.values
        return sum(v) / len(v) if v else None


class server:
    def __init__(self, binary, device, mode, sync, threads, lanes, cuda_connections, extra):
        cmd = [binary, "--port", "0", "--device", device, "--mode", mode,
               "--cuda-connections", str(cuda_connections)]
        if lanes:
            cmd += ["--streams", str(lanes)]  # else the server's default (from the GPU)
        if sync:
            cmd += ["--sync", sync]
        if threads:
            cmd += ["--threads", str(threads)]
        cmd += extra
        self.cmd = cmd
        env = dict(os.environ)
        env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)  # --cuda-connections decides
        t = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env)
        self.lines = []
        self.port = None
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line.rstrip("\n"))
            m = re.match(r"listening on http://[^ ]*:(\d+)/", line)
            if m:
                self.port = int(m.group(1))
                break
        self.startup_s = time.monotonic() - t
        # Keep draining the server's output so that it never blocks on a full pipe.
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()

    def _drain(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(timeout=10)
        summary = next((l for l in self.lines if l.startswith("server: ") and "responses" in l), "")
        return summary, self.proc.returncode


def warm_up(port, route, requests=20):
    """A few requests on one connection before a route's first point (first-use costs)."""
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        for _ in range(requests):
            conn.request("GET", route)
            conn.getresponse().read()
    except OSError as e:
        log(f"warm-up of {route} failed: {e}")
    finally:
        conn.close()


def wait_idle(port, limit=90):
    """Waits until the server has no connection but the probe's and no request in flight: after
    wrk stops, a blocking server still works through the requests its closed connections sent,
    and the next point must not start on top of that. Returns the seconds it took."""
    import http.client
    t = time.monotonic()
    while time.monotonic() - t < limit:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=limit)
        try:
            conn.request("GET", "/metrics")
            page = conn.getresponse().read().decode()
        except OSError:
            page = ""
        finally:
            conn.close()
        open_ = re.search(r"^evr_server_connections (\d+)", page, re.M)
        busy = re.search(r"^evr_server_requests_in_flight (\d+)", page, re.M)
        if open_ and busy and int(open_.group(1)) <= 1 and int(busy.group(1)) <= 1:
            break  # the probe itself is the one connection and the one request
        time.sleep(0.05)
    return time.monotonic() - t


def run_point(srv, route, connections, seconds, wrk, gpu):
    url = f"http://127.0.0.1:{srv.port}{route}"
    threads = max(1, min(connections, 4))
    cmd = [wrk[0], f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency",
           "--timeout", "10s", url]
    before, t0 = thread_cpu(srv.proc.pid), time.monotonic()
    with gpu_sampler(gpu) as g:
        out = subprocess.run(cmd, env=wrk[1], capture_output=True, text=True,
                             timeout=seconds + 60)
    t1 = time.monotonic()
    groups, cpu = cpu_by_group(before, thread_cpu(srv.proc.pid))
    r = parse_wrk(out.stdout)
    r["server_cores"] = cpu / (t1 - t0)
    # Server CPU per request: every thread of the server process (io threads, reactor, CUDA's
    # threads, ...) over the point, divided by the requests wrk completed in it.
    n = r.get("requests") or 0
    r["cpu_us_per_request"] = cpu / n * 1e6 if n else None
    r["cpu_us_per_request_by_thread"] = {k: v / n * 1e6 for k, v in groups.items()} if n else None
    r["cores_by_thread"] = {k: v / (t1 - t0) for k, v in groups.items()}
    r["gpu_util"] = g.mean()
    r["wall_s"] = t1 - t0
    r["drain_s"] = wait_idle(srv.port)
    r["errors"] = r["non2xx"] + r["socket_errors"] + (0 if out.returncode == 0 and r["rps"] else 1)
    if r["rps"] is None:
        r["wrk_output"] = (out.stdout + out.stderr)[-600:]
    return r


def run_builtin_point(binary, device, mode, sync, threads, lanes, cuda_connections, extra, route,
                      connections, seconds):
    cmd = [binary, "--device", device, "--mode", mode,
           "--cuda-connections", str(cuda_connections), "--load-connections", str(connections),
           "--load-seconds", str(seconds), "--load-path", route] + extra
    if lanes:
        cmd += ["--streams", str(lanes)]
    if sync:
        cmd += ["--sync", sync]
    if threads:
        cmd += ["--threads", str(threads)]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = p.communicate(timeout=seconds + 240)
    line = next((l for l in out.splitlines() if l.startswith("load-result ")), "")
    f = dict(kv.split("=", 1) for kv in line.split()[1:])
    r = {"rps": float(f["rps"]) if "rps" in f else None, "requests": int(f.get("requests", 0)),
         "p50_us": float(f.get("p50_us", "nan")), "p75_us": None,
         "p90_us": float(f.get("p90_us", "nan")), "p99_us": float(f.get("p99_us", "nan")),
         "non2xx": 0, "socket_errors": 0, "errors": int(f.get("errors", 1)) + (p.returncode != 0),
         "server_cores": None, "cpu_us_per_request": None, "gpu_util": None,
         "wall_s": time.monotonic() - t0,
         "note": "built-in load (client in the server's process); no CPU figure"}
    return r


# --- the run ------------------------------------------------------------------------------------------

def plan(args):
    if args.tiny:
        servers = [s for s in SERVERS if s[3] in (None, 1, 2)]
        return servers, [16, 64], [(8, 32), (32, 32)]
    every = SERVERS + EXTRA_SERVERS
    if args.servers:
        unknown = [x for x in args.servers if x not in [s[0] for s in every]]
        if unknown:
            raise SystemExit(f"server-study: unknown server(s) {unknown}; known: "
                             f"{[s[0] for s in every]}")
    servers = [s for s in every if s[0] in args.servers] if args.servers else SERVERS
    return servers, args.connections, LANES_SWEEP if not args.no_lanes_sweep else []


def run(args):
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    out_dir = os.path.abspath(args.out or (os.path.join(ROOT, "build", "study-tiny") if args.tiny
                                           else os.path.join(ROOT, "docs", "bench")))
    os.makedirs(out_dir, exist_ok=True)
    device = "sim" if args.tiny else args.device
    seconds = args.seconds
    binary = build(args)
    wrk = None if args.builtin else find_wrk()
    if wrk is None and not args.builtin:
        log("wrk not found (PATH, .tools/): run scripts/stage-tools.sh here and carry \".tools\", "
            "or pass --builtin")
        return 2
    servers, connections, lanes_sweep = plan(args)
    points_total = len(servers) * len(ROUTES) * len(connections) + len(lanes_sweep)
    est = points_total * (seconds + 0.35) + (len(servers) + len(lanes_sweep)) * (
        1.5 if device == "sim" else 5)
    log(f"plan: {len(servers)} servers x {len(ROUTES)} routes x {len(connections)} connection "
        f"counts + {len(lanes_sweep)} lanes-sweep points = {points_total} points of {seconds} s; "
        f"about {est:.0f} s of measuring from now ({elapsed():.0f} s spent), budget "
        f"{args.budget} s; load: {wrk[2] if wrk else 'built-in'}")
    extra = ["--check-every", str(args.check_every)]
    doc = {"meta": {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host_cpus": os.cpu_count(), "seconds_per_point": seconds, "device": None,
        "load": wrk[2] if wrk else "built-in", "server_args": extra, "budget_s": args.budget,
        "tiny": args.tiny, "git": git_head(), "default_lanes": None},
        "points": [], "lanes_sweep": [], "servers": []}
    failed = False

    def budget_left(need):
        return elapsed() + need < args.budget

    def measure(label, mode, sync, threads, lanes, cuda_connections, routes, conns, sink, warm):
        nonlocal failed
        if not budget_left(seconds + 10):
            for route in routes:
                for c in conns:
                    sink.append({"server": label, "route": route, "connections": c,
                                 "lanes": lanes, "cuda_connections": cuda_connections,
                                 "skipped": "budget"})
            log(f"{label}: skipped (budget)")
            return
        if not wrk:
            for route in routes:
                for c in conns:
                    r = run_builtin_point(binary, device, mode, sync, threads, lanes,
                                          cuda_connections, extra, route, c, seconds)
                    r.update({"server": label, "mode": mode, "sync": sync, "threads": threads,
                              "route": route, "connections": c, "lanes": lanes,
                              "cuda_connections": cuda_connections})
                    failed |= r["errors"] != 0
                    sink.append(r)
            return
        srv = server(binary, device, mode, sync, threads, lanes, cuda_connections, extra)
        if doc["meta"]["device"] is None and srv.lines:
            doc["meta"]["device"] = srv.lines[0]
        lanes_line = next((l for l in srv.lines if l.startswith("lanes: ")), None)
        if lanes_line and lanes == 0:
            m = re.match(r"lanes: (\d+)", lanes_line)
            doc["meta"]["default_lanes"] = int(m.group(1)) if m else None
            doc["meta"]["default_lanes_line"] = lanes_line
        if srv.port is None:
            log(f"{label}: the server did not start:\n" + "\n".join(srv.lines[-20:]))
            failed = True
            srv.stop()
            return
        for route in routes:
            if warm:
                warm_up(srv.port, route)
                wait_idle(srv.port)
            for c in conns:
                if not budget_left(seconds + 5):
                    sink.append({"server": label, "route": route, "connections": c,
                                 "lanes": lanes, "cuda_connections": cuda_connections,
                                 "skipped": "budget"})
                    continue
                r = run_point(srv, route, c, seconds, wrk, device != "sim")
                r.update({"server": label, "mode": mode, "sync": sync, "threads": threads,
                          "route": route, "connections": c, "lanes": lanes,
                          "cuda_connections": cuda_connections})
                sink.append(r)
                failed |= r["errors"] != 0
                log(f"{label:24} {route:15} c={c:<5} {fmt(r['rps'], 0):>8} req/s  p99 "
                    f"{fmt(ms(r['p99_us']), 2):>8} ms  cores {fmt(r['server_cores'], 2):>5}"
                    f"  cpu {fmt(r.get('cpu_us_per_request'), 1):>6} us/req"
                    f"{'  gpu ' + fmt(r['gpu_util'], 0) + ' %' if r['gpu_util'] is not None else ''}"
                    f"{'  ERRORS ' + str(r['errors']) if r['errors'] else ''}")
        summary, rc = srv.stop()
        ok = rc == 0 and "(0 failures" in summary
        failed |= not ok
        doc["servers"].append({"server": label, "cmd": srv.cmd[1:], "startup_s": srv.startup_s,
                               "lanes": lanes_line, "summary": summary, "exit": rc, "ok": ok})
        if not ok:
            log(f"{label}: the server reported failures (exit {rc}): {summary}\n" +
                "\n".join(srv.lines[-15:]))

    for label, mode, sync, threads in servers:
        measure(label, mode, sync, threads, args.lanes, args.cuda_connections, ROUTES, connections,
                doc["points"], True)
    sweep_route, sweep_conns = LANES_SWEEP_ROUTE, (64 if args.tiny else 1024)
    for lanes, queues in lanes_sweep:
        measure(f"evr N=1, {lanes} lanes, {queues} queues", "evr", None, 1, lanes, queues,
                [sweep_route], [sweep_conns], doc["lanes_sweep"], True)
    doc["meta"]["elapsed_s"] = elapsed()
    doc["goals"] = goals(doc)
    path = os.path.join(out_dir, "server-study.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    log(f"wrote {path}")
    print_tables(doc)
    if not args.no_plot:
        try:
            plot(doc, out_dir)
        except ImportError:
            log("matplotlib not here: run `scripts/server-study.py plot DIR` where it is")
    return 1 if failed else 0


def git_head():
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None


# --- goals and tables ---------------------------------------------------------------------------------

def fmt(v, digits):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def ms(us):
    return None if us is None else us / 1000.0


def find(doc, server, route, c):
    for p in doc["points"]:
        if p["server"] == server and p["route"] == route and p["connections"] == c \
                and "skipped" not in p:
            return p
    return None


def goals(doc):
    """The goals of issue 24 (docs/benchmarks.md), from the points of the matrix."""
    out = []

    def goal(text, value, target, met):
        out.append({"goal": text, "value": value, "target": target,
                    "met": None if met is None else bool(met)})

    def ratio(a, b, key="rps"):
        if not a or not b or not a.get(key) or not b.get(key):
            return None
        return a[key] / b[key]

    busy200, busy1000, busy5000, mlp = ROUTES
    for c in (256, 1024):
        e1 = find(doc, "evr N=1", busy1000, c)
        v = e1.get("cpu_us_per_request") if e1 else None
        goal(f"/busy?us=1000, {c} connections: server CPU per request (us, every thread), evr N=1",
             v, "<= 15", None if v is None else v <= 15)
    e1 = find(doc, "evr N=1", busy1000, 256)
    v = e1.get("rps") if e1 else None
    goal("/busy?us=1000, 256 connections: evr N=1 requests/s", v, ">= 45000",
         None if v is None else v >= 45000)
    for c in (256, 1024):
        e2 = find(doc, "evr N=2", busy1000, c)
        ts, tb = find(doc, "thread spin", busy1000, c), find(doc, "thread blocking-sync", busy1000, c)
        best = max((p for p in (ts, tb) if p and p.get("rps")), key=lambda p: p["rps"],
                   default=None)
        r = ratio(e2, best)
        cores = ratio(e2, best, "server_cores")
        goal(f"/busy?us=1000, {c} connections: evr N=2 / thread-per-connection (the faster "
             "variant): requests/s, cores", [r, cores], ">= 1 at <= 0.33 of its cores",
             None if r is None or cores is None else r >= 1 and cores <= 1 / 3)
    lanes = doc["meta"].get("default_lanes")
    e4 = find(doc, "evr N=4", busy1000, 1024)
    if lanes and e4 and e4.get("rps"):
        limit = lanes / 1000e-6  # the GPU's concurrency (the default lanes) / the kernel's length
        goal(f"/busy?us=1000, 1024 connections: evr N=4 / the GPU-side limit ({lanes} kernels at "
             f"once / 1 ms = {limit:.0f}/s)", e4["rps"] / limit, ">= 0.9", e4["rps"] / limit >= 0.9)
    else:
        goal("/busy?us=1000, 1024 connections: evr N=4 / the GPU-side limit", None, ">= 0.9", None)
    r = ratio(find(doc, "evr N=4", mlp, 256), find(doc, "pool spin N=4", mlp, 256))
    goal("/mlp, 256 connections: evr N=4 (dynamic batching) / pool spin N=4 (batch size 1) "
         "requests/s", r, ">= 15", None if r is None else r >= 15)
    return out


def print_tables(doc):
    print(markdown(doc))


def markdown(doc):
    lines = []
    meta = doc["meta"]
    lines.append(f"{meta.get('device') or 'device: ?'}; {meta['host_cpus']} CPUs; load "
                 f"{meta['load']}; {meta['seconds_per_point']} s per point; git {meta.get('git')}")
    for route in ROUTES:
        lines.append("")
        lines.append(f"#### GET {route}")
        lines.append("")
        conns = sorted({p["connections"] for p in doc["points"] if p["route"] == route})
        lines.append("| server | " + " | ".join(f"c={c}" for c in conns) + " |")
        lines.append("|---|" + "---:|" * len(conns))
        for label in dict.fromkeys(p["server"] for p in doc["points"]):
            cells = []
            for c in conns:
                p = find(doc, label, route, c)
                if not p:
                    cells.append("skipped")
                    continue
                cell = f"{fmt(p['rps'], 0)} req/s, p99 {fmt(ms(p['p99_us']), 1)} ms"
                if p.get("server_cores") is not None:
                    cell += f", {fmt(p['server_cores'], 2)} cores"
                if p.get("cpu_us_per_request") is not None:
                    cell += f", {fmt(p['cpu_us_per_request'], 1)} us/req"
                if p.get("errors"):
                    cell += f", **{p['errors']} errors**"
                cells.append(cell)
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    by_thread = [p for p in doc["points"] if p.get("cpu_us_per_request_by_thread")]
    if by_thread:
        lines.append("")
        lines.append("#### Server CPU per request by thread (us), at the highest connection count")
        lines.append("")
        cols = [g for g in THREAD_GROUPS
                if any(p["cpu_us_per_request_by_thread"].get(g, 0) >= 0.05 for p in by_thread)]
        lines.append("| server | route | connections | all | " + " | ".join(cols) + " |")
        lines.append("|---|---|---:|---:|" + "---:|" * len(cols))
        top = max(p["connections"] for p in by_thread)
        for p in by_thread:
            if p["connections"] != top:
                continue
            t = p["cpu_us_per_request_by_thread"]
            lines.append(f"| {p['server']} | {p['route']} | {p['connections']} | "
                         f"{fmt(p['cpu_us_per_request'], 1)} | " +
                         " | ".join(fmt(t.get(g, 0.0), 1) for g in cols) + " |")
    if doc.get("lanes_sweep"):
        lines.append("")
        lines.append(f"#### Lanes sweep (evr N=1, GET {doc['lanes_sweep'][0]['route']})")
        lines.append("")
        lines.append("| lanes | CUDA_DEVICE_MAX_CONNECTIONS | connections | requests/s | p99 ms | "
                     "server cores | us/req |")
        lines.append("|---:|---:|---:|---:|---:|---:|---:|")
        for p in doc["lanes_sweep"]:
            if "skipped" in p:
                lines.append(f"| {p['lanes']} | {p['cuda_connections']} | {p['connections']} | "
                             "skipped | | |")
                continue
            lines.append(f"| {p['lanes']} | {p['cuda_connections']} | {p['connections']} | "
                         f"{fmt(p['rps'], 0)} | {fmt(ms(p['p99_us']), 1)} | "
                         f"{fmt(p.get('server_cores'), 2)} | "
                         f"{fmt(p.get('cpu_us_per_request'), 1)} |")
    if doc.get("goals"):
        lines.append("")
        lines.append("| goal | value | target | met |")
        lines.append("|---|---:|---|---|")
        for g in doc["goals"]:
            v = g["value"]
            value = (" vs ".join(fmt(x, 2) for x in v) if isinstance(v, list) else fmt(v, 2))
            met = {True: "**met**", False: "**not met**", None: "not measured"}[g["met"]]
            lines.append(f"| {g['goal']} | {value} | {g['target']} | {met} |")
    return "\n".join(lines)


# --- plots --------------------------------------------------------------------------------------------

def plot(doc, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {"evr": "-", "pool": "--", "thread": ":"}
    labels = list(dict.fromkeys(p["server"] for p in doc["points"]))
    colors = {label: plt.cm.tab10(i % 10) for i, label in enumerate(labels)}
    written = []
    for key, ylabel, fname, logy in (
            ("rps", "requests/s", "server-rps.png", True),
            ("p99_us", "p99 latency (ms)", "server-p99.png", True),
            ("server_cores", "server CPU (cores)", "server-cpu.png", False),
            ("cpu_us_per_request", "server CPU per request (us, all threads)",
             "server-cpu-per-request.png", True)):
        fig, axes = plt.subplots(1, len(ROUTES), figsize=(6 * len(ROUTES), 4.8), squeeze=False)
        for ax, route in zip(axes[0], ROUTES):
            for label in labels:
                pts = sorted((p for p in doc["points"] if p["server"] == label
                              and p["route"] == route and "skipped" not in p
                              and p.get(key) is not None), key=lambda p: p["connections"])
                if not pts:
                    continue
                mode = pts[0].get("mode", "evr")
                ys = [p[key] / 1000.0 if key == "p99_us" else p[key] for p in pts]
                ax.plot([p["connections"] for p in pts], ys, styles.get(mode, "-"), marker="o",
                        color=colors[label], linewidth=2.2 if mode == "evr" else 1.3, label=label)
            ax.set_xscale("log")
            if logy:
                ax.set_yscale("log")
            ax.set_title(f"GET {route}")
            ax.set_xlabel("connections (closed loop, keep-alive)")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
        if axes[0][0].get_legend_handles_labels()[0]:
            axes[0][0].legend(fontsize=8)
        fig.suptitle(f"evr-async-server: {ylabel} ({doc['meta'].get('device') or ''})"[:150],
                     fontsize=9)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, fname), dpi=110)
        plt.close(fig)
        written.append(fname)
    sweep = [p for p in doc.get("lanes_sweep", []) if "skipped" not in p and p.get("rps")]
    if sweep:
        fig, ax = plt.subplots(figsize=(6, 4.2))
        for queues in sorted({p["cuda_connections"] for p in sweep}):
            pts = sorted((p for p in sweep if p["cuda_connections"] == queues),
                         key=lambda p: p["lanes"])
            ax.plot([p["lanes"] for p in pts], [p["rps"] for p in pts], marker="o",
                    label=f"CUDA_DEVICE_MAX_CONNECTIONS={queues}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("lanes (--streams)")
        ax.set_ylabel("requests/s")
        ax.set_title(f"evr N=1, GET {sweep[0]['route']}, {sweep[0]['connections']} connections")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "server-lanes.png"), dpi=110)
        plt.close(fig)
        written.append("server-lanes.png")
    log(f"plots: {', '.join(written)} in {out_dir}")


def load_doc(folder):
    with open(os.path.join(folder, "server-study.json")) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run", help="build, measure, write DIR/server-study.json (+ plots)")
    r.add_argument("--out", help="folder for the JSON and plots (default docs/bench; "
                                 "--tiny: build/study-tiny)")
    r.add_argument("--budget", type=float, default=450,
                   help="seconds from the start (build included) after which no point starts")
    r.add_argument("--seconds", type=int, default=2,
                   help="seconds per point (wrk takes whole seconds; default 2)")
    r.add_argument("--tiny", action="store_true", help="simulated device, a small matrix")
    r.add_argument("--device", default="auto", choices=["auto", "cuda", "sim"])
    r.add_argument("--bin", help="an evr-async-server already built (skips the build)")
    r.add_argument("--build-dir", default="build/study")
    r.add_argument("--builtin", action="store_true",
                   help="use the server's built-in load generator instead of wrk")
    r.add_argument("--connections", type=int, nargs="+", default=CONNECTIONS)
    r.add_argument("--servers", nargs="+", help="only these server labels (see SERVERS)")
    r.add_argument("--lanes", type=int, default=0,
                   help="--streams of the main matrix (0: the server's default, from the GPU)")
    r.add_argument("--cuda-connections", type=int, default=32,
                   help="CUDA_DEVICE_MAX_CONNECTIONS of the main matrix")
    r.add_argument("--check-every", type=int, default=16)
    r.add_argument("--no-lanes-sweep", action="store_true")
    r.add_argument("--no-plot", action="store_true")
    p = sub.add_parser("plot", help="PNG plots from DIR/server-study.json")
    p.add_argument("dir")
    t = sub.add_parser("table", help="markdown tables and goals from DIR/server-study.json")
    t.add_argument("dir")
    args = ap.parse_args()
    if args.what == "run":
        return run(args)
    doc = load_doc(args.dir)
    if args.what == "plot":
        plot(doc, args.dir)
    else:
        print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
