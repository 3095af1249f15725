#!/usr/bin/python3
"""Prints the evr-bench JSON files of a folder as Markdown tables (for docs/benchmarks.md).

usage: scripts/study/bench-tables.py DIR [FILE.json ...]   (only the named files, e.g. idle-last-hop.json)
"""
import json
import os
import sys


def load(folder, name):
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def latency(doc):
    floor = doc["floor_p50_ns"]
    print(f"Latency, GPU work done -> completion known; {doc['samples']} samples per row, gap "
          f"{doc['gap_us']} us. Device: {doc['device']}.\n")
    print("| method | p50 us | p90 us | p99 us | p50 / floor | p99 / floor |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in doc["rows"]:
        ratio = "" if r["group"] == "hand-off" else f"{r['p50_ns'] / floor:.2f}"
        ratio99 = "" if r["group"] == "hand-off" else f"{r['p99_ns'] / floor:.2f}"
        print(f"| {r['name']} | {r['p50_ns'] / 1000:.2f} | {r['p90_ns'] / 1000:.2f} | "
              f"{r['p99_ns'] / 1000:.2f} | {ratio} | {ratio99} |")
    print("\nevr's own overhead at p50 (evr row minus raw mechanism minus raw hand-off):\n")
    print("| evr row | overhead us |")
    print("|---|---:|")
    for o in doc["overheads"]:
        print(f"| {o['name']} | {o['overhead_ns'] / 1000:.2f} |")
    print()


def throughput(doc):
    print(f"Throughput: {doc['streams']} streams x {doc['ops']} waits from {doc['threads']} "
          f"submitting threads. Device: {doc['device']}.\n")
    print("Sustained (a tiny kernel and a wait per operation; the poller's CPU includes its "
          "spinning between completions):\n")
    print("| method | completions/s | poller CPU ns per completion |")
    print("|---|---:|---:|")
    for r in doc["rows"]:
        print(f"| {r['name']} | {r['completions_per_second']:.0f} | "
              f"{r['poller_cpu_ns_per_completion']:.1f} |")
    print("\nBurst drain (all waits queued behind closed gates, released at once; CPU from the "
          "release to the last completion):\n")
    print("| method | completions/s | poller CPU ns per completion |")
    print("|---|---:|---:|")
    for r in doc["drain_rows"]:
        print(f"| {r['name']} | {r['completions_per_second']:.0f} | "
              f"{r['poller_cpu_ns_per_completion']:.1f} |")
    if doc.get("ready_rows"):
        print("\nReady drain (every marker done before the held reactor is released; the reactor's CPU "
              "from the release to the last completion):\n")
        print("| method | streams | waits per round | completions/s | reactor CPU ns per completion "
              "| event queries per completion |")
        print("|---|---:|---:|---:|---:|---:|")
        for r in doc["ready_rows"]:
            print(f"| {r['name']} | {r['streams']} | {r['waits_per_round']} | "
                  f"{r['completions_per_second']:.0f} | {r['reactor_cpu_ns_per_completion']:.1f} | "
                  f"{r['event_queries_per_completion']:.3f} |")
    rows = doc.get("memory_rows") or []
    if len(rows) >= 3:
        # The device's own share is measured first and last; what evr adds is the difference.
        device_rss = (rows[0]["rss_bytes_per_inflight_wait"] + rows[-1]["rss_bytes_per_inflight_wait"]) / 2
        device_heap = (rows[0]["heap_bytes_per_inflight_wait"] + rows[-1]["heap_bytes_per_inflight_wait"]) / 2
        print("\nMemory per in-flight wait (poll: an event each), bytes:\n")
        print("| row | RSS delta | heap in use | evr's own RSS | evr's own heap |")
        print("|---|---:|---:|---:|---:|")
        for i, r in enumerate(rows):
            own = 0 < i < len(rows) - 1
            print(f"| {r['name']} | {r['rss_bytes_per_inflight_wait']:.0f} | "
                  f"{r['heap_bytes_per_inflight_wait']:.0f} | "
                  + (f"{r['rss_bytes_per_inflight_wait'] - device_rss:.0f} | "
                     f"{r['heap_bytes_per_inflight_wait'] - device_heap:.0f} |" if own else " |  |"))
        print()
    else:
        print(f"\nMemory per in-flight wait (RSS delta): {doc['bytes_per_inflight_wait']:.0f} bytes.\n")


def pool(doc):
    print(f"Pool: acquire+release pairs, {doc['ms_per_point']} ms per point. Device: "
          f"{doc['describe']}.\n")
    methods, threads = [], []
    for p in doc["points"]:
        if p["method"] not in methods:
            methods.append(p["method"])
        if p["threads"] not in threads:
            threads.append(p["threads"])
    print("| threads | " + " | ".join(f"{m} M pairs/s (ns/pair/thread)" for m in methods) +
          " | evr / mutex-deque |")
    print("|---:|" + "---:|" * (len(methods) + 1))
    for t in sorted(threads):
        cells = []
        by = {p["method"]: p for p in doc["points"] if p["threads"] == t}
        for m in methods:
            p = by[m]
            cells.append(f"{p['mpairs_per_s']:.2f} ({p['ns_per_pair_per_thread']:.1f})")
        ratio = by["evr"]["mpairs_per_s"] / by["mutex-deque"]["mpairs_per_s"]
        print(f"| {t} | " + " | ".join(cells) + f" | {ratio:.1f}x |")
    print()


def cpu(doc):
    print(f"Reactor CPU while {doc['waits']} waits sit on a 100 ms kernel, and when idle. "
          f"Device: {doc['device']}.\n")
    print("| strategy | busy % of a core | idle % of a core | idle wake-ups/s |")
    print("|---|---:|---:|---:|")
    for r in doc["rows"]:
        print(f"| {r['name']} | {r['busy_percent']:.2f} | {r['idle_percent']:.3f} | "
              f"{r['idle_wakeups_per_second']:.0f} |")
    print()


def idle(doc):
    """evr-bench idle: per stream count, a row per method and a column per workload (p50 / p99 in
    us, the p50's ratio to the workload's floor, CPU in % of one core); then the goals."""
    scenarios = doc["scenarios"]
    for streams in sorted({s["streams"] for s in scenarios}):
        cols = [s for s in scenarios if s["streams"] == streams]
        methods = []
        for s in cols:
            for r in s["rows"]:
                key = (r["name"], r["delivery"])
                if key not in methods:
                    methods.append(key)
        label = "1 stream" if streams == 1 else f"{streams} streams"
        print(f"\n**{label}**: p50 / p99 in us (p50 over the workload's floor), CPU in % of one core\n")
        print("| method | " + " | ".join(c["name"].split(",")[0] for c in cols) + " |")
        print("|---|" + "---:|" * len(cols))
        for name, delivery in methods:
            cells = []
            for c in cols:
                r = next((r for r in c["rows"] if r["name"] == name and r["delivery"] == delivery), None)
                if r is None:
                    cells.append("")
                elif r["group"] == "floor":
                    cells.append(f"{r['p50_ns'] / 1e3:.1f} / {r['p99_ns'] / 1e3:.0f}")
                else:
                    cells.append(f"{r['p50_ns'] / 1e3:.1f} / {r['p99_ns'] / 1e3:.0f} "
                                 f"({r['p50_over_floor']:.2f}x), {r['cpu_percent']:.0f}%")
            shown = name if delivery in ("inline", "spin", "thread") else f"{name}, {delivery}"
            print(f"| {shown} | " + " | ".join(cells) + " |")
    print("\nGoals, as `evr-bench idle` evaluated them in this run:\n")
    for g in doc.get("goals", []):
        print(f"- {'met' if g['met'] else '**missed**'}: {g['goal']}: {g['figures']}")
    print()


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    folder = sys.argv[1]
    tables = (("latency.json", latency), ("throughput.json", throughput), ("pool.json", pool),
              ("cpu.json", cpu), ("idle.json", idle))
    # Named files only (e.g. idle-last-hop.json: the subcommand is read from the file).
    if len(sys.argv) > 2:
        by_sub = {"latency": latency, "throughput": throughput, "pool": pool, "cpu": cpu,
                  "idle": idle}
        for name in sys.argv[2:]:
            doc = load(folder, name)
            if doc and doc.get("subcommand") in by_sub:
                by_sub[doc["subcommand"]](doc)
        return
    for name, fn in tables:
        doc = load(folder, name)
        if doc:
            fn(doc)


if __name__ == "__main__":
    main()
