#!/usr/bin/env python3
"""Checks that an evr-bench JSON file is well formed and has every field a reader relies on.

usage: check-bench-json.py SUBCOMMAND FILE
"""
import json
import math
import sys


def fail(msg):
    print(f"check-bench-json: {msg}", file=sys.stderr)
    sys.exit(1)


def number(v, where):
    if not isinstance(v, (int, float)) or (isinstance(v, float) and math.isnan(v)):
        fail(f"{where}: not a number: {v!r}")


def main():
    if len(sys.argv) != 3:
        fail("usage: check-bench-json.py SUBCOMMAND FILE")
    sub, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        doc = json.load(f)
    if sub in ("latency", "throughput", "cpu", "sim"):
        if doc.get("subcommand") != sub:
            fail(f"subcommand is {doc.get('subcommand')!r}, expected {sub!r}")
        for key in ("device", "backend", "rows"):
            if key not in doc:
                fail(f"missing '{key}'")
        if not doc["rows"]:
            fail("no rows")
    if sub == "latency":
        names = [r["name"] for r in doc["rows"]]
        for needed in ("floor", "raw cudaEventQuery", "cudaLaunchHostFunc + std::promise",
                       "asio::post -> io thread parked", "evr fence", "evr poll", "evr adaptive",
                       "evr host_func", "sender, inline on reactor",
                       "sender + stop token, inline on reactor",
                       "sender, continued on a thread pool", "thread pool hand-off"):
            if not any(needed in n for n in names):
                fail(f"no row for '{needed}'")
        for r in doc["rows"]:
            for k in ("p50_ns", "p90_ns", "p99_ns"):
                number(r[k], f"{r['name']}.{k}")
            if len(r["samples_ns"]) != doc["samples"]:
                fail(f"{r['name']}: {len(r['samples_ns'])} samples, expected {doc['samples']}")
        if not doc["overheads"]:
            fail("no overheads")
        if not doc.get("sender_over_on_complete"):
            fail("no sender_over_on_complete")
        for r in doc["sender_over_on_complete"]:
            number(r["over_on_complete_p50_ns"], f"sender_over_on_complete.{r['name']}")
    elif sub == "throughput":
        for r in doc["rows"]:
            number(r["completions_per_second"], r["name"])
            number(r["poller_cpu_ns_per_completion"], r["name"])
        if not doc.get("drain_rows"):
            fail("no drain rows")
        for r in doc["drain_rows"]:
            number(r["completions_per_second"], r["name"])
            number(r["poller_cpu_ns_per_completion"], r["name"])
        number(doc["bytes_per_inflight_wait"], "bytes_per_inflight_wait")
        # -1 where the C library has no mallinfo2
        number(doc["heap_bytes_per_inflight_wait"], "heap_bytes_per_inflight_wait")
        burst = doc.get("reactor_cpu_ns_per_completion_burst")
        if not isinstance(burst, dict) or not burst:
            fail("no reactor_cpu_ns_per_completion_burst")
        for name, v in burst.items():
            number(v, f"reactor_cpu_ns_per_completion_burst.{name}")
    elif sub == "cpu":
        for r in doc["rows"]:
            for k in ("busy_percent", "idle_percent", "idle_wakeups_per_second"):
                number(r[k], f"{r['name']}.{k}")
    elif sub == "idle":
        if doc.get("subcommand") != "idle":
            fail(f"subcommand is {doc.get('subcommand')!r}, expected 'idle'")
        for k in ("p50_ns", "p90_ns", "p99_ns"):
            number(doc["floor"][k], f"floor.{k}")
        if not doc.get("scenarios"):
            fail("no scenarios")
        kinds = {sc["kind"] for sc in doc["scenarios"]}
        for needed in ("steady", "uniform", "bimodal"):
            if needed not in kinds:
                fail(f"no {needed} scenario")
        for sc in doc["scenarios"]:
            keys = {r["key"] for r in sc["rows"]}
            if "default" not in keys:
                fail(f"{sc['name']}: no row for the default strategy")
            for r in sc["rows"]:
                where = f"{sc['name']}: {r['name']} ({r['delivery']})"
                if r["samples"] < 1:
                    fail(f"{where}: no samples")
                if r["failed"]:
                    fail(f"{where}: a wait failed")
                for k in ("p50_ns", "p99_ns", "p50_over_floor", "cpu_percent",
                          "cpu_ns_per_completion", "reactor_cpu_pct"):
                    number(r[k], f"{where}.{k}")
                # The reactor's share is part of the row's CPU (inline rows: all of it).
                if r["group"] == "evr" and r["reactor_cpu_pct"] > r["cpu_percent"] + 1e-6:
                    fail(f"{where}: reactor_cpu_pct {r['reactor_cpu_pct']} is more than the "
                         f"row's cpu_percent {r['cpu_percent']}")
        for r in doc["cpu_case"]:
            number(r["busy_percent"], r["name"])
        if not doc.get("goals"):
            fail("no goals evaluated")
    elif sub == "sim":
        names = [r["name"] for r in doc["rows"]]
        for kind in ("record_event", "write_fence", "launch_host_func"):
            for where in ("stalled stream", "running stream"):
                if f"{kind}, {where}" not in names:
                    fail(f"no enqueue row for '{kind}, {where}'")
            if f"{kind}, one stream" not in names:
                fail(f"no completion row for '{kind}, one stream'")
        groups = {r["group"] for r in doc["rows"]}
        for g in ("enqueue", "complete", "reactor"):
            if g not in groups:
                fail(f"no '{g}' rows")
        for r in doc["rows"]:
            number(r["ns_per_op"], f"{r['name']}.ns_per_op")
            if r["ops"] <= 0 or not r["seconds"]:
                fail(f"{r['name']}: nothing measured")
            if r["group"] == "reactor":
                number(r["completions_per_second"], r["name"])
                number(r["reactor_cpu_ns_per_completion"], r["name"])
    elif sub == "pool":
        if not isinstance(doc, dict) or not doc:
            fail("empty pool document")
    elif sub == "calls":
        calls = {r["call"]: r for r in doc.get("rows", [])}
        for needed in ("query-done", "query-pending", "query-stream", "record", "write-fence",
                       "submit"):
            if needed not in calls:
                fail(f"no row for '{needed}'")
            number(calls[needed]["p50_ns"], f"{needed}.p50_ns")
            if not calls[needed]["ns_per_call"]:
                fail(f"{needed}: no batches")
    else:
        fail(f"unknown subcommand {sub}")
    print(f"{path}: ok ({sub})")


if __name__ == "__main__":
    main()
