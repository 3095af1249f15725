#!/usr/bin/env python3
"""The Ray Serve deployment of the served model (ray_serve_model.py) on a local Ray, checked under
load while one of its replicas is killed:

  python3 ray_serve_model_check.py [--replicas 2] [--connections 32] [--device sim] [--nodes N]

  1. starts a local Ray and the deployment (simulated replicas by default), and checks it: every
     replica answers /stats, 256 rows are answered right (against served_model's float64
     reference), 4 malformed bodies are refused with 400;
  2. load: --connections clients, each POSTing one row at a time to /predict, every answer
     checked; a request that fails (an HTTP error or a closed connection) is retried until it is
     answered (the same row again: a prediction can be asked twice), and every failed attempt is
     counted;
  3. after --before right answers it kills one replica's process (SIGKILL: the replica crashes
     with its requests in flight) and keeps the load on until Ray Serve reports the deployment's
     replicas RUNNING again, a replica that was not there before has answered, and --after more
     answers were right;
  4. stops the load and reports: requests/s and the latency (p50, p99: request sent to its
     answer checked, retries included) before the kill and after the replacement, the failed
     attempts and what the clients saw, the time from the kill to the replacement's first answer.

With --nodes N (3 or more; simulated replicas), Ray runs as a cluster of N nodes on this machine
(ray.cluster_utils.Cluster: a head node and N-1 worker nodes, each worker one logical GPU, so a
replica a node), and step 3 loses a whole worker node instead of one process: the node that runs
a replica is removed (its raylet and every worker process on it killed), and its replica must come
back on a surviving node with a free GPU.

Passes when no answer was wrong, every request was answered right in the end, no attempt failed
before the kill or once the replacement had answered, the replica count came back, the killed
process is gone and the new replica answered. Exit status 0 then, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
import signal
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ray_serve_model  # noqa: E402  (beside this file; sets up Ray's environment)
import served_model_client  # noqa: E402

from ray import serve  # noqa: E402


def log(msg):
    print(f"[ray_serve_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port():
    """A free port on 127.0.0.1 for Serve's proxy, which binds it only after Ray has started its
    processes. Taken below the kernel's ephemeral range (from which those processes' own ports
    come: a port picked there was once taken meanwhile, and the proxy failed to bind) and above
    Ray's worker ports (10002-19999 by default)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    candidates = list(range(20000, ephemeral_low))
    random.shuffle(candidates)
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # no room below the ephemeral range: any free port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def running_replicas():
    """How many replicas of the deployment Ray Serve reports RUNNING."""
    app = serve.status().applications.get(ray_serve_model.APP)
    if app is None:
        return 0
    return sum(d.replica_states.get("RUNNING", 0) for d in app.deployments.values())


async def replica_stats(session, url, replicas, deadline):
    """{replica id: its /stats} once every one of `replicas` has answered (the proxy spreads the
    GETs over the replicas)."""
    seen = {}
    while len(seen) < replicas:
        if time.monotonic() > deadline:
            raise RuntimeError(f"/stats: {len(seen)} of {replicas} replicas answered")
        async with session.get(url + "/stats") as r:
            doc = await r.json()
        seen[doc["replica"]] = doc
    return seen


