#!/usr/bin/env python3
"""The gate's measuring half: the rows of rows.py for a baseline build and the tree's build,
alternated over rounds, then one table with a verdict per figure (scripts/gpu-gate.sh runs it
after building both sides and running ctest).

    gate.py --base BUILD --tree BUILD --out DIR [--sim] [--all-gpus] [--rounds 3]
            [--budget-s S] [--base-label REV] [--tree-label REV] [--ctest TEXT] [--record DIR]

Rounds: in odd rounds each group runs the baseline first, in even rounds the tree first, so that
a drift of the machine over the run lands on both sides. After the first round the time a round
takes is known; a round that would end past --budget-s is not started (at least one runs).

Verdict per figure: the medians over rounds, their ratio (now / baseline), and the spread: the
baseline's range over its rounds plus the tree's, relative to the baseline's median. WORSE when
the tree's median is worse than the baseline's by more than the spread, by more than 5 % and by
more than the metric's smallest difference that counts (rows.METRICS); better likewise the other
way; otherwise same. A figure measured on one side only is "new" or "gone"; a group that failed on
the tree's side is an error.

Writes DIR/gate.json (every figure of every round) and DIR/gate.md (the table and how it was
made); with --record FOLDER also FOLDER/DATE-TREE.{json,md} (docs/bench/gate: the last record
names the default baseline of the next gate). Exit status: 0, 1 if a figure is WORSE (not with
--sim: the simulated device's timings say nothing about a change), 2 if a group failed.
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rows as gate_rows  # noqa: E402

SIDES = ("base", "tree")
RELATIVE_FLOOR = 0.05


def machine_facts(sim):
    facts = {"cores": os.cpu_count(), "host": platform.node(),
             "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                          if l.startswith("model name")), "?")}
    if not sim and shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True).stdout
        facts["gpus"] = [l.strip() for l in out.splitlines() if l.strip()]
    else:
        facts["gpus"] = ["simulated device"] if sim else []
    facts["cuda_device_max_connections"] = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS",
                                                          "unset (the driver's 8)")
    return facts


def verdict(metric, base, tree):
    """(ratio, spread, verdict) for one figure's per-round values of each side."""
    if not base and not tree:
        return None, None, "-"
    if not base:
        return None, None, "new"
    if not tree:
        return None, None, "gone"
    unit, better, floor = gate_rows.METRICS[metric]
    mb, mt = statistics.median(base), statistics.median(tree)
    if len(base) < 2 or len(tree) < 2:
        # One round a side says nothing of the noise: no verdict.
        return (mt / mb if mb else None), None, "one round"
    # The spread: how far the rounds of the same side fell apart, both sides' ranges together,
    # relative to the baseline. A difference of medians within it is noise: with three rounds a
    # side, two identical trees differ by more than it for under 1 % of figures (normal noise).
    ranges = (max(base) - min(base)) + (max(tree) - min(tree))
    spread = ranges / abs(mb) if mb else 0.0
    ratio = mt / mb if mb else None
    worse_by = (mt - mb) if better == "lower" else (mb - mt)
    beyond = abs(worse_by) > floor and abs(worse_by) > ranges and \
        (ratio is None or abs(ratio - 1) > RELATIVE_FLOOR)
    if beyond and worse_by > 0:
        return ratio, spread, "WORSE"
    if beyond and worse_by < 0:
        return ratio, spread, "better"
    return ratio, spread, "same"


def fmt(v):
    if v is None:
        return "-"
    a = abs(v)
    return f"{v:.0f}" if a >= 1000 else f"{v:.1f}" if a >= 10 else f"{v:.2f}" if a >= 0.1 else f"{v:.3f}"


def table(results, order):
    """The rows of the verdict table: (row, metric, unit, base median, tree median, ratio,
    spread, verdict)."""
    out = []
    for name in order:
        metrics = []
        for side in SIDES:
            for m in results[side].get(name, {}):
                if m not in metrics:
                    metrics.append(m)
        for m in metrics:
            b = results["base"].get(name, {}).get(m, [])
            t = results["tree"].get(name, {}).get(m, [])
            ratio, spread, v = verdict(m, b, t)
            out.append((name, m, gate_rows.METRICS[m][0],
                        statistics.median(b) if b else None, statistics.median(t) if t else None,
                        ratio, spread, v))
    return out


def print_table(lines, doc):
    head = f"{'row':64} {'figure':17} {'baseline':>9} {'now':>9} {'ratio':>6} {'spread':>6}  verdict"
    print(head)
    print("-" * len(head))
    for name, m, unit, b, t, ratio, spread, v in lines:
        print(f"{name[:64]:64} {m:17} {fmt(b):>9} {fmt(t):>9} "
              f"{'-' if ratio is None else f'{ratio:.2f}':>6} "
              f"{'-' if spread is None else f'{spread * 100:.0f}%':>6}  {v}")


