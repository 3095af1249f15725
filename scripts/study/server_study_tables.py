"""The server study's main matrix judged: evr against the best alternative at each route and
connection count, the goals (issue 33), and the markdown tables of a run (server-study.py
`table DIR` recomputes them from the JSON)."""
import server_study_alternating as alternating
from server_harness import THREAD_GROUPS
from server_study_points import (BUSY200, BUSY1000, BUSY5000, MLP, ROUTES, fmt, ms, per_core,
                                 ratio, usable)


# --- evr against the best alternative -------------------------------------------------------------

def matrix(doc):
    """{(route, connections, gpus): [points]} of the main matrix, in the order measured."""
    out = {}
    for p in doc["points"]:
        out.setdefault((p["route"], p["connections"], p.get("gpus")), []).append(p)
    return out


def compare(points):
    """evr against the alternatives at one (route, connections, GPUs). The alternatives are the
    other modes' clean points that do not thrash; None where there is nothing to compare."""
    evr = [p for p in points if p["mode"] == "evr" and usable(p)]
    alts = [p for p in points if p["mode"] != "evr" and usable(p) and not p.get("thrash")]
    c = {"evr_top": max(evr, key=lambda p: p["rps"], default=None),
         "alt_top": max(alts, key=lambda p: p["rps"], default=None),
         "alt_eff": max(alts, key=per_core, default=None),
         "evr_eff": None, "evr_needs": None}
    if c["alt_eff"]:
        # evr's best requests/s per core among its points with a p99 no worse than that rival's.
        fair = [p for p in evr if p["p99_us"] is not None and c["alt_eff"]["p99_us"] is not None
                and p["p99_us"] <= c["alt_eff"]["p99_us"]]
        c["evr_eff"] = max(fair, key=per_core, default=None)
    if c["alt_top"]:
        # The fewest cores with which evr serves what the best alternative serves.
        enough = [p for p in evr if p["rps"] >= c["alt_top"]["rps"]]
        c["evr_needs"] = min(enough, key=lambda p: p["server_cores"], default=None)
    return c


def find_evr(points, threads):
    return next((p for p in points if p["mode"] == "evr" and p["threads"] == threads
                 and usable(p)), None)


def all_goals(doc):
    """The goals a run is held to: issue 39's for the alternating sets, else issue 33's."""
    if doc["meta"].get("rounds"):
        return alternating.goals(alternating.medians(doc["points"]))
    return goals(doc)


def goals(doc):
    """The goals of issue 33 (docs/notebook.md), from the points of the matrix, per number of
    GPUs measured."""
    out = []

    def goal(text, value, target, met):
        out.append({"goal": text, "value": value, "target": target,
                    "met": None if met is None else bool(met)})

    cells = matrix(doc)
    gpus_seen = sorted({k[2] for k in cells if k[2] is not None})
    conns = sorted({k[1] for k in cells})
    for g in gpus_seen:
        if not any(p["mode"] != "evr" for k, pts in cells.items() if k[2] == g for p in pts):
            continue  # evr alone on these GPUs (the scaling rows of a 2-GPU run)
        on = f"{g} GPU{'s' if g != 1 else ''}"
        for route in (BUSY200, BUSY1000):
            for c in conns:
                pts = cells.get((route, c, g), [])
                cmp = compare(pts)
                r = ratio(per_core(cmp["evr_eff"]), per_core(cmp["alt_eff"]))
                goal(f"{route}, {c} connections, {on}: evr's requests/s per server core / the best "
                     f"alternative's ({label(cmp['alt_eff'])}), evr at a p99 no worse "
                     f"({label(cmp['evr_eff'])})", r, ">= 1.5", None if r is None else r >= 1.5)
                e2, top = find_evr(pts, 2), cmp["alt_top"]
                rr, cr = ratio(e2 and e2["rps"], top and top["rps"]), \
                    ratio(e2 and e2["server_cores"], top and top["server_cores"])
                goal(f"{route}, {c} connections, {on}: evr N=2 / the best alternative by "
                     f"requests/s ({label(top)}): requests/s, cores", [rr, cr],
                     ">= 1 at <= 0.5 of its cores",
                     None if rr is None or cr is None else rr >= 1 and cr <= 0.5)
        for c in conns:
            pts = cells.get((MLP, c, g), [])
            e4 = find_evr(pts, 4)
            pools = [p for p in pts if p["mode"] == "pool" and p["threads"] == 4 and usable(p)]
            pool = max(pools, key=lambda p: p["rps"], default=None)
            r = ratio(e4 and e4["rps"], pool and pool["rps"])
            goal(f"/mlp, {c} connections, {on}: evr N=4 (batching) / a blocking pool of 4 "
                 f"({label(pool)}) requests/s", r, ">= 15", None if r is None else r >= 15)
            top = compare(pts)["alt_top"]
            r = ratio(e4 and e4["rps"], top and top["rps"])
            goal(f"/mlp, {c} connections, {on}: evr N=4 / the best alternative ({label(top)}) "
                 "requests/s", r, ">= 2", None if r is None else r >= 2)
    if len(gpus_seen) > 1:
        one, many = gpus_seen[0], gpus_seen[-1]
        for route in (BUSY1000, BUSY5000, MLP):
            for c in conns:
                a = compare(cells.get((route, c, one), []))["evr_top"]
                b = compare(cells.get((route, c, many), []))["evr_top"]
                r = ratio(b and b["rps"], a and a["rps"])
                goal(f"{route}, {c} connections: evr's most requests/s on {many} GPUs "
                     f"({label(b)}) / on {one} ({label(a)})", r, ">= 1.8",
                     None if r is None else r >= 1.8)
    return out


