"""The gate's rows: what each measures, how it is run, and how its figures are read.

A *group* is one program run (one evr-bench invocation, one server start with its points, one
Python benchmark) that yields several rows; the gate runs each group once per side per round.
A *row* is one condition a user meets (1 stream of 1 ms work, posted; 16 streams in lockstep;
/busy?us=200 on one io thread ...) with its metrics, each marked better lower or higher.

Every group is given the build folder of one side (the baseline or the tree under test) and
returns {row name: {metric: value}}; rows.py knows nothing of rounds or verdicts (gate.py). A row
may add "diagnostics" (any JSON), which the record keeps per round and side and never judges.
"""
import importlib.util
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# metric name -> (unit, which way is better, the smallest difference that counts in that unit)
METRICS = {
    "p50_us": ("us", "lower", 1.0),
    "p99_us": ("us", "lower", 5.0),
    "cpu_pct": ("% of a core", "lower", 1.0),
    "wakeups_per_s": ("/s", "lower", 2.0),
    "rps_per_core": ("req/s per core", "higher", 0.0),
    "server_p99_ms": ("ms", "lower", 0.1),
    "reactor_cores": ("cores", "lower", 0.01),
    "evr_over_poll": ("x", "higher", 0.0),
    "over_sync_us": ("us", "lower", 1.0),
    "mean_over_sync_us": ("us", "lower", 10.0),
    "cores": ("cores", "lower", 0.02),
    "rps": ("req/s", "higher", 0.0),
}


def load_server_study():
    """scripts/study/server-study.py as a module (its file name has a hyphen)."""
    path = os.path.join(ROOT, "scripts", "study", "server-study.py")
    spec = importlib.util.spec_from_file_location("server_study", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_logged(cmd, log, timeout, env=None):
    """Runs cmd, appending its output to the file `log`; returns its exit status (124: timed out)."""
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        try:
            return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                                  env=env).returncode
        except subprocess.TimeoutExpired:
            f.write(f"(timed out after {timeout} s)\n")
            return 124


# --- evr-bench idle: 1 stream, lockstep, irregular work -------------------------------------------

def row_figures(r):
    """The figures the gate judges of one `evr-bench idle` row."""
    fig = {"p50_us": r["p50_ns"] / 1e3, "p99_us": r["p99_ns"] / 1e3, "cpu_pct": r["cpu_percent"]}
    if r.get("failed"):
        fig["failed"] = True
    return fig


def run_idle(sim, build, json_path, args, log, queues=None):
    """Runs `evr-bench idle` with `args` (and the gate's scale, floor and device) and returns its
    JSON. CUDA_DEVICE_MAX_CONNECTIONS: `queues`, or left alone (the driver's default, 8)."""
    bench = os.path.join(build, "bench", "evr-bench")
    args = args + ["--scale", "0.15" if sim else "1", "--floor-samples", "100" if sim else "300",
                   "--device", "sim" if sim else "cuda", "--json", json_path]
    env = dict(os.environ)
    env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    if queues is not None:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = str(queues)
    rc = run_logged([bench, "idle"] + args, log, timeout=240, env=env)
    if rc != 0 or not os.path.exists(json_path):
        raise RuntimeError(f"evr-bench idle exited {rc} (see {log})")
    with open(json_path) as f:
        return json.load(f)


def idle_rows(doc, lockstep_suffix=""):
    """Rows from an `evr-bench idle` JSON: the default posted (stream waits) and, in lockstep,
    device-signalled waits posted; the idle case."""
    out = {}
    for sc in doc["scenarios"]:
        if sc["kind"] != "steady":
            continue
        length = sc["length_us"]
        what = f"{length / 1000:g} ms" if length >= 1000 else f"{length:g} us"
        for r in sc["rows"]:
            if r["delivery"] != "post" or r["group"] != "evr":
                continue
            if sc["lockstep"]:
                kind = {"default": "stream waits", "signal": "signal slots"}.get(r["key"])
                if kind is None:
                    continue
                name = f"{sc['streams']} streams x {what} lockstep, {kind}, posted{lockstep_suffix}"
            elif r["key"] == "default":
                name = f"1 stream x {what}, posted"
            else:
                continue
            out[name] = row_figures(r)
    for c in doc.get("cpu_case") or []:
        if c["key"] == "default":
            out["1000 waits on a 100 ms kernel"] = {"cpu_pct": c["busy_percent"]}
            out["idle reactor"] = {"wakeups_per_s": c["idle_wakeups_per_second"]}
    return out


