#!/usr/bin/env python3
"""Rows of several `evr-bench idle --json` files side by side: per workload, one line per file
with the floor's p50 / p99 and, per row (method/delivery), p50 / p99 us and CPU %. For comparing
benches run back to back on one machine (before / after a change, as
scripts/gpu/gpu-many-streams.sh does); figures taken at different times do not compare.

  scripts/study/idle-compare.py before.json after.json [more.json ...]

Files that are missing or empty are left out (a run that timed out).
"""
import json
import os
import sys


def load(paths):
    runs = []
    for path in paths:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            with open(path) as f:
                runs.append((os.path.basename(path), json.load(f)))
    return runs


def row_text(r):
    tag = r["key"][:9] + "/" + r["delivery"][:5]
    return "%s %.1f/%.0f %.0f%%" % (tag, r["p50_ns"] / 1e3, r["p99_ns"] / 1e3, r["cpu_percent"])


def main(paths):
    runs = load(paths)
    if not runs:
        print("idle-compare: no readable JSON file among " + " ".join(paths), file=sys.stderr)
        return 2
    for name in [s["name"] for s in runs[0][1]["scenarios"]]:
        print("==", name)
        for label, data in runs:
            scenario = next((s for s in data["scenarios"] if s["name"] == name), None)
            if scenario is None:
                continue
            floor = next((r for r in scenario["rows"] if r["key"] == "floor"), None)
            if floor is None:
                continue
            rows = " | ".join(row_text(r) for r in scenario["rows"] if r["key"] != "floor")
            print("  %-14s fl %.1f/%.1f | %s"
                  % (label[:14], floor["p50_ns"] / 1e3, floor["p99_ns"] / 1e3, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
