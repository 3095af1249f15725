"""The server study's plots (server-study.py `plot DIR`, and the end of a run unless --no-plot):
requests/s against cores, p99 against requests/s, and the lanes sweep, from a run's JSON. Needs
matplotlib (the run skips its plots when it is missing)."""
import os

from server_harness import NON_BLOCKING, log
from server_study_points import ROUTES, usable


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