class idle_group:
    """One `evr-bench idle` run: 1 stream at four lengths (+ the idle case) and 16/64 streams in
    lockstep; or (conn32) the lockstep rows alone with CUDA_DEVICE_MAX_CONNECTIONS=32; or
    (lockstep_only) the lockstep rows alone with the driver's queues, for a rerun of those rows
    over more rounds (without the 1, 5 and 20 ms single-stream rows that take much of its time)."""

    def __init__(self, name, sim, conn32=False, lockstep_only=False):
        self.name, self.sim, self.conn32, self.lockstep_only = name, sim, conn32, lockstep_only

    def run(self, build, work, log):
        if self.conn32:
            args = ["--streams", "1", "--lengths-us", "1000", "--no-idle-case"]
        elif self.lockstep_only:
            # The bench always runs a single-stream row: the shortest, dropped below.
            args = ["--streams", "1", "--lengths-us", "200", "--no-idle-case"]
        else:
            args = ["--streams", "1", "--lengths-us", "200,1000,5000,20000"]
        args += ["--lockstep-streams", "16,64", "--lockstep-lengths-us", "1000,5000",
                 "--no-irregular", "--methods", "default,signal", "--deliveries", "post"]
        doc = run_idle(self.sim, build, os.path.join(work, "idle.json"), args, log,
                       queues=32 if self.conn32 else None)
        rows = idle_rows(doc, ", 32 queues" if self.conn32 else "")
        if self.conn32 or self.lockstep_only:
            rows = {k: v for k, v in rows.items() if "lockstep" in k}
        return rows


def irregular_rows(doc):
    """Rows from an `evr-bench idle` JSON of irregular work (lengths uniform over 100 us-5 ms, or
    100 us and 5 ms at random): the default posted, on 1 stream and on 16 and 64 in lockstep."""
    out = {}
    for sc in doc["scenarios"]:
        if sc["kind"] == "steady":
            continue
        where = f"{sc['streams']} streams lockstep" if sc["lockstep"] else "1 stream"
        lengths = sc["name"].split(",")[0]  # "uniform 100 us-5 ms"
        for r in sc["rows"]:
            if r["group"] != "evr" or r["key"] != "default" or r["delivery"] != "post":
                continue
            out[f"{where}, {lengths}, posted"] = row_figures(r)
    return out


class irregular_group:
    """One `evr-bench idle` run of irregular work: the windows are polled (not spun through), on
    the io thread's timer, which steady work's rows do not show."""

    def __init__(self, name, sim):
        self.name, self.sim = name, sim

    def run(self, build, work, log):
        args = ["--streams", "1", "--lengths-us", "5000", "--lockstep-streams", "16,64",
                "--lockstep-lengths-us", "5000", "--no-idle-case", "--methods", "default",
                "--deliveries", "post"]
        return irregular_rows(run_idle(self.sim, build, os.path.join(work, "irregular.json"),
                                       args, log))


# --- the example server under wrk ------------------------------------------------------------------

