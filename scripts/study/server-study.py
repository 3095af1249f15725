#!/usr/bin/python3
"""The async server study: evr against the best a user writes without it, one matrix per run.

    scripts/study/server-study.py run [--set gpu1|gpu2|tiny|alt1|alt-tiny] [--out DIR] [--budget S]
                            [--rounds R] [--seconds S] [...]
    scripts/study/server-study.py plot DIR                       JSON -> PNG plots
    scripts/study/server-study.py table DIR                      JSON -> markdown tables and goals

`run` builds evr-async-server (build/study: Release, CUDA when nvcc is found, headers from
.deps/include when staged), then for each server of the set starts one server and loads it with
wrk (--latency) on its routes at each connection count.

Servers are named by label (--servers takes any):
  evr N=4 | hostfunc N=4 | poll N=4          the non-blocking modes, N io threads
  pool SYNC N=4 | pool SYNC N=lanes          a blocking pool (N=lanes: a thread per lane)
  thread SYNC                                a thread per connection
  evr N=1 stream-waits                       evr waiting on /busy's stream (--no-busy-signal)
  ... @0 | @0,1                              on those GPUs only (default: every GPU, or --devices)
with SYNC one of auto (the driver's default scheduling), spin, blocking-sync.
A configuration whose spinning threads outnumber the host's cores (pool/thread with spin or auto:
more threads than cores) thrashes: its points are marked and never taken as the best alternative.

Sets (each fits a run of 9 minutes, the build included; the order puts what the goals
need first in case the budget runs out):
  gpu1   one H100 (16 cores): evr, hostfunc and poll at N = 1, 2, 4; thread-per-connection and a
         pool of a thread per lane, blocking-sync; a pool of 4, auto (the /mlp baseline); the
         thrashing thread auto and pool auto N=lanes on one route, marked. Routes /busy?us=200,
         /busy?us=1000, /busy?us=5000, /mlp?seed=1, /saxpy?n=65536; 256 and 1024 connections.
  gpu2   two H100s (32 cores): evr N = 4 and 8 on both GPUs and on GPU 0 alone (the scaling
         goal), evr N=2, the alternatives on both GPUs at N = 2 and 8, a pool of 4 on /mlp.
  tiny   the simulated device with two GPUs, a few servers, 16 and 64 connections: a test of
         this script (a minute or two here).
  alt1   one GPU, evr against the poll mode in alternation (server_study_alternating.py): in
         each of --rounds rounds (default 3) evr N=1, poll N=1, evr N=2, poll N=2, evr N=1
         stream-waits, each started afresh (even rounds backwards); /busy?us=200, 1000, 5000 at
         256 and 1024 connections, /healthz at 256; tables of the medians over rounds and the
         goals of issue 39. 3 rounds: 15 server starts, 102 points, ~5 min after the build.
  alt-tiny  the same on the simulated device at 32 connections, 1 s per point (a couple of
         minutes here).

Each point records requests/s, latency percentiles (wrk's), errors (non-2xx, socket errors),
the server's CPU: in cores and in microseconds per request, all threads of the server process
(utime+stime from /proc over the point), and per thread group (io threads evr-io-N, the reactor
evr-reactor, thread-per-connection threads evr-conn, CUDA's own threads, the simulated device,
threads that exited during the point) from /proc/PID/task/*/stat, and the GPUs' utilization
(nvidia-smi sampling, when present). The servers check answers against the CPU (every 16th on
/busy and /mlp, every one on /saxpy), and a server that reports a failure marks its points.

For every route and connection count (and number of GPUs) the tables compare evr with the best
alternative: the one with the most requests/s, and the one with the most requests/s per server
core, each with its p99 and cores; and the cores evr needs (its fewest among N) to serve what
the best alternative serves. The goals of issue 33 are evaluated from that (met / not met, with
the numbers). The alternating sets have their own tables and goals (evr beside poll per point,
medians over rounds; server_study_alternating.py) and no plots. JSON to DIR/server-study.json
(every point as measured, with its round), tables to DIR/server-study.md, plots to DIR/*.png
(when matplotlib is there; `plot DIR` elsewhere); `table DIR` recomputes the tables from the
JSON. The run ends by printing the one-screen summary and the goals.

Budget: --budget seconds from the script's start (build included): a point that would overrun
it is recorded as skipped and the JSON is still written. Each point runs --seconds (wrk takes
whole seconds; default 2) plus ~0.5 s; a server start on a GPU takes a few seconds (CUDA, the
/mlp weights, the lanes warmed up). The plan and its estimate are printed before the build, the
time measuring should end after it.

wrk: from PATH, or staged by scripts/gpu/stage-tools.sh in .tools/ (for a GPU machine without a
package registry: stage it on a machine that has one and copy .tools along with .deps). Without
wrk, --builtin uses the server's own load generator (one process per point, its CPU figure then
includes the client's).

Exit status: 0 when every point ran without errors and every server reported 0 failures.
"""
import argparse
import datetime
import itertools
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time

# Its sibling modules, also when it is loaded by path from elsewhere (served_model_load.py,
# server-profile.py import it so), where this folder is not on sys.path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_study_alternating as alternating  # noqa: E402
from server_study_points import (BUSY200, BUSY1000, BUSY5000, MLP, ROUTES, SAXPY,  # noqa: E402
                                 STREAM_WAITS, fmt, ms, per_core, ratio, usable)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
T0 = time.monotonic()

NON_BLOCKING = ("evr", "hostfunc", "poll")
BLOCKING = ("pool", "thread")
SYNCS = ("auto", "spin", "blocking-sync")

