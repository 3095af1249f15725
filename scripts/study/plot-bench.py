#!/usr/bin/python3
"""Renders evr-bench JSON files into PNG plots (Debian's python3-matplotlib).

usage: scripts/study/plot-bench.py DIR    (DIR holds latency.json, pool.json, cpu.json, throughput.json,
                                     idle.json; each is optional)

Writes into DIR: latency-cdf.png (latency CDF, one panel per kind of method),
idle-pareto.png and idle-pareto-64.png (p50/floor against CPU per steady work length, 1 and 64
streams), pool-scaling.png (acquire+release
pairs/s against threads, per pool), cpu-vs-latency.png (reactor CPU while waiting against p50
latency, per evr strategy).
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(folder, name):
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def latency_cdf(doc, out):
    """Small multiples: one panel per kind of method, each with the floor as a grey reference, so
    that no panel holds more than a handful of lines."""
    rows = [r for r in doc["rows"] if r["group"] != "hand-off" and r["samples_ns"]]
    floor = next((r for r in rows if r["group"] == "floor"), None)

    def panel_of(r):
        name = r["name"]
        if r["group"] == "floor":
            return None
        if name.startswith("evr "):
            for strategy in ("fence", "poll", "adaptive", "host_func"):
                if name.startswith(f"evr {strategy}"):
                    return f"evr {strategy}"
            return "evr (other)"
        if name.startswith("raw "):
            return "raw mechanisms (no delivery)"
        return "baselines: threads and pollers"

    panels = {}
    for r in rows:
        key = panel_of(r)
        if key is not None:
            panels.setdefault(key, []).append(r)
    names = sorted(panels)
    cols = 3
    nrows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(15, 4.2 * nrows), squeeze=False, sharex=True)
    for ax, key in zip(axes.flat, names):
        if floor is not None:
            xs = sorted(v / 1000.0 for v in floor["samples_ns"])
            ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], color="0.6", linewidth=3,
                    label="floor")
        for r in panels[key]:
            xs = sorted(v / 1000.0 for v in r["samples_ns"])
            ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], linewidth=1.6,
                    label=r["name"].replace(key, "").strip(" ,") or r["name"])
        ax.set_title(key, fontsize=10)
        ax.set_xscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
        ax.set_xlabel("GPU done -> known (us, log)")
        ax.set_ylabel("fraction of samples")
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.suptitle(f"latency CDF, {doc['samples']} samples per method: {doc['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def idle_pareto(doc, out, streams=1):
    """One panel per steady work length: p50 latency (ratio to that workload's floor) against
    the reactor's CPU, one point per method (inline delivery for evr); lower left is better."""
    scen = [s for s in doc["scenarios"] if s["kind"] == "steady" and s["streams"] == streams]
    if not scen:
        return
    fig, axes = plt.subplots(1, len(scen), figsize=(4.2 * len(scen), 4.4), squeeze=False)
    markers = "os^Dv<>phX*"
    for ax, sc in zip(axes[0], scen):
        k = 0
        for r in sc["rows"]:
            if r["key"] == "floor" or r["delivery"] == "posted" or not r["samples"]:
                continue
            if r["key"] == "stream-sync":
                continue  # a core per stream: off the chart
            default = r["key"] == "default"
            ax.scatter(r["cpu_percent"], r["p50_over_floor"], s=90 if default else 40,
                       marker=markers[k % len(markers)], zorder=3 if default else 2,
                       color="crimson" if default else None, label=r["name"])
            k += 1
        ax.set_yscale("log")
        ax.set_xlim(-3, 103)
        ax.axhline(1.5, color="0.5", linestyle=":", linewidth=1)
        ax.set_title(f"{sc['name']}", fontsize=9)
        ax.set_xlabel("reactor / waiting threads CPU (% of one core)")
        ax.set_ylabel("p50 / floor (log)")
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=7)
    fig.suptitle(f"latency vs CPU by work length ({streams} stream{'s' if streams > 1 else ''}); "
                 f"dotted: the 1.5x goal. {doc['device']}", fontsize=9)
    fig.tight_layout(rect=(0, 0.12, 1, 0.95))
    fig.savefig(out, dpi=100)
    plt.close(fig)


def pool_scaling(doc, out):
    fig, ax = plt.subplots(figsize=(8, 5))
    methods = []
    for p in doc["points"]:
        if p["method"] not in methods:
            methods.append(p["method"])
    for m in methods:
        pts = sorted((p["threads"], p["mpairs_per_s"]) for p in doc["points"] if p["method"] == m)
        ax.plot([t for t, _ in pts], [v for _, v in pts], "o-", label=m)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("threads")
    ax.set_ylabel("acquire+release pairs per second (millions, log scale)")
    ax.set_title(f"event pool scaling\n{doc['describe']}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def cpu_vs_latency(cpu, lat, out):
    fig, ax = plt.subplots(figsize=(8, 5))
    p50 = {}
    for row in lat["rows"]:
        if row["group"] == "evr" and "inline" in row["name"]:
            strategy = row["name"].split()[1]
            p50[strategy] = row["p50_ns"] / 1000.0
    for row in cpu["rows"]:
        strategy = row["name"].split()[1]
        if strategy not in p50:
            continue
        ax.scatter([row["busy_percent"]], [p50[strategy]], s=60)
        ax.annotate(strategy, (row["busy_percent"], p50[strategy]), textcoords="offset points",
                    xytext=(6, 4))
    ax.set_yscale("log")
    ax.set_xlabel(f"reactor CPU while {cpu['waits']} waits sit on a 100 ms kernel (% of a core)")
    ax.set_ylabel("p50 latency, inline delivery (us, log scale)")
    ax.set_title("CPU against latency per strategy (defaults; fence/poll latency measured spinning)",
                 fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    folder = sys.argv[1]
    lat, pool, cpu = load(folder, "latency.json"), load(folder, "pool.json"), load(folder, "cpu.json")
    made = []
    if lat:
        latency_cdf(lat, os.path.join(folder, "latency-cdf.png"))
        made.append("latency-cdf.png")
    if pool:
        pool_scaling(pool, os.path.join(folder, "pool-scaling.png"))
        made.append("pool-scaling.png")
    idle = load(folder, "idle.json")
    if idle:
        idle_pareto(idle, os.path.join(folder, "idle-pareto.png"), 1)
        idle_pareto(idle, os.path.join(folder, "idle-pareto-64.png"), 64)
        made += ["idle-pareto.png", "idle-pareto-64.png"]
    if cpu and lat:
        cpu_vs_latency(cpu, lat, os.path.join(folder, "cpu-vs-latency.png"))
        made.append("cpu-vs-latency.png")
    if not made:
        print(f"plot-bench: no evr-bench JSON in {folder}", file=sys.stderr)
        sys.exit(1)
    print("plot-bench: wrote " + ", ".join(os.path.join(folder, m) for m in made))


if __name__ == "__main__":
    main()
