#!/usr/bin/python3
"""Where the async server's CPU goes under load: CPU per request by thread, and the hottest frames.

    scripts/study/server-profile.py [--out DIR] [--servers "evr N=1" "evr N=4"] [--route /busy?us=1000]
                              [--connections 512] [--seconds 5] [--device auto|cuda|sim] [--no-perf]

For each server (labels of scripts/study/server-study.py: "evr N=1", "hostfunc N=4", "poll N=2",
"pool blocking-sync N=lanes", "thread blocking-sync", "evr N=4 @0", ...) it starts
evr-async-server, warms the route up with wrk, then runs wrk for --seconds while it
  * reads every thread's utime+stime from /proc/PID/task/*/stat before and after, and prints the
    CPU per request (us) and the cores per thread group: the io threads (named evr-io-N), the evr
    reactor (evr-reactor), thread-per-connection threads (evr-conn), CUDA's own threads (cuda*),
    the simulated device (evr-sim-*), and what exited meanwhile (the process's total minus the
    live threads');
  * samples the server with perf (cpu-clock, no hardware counters needed) and prints the top
    frames by self time, for the whole process and per thread group, in % and in us per request.
  * with --callers (call graphs, DWARF unwinding), three more tables each for the io threads and
    the reactor thread, in us per request: the CPU spent outside the server (the CUDA driver,
    the kernel, libc) by the server's function that called out and the CUDA runtime call it made
    (which of evr's calls the driver's time belongs to, although libcuda's frames have no
    symbols); and all their CPU by the innermost evr function on the stack and the evr function
    that called it (what evr costs the thread, callees included); and that share again by the
    frame the innermost evr function called (its own code, Asio's, the driver's).
  * with --syscalls, instead of sampling: the system calls each thread group made a request
    (perf stat on the syscalls:sys_enter_* tracepoints; needs tracefs and root): how often an io
    thread went round its loop (epoll_wait), woke or waited for another thread (futex), sent,
    received, or entered the driver (ioctl).
Output goes to stdout and DIR/profile.txt; numbers to DIR/profile.json.

On a GPU machine without a package registry: run scripts/gpu/stage-deps.sh,
scripts/gpu/stage-tools.sh and scripts/gpu/stage-perf.sh on a machine that has one, copy .deps and
.tools along, then, from the repository root:
    python3 scripts/study/server-profile.py --out OUTDIR/profile
It builds build/study as scripts/study/server-study.py does (Release, CUDA, headers from .deps/include),
finds wrk in .tools/usr/bin and perf in .tools/perf (or on PATH). Here, on the simulated device:
    scripts/study/server-profile.py --device sim --seconds 3
perf needs kernel.perf_event_paranoid <= 1 or root; without perf the thread table still comes out.
"""
import argparse
import shlex
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("server_study",
                                               os.path.join(ROOT, "scripts", "study", "server-study.py"))
study = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(study)
sys.path.insert(0, os.path.join(ROOT, "scripts", "study"))
import perf_callers  # noqa: E402  (beside this script)
import server_syscalls  # noqa: E402
TICK = os.sysconf("SC_CLK_TCK")


def log(msg):
    print(f"[server-profile] {msg}", flush=True)


# --- per-thread CPU ----------------------------------------------------------------------------------

def threads(pid):
    """{tid: (comm, cpu seconds)} of the live threads, and the process's own total (dead threads
    included)."""
    return study.thread_cpu(pid)


GROUP_LABELS = {"io": "evr-io (io threads)", "reactor": "evr-reactor",
                "conn": "evr-conn (thread per connection)", "sim": "evr-sim (simulated device)",
                "cuda": "cuda (driver threads)", "other": "other (main, ...)"}


def group_of(comm):
    return GROUP_LABELS[study.thread_group(comm)]