class server_group:
    """evr-async-server against the poll mode (io threads querying their own events), each
    server started afresh, one wrk point per route."""

    def __init__(self, name, sim, plan, connections=256, seconds=1, devices="0"):
        self.name, self.sim, self.plan, self.devices = name, sim, plan, devices
        self.connections, self.seconds = connections, seconds
        self.study = load_server_study()
        self.wrk = self.study.find_wrk()

    def run(self, build, work, log):
        st = self.study
        if self.wrk is None:
            raise RuntimeError("wrk not found (PATH, or .tools from scripts/gpu/stage-tools.sh)")
        wrk = (self.wrk[0], self.wrk[1])
        binary = os.path.join(build, "examples", "evr-async-server")
        device = "sim" if self.sim else "cuda"
        out = {}
        points = {}
        for label, routes in self.plan:
            spec = st.parse_server(label)
            args = st.server_args(spec, device, 0, 32, self.devices)
            extra = ["--check-every", "16"]
            if self.sim:
                extra += ["--sim-devices", "1"]
            srv = st.server(binary, args, extra)
            try:
                if srv.port is None:
                    raise RuntimeError(f"{label}: the server did not start: "
                                       + " | ".join(srv.lines[-5:]))
                wrk_threads = min(8, os.cpu_count() or 2)
                for i, route in enumerate(routes):
                    st.warm_up(srv.port, route)
                    if i == 0:
                        st.warm_at_load(srv, route, self.connections, wrk, wrk_threads)
                    p = st.run_point(srv, route, self.connections, self.seconds, wrk, False,
                                     wrk_threads)
                    points[(label, route)] = p
            finally:
                summary, rc = srv.stop()
                with open(log, "a") as f:
                    f.write(f"{label}: {summary} (exit {rc})\n" + "\n".join(srv.lines[-3:]) + "\n")
            if rc not in (0, None) or "(0 failures" not in summary:
                raise RuntimeError(f"{label}: the server reported failures or exited {rc}: {summary}")
        for (label, route), p in points.items():
            name = f"server {route} {self.connections} conns, {label}"
            if p.get("errors"):
                out[name] = {"failed": True}
                continue
            reactor = (p.get("cores_by_thread") or {}).get("reactor")
            out[name] = {"rps_per_core": st.per_core(p), "server_p99_ms": (p["p99_us"] or 0) / 1e3}
            if label.startswith("evr"):
                out[name]["reactor_cores"] = reactor or 0.0
            # Kept beside the figures, never judged: what the reactor did over the point (per
            # second) and each thread group's cores, to tell why a point ran unlike the others.
            out[name]["diagnostics"] = {
                "reactor_per_s": {k: round(v, 1) for k, v in (p.get("reactor_per_s") or {}).items()},
                "cores_by_thread": {k: round(v, 3) for k, v in p["cores_by_thread"].items()},
                "rps": p.get("rps")}
        # evr over the poll mode per core, at the same io threads and route: the ratio users decide
        # on. Stream waits (no kernel of evr's: issue 45's goal) against the same poll mode.
        for (label, route), p in points.items():
            if not label.startswith("evr N="):
                continue
            poll = points.get(("poll " + label[4:].replace(" stream-waits", ""), route))
            if poll and st.per_core(poll) and st.per_core(p):
                out[f"server {route} {self.connections} conns, {label} over poll"] = {
                    "evr_over_poll": st.per_core(p) / st.per_core(poll)}
        return out


# --- Python on torch ---------------------------------------------------------------------------------

