#!/usr/bin/python3
"""Renders evr-bench JSON files into PNG plots (Debian's python3-matplotlib).

usage: scripts/plot-bench.py DIR    (DIR holds latency.json, pool.json, cpu.json, throughput.json)

Writes into DIR: latency-cdf.png (latency CDF per method), pool-scaling.png (acquire+release
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
    fig, ax = plt.subplots(figsize=(11, 7))
    ax.set_prop_cycle(color=[plt.cm.tab20(i % 20) for i in range(40)])
    for row in doc["rows"]:
        if row["group"] == "hand-off":
            continue
        xs = sorted(v / 1000.0 for v in row["samples_ns"])
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        style = "-" if row["group"] == "evr" else "--"
        width = 2.0 if row["group"] in ("evr", "floor") else 1.0
        ax.plot(xs, ys, style, linewidth=width, label=row["name"])
    ax.set_xscale("log")
    ax.set_xlabel("GPU work done -> completion known (us, log scale)")
    ax.set_ylabel("fraction of samples")
    ax.set_title(f"latency CDF ({doc['samples']} samples per method)\n{doc['device']}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
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
    if cpu and lat:
        cpu_vs_latency(cpu, lat, os.path.join(folder, "cpu-vs-latency.png"))
        made.append("cpu-vs-latency.png")
    if not made:
        print(f"plot-bench: no evr-bench JSON in {folder}", file=sys.stderr)
        sys.exit(1)
    print("plot-bench: wrote " + ", ".join(os.path.join(folder, m) for m in made))


if __name__ == "__main__":
    main()
