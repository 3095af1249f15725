"""The alternating sets of the server study (scripts/study/server-study.py): evr and the poll mode in
turns in one run, medians over the rounds.

The machine's speed drifts between runs by as much as the differences measured (a third),
so evr and the poll mode are compared only within one run, in alternation: in each of R rounds
every server is started afresh and serves all of its points, in the order evr N=1, poll N=1,
evr N=2, poll N=2, evr N=1 with stream waits; every second round runs that order backwards, so
that a steady drift favours neither mode (a server that ran first of its pair in one round runs
second in the next). A figure of a table is the median over the rounds of that server's clean
points; evr / poll per core also shows the range of the rounds' own ratios (evr and poll of the
same round), which says how far one round's figures can be trusted, and a 90 % bootstrap interval
of the ratio of medians, which says how far the run's can: a fresh server's requests per core
vary by about a third (an H200 with 16 cores), and 14 rounds of 2 s points put the ratio within
about +-10 %.

Points: /busy?us=200, 1000 and 5000 at each connection count of the set, and /healthz (no GPU
work: the HTTP path alone, the CPU per request the GPU routes are measured against) at the first;
the stream-waits server serves the /busy routes only (its /healthz is evr's). /mlp (cuBLAS)
only when --routes names it.

The goals (issue 39) are evaluated from the medians: evr's requests/s per server core >= 1.2x the
poll mode's at every /busy point at a p99 no worse, evr's reactor thread <= 0.05 of a core there,
and evr with stream waits >= 1.0x the poll mode per core.
"""
import random
import statistics

from server_harness import parse_server
from server_study_points import (BUSY200, BUSY1000, BUSY5000, HEALTHZ, KERNEL_FENCES, MLP, ROUTES,
                                 STREAM_WAITS, fmt, ms, per_core, ratio, usable)

BUSY = [BUSY200, BUSY1000, BUSY5000]
ORDER = ["evr N=1", "poll N=1", "evr N=2", "poll N=2", f"evr N=1 {STREAM_WAITS}"]
SETS = {
    "alt1": {"alternating": True, "servers": ORDER, "connections": [256, 1024],
             "wrk_threads": 4, "sim": False},
    # A test of the script in a couple of minutes on two cores: one connection count, 1 s points.
    "alt-tiny": {"alternating": True, "servers": ORDER, "connections": [32], "seconds": 1,
                 "wrk_threads": 2, "sim": True},
}
MIN_ROUNDS = 3
PER_CORE_GOAL, REACTOR_GOAL, STREAM_WAITS_GOAL = 1.2, 0.05, 1.0
# Thread groups of the tables (server-study.py's groups folded): the simulated device's thread
# is shown on its own, as CUDA's threads are; whatever else ran in the process is "rest".
GROUPS = {"io": ("io",), "reactor": ("reactor",), "cuda": ("cuda",), "sim": ("sim",),
          "rest": ("conn", "other", "exited")}


# --- the order ------------------------------------------------------------------------------------

def server_points(label, connections, routes=None):
    """[(route, [connections])] one server of the alternation serves: the /busy routes at every
    count, /healthz at the first (not for stream waits: no GPU wait there to differ), and /mlp
    at every count only when `routes` names it (cuBLAS: every server's waits on it are stream
    waits; compared in the first table, without a goal)."""
    extra = [MLP] if routes and MLP in routes else []
    out = [(r, list(connections)) for r in BUSY + extra]
    if STREAM_WAITS not in label.split(" @")[0].split():
        out.append((HEALTHZ, connections[:1]))
    return [(r, c) for r, c in out if not routes or r in routes]


def schedule(labels, rounds, connections, routes=None):
    """[(round, label, [(route, [connections])])]: rounds 1..R, each server started afresh in
    every round; even rounds run the order backwards."""
    if rounds < MIN_ROUNDS:
        raise ValueError(f"--rounds must be at least {MIN_ROUNDS} (a median of fewer says little), "
                         f"not {rounds}")
    out = []
    for r in range(1, rounds + 1):
        order = labels if r % 2 else list(reversed(labels))
        out += [(r, label, server_points(label, connections, routes)) for label in order]
    return [step for step in out if step[2]]


def n_text(e):
    """A row's N: its io threads, with the label's hardware queues when it names them (q=8)."""
    queues = parse_server(e["server"])["queues"]
    return f"{e['threads']}, q={queues}" if queues else f"{e['threads']}"


def rival(label):
    """The poll mode's server that an evr server is compared with: the same N and GPUs."""
    text, _, at = label.partition(" @")
    words = [w for w in text.split() if w not in (STREAM_WAITS, KERNEL_FENCES)]
    return " ".join(["poll"] + words[1:]) + (f" @{at}" if at else "")