def markdown(lines, doc):
    m = doc["machine"]
    md = [f"# Gate {doc['date']}: {doc['tree']} against {doc['base']}", "",
          f"- Machine: {', '.join(m['gpus']) or 'no GPU'}; {m['cores']} cores ({m['cpu']})",
          f"- CUDA_DEVICE_MAX_CONNECTIONS: {m['cuda_device_max_connections']} for every row but "
          "those marked \"32 queues\"; the servers set 32 themselves (--cuda-connections)",
          f"- Rounds: {doc['rounds']} (baseline and tree alternated; odd rounds baseline first)",
          f"- ctest: {doc.get('ctest') or 'not run'}",
          f"- Command: `{doc['command']}`", "",
          "Figures are medians over the rounds; spread is the baseline's range over its rounds "
          "plus the tree's, relative to the baseline's median. WORSE / better: the medians "
          "differ by more than the spread, by more than 5 % and by more than the figure's "
          "smallest difference that counts.", "",
          "| row | figure | baseline | now | ratio | spread | verdict |",
          "|---|---|---|---|---|---|---|"]
    for name, met, unit, b, t, ratio, spread, v in lines:
        md.append(f"| {name} | {met} ({unit}) | {fmt(b)} | {fmt(t)} | "
                  f"{'-' if ratio is None else f'{ratio:.2f}'} | "
                  f"{'-' if spread is None else f'{spread * 100:.0f} %'} | "
                  f"{'**WORSE**' if v == 'WORSE' else v} |")
    md += busy_reactor_points(doc.get("diagnostics") or {})
    if doc["errors"]:
        md += ["", "Errors:", ""] + [f"- {e}" for e in doc["errors"]]
    return "\n".join(md) + "\n"


BUSY_REACTOR_CORES = 0.1  # a reactor thread above this in a server point is listed with its counters
REACTOR_COUNTERS = ("completed", "sweeps", "parks", "wakeups", "event_queries",
                    "host_event_queries", "prediction_misses", "host_completions")


def busy_reactor_points(diags):
    """Markdown lines: every point whose reactor thread ran above BUSY_REACTOR_CORES, with what
    the reactor did per second there and, for comparison, the same row's quietest point."""
    def reactor(p):
        return p["cores_by_thread"].get("reactor", 0)

    by_name = {}  # row -> [(side, point)] over both sides and every round
    for side, by_row in diags.items():
        for name, points in by_row.items():
            by_name.setdefault(name, []).extend((side, p) for p in points)
    rows = []
    for name, points in by_name.items():
        quiet = min(points, key=lambda sp: reactor(sp[1]))
        busy = [sp for sp in points if reactor(sp[1]) > BUSY_REACTOR_CORES]
        rows += [(name, sp, quiet) for sp in busy]
    if not rows:
        return []
    md = ["", f"Points with the reactor thread above {BUSY_REACTOR_CORES} core, and their row's "
          "quietest point (per second; io = the io threads' cores):", "",
          "| row | side, round | reactor cores | io cores | req/s | "
          + " | ".join(REACTOR_COUNTERS) + " |", "|---|---|---|---|---|" + "---|" * len(REACTOR_COUNTERS)]
    for name, (side, p), (quiet_side, quiet) in rows:
        shown = [(p, f"{side}, {p['round']}")]
        if quiet is not p:
            shown.append((quiet, f"{quiet_side}, {quiet['round']} (quietest)"))
        for q, tag in shown:
            per_s = q.get("reactor_per_s") or {}
            md.append(f"| {name} | {tag} | {reactor(q):.3f} | "
                      f"{q['cores_by_thread'].get('io', 0):.2f} | {fmt(q.get('rps'))} | "
                      + " | ".join(fmt(per_s.get(c)) for c in REACTOR_COUNTERS) + " |")
    return md