ALL = [BUSY200, BUSY1000, BUSY5000, MLP, SAXPY]
GPU_ROUTES = [BUSY200, BUSY1000, BUSY5000, MLP]
# (server label, its routes). One H100, 16 cores.
GPU1 = [
    ("evr N=1", ALL), ("hostfunc N=1", GPU_ROUTES), ("poll N=1", GPU_ROUTES),
    ("thread blocking-sync", ALL), ("pool blocking-sync N=lanes", ALL),
    ("evr N=2", GPU_ROUTES), ("hostfunc N=2", GPU_ROUTES), ("poll N=2", GPU_ROUTES),
    ("evr N=4", ALL), ("hostfunc N=4", ALL), ("poll N=4", ALL),
    ("pool auto N=4", [BUSY200, BUSY1000, MLP, SAXPY]),
    ("thread auto", [BUSY1000]), ("pool auto N=lanes", [BUSY1000]),  # thrash: shown, marked
]
# Two H100s, 32 cores: the same GPU-bound routes on both GPUs and, for evr, on GPU 0 alone.
GPU2 = [
    ("evr N=4", GPU_ROUTES), ("evr N=4 @0", [BUSY1000, BUSY5000, MLP]),
    ("evr N=8", GPU_ROUTES), ("evr N=8 @0", [BUSY1000, MLP]),
    ("hostfunc N=8", GPU_ROUTES), ("poll N=8", GPU_ROUTES),
    ("thread blocking-sync", GPU_ROUTES), ("pool blocking-sync N=lanes", GPU_ROUTES),
    ("evr N=2", [BUSY200, BUSY1000]), ("hostfunc N=2", [BUSY200, BUSY1000]),
    ("poll N=2", [BUSY200, BUSY1000]), ("pool auto N=4", [MLP]),
]
# The simulated device (two GPUs), for testing this script.
TINY = [
    ("evr N=1", [BUSY200, BUSY1000, MLP]), ("evr N=2", [BUSY200, BUSY1000, MLP]),
    ("evr N=1 @0", [BUSY1000, MLP]), ("hostfunc N=1", [BUSY200, BUSY1000, MLP]),
    ("poll N=1", [BUSY200, BUSY1000, MLP]), ("thread blocking-sync", [BUSY200, BUSY1000, MLP]),
    ("pool blocking-sync N=lanes", [BUSY1000]), ("pool auto N=2", [MLP]),
]
SETS = {
    "gpu1": {"servers": GPU1, "connections": [256, 1024], "wrk_threads": 4},
    "gpu2": {"servers": GPU2, "connections": [256, 1024], "wrk_threads": 8},
    "tiny": {"servers": TINY, "connections": [16, 64], "wrk_threads": 2, "sim": True},
    **alternating.SETS,
}
LANES_SWEEP_ROUTE = BUSY1000
LANES_SWEEP = [(32, 32), (64, 32), (128, 32), (256, 32), (128, 8)]


def log(msg):
    print(f"[server-study {time.monotonic() - T0:6.1f} s] {msg}", flush=True)


def elapsed():
    return time.monotonic() - T0


# --- server labels --------------------------------------------------------------------------------

def parse_server(label):
    """A server label (see the module's doc) as {label, mode, sync, threads, devices,
    busy_signal}: threads None for thread-per-connection, 0 for a pool of a thread per lane;
    devices None for the default; busy_signal False for evr's stream waits on /busy. Raises
    ValueError for a label that names no server."""
    text, _, devices = label.partition(" @")
    if devices and not re.fullmatch(r"\d+(,\d+)*", devices):
        raise ValueError(f"'{label}': @ takes GPU indices like @0 or @0,1")
    words = text.split()
    stream_waits = words[-1:] == [STREAM_WAITS]
    if stream_waits:
        words.pop()
    n = words.pop() if words and words[-1].startswith("N=") else None
    mode = words[0] if words else ""
    sync = words[1] if len(words) > 1 else None
    ok = (mode in NON_BLOCKING and len(words) == 1 and n) or \
         (mode == "pool" and len(words) == 2 and sync in SYNCS and n) or \
         (mode == "thread" and len(words) == 2 and sync in SYNCS and not n)
    if not ok or (n and not re.fullmatch(r"N=(\d+|lanes)", n)) or \
            (stream_waits and mode != "evr"):
        raise ValueError(f"'{label}' names no server: try 'evr N=2', 'hostfunc N=4', 'poll N=1', "
                         "'pool blocking-sync N=lanes', 'pool auto N=4', 'thread blocking-sync', "
                         f"'evr N=1 {STREAM_WAITS}', with ' @0' for GPU 0 alone")
    threads = None if not n else (0 if n == "N=lanes" else int(n[2:]))
    return {"label": label, "mode": mode, "sync": sync, "threads": threads,
            "devices": devices or None, "busy_signal": not stream_waits}


def spinning_threads(spec, lanes, connections):
    """How many threads of this server may spin while they wait (0 for the ones that never do)."""
    if spec["mode"] == "poll":
        return spec["threads"]  # an io thread never sleeps while its requests are on the GPU
    if spec["mode"] not in BLOCKING or spec["sync"] == "blocking-sync":
        return 0
    if spec["mode"] == "thread":
        return connections
    return lanes if spec["threads"] == 0 else spec["threads"]


# --- build ----------------------------------------------------------------------------------------

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


# --- wrk ------------------------------------------------------------------------------------------

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
    # The thread stats' Latency line: avg, stdev, max (wrk's own figures, not corrected).
    m = re.search(r"^\s+Latency\s+\S+\s+\S+\s+(\S+)", text, re.M)
    r["max_us"] = to_us(m.group(1)) if m else None
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    r["non2xx"] = int(m.group(1)) if m else 0
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    r["socket_errors"] = sum(int(g) for g in m.groups()) if m else 0
    return r


# --- the server process ---------------------------------------------------------------------------

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
    """nvidia-smi utilization.gpu every 100 ms while a point runs, the mean over the host's GPUs
    (None without nvidia-smi)."""

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


def server_args(spec, device, lanes, cuda_connections, devices):
    """The command-line arguments of a server spec (parse_server), after the binary."""
    cmd = ["--device", device, "--mode", spec["mode"], "--cuda-connections", str(cuda_connections)]
    if lanes:
        cmd += ["--streams", str(lanes)]  # else the server's default (from the GPU)
    if spec["sync"]:
        cmd += ["--sync", spec["sync"]]
    if spec["threads"] is not None:
        cmd += ["--threads", str(spec["threads"])]
    if spec["devices"] or devices:
        cmd += ["--devices", spec["devices"] or devices]
    if not spec["busy_signal"]:
        cmd.append("--no-busy-signal")
    return cmd