# --- medians over rounds --------------------------------------------------------------------------

def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def grouped(by_thread):
    """A point's per-thread-group figures (cores or us per request) in the tables' groups."""
    by_thread = by_thread or {}
    return {g: sum(by_thread.get(k, 0.0) for k in ks) for g, ks in GROUPS.items()}


def median_row(points):
    """One (server, route, connections) over its rounds: the medians of its clean points; a group's
    median is taken over the rounds on its own, so the groups need not add up to the total."""
    ok = [p for p in points if usable(p)]
    first = (ok or points)[0]
    row = {k: first.get(k) for k in ("server", "mode", "threads", "route", "connections", "gpus")}
    row["busy_signal"] = first.get("busy_signal", True)
    row.update({
        "rounds": len(ok), "rounds_skipped": sum("skipped" in p for p in points),
        "rounds_failed": sum("skipped" not in p and not usable(p) for p in points),
        "rps": median(p["rps"] for p in ok), "p50_us": median(p.get("p50_us") for p in ok),
        "p99_us": median(p.get("p99_us") for p in ok),
        "server_cores": median(p["server_cores"] for p in ok),
        "per_core": median(per_core(p) for p in ok),
        "cpu_us_per_request": median(p.get("cpu_us_per_request") for p in ok),
        "cores_by_group": {g: median(grouped(p.get("cores_by_thread"))[g] for p in ok)
                           for g in GROUPS},
        "us_per_request_by_group": {
            g: median(grouped(p.get("cpu_us_per_request_by_thread"))[g] for p in ok)
            for g in GROUPS}})
    return row


def medians(points):
    """[row] per (server, route, connections) of the points that carry a round, in the order the
    routes are listed, then connections, then the order measured."""
    cells = {}
    for p in points:
        if p.get("round") is not None:
            cells.setdefault((p["server"], p["route"], p["connections"]), []).append(p)
    rows = [median_row(pts) for pts in cells.values()]
    return sorted(rows, key=lambda r: (ROUTES.index(r["route"]) if r["route"] in ROUTES else 99,
                                       r["connections"]))


def find(rows, server, route, connections):
    """The row of (server, route, connections); connections None: the route's only count."""
    return next((r for r in rows if r["server"] == server and r["route"] == route
                 and connections in (None, r["connections"])), None)


def clean_points(points, server, row):
    """`server`'s clean points at `row`'s route and connection count, in the JSON's order."""
    return [p for p in points if p["server"] == server and p["route"] == row["route"]
            and p["connections"] == row["connections"] and usable(p)]


def round_ratios(points, evr_row):
    """evr / poll requests/s per core within each round where both points are clean."""
    evr = {p.get("round"): p for p in clean_points(points, evr_row["server"], evr_row)}
    poll = {p.get("round"): p for p in clean_points(points, rival(evr_row["server"]), evr_row)}
    return [per_core(evr[r]) / per_core(poll[r])
            for r in sorted(set(evr) & set(poll) - {None})]


def ratio_interval(points, evr_row, level=0.9, draws=2000):
    """A bootstrap interval (`level`, seeded: the same JSON gives the same text) of the ratio of
    medians, evr's requests/s per core over the poll mode's, from each mode's clean points over
    the rounds; None with fewer than MIN_ROUNDS of either. Unpaired: on an H200 with 16 cores the
    rounds' evr and poll points were hardly correlated (14 rounds: r <= 0.6), so a fresh
    server's speed is its own, and the interval narrows only with more servers started."""
    def values(server):
        return [per_core(p) for p in clean_points(points, server, evr_row)]
    evr, poll = values(evr_row["server"]), values(rival(evr_row["server"]))
    if len(evr) < MIN_ROUNDS or len(poll) < MIN_ROUNDS:
        return None
    rng = random.Random(0)
    ratios = sorted(statistics.median(rng.choices(evr, k=len(evr))) /
                    statistics.median(rng.choices(poll, k=len(poll))) for _ in range(draws))
    tail = round(draws * (1 - level) / 2)
    return ratios[tail], ratios[draws - 1 - tail]


def pairs(rows, stream_waits=False):
    """[(evr row, its poll row or None)] for the evr servers with (or without) stream waits."""
    evr = [r for r in rows if r["mode"] == "evr" and r["busy_signal"] != stream_waits]
    return [(e, find(rows, rival(e["server"]), e["route"], e["connections"])) for e in evr]


# --- goals ----------------------------------------------------------------------------------------