class python_group:
    """bench/python/bench_await.py with the side's Python module: `await evr.wait` against a
    blocking synchronize; 64 tasks on 64 streams at 2 ms (more waits in flight than the loop polls
    for, on a GPU that is the bottleneck); 4 tasks on 4 streams at 200 us (few waits, each task's
    rate bound by its own wait's latency: the case the loop's polling windows are for); 64 tasks
    at 500 us (the loop thread saturated: a completion waits for its round; a bimodal row); one
    stream whose work alternates 20 kernels of 5 ms and 20 of 200 us (what the loop's predictions
    make of a change of length: the mean over the blocking floor's). Each kernel length's rows
    measure for half a second at least (--min-seconds): 300 awaits of 200 us were 63 ms, over
    which the loop's CPU ranged 0.30-0.65 cores between rounds of one build."""

    def __init__(self, name, sim):
        self.name, self.sim = name, sim

    def run(self, build, work, log):
        kernels = "1000" if self.sim else "200,1000,5000"
        doc = self._bench(build, work, log, "await.json",
                          ["--kernels-us", kernels, "--methods", "sync,evr",
                           "--samples", "100" if self.sim else "300",
                           "--min-seconds", "0.1" if self.sim else "0.5",
                           "--tasks", "64", "--task-kernel-us", "2000",
                          "--phases", "5000:20,200:20"])
        out = {}
        for k, rows in doc["kernels"].items():
            us = float(k)
            what = f"{us / 1000:g} ms" if us >= 1000 else f"{us:g} us"
            e = rows["evr"]
            out[f"python await evr.wait, {what}"] = {
                "over_sync_us": e["p50_us"] - rows["sync"]["p50_us"], "cores": e["cpu_cores"],
                "reactor_cores": e["reactor_cores"]}
        if "phases" in doc:
            ph = doc["phases"]["rows"]
            out["python await evr.wait, 20 x 5 ms then 20 x 200 us"] = {
                "mean_over_sync_us": ph["evr"]["mean_us"] - ph["sync"]["mean_us"],
                "cores": ph["evr"]["cpu_cores"]}
        few = self._bench(build, work, log, "few-tasks.json",
                          ["--kernels-us", "200", "--methods", "sync", "--samples", "20",
                           "--tasks", "4", "--task-kernel-us", "200", "--more-tasks", "64x500"])
        for d in (doc, few):
            for t in ([d["tasks"]] if "tasks" in d else []) + d.get("more_tasks", []):
                # The reactor's share apart: the loop thread's scatter between rounds (0.5-0.8 of
                # a core at 64 tasks) hides a change of the reactor's in the process's cores.
                out[f"python {t['n']} tasks on {t['n']} streams, {t['kernel_us'] / 1000:g} ms"] = {
                    "rps": t["rps"], "cores": t["cpu_cores"],
                    "reactor_cores": t["reactor_cores"]}
        return out

    def _bench(self, build, work, log, json_name, args):
        out_json = os.path.join(work, json_name)
        script = os.path.join(ROOT, "bench", "python", "bench_await.py")
        cmd = [sys.executable, script, "--device", "sim" if self.sim else "cuda", "--many", "0",
               "--task-seconds", "1" if self.sim else "2", "--json", out_json] + args
        env = dict(os.environ)
        env["PYTHONPATH"] = os.path.join(build, "python")
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        rc = run_logged(cmd, log, timeout=180, env=env)
        if rc != 0 or not os.path.exists(out_json):
            raise RuntimeError(f"bench_await.py exited {rc} (see {log})")
        with open(out_json) as f:
            return json.load(f)


def groups(sim, all_gpus=False):
    """The gate's groups, in the order a round runs them."""
    busy200, busy1000, mlp = "/busy?us=200", "/busy?us=1000", "/mlp?seed=1"
    plan = [("evr N=1", [busy200, busy1000]), ("poll N=1", [busy200, busy1000]),
            ("evr N=2", [busy200, busy1000, mlp]), ("poll N=2", [busy200, busy1000, mlp]),
            ("evr N=1 stream-waits", [busy200, busy1000]),
            ("evr N=2 stream-waits", [busy200, busy1000])]
    if all_gpus:
        # Every GPU of the host: two io threads a GPU against the poll mode, and /mlp on all.
        plan = [("evr N=4", [busy1000, mlp]), ("poll N=4", [busy1000, mlp])]
    out = [idle_group("idle", sim)]
    if not sim:  # the simulated device has no hardware queues
        out.append(idle_group("idle, 32 queues", sim, conn32=True))
    out.append(irregular_group("irregular", sim))
    # One GPU: the servers on GPU 0, so that a host with more GPUs measures the same rows.
    out.append(server_group("server", sim, plan, connections=64 if sim else 256,
                            devices=None if all_gpus else "0"))
    if not all_gpus:
        # A server with spare CPU (its io thread not saturated): per core is then the CPU a
        # request costs, where the host's polls between completions are most of evr's share.
        moderate = [("evr N=1 stream-waits", [busy200, busy1000]), ("evr N=1", [busy1000]),
                    ("poll N=1", [busy200, busy1000])]
        out.append(server_group("server, few connections", sim, moderate,
                                connections=16 if sim else 32, devices="0"))
    out.append(python_group("python", sim))
    return out


def optional_groups(sim):
    """Groups run only when --groups names them: they measure rows of the groups above again."""
    return [idle_group("lockstep", sim, lockstep_only=True)]


# Groups that measure the same rows: naming both would mix their figures in one row.
OVERLAPPING = [("idle", "lockstep")]