class server:
    def __init__(self, binary, args, extra):
        cmd = [binary, "--port", "0"] + args + extra
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
        summary = next((l for l in self.lines if l.startswith("server: ") and " respons" in l), "")
        return summary, self.proc.returncode


def warm_up(port, route, requests=20, connections=1):
    """A few requests on each of `connections` connections, one after another, before a route's
    first point (first-use costs). Several connections when the port has several processes
    behind it (--reuse-port, a balancer that spreads connections): each must be warmed, and the
    kernel or the balancer picks the process by connection."""
    import http.client
    for _ in range(connections):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            for _ in range(requests):
                conn.request("GET", route)
                conn.getresponse().read()
        except OSError as e:
            log(f"warm-up of {route} failed: {e}")
            return
        finally:
            conn.close()


def warm_at_load(srv, route, connections, wrk, wrk_threads):
    """One second of `route` at `connections` (a server's largest count), not measured, after
    warm_up and before a fresh server's first point: warm_up's one connection uses one lane, and
    the first use of the others (evr's first waits on them, the driver's first launches) made
    first points' p99 tail (an H200 with 16 cores: 6.7-18 ms at 32 connections where later points
    had 1.2-1.3). Only before the first route: a later route's own first uses (/mlp's cuBLAS
    kernels) are left to its one-connection warm_up."""
    run_point(srv, route, connections, 1, wrk, False, wrk_threads)


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


def reactor_counters(port):
    """The evr reactor's counters from the server's /metrics (evr_reactor_*_total, by name
    without the prefix and suffix); {} for a server without a reactor or when it does not answer."""
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        page = conn.getresponse().read().decode()
    except OSError:
        return {}
    finally:
        conn.close()
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^evr_reactor_(\w+)_total (\S+)$", page, re.M)}


def run_point(srv, route, connections, seconds, wrk, gpu, wrk_threads):
    url = f"http://127.0.0.1:{srv.port}{route}"
    threads = max(1, min(connections, wrk_threads))
    cmd = [wrk[0], f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency",
           "--timeout", "10s", url]
    counters0 = reactor_counters(srv.port)
    before, t0 = thread_cpu(srv.proc.pid), time.monotonic()
    with gpu_sampler(gpu) as g:
        out = subprocess.run(cmd, env=wrk[1], capture_output=True, text=True,
                             timeout=seconds + 60)
    t1 = time.monotonic()
    groups, cpu = cpu_by_group(before, thread_cpu(srv.proc.pid))
    counters1 = reactor_counters(srv.port)
    r = parse_wrk(out.stdout)
    # What the reactor did over the point, per second (the probes' own /metrics requests aside):
    # wake-ups, naps, sweeps, prediction misses, doorbells, and how much the hosts found.
    r["reactor_per_s"] = {k: (counters1[k] - counters0.get(k, 0)) / (t1 - t0)
                          for k in counters1} if counters1 else None
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


def run_builtin_point(binary, args, extra, route, connections, seconds):
    cmd = [binary] + args + ["--load-connections", str(connections), "--load-seconds",
                             str(seconds), "--load-path", route] + extra
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


# --- the run --------------------------------------------------------------------------------------

def plan(args):
    """The run's steps [(spec, [(route, [connections])], tag)] (a server started once each, its
    points tagged with tag), the lanes sweep's steps, and wrk's threads: the set, narrowed by
    --servers, --routes and --connections."""
    chosen = SETS[args.set]
    connections = args.connections or chosen["connections"]
    try:
        if chosen.get("alternating"):
            steps = [(parse_server(label), points, {"round": rnd}) for rnd, label, points in
                     alternating.schedule(args.servers or chosen["servers"], args.rounds,
                                          connections, args.routes)]
        elif args.servers:
            steps = [(parse_server(label), [(r, connections) for r in args.routes or ROUTES], {})
                     for label in args.servers]
        else:
            steps = [(parse_server(label), [(r, connections) for r in routes
                                            if not args.routes or r in args.routes], {})
                     for label, routes in chosen["servers"]]
    except ValueError as e:
        raise SystemExit(f"server-study: {e}")
    steps = [step for step in steps if step[1]]
    sweep = []
    if args.lanes_sweep:
        for lanes, queues in (LANES_SWEEP if not chosen.get("sim") else [(8, 32), (32, 32)]):
            spec = parse_server("evr N=1")
            spec["label"] = f"evr N=1, {lanes} lanes, {queues} queues"
            sweep.append((spec, [(LANES_SWEEP_ROUTE, [64 if chosen.get("sim") else 1024])],
                          {"lanes": lanes, "queues": queues}))
    return steps, sweep, args.wrk_threads or chosen["wrk_threads"]


def estimate_s(steps, seconds, sim):
    """Seconds of measuring the steps take: each point its wrk seconds and ~0.5 s (CPU samples,
    draining), each route a warm-up, each server its start (a few seconds on a GPU)."""
    points = sum(len(conns) for _, pts, _ in steps for _, conns in pts)
    routes = sum(len(pts) for _, pts, _ in steps)
    return points * (seconds + 0.5) + routes * 0.3 + len(steps) * (1.5 if sim else 5), points


def server_facts(srv, doc):
    """The device line, the lanes and the GPUs a started server reports (its first lines)."""
    facts = {"lanes": None, "gpus": None, "lanes_line": None}
    for line in srv.lines:
        if line.startswith("device: ") and doc["meta"]["device"] is None:
            doc["meta"]["device"] = line
        m = re.match(r"lanes: (\d+)", line)
        if m:
            facts["lanes"], facts["lanes_line"] = int(m.group(1)), line
        m = re.match(r"devices: \S+ \((\d+) used\)", line)
        if m:
            facts["gpus"] = int(m.group(1))
    return facts


