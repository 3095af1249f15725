"""How the server studies start evr-async-server, load it with wrk and read its CPU: server labels,
the build, wrk, the server process (its threads' CPU, the GPUs' utilization, the reactor's
counters) and one measured point. server-study.py's runner, the gate's server rows
(scripts/gate/rows.py), server-profile.py and the fleet's bench use it, most through
server-study.py, which re-exports these names."""
import os
import re
import shutil
import signal
import subprocess
import threading
import time

from server_study_points import BUSY_GRAPH, EAGER_MLP, KERNEL_FENCES, STREAM_WAITS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
T0 = time.monotonic()

NON_BLOCKING = ("evr", "hostfunc", "poll")
BLOCKING = ("pool", "thread")
SYNCS = ("auto", "spin", "blocking-sync")

def log(msg):
    print(f"[server-study {time.monotonic() - T0:6.1f} s] {msg}", flush=True)


def elapsed():
    return time.monotonic() - T0


# --- server labels --------------------------------------------------------------------------------

def parse_server(label):
    """A server label (see the module's doc) as {label, mode, sync, threads, devices,
    busy_signal, mlp_graphs, busy_graph, kernel_fences}: threads None for thread-per-connection,
    0 for a pool of a thread per lane; devices None for the default; busy_signal False for evr's stream waits on
    /busy; mlp_graphs False for /mlp call by call (the word eager-mlp); busy_graph True for /busy
    as a CUDA graph (the word busy-graph); kernel_fences True for evr's fence kernel past the
    hardware queues (the word kernel-fences, evr only). These words end a label, in any order.
    Raises ValueError for a label that names no server."""
    text, _, devices = label.partition(" @")
    if devices and not re.fullmatch(r"\d+(,\d+)*", devices):
        raise ValueError(f"'{label}': @ takes GPU indices like @0 or @0,1")
    words = text.split()
    suffixes = set()
    while words and words[-1] in (EAGER_MLP, STREAM_WAITS, BUSY_GRAPH, KERNEL_FENCES):
        suffixes.add(words.pop())
    eager_mlp, stream_waits = EAGER_MLP in suffixes, STREAM_WAITS in suffixes
    queues = int(words.pop()[2:]) if words and re.fullmatch(r"q=\d+", words[-1]) else None
    if queues is not None and not 1 <= queues <= 32:
        raise ValueError(f"'{label}': q= takes CUDA's hardware queues, 1 to 32")
    n = words.pop() if words and words[-1].startswith("N=") else None
    mode = words[0] if words else ""
    sync = words[1] if len(words) > 1 else None
    ok = (mode in NON_BLOCKING and len(words) == 1 and n) or \
         (mode == "pool" and len(words) == 2 and sync in SYNCS and n) or \
         (mode == "thread" and len(words) == 2 and sync in SYNCS and not n)
    if not ok or (n and not re.fullmatch(r"N=(\d+|lanes)", n)) or \
            ((stream_waits or KERNEL_FENCES in suffixes) and mode != "evr"):
        raise ValueError(f"'{label}' names no server: try 'evr N=2', 'hostfunc N=4', 'poll N=1', "
                         "'pool blocking-sync N=lanes', 'pool auto N=4', 'thread blocking-sync', "
                         f"'evr N=1 {STREAM_WAITS}', 'poll N=1 q=8' (CUDA_DEVICE_MAX_CONNECTIONS "
                         "for this server alone), with ' @0' for GPU 0 alone")
    threads = None if not n else (0 if n == "N=lanes" else int(n[2:]))
    return {"label": label, "mode": mode, "sync": sync, "threads": threads,
            "devices": devices or None, "busy_signal": not stream_waits, "queues": queues,
            "mlp_graphs": not eager_mlp, "busy_graph": BUSY_GRAPH in suffixes,
            "kernel_fences": KERNEL_FENCES in suffixes}


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


def cpu_deltas(before, after):
    """Between two thread_cpu() samples: [(comm, CPU seconds)] of the threads alive at the second,
    the CPU of threads that ended in between (the process's total minus its live threads': e.g.
    thread per connection), and the process's total."""
    (t0, p0), (t1, p1) = before, after
    live = [(comm, cpu - (t0[tid][1] if tid in t0 else 0.0)) for tid, (comm, cpu) in t1.items()]
    total = p1 - p0
    return live, total - sum(d for _, d in live), total


def cpu_by_group(before, after):
    """CPU seconds per thread group between two thread_cpu() samples; 'exited': the threads that
    ended in between."""
    live, exited, total = cpu_deltas(before, after)
    groups = {}
    for comm, d in live:
        g = thread_group(comm)
        groups[g] = groups.get(g, 0.0) + d
    groups["exited"] = max(0.0, exited)
    return groups, total


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


def queues_of(spec, cuda_connections):
    """The hardware queues a server spec (parse_server) runs with: its label's q=, else
    `cuda_connections`."""
    return spec.get("queues") or cuda_connections


def server_args(spec, device, lanes, cuda_connections, devices):
    """The command-line arguments of a server spec (parse_server), after the binary."""
    cmd = ["--device", device, "--mode", spec["mode"], "--cuda-connections",
           str(queues_of(spec, cuda_connections))]
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
    if not spec.get("mlp_graphs", True):
        cmd.append("--no-mlp-graphs")
    if spec.get("busy_graph"):
        cmd.append("--busy-graph")
    if spec.get("kernel_fences"):
        cmd.append("--kernel-fences")
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