class Load:
    """`connections` clients POSTing rows one at a time, until stop(); every answer checked.
    Requests are grouped by the phase when they were sent (answers right, latencies from sent to
    checked with retries included, requests that needed a retry, answers per replica), failed
    attempts by the phase when they failed and by what the client saw."""

    def __init__(self, session, url, checker, connections, deadline):
        self.session, self.url, self.checker = session, url, checker
        self.deadline = deadline
        self.connections = connections
        self.phase = "before"
        self.right = collections.Counter()  # phase -> requests answered right
        self.latency = collections.defaultdict(list)  # phase -> seconds per request
        self.failed = collections.defaultdict(collections.Counter)  # phase -> outcome -> attempts
        self.requests_failed = collections.Counter()  # phase -> requests with a failed attempt
        self.wrong = 0
        self.seen = {}  # outcome of a failed attempt -> the first body that came with it
        self.by_replica = collections.defaultdict(collections.Counter)  # phase -> replica -> n
        self.first_answer = {}  # replica -> monotonic time of its first answer
        self.phase_start = {"before": time.monotonic()}
        self.changed = asyncio.Event()  # set on each answer: what the driver waits for
        self._stop = False
        self._tasks = [asyncio.ensure_future(self._client(i)) for i in range(connections)]

    def enter(self, phase):
        self.phase = phase
        self.phase_start[phase] = time.monotonic()

    async def stop(self):
        self._stop = True
        await asyncio.gather(*self._tasks)
        self.phase_start["end"] = time.monotonic()

    async def _client(self, i):
        k = i
        while not self._stop:
            k = (k + self.connections) % len(self.checker.bodies)
            phase, t0, failed = self.phase, time.perf_counter(), False
            while True:
                outcome, doc = await served_model_client.post_row_answer(self.session, self.url,
                                                                  self.checker, k)
                if outcome == "ok":
                    break
                if outcome == "wrong":
                    self.wrong += 1
                self.seen.setdefault(outcome, doc)  # what a client saw, the first time
                self.failed[self.phase][outcome] += 1  # the phase when it failed
                failed = True
                await asyncio.sleep(0.05)  # a client's back-off before it asks again
                if time.monotonic() > self.deadline:
                    raise RuntimeError(f"row {k} not answered right in the time allowed: "
                                       f"{outcome}")
            self.latency[phase].append(time.perf_counter() - t0)
            self.right[phase] += 1
            self.requests_failed[phase] += failed
            self.by_replica[phase][doc["replica"]] += 1
            self.first_answer.setdefault(doc["replica"], time.monotonic())
            self.changed.set()

    async def until(self, condition, deadline, what):
        """Waits (on answers, not on time) until condition() holds; RuntimeError after
        `deadline`."""
        while not condition():
            if time.monotonic() > deadline:
                raise RuntimeError(f"not reached within the time allowed: {what}")
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), max(0.01, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                pass

    def rate(self, phase, following):
        seconds = self.phase_start[following] - self.phase_start[phase]
        return self.right[phase] / seconds if seconds > 0 else float("nan")


def cpu_by_role():
    """{role: CPU seconds} of this process and its descendants, which a local Ray's processes
    are: "client" (this process: the load and the checks), "proxy" (Serve's HTTP proxy),
    "replicas", "ray" (the rest: GCS, raylet, Serve's controller, ...). Processes that exited
    are not counted."""
    ticks = os.sysconf("SC_CLK_TCK")
    procs = {}  # pid -> (parent pid, CPU seconds, argv[0])
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue  # exited meanwhile
        fields = stat[stat.rindex(")") + 2:].split()
        procs[int(name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks, argv0)
    children = collections.defaultdict(list)
    for pid, (ppid, _, _) in procs.items():
        children[ppid].append(pid)
    roles, todo = collections.Counter(), [os.getpid()]
    while todo:
        pid = todo.pop()
        todo += children[pid]
        _, cpu, argv0 = procs.get(pid, (0, 0.0, ""))
        roles["client" if pid == os.getpid() else "proxy" if argv0.startswith("ray::ProxyActor")
              else "replicas" if argv0.startswith("ray::ServeReplica") else "ray"] += cpu
    return roles


def percentile(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


async def check_basics(session, url, replicas, deadline):
    """Every replica answers /stats; 256 rows answered right; malformed bodies refused with 400.
    Returns (replica stats, checker, failures)."""
    stats = await replica_stats(session, url, replicas, deadline)
    config = next(iter(stats.values()))["config"]
    checker = served_model_client.Checker.of(config["dims"], config["seed"])
    failures = []
    got = collections.Counter(await asyncio.gather(
        *(served_model_client.post_row(session, url, checker, i % len(checker.bodies))
          for i in range(256))))
    if got != {"ok": 256}:
        failures.append(f"256 requests: {dict(got)} (all 'ok' expected)")
    for body, what in served_model_client.malformed_bodies(config["d_in"]):
        async with session.post(url + "/predict", data=body) as r:
            if r.status != 400:
                failures.append(f"{what}: status {r.status}, expected 400")
    pids = ", ".join(f"{r} pid {s['pid']}" for r, s in stats.items())
    log(f"{replicas} replicas answer ({pids}), model {'-'.join(map(str, config['dims']))}; "
        f"256 answers checked: {dict(got)}; 4 malformed bodies refused with 400")
    return stats, checker, failures


def start_cluster(nodes):
    """A Ray cluster of `nodes` nodes on this machine: a head without GPUs (Serve's controller and
    proxy) and nodes-1 workers with one logical GPU each (a replica per node)."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0})
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=2, num_gpus=1)
    cluster.wait_for_nodes()
    return cluster


def remove_node_of(cluster, pid):
    """Removes (kills) the worker node that runs the process `pid`; returns its node id."""
    from ray.util.state import list_actors

    actors = list_actors(filters=[("pid", "=", pid)], detail=True)
    if not actors:
        raise RuntimeError(f"no Ray actor with pid {pid}")
    node_id = actors[0]["node_id"]
    for node in cluster.worker_nodes:
        if node.node_id == node_id:
            cluster.remove_node(node, allow_graceful=False)
            return node_id
    raise RuntimeError(f"pid {pid} runs on node {node_id}, which is not a worker node")


async def kill_and_replace(args, url, cluster=None):
    """Steps 1-4 of the module's docstring; returns the list of failures (empty: passed)."""
    import aiohttp

    deadline = time.monotonic() + args.time_limit
    timeout = aiohttp.ClientTimeout(total=30)
    conn = aiohttp.TCPConnector(limit=args.connections + 4)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        stats, checker, failures = await check_basics(session, url, args.replicas, deadline)
        cpu_start = cpu_by_role()
        load = Load(session, url, checker, args.connections, deadline)
        await load.until(lambda: load.right["before"] >= args.before, deadline,
                         f"{args.before} answers before the kill")
        cpu = cpu_by_role()
        cpu.subtract(cpu_start)
        victim, victim_stats = next(iter(stats.items()))
        load.enter("during")
        if cluster is None:
            os.kill(victim_stats["pid"], signal.SIGKILL)
            log(f"killed replica {victim} (SIGKILL to pid {victim_stats['pid']}) after "
                f"{load.right['before']} answers")
        else:
            node = await asyncio.get_running_loop().run_in_executor(
                None, remove_node_of, cluster, victim_stats["pid"])
            log(f"removed node {node} with replica {victim} (pid {victim_stats['pid']}) after "
                f"{load.right['before']} answers")
        running = await wait_for_replacement(load, stats, args.replicas, deadline)
        load.enter("after")
        await load.until(lambda: load.right["after"] >= args.after, deadline,
                         f"{args.after} answers after the replacement")
        await load.stop()
        end = {"gone": not pid_alive(victim_stats["pid"]),
               "running": await asyncio.get_running_loop().run_in_executor(None,
                                                                           running_replicas),
               "replicas": await replica_stats(session, url, args.replicas, deadline)}
    newcomers = [r for r in load.first_answer if r not in stats]
    report(load, victim, newcomers, running, cpu, end["replicas"])
    return failures + verdict(load, stats, victim, newcomers, end, args.replicas)


async def wait_for_replacement(load, before, replicas, deadline):
    """Until a replica that was not among `before` has answered and Ray Serve counts `replicas`
    running (polling its status while the load runs); returns that count."""
    loop = asyncio.get_running_loop()
    while True:
        running = await loop.run_in_executor(None, running_replicas)
        new = [r for r in load.first_answer if r not in before]
        if new and running == replicas:
            return running
        if time.monotonic() > deadline:
            raise RuntimeError(f"the deployment has {running} replicas running, new replicas "
                               f"answering: {new}")
        await asyncio.sleep(0.1)  # between status queries


def verdict(load, before, victim, newcomers, end, replicas):
    """What went wrong (the checks of step 4), as a list of sentences."""
    failures = []
    if load.wrong:
        failures.append(f"{load.wrong} answers were wrong")
    for phase in ("before", "after"):
        if load.failed[phase]:
            failures.append(f"failed attempts {phase} the kill/replacement: "
                            f"{dict(load.failed[phase])}")
    if victim in load.by_replica["after"]:
        failures.append(f"the killed replica {victim} answered after the replacement")
    final = end["replicas"]
    if set(final) != set(before) - {victim} | set(newcomers):
        failures.append(f"the replicas at the end are {sorted(final)}: not the survivors of "
                        f"{sorted(before)} without {victim} and the new {newcomers}")
    if end["running"] != replicas:
        failures.append(f"{end['running']} replicas running at the end, not {replicas}")
    if not end["gone"]:
        failures.append(f"the killed replica's process ({victim}) is still there")
    if not load.by_replica["after"].keys() & set(newcomers):
        failures.append("the new replica did not answer after the replacement")
    return failures


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie's state is Z
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def report(load, victim, newcomers, running, cpu, final):
    """Prints each phase's figures, what failed attempts got, the replacement's times, the CPU
    by role before the kill and the batches of the `final` replicas."""
    for phase, following in (("before", "during"), ("during", "after"), ("after", "end")):
        lat = load.latency[phase]
        log(f"{phase:>6}: {load.right[phase]} requests answered right in "
            f"{load.phase_start[following] - load.phase_start[phase]:.2f} s "
            f"({load.rate(phase, following):.0f}/s), p50 {percentile(lat, 0.5) * 1e3:.1f} ms, "
            f"p99 {percentile(lat, 0.99) * 1e3:.1f} ms; {load.requests_failed[phase]} needed a "
            f"retry; failed attempts {dict(load.failed[phase]) or 0}; answers by replica "
            f"{dict(load.by_replica[phase])}")
    for outcome, body in load.seen.items():
        log(f"a failed attempt ({outcome}) got: {str(body)[:300]!r}")
    killed_at = load.phase_start["during"]
    first_new = min((load.first_answer[r] for r in newcomers), default=float("nan"))
    log(f"replica {victim} killed; replaced by {', '.join(newcomers)}: its first answer "
        f"{first_new - killed_at:.2f} s after the kill; {running} replicas running "
        f"{load.phase_start['after'] - killed_at:.2f} s after the kill; wrong answers "
        f"{load.wrong}")
    seconds = load.phase_start["during"] - load.phase_start["before"]
    log("CPU before the kill, cores (ms per request): " + ", ".join(
        f"{role} {cpu[role] / seconds:.2f} ({cpu[role] / load.right['before'] * 1e3:.1f})"
        for role in ("client", "proxy", "replicas", "ray")))
    batches, rows = (sum(st[k] for st in final.values()) for k in ("batches", "rows"))
    log(f"replicas at the end: {', '.join(sorted(final))} ({batches} batches, "
        f"{rows / max(1, batches):.1f} rows per batch since each started)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ray_serve_model.add_arguments(ap)
    ap.set_defaults(device="sim", replicas=2, port=None)
    ap.add_argument("--connections", type=int, default=32, help="clients, one request each")
    ap.add_argument("--before", type=int, default=2000, help="right answers before the kill")
    ap.add_argument("--after", type=int, default=1000,
                    help="right answers after the replacement answered")
    ap.add_argument("--nodes", type=int, default=0,
                    help="a Ray cluster of this many nodes on this machine; a node is lost "
                         "(0: one local Ray, a replica's process is killed)")
    ap.add_argument("--time-limit", type=float, default=240.0,
                    help="seconds after which the check fails instead of waiting longer")
    args = ap.parse_args()
    ray_serve_model.check_arguments(ap, args)
    for name in ("connections", "before", "after"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.replicas < 2:
        ap.error("--replicas must be >= 2: one is killed while the others answer")
    if args.address:
        ap.error("--address: the check kills a replica's process, so it starts a local Ray")
    if args.nodes and (args.nodes < 3 or args.device != "sim" or args.replicas > args.nodes - 2):
        ap.error(f"--nodes {args.nodes}: takes 3 or more, with --device sim and at most nodes-2 "
                 f"replicas (--replicas {args.replicas}): a lost node's replica needs a free one")
    args.port = args.port or free_port()
    t0 = time.monotonic()
    cluster = None
    if args.nodes:
        cluster = start_cluster(args.nodes)
        args.address, args.head_proxy_only = cluster.address, True
        log(f"a Ray cluster of {args.nodes} nodes on this machine ({args.nodes - 1} workers with "
            f"one GPU each) at {cluster.address}")
    ray_serve_model.start(args)
    url = f"http://{args.host}:{args.port}"
    log(f"Ray {ray_serve_model.ray.__version__}, {args.replicas} replicas on device "
        f"{args.device}, {url}, started in {time.monotonic() - t0:.1f} s")
    try:
        failures = asyncio.run(kill_and_replace(args, url, cluster))
    except RuntimeError as e:
        failures = [str(e)]
    finally:
        ray_serve_model.stop()
        if cluster is not None:
            cluster.shutdown()
    for f in failures:
        log(f"FAILED: {f}")
    log(f"result: {'OK' if not failures else f'FAILED ({len(failures)})'} in "
        f"{time.monotonic() - t0:.1f} s")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