def run(args):
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    chosen = SETS[args.set]
    args.tiny = bool(chosen.get("sim"))
    out_dir = os.path.abspath(args.out or default_out(args.set))
    os.makedirs(out_dir, exist_ok=True)
    device = "sim" if args.tiny else args.device
    args.seconds = args.seconds or chosen.get("seconds", 2)
    steps, lanes_sweep, wrk_threads = plan(args)
    est, points_total = estimate_s(steps + lanes_sweep, args.seconds, device == "sim")
    rounds = f", {args.rounds} alternating rounds" if chosen.get("alternating") else ""
    log(f"plan: set {args.set}{rounds}, {len(steps) + len(lanes_sweep)} server starts, "
        f"{points_total} points of {args.seconds} s; about {est:.0f} s of measuring after the "
        f"build, budget {args.budget} s from the start")
    binary = build(args)
    wrk = None if args.builtin else find_wrk()
    if wrk is None and not args.builtin:
        log("wrk not found (PATH, .tools/): stage it with scripts/gpu/stage-tools.sh and copy "
            ".tools along, or pass --builtin")
        return 2
    log(f"built in {elapsed():.0f} s; measuring should end at about {elapsed() + est:.0f} s"
        f"{'' if elapsed() + est < args.budget else ' (past the budget: its last points skipped)'}"
        f"; load: {wrk[2] if wrk else 'built-in'}, {wrk_threads} wrk threads")
    extra = ["--check-every", str(args.check_every)] + (["--sim-devices", "2"] if args.tiny else [])
    doc = new_doc(args, wrk, wrk_threads, extra)
    study = measurer(args, binary, wrk, device, extra, doc)
    study.run_steps(steps)
    for spec, points, tag in lanes_sweep:
        study.measure(spec, points, doc["lanes_sweep"], {}, tag["lanes"], tag["queues"])
    doc["meta"]["elapsed_s"] = elapsed()
    write_results(doc, out_dir, not args.no_plot)
    print(short_summary(doc), flush=True)
    return 1 if study.failed else 0


def new_doc(args, wrk, wrk_threads, extra):
    """The study's document before its first point: what the run was, on what."""
    return {"meta": {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host_cpus": os.cpu_count(), "seconds_per_point": args.seconds, "device": None,
        "load": wrk[2] if wrk else "built-in", "wrk_threads": wrk_threads, "server_args": extra,
        "budget_s": args.budget, "set": args.set, "devices": args.devices, "git": git_head(),
        "default_lanes": None,
        "rounds": args.rounds if SETS[args.set].get("alternating") else None},
        "points": [], "lanes_sweep": [], "servers": []}


class measurer:
    """Starts the servers of a plan and loads them, into the study's document. failed: a point
    had errors, or a server failed to start or reported failures. Points past --budget are
    recorded as skipped; so is a whole alternating round (after the first) that would overrun it,
    so that every round measured has both modes."""

    def __init__(self, args, binary, wrk, device, extra, doc):
        self.args, self.binary, self.wrk, self.device = args, binary, wrk, device
        self.extra, self.doc, self.failed = extra, doc, False
        self.seconds = args.seconds

    def budget_left(self, need):
        return elapsed() + need < self.args.budget

    def run_steps(self, steps):
        for rnd, group in itertools.groupby(steps, key=lambda step: step[2].get("round")):
            group = list(group)
            need, _ = estimate_s(group, self.seconds, self.device == "sim")
            if rnd and rnd > 1 and not self.budget_left(need):
                log(f"round {rnd}: skipped whole (about {need:.0f} s to measure, past the budget)")
                for spec, points, tag in group:
                    self.skip(spec, points, self.doc["points"], tag, self.args.lanes,
                              self.args.cuda_connections)
                continue
            for spec, points, tag in group:
                self.measure(spec, points, self.doc["points"], tag, self.args.lanes,
                             self.args.cuda_connections)

    def skip(self, spec, points, sink, tag, lanes, queues):
        sink.extend(dict(tag, server=spec["label"], mode=spec["mode"], threads=spec["threads"],
                         busy_signal=spec["busy_signal"], route=route, connections=c,
                         lanes=lanes, cuda_connections=queues, skipped="budget")
                    for route, conns in points for c in conns)

    def measure(self, spec, points, sink, tag, lanes, queues):
        """One server started, its points [(route, [connections])] measured into sink, each point
        tagged with tag."""
        sargs = server_args(spec, self.device, lanes, queues, self.args.devices)
        if not self.budget_left(self.seconds + 10):
            self.skip(spec, points, sink, tag, lanes, queues)
            log(f"{spec['label']}: skipped (budget)")
            return
        if not self.wrk:
            for route, conns in points:
                for c in conns:
                    r = run_builtin_point(self.binary, sargs, self.extra, route, c, self.seconds)
                    r.update(point_fields(spec, route, c, lanes, queues, None, None), **tag)
                    self.failed |= r["errors"] != 0
                    sink.append(r)
            return
        srv = server(self.binary, sargs, self.extra)
        facts = server_facts(srv, self.doc)
        if facts["lanes"] and lanes == 0 and not spec["devices"]:
            self.doc["meta"]["default_lanes"] = facts["lanes"]
            self.doc["meta"]["default_lanes_line"] = facts["lanes_line"]
        if srv.port is None:
            log(f"{spec['label']}: the server did not start:\n" + "\n".join(srv.lines[-20:]))
            self.failed = True
            srv.stop()
            return
        for i, (route, conns) in enumerate(points):
            warm_up(srv.port, route)
            if i == 0 and self.budget_left(1 + 5):
                warm_at_load(srv, route, max(conns), self.wrk, self.doc["meta"]["wrk_threads"])
            wait_idle(srv.port)
            for c in conns:
                if not self.budget_left(self.seconds + 5):
                    self.skip(spec, [(route, [c])], sink, tag, lanes, queues)
                    continue
                r = run_point(srv, route, c, self.seconds, self.wrk, self.device != "sim",
                              self.doc["meta"]["wrk_threads"])
                r.update(point_fields(spec, route, c, lanes, queues, facts, self.doc), **tag)
                sink.append(r)
                self.failed |= r["errors"] != 0
                log_point(r)
        record = server_record(srv, spec, facts, tag)
        self.doc["servers"].append(record)
        self.failed |= not record["ok"]