def label(p):
    return p["server"] if p else "none"


# --- tables ---------------------------------------------------------------------------------------

def cell(p, what=("rps", "p99", "cores")):
    """A point in a few words: 'evr N=2: 82 100 req/s, 2.70 cores, p99 9.1 ms'."""
    if not p:
        return "-"
    parts = []
    if "rps" in what:
        parts.append(f"{fmt(p['rps'], 0)} req/s")
    if "per_core" in what:
        parts.append(f"{fmt(per_core(p), 0)} req/s/core")
    if "cores" in what:
        parts.append(f"{fmt(p['server_cores'], 2)} cores")
    if "p99" in what:
        parts.append(f"p99 {fmt(ms(p['p99_us']), 1)} ms")
    return f"{p['server']}: " + ", ".join(parts)


def summary_tables(doc):
    """The one-screen comparison: per route, connections and GPUs, evr against the best
    alternative by requests/s and by requests/s per core."""
    lines = ["#### evr against the best alternative: requests/s", "",
             "| route | conns | GPUs | evr, most requests/s | best alternative | evr / it | "
             "cores evr needs for its requests/s |", "|---|---:|---:|---|---|---:|---|"]
    cells = matrix(doc)
    keys = sorted(cells, key=lambda k: (ROUTES.index(k[0]) if k[0] in ROUTES else 99, k[2] or 0,
                                        k[1]))
    for route, c, g in keys:
        cmp = compare(cells[(route, c, g)])
        top, alt, needs = cmp["evr_top"], cmp["alt_top"], cmp["evr_needs"]
        lines.append(f"| {route} | {c} | {g or '?'} | {cell(top)} | {cell(alt)} | "
                     f"{fmt(ratio(top and top['rps'], alt and alt['rps']), 2)} | "
                     f"{cell(needs, ('cores',)) if needs else 'none of its points serves that'} |")
    lines += ["", "#### evr against the best alternative: requests/s per server core (evr at a "
              "p99 no worse than that alternative's)", "",
              "| route | conns | GPUs | best alternative per core | evr per core, p99 no worse | "
              "evr / it |", "|---|---:|---:|---|---|---:|"]
    for route, c, g in keys:
        cmp = compare(cells[(route, c, g)])
        what = ("per_core", "p99")
        lines.append(f"| {route} | {c} | {g or '?'} | {cell(cmp['alt_eff'], what)} | "
                     f"{cell(cmp['evr_eff'], what) if cmp['evr_eff'] else 'none at that p99'} | "
                     f"{fmt(ratio(per_core(cmp['evr_eff']), per_core(cmp['alt_eff'])), 2)} |")
    return lines


def goals_table(doc):
    lines = ["| goal | value | target | met |", "|---|---:|---|---|"]
    for g in doc.get("goals", []):
        v = g["value"]
        value = (" vs ".join(fmt(x, 2) for x in v) if isinstance(v, list) else fmt(v, 2))
        met = {True: "**met**", False: "**not met**", None: "not measured"}[g["met"]]
        lines.append(f"| {g['goal']} | {value} | {g['target']} | {met} |")
    return lines