def cpu_by_group(before, after, requests, seconds):
    live, exited, total = study.cpu_deltas(before, after)
    groups = {}
    for comm, d in live:
        g = groups.setdefault(group_of(comm), {"threads": 0, "cpu_s": 0.0, "names": set()})
        g["threads"] += 1
        g["cpu_s"] += d
        g["names"].add(re.sub(r"\d+$", "N", comm))
    if exited > 0.005:
        groups["exited during the run"] = {"threads": None, "cpu_s": exited, "names": set()}
    rows = []
    for name, g in sorted(groups.items(), key=lambda kv: -kv[1]["cpu_s"]):
        rows.append({"group": name, "threads": g["threads"], "cores": g["cpu_s"] / seconds,
                     "us_per_request": g["cpu_s"] / requests * 1e6 if requests else None,
                     "names": sorted(g["names"])})
    rows.append({"group": "all server threads", "threads": len(live), "cores": total / seconds,
                 "us_per_request": total / requests * 1e6 if requests else None, "names": []})
    return rows


# --- perf ---------------------------------------------------------------------------------------------

def find_perf():
    staged = os.path.join(ROOT, ".tools", "perf", "perf")
    if os.path.exists(staged):
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.path.join(ROOT, ".tools", "perf", "lib")
        return [staged], env
    if shutil.which("perf"):
        return [shutil.which("perf")], dict(os.environ)
    return None


def perf_report(perf, data, requests, cpu_s_by_comm, comms=None, lines=25):
    """Top symbols by self time: [{percent, us_per_request, symbol, dso}]. A symbol's us per
    request is its share of these threads' samples times their CPU over the run (from /proc)."""
    # The limit is a share of every thread's samples: a small thread's (the reactor's) own top
    # frames would all fall under it, so a group's table has none (it keeps its top `lines`).
    cmd = perf[0] + ["report", "-i", data, "--no-children", "--sort", "sym,dso", "--stdio",
                     "-F", "overhead,sample,sym,dso", "--percent-limit", "0" if comms else "0.3"]
    if comms:
        cmd += ["--comms", ",".join(comms)]
    out = subprocess.run(cmd, env=perf[1], capture_output=True, text=True).stdout
    cpu = sum(v for c, v in cpu_s_by_comm.items() if comms is None or c in comms)
    all_samples = sum_samples(perf, data, comms)
    result = []
    for line in out.splitlines():
        m = re.match(r"^\s+([0-9.]+)%\s+(\d+)\s+\[[.kgu]\]\s+(.*?)\s{2,}(\S+)\s*$", line)
        if not m:
            continue
        samples = int(m.group(2))
        us = samples / all_samples * cpu / requests * 1e6 if all_samples and requests else None
        result.append({"percent": float(m.group(1)), "us_per_request": us,
                       "symbol": m.group(3).strip(), "dso": m.group(4)})
    result.sort(key=lambda r: -r["percent"])  # (perf keeps its sort keys' order with -F)
    return result[:lines]


def dso_report(perf, data, requests, cpu_s_by_comm, comms):
    """The threads' self time by library (the driver, the kernel, libc, the server's binary):
    [{percent, us_per_request, dso}], every library, what the top frames leave in their tail;
    percent is a share of the whole profile's samples (all threads), as in the frame tables.
    (Sorted by thread and library and filtered here: perf's --comms with --sort dso dropped
    libraries.)"""
    cmd = perf[0] + ["report", "-i", data, "--no-children", "--sort", "comm,dso", "--stdio",
                     "-F", "overhead,sample,comm,dso"]
    out = subprocess.run(cmd, env=perf[1], capture_output=True, text=True).stdout
    cpu = sum(v for c, v in cpu_s_by_comm.items() if c in comms)
    by_dso = {}
    for line in out.splitlines():
        m = re.match(r"^\s+([0-9.]+)%\s+(\d+)\s+(\S+)\s+(\S.*?)\s*$", line)
        if m and m.group(3) in comms:
            dso = perf_callers.short_dso(m.group(4))
            pct, n = by_dso.get(dso, (0.0, 0))
            by_dso[dso] = (pct + float(m.group(1)), n + int(m.group(2)))
    all_samples = sum(n for _, n in by_dso.values())
    return sorted(({"percent": pct, "dso": dso,
                    "us_per_request": n / all_samples * cpu / requests * 1e6
                    if all_samples and requests else None}
                   for dso, (pct, n) in by_dso.items()), key=lambda r: -r["percent"])


