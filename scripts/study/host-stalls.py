#!/usr/bin/env python3
"""How often an io thread of the example server stops looking for its waits' completions.

An io thread hosts its waits (delivery::post): it looks for them itself, in passes of the reactor
on its own thread, and the reactor thread looks only as a safety net. A host that stops passing
leaves every completion to the reactor, which then sweeps through its streams at 0.4-0.6 of a
core. Such a state lasts as long as the host has waits pending, so under steady load it lasts; it
begins, if at all, when the load starts. So this study starts the load many times: servers of
each build in turn (evr N=1 and N=2, alternated between the builds), each serving short wrk points
(the routes in turn) with the load stopped (every wait finished) between them, and counts the points where a thread's
hosting stalled: the io threads found less than `--found-below` of the completions.

    scripts/study/host-stalls.py --build A=build/gate/base --build B=build/gate/tree \\
        [--device cuda] [--servers 3] [--points 10] [--seconds 1] [--routes "/busy?us=200" "/busy?us=1000"]

Prints one line per server (points, stalled points, the reactor's cores in each point) and a
total per build.
"""
import argparse
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def load_server_study():
    spec = importlib.util.spec_from_file_location("server_study",
                                                  os.path.join(HERE, "server-study.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def serve_points(st, binary, label, args, wrk):
    """One fresh server of `label`: args.points wrk points; [(found share, reactor cores)]."""
    spec = st.parse_server(label)
    extra = ["--sim-devices", "1"] if args.device == "sim" else []
    srv = st.server(binary, st.server_args(spec, args.device, 0, 32, "0"), extra)
    out = []
    try:
        if srv.port is None:
            raise RuntimeError(f"{label}: the server did not start: " + " | ".join(srv.lines[-5:]))
        st.warm_up(srv.port, args.routes[0])
        for k in range(args.points):
            p = st.run_point(srv, args.routes[k % len(args.routes)], args.connections, args.seconds,
                             wrk, False,
                             min(8, os.cpu_count() or 2))
            per_s = p.get("reactor_per_s") or {}
            done = per_s.get("completed") or 0
            found = per_s.get("host_completions", 0) / done if done else 0.0
            out.append((found, (p.get("cores_by_thread") or {}).get("reactor", 0.0)))
    finally:
        summary, rc = srv.stop()
    if rc not in (0, None) or "(0 failures" not in summary:
        raise RuntimeError(f"{label}: the server reported failures or exited {rc}: {summary}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", action="append", required=True, metavar="NAME=DIR",
                    help="a build folder holding examples/evr-async-server (repeatable)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "sim"])
    ap.add_argument("--servers", type=int, default=3, help="fresh servers per build and label")
    ap.add_argument("--points", type=int, default=10, help="load starts per server")
    ap.add_argument("--seconds", type=int, default=1, help="each point's load (whole seconds: wrk)")
    ap.add_argument("--connections", type=int, default=256)
    ap.add_argument("--routes", nargs="+", default=["/busy?us=200", "/busy?us=1000"],
                    help="the points' routes, in turn")
    ap.add_argument("--labels", nargs="+", default=["evr N=1", "evr N=2"])
    ap.add_argument("--found-below", type=float, default=0.6,
                    help="a point whose io threads found less than this share stalled")
    args = ap.parse_args()
    if args.servers < 1 or args.points < 1 or args.seconds <= 0:
        ap.error("--servers, --points and --seconds must be positive")
    builds = []
    for b in args.build:
        name, sep, folder = b.partition("=")
        binary = os.path.join(folder, "examples", "evr-async-server")
        if not sep or not os.access(binary, os.X_OK):
            ap.error(f"--build {b}: expected NAME=DIR with DIR/examples/evr-async-server")
        builds.append((name, binary))
    st = load_server_study()
    wrk = st.find_wrk()
    if wrk is None:
        sys.exit("host-stalls: wrk not found (PATH, or .tools from scripts/gpu/stage-tools.sh)")
    totals = {name: [0, 0] for name, _ in builds}
    for i in range(args.servers):
        for label in args.labels:
            order = builds if i % 2 == 0 else builds[::-1]
            for name, binary in order:
                points = serve_points(st, binary, label, args, (wrk[0], wrk[1]))
                stalled = sum(1 for found, _ in points if found < args.found_below)
                totals[name][0] += len(points)
                totals[name][1] += stalled
                print(f"{name:8} {label:8} server {i + 1}: {stalled} of {len(points)} points "
                      f"stalled; found {' '.join(f'{f:.2f}' for f, _ in points)}; reactor cores "
                      f"{' '.join(f'{c:.3f}' for _, c in points)}", flush=True)
    for name, (n, stalled) in totals.items():
        print(f"host-stalls: {name}: {stalled} of {n} points stalled "
              f"(io threads found < {args.found_below:.0%} of the completions)")


if __name__ == "__main__":
    main()