def goals(rows):
    """The goals of issue 39 from the medians: [{goal, value, target, met, why}], met None where a
    figure is missing, why what missed."""
    out = []
    for e, p in pairs(rows):
        if e["route"] not in BUSY:
            continue
        at = f"{e['route']}, {e['connections']} connections, N={n_text(e)}"
        out.append(per_core_goal(f"{at}: evr / poll requests/s per server core, p99 no worse",
                                 e, p, PER_CORE_GOAL, check_p99=True))
        cores = e["cores_by_group"]["reactor"] if e["rounds"] else None
        out.append({"goal": f"{at}: evr's reactor thread, cores", "value": cores,
                    "target": f"<= {REACTOR_GOAL}",
                    "met": None if cores is None else cores <= REACTOR_GOAL,
                    "why": f"{fmt(cores, 3)} > {REACTOR_GOAL}"})
    for e, p in pairs(rows, stream_waits=True):
        out.append(per_core_goal(
            f"{e['route']}, {e['connections']} connections, N={n_text(e)}: evr with stream "
            "waits / poll requests/s per server core", e, p, STREAM_WAITS_GOAL, check_p99=False))
    return out


def per_core_goal(text, evr, poll, target, check_p99):
    """evr's requests/s per core against the poll mode's (and, with check_p99, its p99 no worse);
    value [ratio, p99 evr ms, p99 poll ms]."""
    r = ratio(evr["per_core"], poll and poll["per_core"])
    p99 = [ms(evr["p99_us"]), ms(poll and poll["p99_us"])]
    short = r is not None and r < target
    worse = check_p99 and None not in p99 and p99[0] > p99[1]
    measured = r is not None and (not check_p99 or None not in p99)
    return {"goal": text, "value": [r] + p99,
            "target": f">= {target}" + (", p99 no worse" if check_p99 else ""),
            "met": (not short and not worse) if measured else None,
            "why": "; ".join(([f"{fmt(r, 2)} < {target}"] if short else []) +
                             ([f"p99 {fmt(p99[0], 2)} > {fmt(p99[1], 2)} ms"] if worse else []))}


# --- tables ---------------------------------------------------------------------------------------

def spread(values):
    return f"{min(values):.2f}-{max(values):.2f}" if values else "-"


def interval_text(interval):
    return f"{interval[0]:.2f}-{interval[1]:.2f}" if interval else "-"


def comparison_table(rows, points):
    lines = ["| route | conns | N | evr: req/s, cores | poll: req/s, cores | per core, evr / poll "
             "(rounds' range; 90 % interval) | p99 evr / poll, ms | evr's reactor, cores | "
             "rounds, evr / poll |",
             "|---|---:|---:|---|---|---|---|---:|---|"]
    for e, p in pairs(rows):
        r = ratio(e["per_core"], p and p["per_core"])
        lines.append(
            f"| {e['route']} | {e['connections']} | {n_text(e)} | "
            f"{fmt(e['rps'], 0)}, {fmt(e['server_cores'], 2)} | "
            f"{fmt(p and p['rps'], 0)}, {fmt(p and p['server_cores'], 2)} | "
            f"**{fmt(r, 2)}** ({spread(round_ratios(points, e))}; "
            f"{interval_text(ratio_interval(points, e))}) | "
            f"{fmt(ms(e['p99_us']), 2)} / {fmt(ms(p and p['p99_us']), 2)} | "
            f"{fmt(e['cores_by_group']['reactor'], 3)} | {rounds_text(e)} / {rounds_text(p)} |")
    return lines


def rounds_text(row):
    if not row:
        return "-"
    extra = ", ".join(f"{row[k]} {k[7:]}" for k in ("rounds_failed", "rounds_skipped") if row[k])
    return f"{row['rounds']}" + (f" ({extra})" if extra else "")