def sum_samples(perf, data, comms):
    cmd = perf[0] + ["report", "-i", data, "--no-children", "--sort", "comm", "--stdio",
                     "-F", "sample,comm"]
    out = subprocess.run(cmd, env=perf[1], capture_output=True, text=True).stdout
    n = 0
    for line in out.splitlines():
        m = re.match(r"^\s+(\d+)\s+(\S.*?)\s*$", line)
        if m and (comms is None or m.group(2) in comms):
            n += int(m.group(1))
    return n


# --- the run ------------------------------------------------------------------------------------------

def profile_one(args, binary, wrk, perf, label, out_dir, lines):
    try:
        spec = study.parse_server(label)
    except ValueError as e:
        raise SystemExit(f"server-profile: {e}")
    srv = study.server(binary, study.server_args(spec, args.device, args.lanes,
                                                 args.cuda_connections, args.devices),
                       ["--check-every", "16"] + shlex.split(args.server_args))
    if srv.port is None:
        log(f"{label}: the server did not start:\n" + "\n".join(srv.lines[-20:]))
        srv.stop()
        return None
    url = f"http://127.0.0.1:{srv.port}{args.route}"
    t = max(1, min(args.connections, args.wrk_threads))
    wrk_cmd = [wrk[0], f"-t{t}", f"-c{args.connections}", "--timeout", "10s", "--latency", url]
    subprocess.run(wrk_cmd[:3] + ["-d1s"] + wrk_cmd[3:], env=wrk[1], capture_output=True,
                   timeout=120)  # warm-up: connections, lanes, caches
    study.wait_idle(srv.port)
    data = os.path.join(out_dir, f"perf-{re.sub(r'[^A-Za-z0-9]+', '-', label)}.data")
    rec = None
    before = threads(srv.proc.pid)
    t0 = time.monotonic()
    stat_file = os.path.join(out_dir, f"syscalls-{re.sub(r'[^A-Za-z0-9]+', '-', label)}.txt")
    if perf and args.syscalls:
        rec = server_syscalls.start_count(perf, srv.proc.pid, stat_file)
    elif perf:
        graph = ["--call-graph", "dwarf,16384"] if args.callers else []
        rec = subprocess.Popen(perf[0] + ["record", "-q", "-e", "cpu-clock", "-F",
                                          str(args.frequency), "-p", str(srv.proc.pid), "-o",
                                          data] + graph, env=perf[1], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    out = subprocess.run(wrk_cmd[:3] + [f"-d{args.seconds}s"] + wrk_cmd[3:], env=wrk[1],
                         capture_output=True, text=True, timeout=args.seconds + 120)
    after = threads(srv.proc.pid)
    seconds = time.monotonic() - t0
    perf_err = ""
    if rec:
        rec.send_signal(signal.SIGINT)
        try:
            perf_err = rec.communicate(timeout=60)[1]
        except subprocess.TimeoutExpired:
            rec.kill()
    r = study.parse_wrk(out.stdout)
    requests = r.get("requests") or 0
    lanes = next((l for l in srv.lines if l.startswith("lanes:")), "")
    summary, rc = srv.stop()
    reactor_line = next((line for line in srv.lines if line.startswith("reactor:")), "")
    rows = cpu_by_group(before, after, requests, seconds)
    doc = {"server": label, "route": args.route, "connections": args.connections,
           "seconds": seconds, "rps": r.get("rps"), "requests": requests,
           "p50_us": r.get("p50_us"), "p99_us": r.get("p99_us"),
           "errors": r.get("non2xx", 0) + r.get("socket_errors", 0), "lanes": lanes,
           "server_summary": summary, "reactor_summary": reactor_line, "exit": rc,
           "threads": rows, "frames": {}}
    if perf and args.syscalls:
        if os.path.exists(stat_file) and os.path.getsize(stat_file) > 0:
            doc["syscalls"] = server_syscalls.per_request(stat_file, requests, group_of)
        if not doc.get("syscalls"):
            doc["perf_error"] = perf_err[-500:] or "perf stat counted no system call"
    elif perf and os.path.exists(data):
        cpu_by_comm = {}
        for tid, (comm, cpu) in after[0].items():
            cpu_by_comm[comm] = cpu_by_comm.get(comm, 0.0) + cpu - (
                before[0][tid][1] if tid in before[0] else 0.0)
        comms_of = {}
        for comm in cpu_by_comm:
            comms_of.setdefault(group_of(comm), []).append(comm)
        doc["frames"]["all"] = perf_report(perf, data, requests, cpu_by_comm, None, lines)
        for g in ("evr-io (io threads)", "evr-reactor", "evr-conn (thread per connection)",
                  "cuda (driver threads)"):
            if g in comms_of:
                doc["frames"][g] = perf_report(perf, data, requests, cpu_by_comm, comms_of[g],
                                               lines)
        if "evr-io (io threads)" in comms_of:
            doc["io_by_library"] = dso_report(perf, data, requests, cpu_by_comm,
                                              comms_of["evr-io (io threads)"])
        if args.callers:
            doc["callers"] = {}
            for g, short in (("evr-io (io threads)", "io"), ("evr-reactor", "reactor")):
                comms = comms_of.get(g)
                if comms:
                    doc["callers"][short] = perf_callers.caller_tables(
                        perf, data, binary, requests, sum(cpu_by_comm[c] for c in comms), comms,
                        lines)
        if not args.keep_perf_data:
            os.remove(data)
    elif perf:
        doc["perf_error"] = perf_err[-500:]
    return doc


def text(doc):
    out = []
    out.append(f"== {doc['server']}: GET {doc['route']}, {doc['connections']} connections, "
               f"{doc['seconds']:.1f} s: {study.fmt(doc['rps'], 0)} requests/s, p50 "
               f"{study.fmt(study.ms(doc['p50_us']), 2)} ms, p99 {study.fmt(study.ms(doc['p99_us']), 2)}"
               f" ms, {doc['errors']} errors; {doc['lanes']}")
    out.append(f"   {doc['server_summary']}")
    if doc.get("reactor_summary"):
        out.append(f"   {doc['reactor_summary']}")
    out.append(f"   {'thread group':36} {'threads':>7} {'cores':>6} {'us/request':>10}  names")
    for row in doc["threads"]:
        out.append(f"   {row['group']:36} {'' if row['threads'] is None else row['threads']:>7} "
                   f"{row['cores']:6.2f} {study.fmt(row['us_per_request'], 2):>10}  "
                   f"{' '.join(row['names'])[:60]}")
    for g, calls in doc.get("syscalls", {}).items():
        out.append(f"   system calls a request, {g}: " +
                   ", ".join(f"{name} {n:.2f}" for name, n in calls.items()))
    for g, frames in doc.get("frames", {}).items():
        out.append(f"   top frames by self time, {g}:")
        out.append(f"   {'% all':>6} {'us/req':>7}  symbol [dso]  (% of all samples; us per request of these threads)")
        for f in frames:
            out.append(f"   {f['percent']:6.2f} {study.fmt(f['us_per_request'], 2):>7}  "
                       f"{f['symbol'][:110]} [{os.path.basename(f['dso'])}]")
    if doc.get("io_by_library"):
        out.append("   the io threads' self time by library (us per request): " + ", ".join(
            f"{r['dso']} {study.fmt(r['us_per_request'], 2)}" for r in doc["io_by_library"]
            if r["percent"] >= 0.5))
    titles = {"calling_out": "time outside the server, by who called out [where the time went]",
              "evr": "time by the innermost evr function on the stack < the evr function that "
                     "called it",
              "evr_callees": "evr's share by the innermost evr function > the frame it called"}
    for group, tables in doc.get("callers", {}).items():
        who = {"io": "the io threads'", "reactor": "the reactor thread's"}[group]
        for table, rows in tables.items():
            out.append(f"   {who} {titles[table]}:")
            out.append(f"   {'% ' + group:>9} {'us/req':>7}  function")
            for r in rows:
                key = (f"{r['key'][0][:110]} [{r['key'][1]}]" if table == "calling_out"
                       else r["key"][:140])
                out.append(f"   {r['percent']:9.2f} {study.fmt(r['us_per_request'], 2):>7}  {key}")
    if doc.get("perf_error"):
        out.append(f"   perf failed: {doc['perf_error']}")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--out", help="folder for profile.txt and profile.json (default "
                                  "build/profile)")
    ap.add_argument("--servers", nargs="+", default=["evr N=1", "evr N=4"])
    ap.add_argument("--route", default="/busy?us=1000")
    ap.add_argument("--connections", type=int, default=512)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "sim"])
    ap.add_argument("--lanes", type=int, default=0, help="--streams (0: the server's default)")
    ap.add_argument("--devices", help="the servers' --devices (default: every GPU)")
    ap.add_argument("--server-args", default="",
                    help="more arguments for every server, e.g. '--coalesce-us 50'")
    ap.add_argument("--cuda-connections", type=int, default=32)
    ap.add_argument("--wrk-threads", type=int, default=4)
    ap.add_argument("--frequency", type=int, default=2999, help="perf samples per second")
    ap.add_argument("--lines", type=int, default=25, help="frames per table")
    ap.add_argument("--no-perf", action="store_true")
    ap.add_argument("--callers", action="store_true",
                    help="call graphs: the io threads' time in the driver, kernel and libc by "
                         "the server's function that called out (use a lower --frequency, 499)")
    ap.add_argument("--syscalls", action="store_true",
                    help="count each thread group's system calls a request instead of sampling")
    ap.add_argument("--keep-perf-data", action="store_true")
    ap.add_argument("--bin", help="an evr-async-server already built (skips the build)")
    ap.add_argument("--build-dir", default="build/study")
    args = ap.parse_args()
    out_dir = os.path.abspath(args.out or os.path.join(ROOT, "build", "profile"))
    os.makedirs(out_dir, exist_ok=True)
    import resource
    resource.setrlimit(resource.RLIMIT_NOFILE,
                       (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    args.tiny = args.device == "sim"
    binary = study.build(args)
    wrk = study.find_wrk()
    if wrk is None:
        log("wrk not found (PATH, .tools/): stage it with scripts/gpu/stage-tools.sh and copy "
            ".tools along")
        return 2
    perf = None if args.no_perf else find_perf()
    if not args.no_perf and perf is None:
        log("perf not found (PATH, .tools/perf): the thread table only")
    docs, texts = [], []
    for label in args.servers:
        log(f"{label}: GET {args.route}, {args.connections} connections, {args.seconds} s")
        doc = profile_one(args, binary, wrk, perf, label, out_dir, args.lines)
        if doc is None:
            continue
        docs.append(doc)
        texts.append(text(doc))
        print(texts[-1], flush=True)
    with open(os.path.join(out_dir, "profile.txt"), "w") as f:
        f.write("\n\n".join(texts) + "\n")
    with open(os.path.join(out_dir, "profile.json"), "w") as f:
        json.dump({"git": study.git_head(), "docs": docs}, f, indent=1)
    log(f"wrote {out_dir}/profile.txt and profile.json")
    ok = docs and all(d["errors"] == 0 and d["exit"] == 0 for d in docs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