def default_out(set_name):
    """Where a set writes by default: docs/bench for gpu1, the alternating sets' own folder under
    it, the simulated device's sets under build/."""
    if SETS[set_name].get("sim"):
        return os.path.join(ROOT, "build", f"study-{set_name}")
    return os.path.join(ROOT, "docs", "bench", *([] if set_name == "gpu1" else [set_name]))


def reactor_text(per_s):
    """The reactor's counters of a point in a few words, per second (k = thousands)."""
    if not per_s:
        return ""
    names = [("wakeups", "woken"), ("parks", "naps"), ("sweeps", "sweeps"),
             ("prediction_misses", "misses"), ("doorbells", "doorbells"),
             ("host_completions", "host-found"), ("event_queries", "queries"),
             ("host_event_queries", "host-queries"), ("completed", "done")]
    return "  reactor/s: " + " ".join(f"{short} {per_s[k] / 1e3:.1f}k" for k, short in names
                                      if k in per_s)


def log_point(r):
    log(f"{r['server']:26} {r['route']:15} c={r['connections']:<5} {fmt(r['rps'], 0):>8} req/s  "
        f"p99 {fmt(ms(r['p99_us']), 2):>8} ms  cores {fmt(r['server_cores'], 2):>5}"
        f"  cpu {fmt(r.get('cpu_us_per_request'), 1):>6} us/req"
        f"{'  gpu ' + fmt(r['gpu_util'], 0) + ' %' if r['gpu_util'] is not None else ''}"
        f"{'  round ' + str(r['round']) if r.get('round') else ''}"
        f"{reactor_text(r.get('reactor_per_s'))}"
        f"{'  THRASH' if r['thrash'] else ''}"
        f"{'  ERRORS ' + str(r['errors']) if r['errors'] else ''}")


def server_record(srv, spec, facts, tag):
    """Stops a server and says how it ended: its summary line, exit status, ok (no failures)."""
    summary, rc = srv.stop()
    ok = rc == 0 and "(0 failures" in summary
    if not ok:
        log(f"{spec['label']}: the server reported failures (exit {rc}): {summary}\n" +
            "\n".join(srv.lines[-15:]))
    return dict(tag, server=spec["label"], cmd=srv.cmd[1:], startup_s=srv.startup_s,
                lanes=facts["lanes_line"], gpus=facts["gpus"], summary=summary, exit=rc, ok=ok)