def cpu_table(rows):
    """CPU per request against /healthz's: what a GPU wait adds to a request, and the reactor's
    part of it (evr's /healthz has no GPU wait, so its reactor has nothing to do there)."""
    lines = ["| route | conns | N | evr us/req | poll us/req | /healthz us/req, evr / poll | "
             "a GPU wait adds, evr | of it evr's reactor | a GPU wait adds, poll |",
             "|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    for e, p in pairs(rows):
        if e["route"] not in BUSY:
            continue
        he = find(rows, e["server"], HEALTHZ, None)
        hp = p and find(rows, p["server"], HEALTHZ, None)
        cpu_e, cpu_p = e["cpu_us_per_request"], p and p["cpu_us_per_request"]
        lines.append(
            f"| {e['route']} | {e['connections']} | {n_text(e)} | {fmt(cpu_e, 1)} | "
            f"{fmt(cpu_p, 1)} | {fmt(he and he['cpu_us_per_request'], 1)} / "
            f"{fmt(hp and hp['cpu_us_per_request'], 1)} | "
            f"{fmt(diff(cpu_e, he and he['cpu_us_per_request']), 1)} | "
            f"{fmt(e['us_per_request_by_group']['reactor'], 1)} | "
            f"{fmt(diff(cpu_p, hp and hp['cpu_us_per_request']), 1)} |")
    return lines


def diff(a, b):
    return a - b if a is not None and b is not None else None


def detail_table(rows):
    """Every server, route and connection count: its medians, the CPU by thread group in cores
    and us per request."""
    cols = [g for g in GROUPS if any((r["cores_by_group"][g] or 0) >= 0.005 for r in rows)]
    lines = ["| server | route | conns | rounds | req/s | p50 ms | p99 ms | cores | req/s/core | "
             "us/req | " + " | ".join(f"{g}: cores, us/req" for g in cols) + " |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|" + "---|" * len(cols)]
    for r in rows:
        c, u = r["cores_by_group"], r["us_per_request_by_group"]
        lines.append(f"| {r['server']} | {r['route']} | {r['connections']} | {rounds_text(r)} | "
                     f"{fmt(r['rps'], 0)} | {fmt(ms(r['p50_us']), 2)} | "
                     f"{fmt(ms(r['p99_us']), 2)} | {fmt(r['server_cores'], 2)} | "
                     f"{fmt(r['per_core'], 0)} | {fmt(r['cpu_us_per_request'], 1)} | " +
                     " | ".join(f"{fmt(c[g], 3)}, {fmt(u[g], 1)}" for g in cols) + " |")
    return lines


def stream_table(rows, points):
    lines = ["| route | conns | N | evr, stream waits: req/s, cores, p99 ms | poll: req/s, cores, "
             "p99 ms | per core, evr / poll (rounds' range; 90 % interval) | evr's reactor, cores |",
             "|---|---:|---:|---|---|---|---:|"]
    for e, p in pairs(rows, stream_waits=True):
        lines.append(
            f"| {e['route']} | {e['connections']} | {n_text(e)} | {fmt(e['rps'], 0)}, "
            f"{fmt(e['server_cores'], 2)}, {fmt(ms(e['p99_us']), 2)} | {fmt(p and p['rps'], 0)}, "
            f"{fmt(p and p['server_cores'], 2)}, {fmt(ms(p and p['p99_us']), 2)} | "
            f"**{fmt(ratio(e['per_core'], p and p['per_core']), 2)}** "
            f"({spread(round_ratios(points, e))}; {interval_text(ratio_interval(points, e))}) | "
            f"{fmt(e['cores_by_group']['reactor'], 3)} |")
    return lines if len(lines) > 2 else ["none measured"]


def goals_table(goal_rows):
    lines = ["| goal | value | target | |", "|---|---|---|---|"]
    for g in goal_rows:
        v = g["value"]
        value = (f"{fmt(v[0], 2)} (p99 {fmt(v[1], 2)} vs {fmt(v[2], 2)} ms)"
                 if isinstance(v, list) else fmt(v, 3))
        met = {True: "met", False: f"**MISSED**: {g['why']}", None: "not measured"}[g["met"]]
        lines.append(f"| {g['goal']} | {value} | {g['target']} | {met} |")
    counted = [g for g in goal_rows if g["met"] is not None]
    lines += ["", f"{sum(g['met'] for g in counted)} of {len(counted)} goals met "
              f"({len(goal_rows) - len(counted)} not measured)."]
    return lines


def markdown(doc, header, detail=True):
    """Every table of an alternating run, from its raw points (`table DIR` recomputes them);
    detail False leaves out the long table of every server's medians."""
    rows, points = medians(doc["points"]), doc["points"]
    lines = [header, "", f"#### evr and the poll mode, medians over the rounds measured "
             f"({doc['meta'].get('rounds')} planned; per core: each mode's median, in brackets "
             "the range of the rounds' own ratios and a 90 % bootstrap interval of the ratio of "
             "medians)", ""] + comparison_table(rows, points)
    lines += ["", "#### CPU per request (us, medians) against /healthz, the HTTP path alone (at "
              "its one connection count)", ""] + cpu_table(rows)
    lines += ["", "#### evr with stream waits (--no-busy-signal) and the poll mode", ""] + \
        stream_table(rows, points)
    if detail:
        lines += ["", "#### Every server's medians, with its CPU by thread group", ""] + \
            detail_table(rows)
    return "\n".join(lines + ["", "#### Goals (issue 39), from the medians", ""] +
                     goals_table(goals(rows)))


def summary(doc, header):
    """What the run prints last: every table but the long one of every server's medians."""
    return markdown(doc, header, detail=False)
