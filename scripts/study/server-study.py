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
  evr N=2 eager-mlp | poll N=2 eager-mlp     /mlp call by call instead of CUDA graphs (--no-mlp-graphs)
  evr N=1 busy-graph | poll N=1 busy-graph   /busy as a CUDA graph per lane (--busy-graph); with
                                             stream-waits too, the graph ends in no signal
  evr N=1 q=8 stream-waits | poll N=1 q=8    with 8 hardware queues (CUDA_DEVICE_MAX_CONNECTIONS)
                                             for this server alone (default: --cuda-connections)
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
import subprocess
import sys

# Its sibling modules, also when it is loaded by path from elsewhere (served_model_load.py,
# server-profile.py import it so), where this folder is not on sys.path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_study_alternating as alternating  # noqa: E402
from server_harness import (ROOT, build, cpu_deltas, cpu_seconds, elapsed,  # noqa: E402
                            find_wrk, log, parse_server, parse_wrk, run_builtin_point, run_point,
                            queues_of, server, server_args, spinning_threads, thread_cpu,
                            thread_group, wait_idle, warm_at_load, warm_up)
from server_study_plots import plot  # noqa: E402
from server_study_points import (BUSY200, BUSY1000, BUSY5000, MLP, ROUTES, SAXPY,  # noqa: E402
                                 fmt, ms, per_core)
from server_study_tables import all_goals, markdown, short_summary  # noqa: E402

# What other scripts use of this module when they load it by path as `study` (the gate's server
# rows, server-profile.py, fleet-bench.py, host-stalls.py, served_model_load.py): the harness's
# names (server_harness.py) and the points' helpers, re-exported here.
__all__ = ["build", "cpu_deltas", "cpu_seconds", "find_wrk", "fmt", "git_head", "ms",
           "parse_server", "parse_wrk", "per_core", "run_point", "server", "server_args",
           "thread_cpu", "thread_group", "wait_idle", "warm_at_load", "warm_up"]



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
        queues = queues_of(spec, queues)  # recorded with each point
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