def write_results(doc, out_dir, plots):
    """server-study.json (every point as measured, each round's for the alternating sets, with the
    goals), server-study.md (every table) and, unless plots is False, the PNG plots."""
    doc["goals"] = all_goals(doc)
    if doc["meta"].get("rounds"):
        doc["medians"] = alternating.medians(doc["points"])
    path = os.path.join(out_dir, "server-study.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    with open(os.path.join(out_dir, "server-study.md"), "w") as f:
        f.write(markdown(doc) + "\n")
    log(f"wrote {path} and server-study.md")
    if not plots:
        return
    try:
        plot(doc, out_dir)
    except ImportError:
        log("matplotlib not here: run `scripts/study/server-study.py plot DIR` where it is")


def point_fields(spec, route, connections, lanes, queues, facts, doc):
    """What a point records about its server beside the measurement."""
    cpus = doc["meta"]["host_cpus"] if doc else os.cpu_count()
    server_lanes = (facts or {}).get("lanes") or lanes or 0
    spin = spinning_threads(spec, server_lanes, connections)
    return {"server": spec["label"], "mode": spec["mode"], "sync": spec["sync"],
            "threads": spec["threads"], "route": route, "connections": connections,
            "lanes": lanes, "server_lanes": server_lanes, "cuda_connections": queues,
            "gpus": (facts or {}).get("gpus"), "spinning_threads": spin,
            "thrash": spin > cpus, "busy_signal": spec["busy_signal"]}


def git_head():
    """The commit measured, "+dirty" when the tree had changes not committed."""
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head + ("+dirty" if head and dirty else "") or None
    except (OSError, subprocess.TimeoutExpired):
        return None


# --- evr against the best alternative -------------------------------------------------------------

def matrix(doc):
    """{(route, connections, gpus): [points]} of the main matrix, in the order measured."""
    out = {}
    for p in doc["points"]:
        out.setdefault((p["route"], p["connections"], p.get("gpus")), []).append(p)
    return out


def compare(points):
    """evr against the alternatives at one (route, connections, GPUs). The alternatives are the
    other modes' clean points that do not thrash; None where there is nothing to compare."""
    evr = [p for p in points if p["mode"] == "evr" and usable(p)]
    alts = [p for p in points if p["mode"] != "evr" and usable(p) and not p.get("thrash")]
    c = {"evr_top": max(evr, key=lambda p: p["rps"], default=None),
         "alt_top": max(alts, key=lambda p: p["rps"], default=None),
         "alt_eff": max(alts, key=per_core, default=None),
         "evr_eff": None, "evr_needs": None}
    if c["alt_eff"]:
        # evr's best requests/s per core among its points with a p99 no worse than that rival's.
        fair = [p for p in evr if p["p99_us"] is not None and c["alt_eff"]["p99_us"] is not None
                and p["p99_us"] <= c["alt_eff"]["p99_us"]]
        c["evr_eff"] = max(fair, key=per_core, default=None)
    if c["alt_top"]:
        # The fewest cores with which evr serves what the best alternative serves.
        enough = [p for p in evr if p["rps"] >= c["alt_top"]["rps"]]
        c["evr_needs"] = min(enough, key=lambda p: p["server_cores"], default=None)
    return c


def find_evr(points, threads):
    return next((p for p in points if p["mode"] == "evr" and p["threads"] == threads
                 and usable(p)), None)


def all_goals(doc):
    """The goals a run is held to: issue 39's for the alternating sets, else issue 33's."""
    if doc["meta"].get("rounds"):
        return alternating.goals(alternating.medians(doc["points"]))
    return goals(doc)


def goals(doc):
    """The goals of issue 33 (docs/notebook.md), from the points of the matrix, per number of
    GPUs measured."""
    out = []

    def goal(text, value, target, met):
        out.append({"goal": text, "value": value, "target": target,
                    "met": None if met is None else bool(met)})

    cells = matrix(doc)
    gpus_seen = sorted({k[2] for k in cells if k[2] is not None})
    conns = sorted({k[1] for k in cells})
    for g in gpus_seen:
        if not any(p["mode"] != "evr" for k, pts in cells.items() if k[2] == g for p in pts):
            continue  # evr alone on these GPUs (the scaling rows of a 2-GPU run)
        on = f"{g} GPU{'s' if g != 1 else ''}"
        for route in (BUSY200, BUSY1000):
            for c in conns:
                pts = cells.get((route, c, g), [])
                cmp = compare(pts)
                r = ratio(per_core(cmp["evr_eff"]), per_core(cmp["alt_eff"]))
                goal(f"{route}, {c} connections, {on}: evr's requests/s per server core / the best "
                     f"alternative's ({label(cmp['alt_eff'])}), evr at a p99 no worse "
                     f"({label(cmp['evr_eff'])})", r, ">= 1.5", None if r is None else r >= 1.5)
                e2, top = find_evr(pts, 2), cmp["alt_top"]
                rr, cr = ratio(e2 and e2["rps"], top and top["rps"]), \
                    ratio(e2 and e2["server_cores"], top and top["server_cores"])
                goal(f"{route}, {c} connections, {on}: evr N=2 / the best alternative by "
                     f"requests/s ({label(top)}): requests/s, cores", [rr, cr],
                     ">= 1 at <= 0.5 of its cores",
                     None if rr is None or cr is None else rr >= 1 and cr <= 0.5)
        for c in conns:
            pts = cells.get((MLP, c, g), [])
            e4 = find_evr(pts, 4)
            pools = [p for p in pts if p["mode"] == "pool" and p["threads"] == 4 and usable(p)]
            pool = max(pools, key=lambda p: p["rps"], default=None)
            r = ratio(e4 and e4["rps"], pool and pool["rps"])
            goal(f"/mlp, {c} connections, {on}: evr N=4 (batching) / a blocking pool of 4 "
                 f"({label(pool)}) requests/s", r, ">= 15", None if r is None else r >= 15)
            top = compare(pts)["alt_top"]
            r = ratio(e4 and e4["rps"], top and top["rps"])
            goal(f"/mlp, {c} connections, {on}: evr N=4 / the best alternative ({label(top)}) "
                 "requests/s", r, ">= 2", None if r is None else r >= 2)
    if len(gpus_seen) > 1:
        one, many = gpus_seen[0], gpus_seen[-1]
        for route in (BUSY1000, BUSY5000, MLP):
            for c in conns:
                a = compare(cells.get((route, c, one), []))["evr_top"]
                b = compare(cells.get((route, c, many), []))["evr_top"]
                r = ratio(b and b["rps"], a and a["rps"])
                goal(f"{route}, {c} connections: evr's most requests/s on {many} GPUs "
                     f"({label(b)}) / on {one} ({label(a)})", r, ">= 1.8",
                     None if r is None else r >= 1.8)
    return out


def label(p):
    return p["server"] if p else "none"


# --- tables ---------------------------------------------------------------------------------------

def cell(p, what=("rps", "p99", "cores")):
    """A point in a few words: 'evr N=2: 82 100 req/s, 2.70 cores, p99 9.1 ms'."""
    if not p:
        return "-"
    parts = []
    if "rps" in what:
        parts.append(f"{fmt(p['rps'], 0)} req/s")
    if "per_core" in what:
        parts.append(f"{fmt(per_core(p), 0)} req/s/core")
    if "cores" in what:
        parts.append(f"{fmt(p['server_cores'], 2)} cores")
    if "p99" in what:
        parts.append(f"p99 {fmt(ms(p['p99_us']), 1)} ms")
    return f"{p['server']}: " + ", ".join(parts)


def summary_tables(doc):
    """The one-screen comparison: per route, connections and GPUs, evr against the best
    alternative by requests/s and by requests/s per core."""
    lines = ["#### evr against the best alternative: requests/s", "",
             "| route | conns | GPUs | evr, most requests/s | best alternative | evr / it | "
             "cores evr needs for its requests/s |", "|---|---:|---:|---|---|---:|---|"]
    cells = matrix(doc)
    keys = sorted(cells, key=lambda k: (ROUTES.index(k[0]) if k[0] in ROUTES else 99, k[2] or 0,
                                        k[1]))
    for route, c, g in keys:
        cmp = compare(cells[(route, c, g)])
        top, alt, needs = cmp["evr_top"], cmp["alt_top"], cmp["evr_needs"]
        lines.append(f"| {route} | {c} | {g or '?'} | {cell(top)} | {cell(alt)} | "
                     f"{fmt(ratio(top and top['rps'], alt and alt['rps']), 2)} | "
                     f"{cell(needs, ('cores',)) if needs else 'none of its points serves that'} |")
    lines += ["", "#### evr against the best alternative: requests/s per server core (evr at a "
              "p99 no worse than that alternative's)", "",
              "| route | conns | GPUs | best alternative per core | evr per core, p99 no worse | "
              "evr / it |", "|---|---:|---:|---|---|---:|"]
    for route, c, g in keys:
        cmp = compare(cells[(route, c, g)])
        what = ("per_core", "p99")
        lines.append(f"| {route} | {c} | {g or '?'} | {cell(cmp['alt_eff'], what)} | "
                     f"{cell(cmp['evr_eff'], what) if cmp['evr_eff'] else 'none at that p99'} | "
                     f"{fmt(ratio(per_core(cmp['evr_eff']), per_core(cmp['alt_eff'])), 2)} |")
    return lines


def goals_table(doc):
    lines = ["| goal | value | target | met |", "|---|---:|---|---|"]
    for g in doc.get("goals", []):
        v = g["value"]
        value = (" vs ".join(fmt(x, 2) for x in v) if isinstance(v, list) else fmt(v, 2))
        met = {True: "**met**", False: "**not met**", None: "not measured"}[g["met"]]
        lines.append(f"| {g['goal']} | {value} | {g['target']} | {met} |")
    return lines


def route_tables(doc):
    lines = []
    for route in ROUTES:
        pts = [p for p in doc["points"] if p["route"] == route]
        if not pts:
            continue
        conns = sorted({p["connections"] for p in pts})
        lines += ["", f"#### GET {route}", "",
                  "| server | GPUs | " + " | ".join(f"c={c}" for c in conns) + " |",
                  "|---|---:|" + "---:|" * len(conns)]
        for name in dict.fromkeys(p["server"] for p in pts):
            row = [p for p in pts if p["server"] == name]
            cells = []
            for c in conns:
                p = next((q for q in row if q["connections"] == c), None)
                if not p or "skipped" in p:
                    cells.append("skipped" if p else "")
                    continue
                text = (f"{fmt(p['rps'], 0)} req/s, p99 {fmt(ms(p['p99_us']), 1)} ms, "
                        f"{fmt(p.get('server_cores'), 2)} cores, "
                        f"{fmt(p.get('cpu_us_per_request'), 1)} us/req, "
                        f"{fmt(per_core(p), 0)} req/s/core")
                if p.get("thrash"):
                    text += f", **thrashes** ({p['spinning_threads']} spinning threads)"
                if p.get("errors"):
                    text += f", **{p['errors']} errors**"
                cells.append(text)
            gpus = next((q.get("gpus") for q in row if q.get("gpus")), None)
            lines.append(f"| {name} | {gpus or '-'} | " + " | ".join(cells) + " |")
    return lines


def thread_table(doc):
    by_thread = [p for p in doc["points"] if p.get("cpu_us_per_request_by_thread")]
    if not by_thread:
        return []
    cols = [g for g in THREAD_GROUPS
            if any(p["cpu_us_per_request_by_thread"].get(g, 0) >= 0.05 for p in by_thread)]
    top = max(p["connections"] for p in by_thread)
    lines = ["", "#### Server CPU per request by thread (us), at the highest connection count", "",
             "| server | route | connections | all | " + " | ".join(cols) + " |",
             "|---|---|---:|---:|" + "---:|" * len(cols)]
    for p in by_thread:
        if p["connections"] != top:
            continue
        t = p["cpu_us_per_request_by_thread"]
        lines.append(f"| {p['server']} | {p['route']} | {p['connections']} | "
                     f"{fmt(p['cpu_us_per_request'], 1)} | " +
                     " | ".join(fmt(t.get(g, 0.0), 1) for g in cols) + " |")
    return lines


def sweep_table(doc):
    if not doc.get("lanes_sweep"):
        return []
    lines = ["", f"#### Lanes sweep (evr N=1, GET {doc['lanes_sweep'][0]['route']})", "",
             "| lanes | CUDA_DEVICE_MAX_CONNECTIONS | connections | requests/s | p99 ms | "
             "server cores | us/req |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for p in doc["lanes_sweep"]:
        if "skipped" in p:
            lines.append(f"| {p['lanes']} | {p['cuda_connections']} | {p['connections']} | "
                         "skipped | | | |")
            continue
        lines.append(f"| {p['lanes']} | {p['cuda_connections']} | {p['connections']} | "
                     f"{fmt(p['rps'], 0)} | {fmt(ms(p['p99_us']), 1)} | "
                     f"{fmt(p.get('server_cores'), 2)} | {fmt(p.get('cpu_us_per_request'), 1)} |")
    return lines


def meta_line(doc):
    meta = doc["meta"]
    return (f"{meta.get('device') or 'device: ?'}; {meta['host_cpus']} CPUs; set "
            f"{meta.get('set')}; load {meta['load']} ({meta.get('wrk_threads')} threads); "
            f"{meta['seconds_per_point']} s per point"
            f"{'; ' + str(meta['rounds']) + ' alternating rounds' if meta.get('rounds') else ''}"
            f"{'; ' + format(meta['elapsed_s'], '.0f') + ' s in all' if meta.get('elapsed_s') else ''}"
            f"; git {meta.get('git')}")


def markdown(doc):
    if doc["meta"].get("rounds"):
        return alternating.markdown(doc, meta_line(doc))
    lines = [meta_line(doc), ""] + summary_tables(doc) + route_tables(doc) + thread_table(doc) + \
        sweep_table(doc)
    if doc.get("goals"):
        lines += [""] + goals_table(doc)
    return "\n".join(lines)


def short_summary(doc):
    """What the run prints last: the comparison and the goals."""
    if doc["meta"].get("rounds"):
        return alternating.summary(doc, meta_line(doc))
    return "\n".join([meta_line(doc), ""] + summary_tables(doc) + [""] + goals_table(doc))


# --- plots ----------------------------------------------------------------------------------------

def plot(doc, out_dir):
    """server-rps-vs-cores.png: requests/s against server cores, a panel per route and connection
    count, a line per mode over N (the cores each needs for a given requests/s);
    server-p99-vs-rps.png: p99 against requests/s, the same panels; server-lanes.png: the lanes
    sweep."""
    if doc["meta"].get("rounds"):
        log("plots: none for an alternating set (its tables are the result)")
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [p for p in doc["points"] if usable(p)]
    routes = [r for r in ROUTES if any(p["route"] == r for p in pts)]
    conns = sorted({p["connections"] for p in pts})
    if not routes:
        log("plots: no point to plot")
        return
    colors = {"evr": "tab:blue", "hostfunc": "tab:orange", "poll": "tab:green",
              "pool": "tab:red", "thread": "tab:purple"}
    written = []
    for fname, xkey, ykey, xlabel, ylabel in (
            ("server-rps-vs-cores.png", "server_cores", "rps", "server cores (all its threads)",
             "requests/s"),
            ("server-p99-vs-rps.png", "rps", "p99_ms", "requests/s", "p99 latency (ms)")):
        fig, axes = plt.subplots(len(conns), len(routes), figsize=(5 * len(routes),
                                                                    4.2 * len(conns)),
                                 squeeze=False)
        for i, c in enumerate(conns):
            for j, route in enumerate(routes):
                ax = axes[i][j]
                here = [p for p in pts if p["route"] == route and p["connections"] == c]
                for series, group in series_of(here).items():
                    xs = [p[xkey] for p in group]
                    ys = [p["p99_us"] / 1000.0 if ykey == "p99_ms" else p[ykey] for p in group]
                    mode = group[0]["mode"]
                    ax.plot(xs, ys, linestyle="-" if mode in NON_BLOCKING else "none",
                            marker="x" if group[0].get("thrash") else "o",
                            color=colors.get(mode, "gray"),
                            alpha=0.5 if (group[0].get("gpus") or 1) < max_gpus(pts) else 1.0,
                            linewidth=2.2 if mode == "evr" else 1.2, label=series)
                    for p, x, y in zip(group, xs, ys):
                        if p["mode"] in NON_BLOCKING:
                            ax.annotate(str(p["threads"]), (x, y), fontsize=7,
                                        textcoords="offset points", xytext=(3, 3))
                if ykey == "p99_ms":
                    ax.set_yscale("log")
                ax.set_title(f"GET {route}, {c} connections", fontsize=9)
                ax.set_xlabel(xlabel)
                ax.set_ylabel(ylabel)
                ax.grid(True, which="both", alpha=0.3)
                ax.legend(fontsize=6)
        fig.suptitle(f"evr-async-server: {ylabel} against {xlabel} (labels: N; x: thrashes) "
                     f"({doc['meta'].get('device') or ''})"[:160], fontsize=9)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, fname), dpi=100)
        plt.close(fig)
        written.append(fname)
    sweep = [p for p in doc.get("lanes_sweep", []) if usable(p)]
    if sweep:
        fig, ax = plt.subplots(figsize=(6, 4.2))
        for queues in sorted({p["cuda_connections"] for p in sweep}):
            row = sorted((p for p in sweep if p["cuda_connections"] == queues),
                         key=lambda p: p["lanes"])
            ax.plot([p["lanes"] for p in row], [p["rps"] for p in row], marker="o",
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


def max_gpus(points):
    return max((p.get("gpus") or 1 for p in points), default=1)


def series_of(points):
    """The plotted series: a line per non-blocking mode and GPU set over N, a point per other
    server."""
    out = {}
    for p in sorted(points, key=lambda p: (p["threads"] or 0)):
        if p["mode"] in NON_BLOCKING:
            at = p["server"].partition(" @")[2]
            key = p["mode"] + (f" @{at}" if at else "") + (f" ({p['gpus']} GPUs)"
                                                           if (p.get("gpus") or 1) > 1 else "")
        else:
            key = p["server"] + (" (thrashes)" if p.get("thrash") else "")
        out.setdefault(key, []).append(p)
    return out


def load_doc(folder):
    with open(os.path.join(folder, "server-study.json")) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run", help="build, measure, write DIR/server-study.json (+ tables, plots)")
    r.add_argument("--set", choices=sorted(SETS), default=None,
                   help="the servers and routes to measure (default gpu1; tiny with --tiny)")
    r.add_argument("--tiny", action="store_true", help="the same as --set tiny")
    r.add_argument("--out", help="folder for the JSON, tables and plots (default docs/bench for "
                                 "gpu1, docs/bench/SET for the others; build/study-SET for the "
                                 "simulated device's sets)")
    r.add_argument("--rounds", type=int, default=3,
                   help="alternating sets: rounds of every server, at least 3 (default 3)")
    r.add_argument("--budget", type=float, default=450,
                   help="seconds from the start (build included) after which no point starts")
    r.add_argument("--seconds", type=int,
                   help="seconds per point (wrk takes whole seconds; default 2, alt-tiny 1)")
    r.add_argument("--device", default="auto", choices=["auto", "cuda", "sim"])
    r.add_argument("--devices", help="the servers' --devices (GPU indices like 0,1; default: every "
                                     "GPU; a label's @ wins)")
    r.add_argument("--bin", help="an evr-async-server already built (skips the build)")
    r.add_argument("--build-dir", default="build/study")
    r.add_argument("--builtin", action="store_true",
                   help="use the server's built-in load generator instead of wrk")
    r.add_argument("--connections", type=int, nargs="+", help="instead of the set's")
    r.add_argument("--servers", nargs="+",
                   help="these server labels instead of the set's, each on --routes (default: "
                        "every route); an alternating set alternates them, in this order, on its "
                        "points")
    r.add_argument("--routes", nargs="+", choices=ROUTES, help="only these routes")
    r.add_argument("--wrk-threads", type=int, help="instead of the set's")
    r.add_argument("--lanes", type=int, default=0,
                   help="--streams of the servers (0: the server's default, from the GPU)")
    r.add_argument("--cuda-connections", type=int, default=32,
                   help="CUDA_DEVICE_MAX_CONNECTIONS of the servers")
    r.add_argument("--check-every", type=int, default=16)
    r.add_argument("--lanes-sweep", action="store_true",
                   help="also evr N=1 on /busy?us=1000 with 32 to 256 lanes and 8 or 32 queues")
    r.add_argument("--no-plot", action="store_true")
    p = sub.add_parser("plot", help="PNG plots from DIR/server-study.json")
    p.add_argument("dir")
    t = sub.add_parser("table", help="markdown tables and goals from DIR/server-study.json")
    t.add_argument("dir")
    args = ap.parse_args()
    if args.what == "run":
        args.set = "tiny" if args.tiny else (args.set or "gpu1")
        return run(args)
    doc = load_doc(args.dir)
    if args.what == "plot":
        plot(doc, args.dir)
    else:
        doc["goals"] = all_goals(doc)
        print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