def route_tables(doc):
    lines = []
    for route in ROUTES:
        pts = [p for p in doc["points"] if p["route"] == route]
        if not pts:
            continue
        conns = sorted({p["connections"] for p in pts})
        lines += ["", f"#### GET {route}", "",
                  "| server | GPUs | " + " | ".join(f"c={c}" for c in conns) + " |",
                  "|---|---:|" + "---:|" * len(conns)]
        for name in dict.fromkeys(p["server"] for p in pts):
            row = [p for p in pts if p["server"] == name]
            cells = []
            for c in conns:
                p = next((q for q in row if q["connections"] == c), None)
                if not p or "skipped" in p:
                    cells.append("skipped" if p else "")
                    continue
                text = (f"{fmt(p['rps'], 0)} req/s, p99 {fmt(ms(p['p99_us']), 1)} ms, "
                        f"{fmt(p.get('server_cores'), 2)} cores, "
                        f"{fmt(p.get('cpu_us_per_request'), 1)} us/req, "
                        f"{fmt(per_core(p), 0)} req/s/core")
                if p.get("thrash"):
                    text += f", **thrashes** ({p['spinning_threads']} spinning threads)"
                if p.get("errors"):
                    text += f", **{p['errors']} errors**"
                cells.append(text)
            gpus = next((q.get("gpus") for q in row if q.get("gpus")), None)
            lines.append(f"| {name} | {gpus or '-'} | " + " | ".join(cells) + " |")
    return lines


def thread_table(doc):
    by_thread = [p for p in doc["points"] if p.get("cpu_us_per_request_by_thread")]
    if not by_thread:
        return []
    cols = [g for g in THREAD_GROUPS
            if any(p["cpu_us_per_request_by_thread"].get(g, 0) >= 0.05 for p in by_thread)]
    top = max(p["connections"] for p in by_thread)
    lines = ["", "#### Server CPU per request by thread (us), at the highest connection count", "",
             "| server | route | connections | all | " + " | ".join(cols) + " |",
             "|---|---|---:|---:|" + "---:|" * len(cols)]
    for p in by_thread:
        if p["connections"] != top:
            continue
        t = p["cpu_us_per_request_by_thread"]
        lines.append(f"| {p['server']} | {p['route']} | {p['connections']} | "
                     f"{fmt(p['cpu_us_per_request'], 1)} | " +
                     " | ".join(fmt(t.get(g, 0.0), 1) for g in cols) + " |")
    return lines


def sweep_table(doc):
    if not doc.get("lanes_sweep"):
        return []
    lines = ["", f"#### Lanes sweep (evr N=1, GET {doc['lanes_sweep'][0]['route']})", "",
             "| lanes | CUDA_DEVICE_MAX_CONNECTIONS | connections | requests/s | p99 ms | "
             "server cores | us/req |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for p in doc["lanes_sweep"]:
        if "skipped" in p:
            lines.append(f"| {p['lanes']} | {p['cuda_connections']} | {p['connections']} | "
                         "skipped | | | |")
            continue
        lines.append(f"| {p['lanes']} | {p['cuda_connections']} | {p['connections']} | "
                     f"{fmt(p['rps'], 0)} | {fmt(ms(p['p99_us']), 1)} | "
                     f"{fmt(p.get('server_cores'), 2)} | {fmt(p.get('cpu_us_per_request'), 1)} |")
    return lines


def meta_line(doc):
    meta = doc["meta"]
    return (f"{meta.get('device') or 'device: ?'}; {meta['host_cpus']} CPUs; set "
            f"{meta.get('set')}; load {meta['load']} ({meta.get('wrk_threads')} threads); "
            f"{meta['seconds_per_point']} s per point"
            f"{'; ' + str(meta['rounds']) + ' alternating rounds' if meta.get('rounds') else ''}"
            f"{'; ' + format(meta['elapsed_s'], '.0f') + ' s in all' if meta.get('elapsed_s') else ''}"
            f"; git {meta.get('git')}")


def markdown(doc):
    if doc["meta"].get("rounds"):
        return alternating.markdown(doc, meta_line(doc))
    lines = [meta_line(doc), ""] + summary_tables(doc) + route_tables(doc) + thread_table(doc) + \
        sweep_table(doc)
    if doc.get("goals"):
        lines += [""] + goals_table(doc)
    return "\n".join(lines)


def short_summary(doc):
    """What the run prints last: the comparison and the goals."""
    if doc["meta"].get("rounds"):
        return alternating.summary(doc, meta_line(doc))
    return "\n".join([meta_line(doc), ""] + summary_tables(doc) + [""] + goals_table(doc))