def wanted_groups(text, names):
    """The group names in `text`, comma-separated; "idle, 32 queues" has a comma of its own, so a
    piece that is no name but completes the one before it to a name joins it."""
    out = []
    for piece in (p.strip() for p in text.split(",")):
        if out and piece not in names and f"{out[-1]}, {piece}" in names:
            out[-1] = f"{out[-1]}, {piece}"
        else:
            out.append(piece)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="the baseline's build folder")
    ap.add_argument("--tree", required=True, help="the tree's build folder")
    ap.add_argument("--base-label", default="baseline")
    ap.add_argument("--tree-label", default="tree")
    ap.add_argument("--out", required=True)
    ap.add_argument("--record", help="also write DATE-TREE.{json,md} into this folder")
    ap.add_argument("--sim", action="store_true")
    ap.add_argument("--all-gpus", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=420)
    ap.add_argument("--ctest", help="what ctest said, for the record")
    ap.add_argument("--groups", help="only these groups (comma-separated names)")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds takes 1 or more")
    t_start = time.monotonic()
    os.makedirs(args.out, exist_ok=True)
    log = os.path.join(args.out, "gate-rows.log")
    builds = {"base": os.path.abspath(args.base), "tree": os.path.abspath(args.tree)}
    groups = gate_rows.groups(args.sim, args.all_gpus)
    if args.groups:
        groups += gate_rows.optional_groups(args.sim)
        names = [g.name for g in groups]
        wanted = wanted_groups(args.groups, names)
        unknown = [w for w in wanted if w not in names]
        if unknown:
            ap.error(f"--groups: no group {unknown[0]!r} here (there are: {'; '.join(names)})")
        for a, b in gate_rows.OVERLAPPING:
            if a in wanted and b in wanted:
                ap.error(f"--groups: {a!r} and {b!r} measure the same rows; name one of them")
        groups = [g for g in groups if g.name in wanted]
    results = {s: {} for s in SIDES}
    diags = {s: {} for s in SIDES}  # row -> [its diagnostics in each round], never judged
    order, errors = [], []
    rounds_done = 0
    for rnd in range(1, args.rounds + 1):
        elapsed = time.monotonic() - t_start
        if rounds_done and elapsed / rounds_done > args.budget_s - elapsed:
            print(f"gate: round {rnd} would end past the budget ({args.budget_s:.0f} s): "
                  f"stopping after {rounds_done}", flush=True)
            break
        sides = SIDES if rnd % 2 else SIDES[::-1]
        for g in groups:
            for side in sides:
                t = time.monotonic()
                with tempfile.TemporaryDirectory() as work:
                    try:
                        got = g.run(builds[side], work, log)
                    except Exception as e:  # noqa: BLE001 - one group's failure is reported, the rest runs
                        errors.append(f"round {rnd}, {side}, {g.name}: {e}")
                        print(f"gate: round {rnd} {side} {g.name}: FAILED: {e}", flush=True)
                        continue
                for name, figures in got.items():
                    if name not in order:
                        order.append(name)
                    diagnostics = figures.pop("diagnostics", None)
                    if diagnostics is not None:
                        diags[side].setdefault(name, []).append({"round": rnd, **diagnostics})
                    if figures.pop("failed", False):
                        errors.append(f"round {rnd}, {side}, {name}: the row reported errors")
                    for m, v in figures.items():
                        if v is not None:
                            results[side].setdefault(name, {}).setdefault(m, []).append(v)
                print(f"gate: round {rnd} {side:4} {g.name:16} {time.monotonic() - t:5.1f} s",
                      flush=True)
        rounds_done += 1
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    doc = {"date": date, "base": args.base_label, "tree": args.tree_label, "sim": args.sim,
           "rounds": rounds_done, "machine": machine_facts(args.sim), "ctest": args.ctest,
           "command": " ".join(os.environ.get("EVR_GATE_COMMAND", "").split()) or
           " ".join(sys.argv), "errors": errors, "results": results,
           "diagnostics": diags}
    lines = table(results, order)
    doc["table"] = [dict(zip(("row", "figure", "unit", "baseline", "now", "ratio", "spread",
                              "verdict"), l)) for l in lines]
    print()
    print_table(lines, doc)
    worse = [l for l in lines if l[7] == "WORSE"]
    tree_errors = [e for e in errors if ", tree, " in e]
    md = markdown(lines, doc)
    with open(os.path.join(args.out, "gate.json"), "w") as f:
        json.dump(doc, f, indent=1)
    with open(os.path.join(args.out, "gate.md"), "w") as f:
        f.write(md)
    if args.record:
        os.makedirs(args.record, exist_ok=True)
        stem = os.path.join(args.record, f"{date}-{args.tree_label}")
        shutil.copy(os.path.join(args.out, "gate.json"), stem + ".json")
        shutil.copy(os.path.join(args.out, "gate.md"), stem + ".md")
        print(f"gate: recorded {stem}.md")
    print(f"\ngate: {len(lines)} figures over {rounds_done} rounds in "
          f"{time.monotonic() - t_start:.0f} s: {len(worse)} WORSE, "
          f"{sum(1 for l in lines if l[7] == 'better')} better, {len(errors)} errors"
          + (" (simulated device: timing verdicts do not fail the gate)" if args.sim else ""))
    if errors:
        for e in errors:
            print(f"gate: error: {e}")
    if tree_errors or (errors and not results["tree"]):
        return 2
    if worse and not args.sim:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
