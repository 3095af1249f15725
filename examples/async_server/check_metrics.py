#!/usr/bin/python3
"""Parses evr-async-server's whole /metrics page with the Prometheus client library's parser.

    /usr/bin/python3 check_metrics.py BUILD/examples/evr-async-server [--mode MODE]

MODE: evr (default), hostfunc, poll, pool or thread.

Starts the server on the simulated device on a free port, sends requests to every route (so every
histogram has samples), fetches /metrics and checks, beyond the parser accepting every line:
  * each histogram has _bucket lines with increasing `le` ending at +Inf, cumulative counts that
    never decrease, a _count equal to the +Inf bucket, and a _sum (finite for the server's own
    histograms; the reactor's, which keeps no sum, say NaN);
  * the families the server documents are there (the reactor's only in evr mode), with samples
    for every route;
  * the counters agree with what was sent.
Then stops the server with SIGTERM and checks that it exits 0. Exit status 0 when all holds.

Uses Debian's python3-prometheus-client, hence /usr/bin/python3 (not a virtualenv's python3).
"""
import argparse
import math
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def fail(msg):
    print(f"check_metrics: FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("server", help="path of the evr-async-server executable")
    ap.add_argument("--mode", default="evr", choices=["evr", "hostfunc", "poll", "pool", "thread"])
    args = ap.parse_args()

    cmd = [args.server, "--device", "sim", "--port", "0", "--mode", args.mode]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        port = None
        deadline = time.monotonic() + 30
        lines = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            m = re.match(r"listening on http://[^ ]*:(\d+)/", line)
            if m:
                port = int(m.group(1))
                break
        if port is None:
            fail("the server did not start: " + "".join(lines))
        base = f"http://127.0.0.1:{port}"

        def get(path, body=None, expect=200):
            req = urllib.request.Request(base + path, data=body,
                                         headers={"Content-Type": "text/csv"} if body else {})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    status, text = r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                status, text = e.code, e.read().decode()
            if status != expect:
                fail(f"{path}: status {status}, want {expect}: {text[:200]}")
            return text

        sent = {"/busy": 0, "/mlp": 0, "/saxpy": 0, "/sum": 0, "/healthz": 0}
        for i in range(5):
            get(f"/busy?us=300&seed={i}"); sent["/busy"] += 1
            get(f"/mlp?seed={i}&rows={1 + i % 3}"); sent["/mlp"] += 1
            get(f"/saxpy?n=4096&seed={i}"); sent["/saxpy"] += 1
            get(f"/sum?n=4096&seed={i}"); sent["/sum"] += 1
            if get("/healthz") != "ok\n":
                fail("/healthz does not answer 'ok'")
            sent["/healthz"] += 1
        get("/mlp", body=("0," * 1023 + "0\n").encode()); sent["/mlp"] += 1
        get("/busy?us=0", expect=400)
        get("/nowhere", expect=404)
        page = get("/metrics")

        families = {f.name: f for f in text_string_to_metric_families(page)}
        want = ["evr_server_info", "evr_server_requests", "evr_server_requests_in_flight",
                "evr_server_connections",
                "evr_server_request_duration_seconds", "evr_server_gpu_wait_seconds",
                "evr_server_mlp_batch_rows", "evr_server_checks"]
        if args.mode == "evr":
            want += ["evr_reactor_submitted", "evr_reactor_in_flight",
                     "evr_reactor_submit_to_deliver_seconds",
                     "evr_reactor_detect_to_deliver_seconds"]
        for name in want:
            if name not in families:
                fail(f"family {name} is missing (have: {sorted(families)})")
        if args.mode != "evr" and any(n.startswith("evr_reactor_") for n in families):
            fail("a blocking server lists reactor metrics")

        histograms = 0
        for fam in families.values():
            if fam.type != "histogram":
                continue
            series = {}
            for s in fam.samples:
                key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                series.setdefault(key, []).append(s)
            for key, samples in series.items():
                where = f"{fam.name}{dict(key)}"
                buckets = [s for s in samples if s.name.endswith("_bucket")]
                sums = [s for s in samples if s.name.endswith("_sum")]
                counts = [s for s in samples if s.name.endswith("_count")]
                if not buckets or len(sums) != 1 or len(counts) != 1:
                    fail(f"{where}: want buckets, one _sum and one _count, got "
                         f"{len(buckets)}/{len(sums)}/{len(counts)}")
                les = [float(s.labels["le"]) for s in buckets]
                if les != sorted(les) or len(set(les)) != len(les) or les[-1] != math.inf:
                    fail(f"{where}: bucket bounds not increasing to +Inf: {les}")
                values = [s.value for s in buckets]
                if any(b < a for a, b in zip(values, values[1:])):
                    fail(f"{where}: cumulative bucket counts decrease: {values}")
                if counts[0].value != values[-1]:
                    fail(f"{where}: _count {counts[0].value} != +Inf bucket {values[-1]}")
                total = sums[0].value
                if fam.name.startswith("evr_reactor_"):
                    if not math.isnan(total):
                        fail(f"{where}: the reactor keeps no sum, yet _sum is {total}")
                elif not (math.isfinite(total) and total >= 0):
                    fail(f"{where}: _sum {total} is not a finite non-negative number")
                elif (counts[0].value > 0) != (total > 0):
                    fail(f"{where}: _sum {total} with _count {counts[0].value}")
                histograms += 1

        requests = families["evr_server_requests"]
        by_path = {}
        for s in requests.samples:
            if s.labels.get("status") == "200":
                by_path[s.labels["path"]] = s.value
        for path, n in sent.items():
            if by_path.get(path, 0) != n:
                fail(f"requests_total{{path={path},status=200}} is {by_path.get(path)}, sent {n}")
        batch = [s for s in families["evr_server_mlp_batch_rows"].samples]
        rows = next(s.value for s in batch if s.name.endswith("_sum"))
        want_rows = sum(1 + i % 3 for i in range(5)) + 1
        if rows != want_rows:
            fail(f"evr_server_mlp_batch_rows_sum is {rows}, the /mlp requests carried {want_rows} rows")
        info = families["evr_server_info"].samples[0].labels
        if info.get("mode") != args.mode:
            fail(f"evr_server_info says mode {info.get('mode')}, want {args.mode}")

        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        if proc.returncode != 0:
            fail(f"the server exited with {proc.returncode} after SIGTERM:\n{out}")
        print(f"check_metrics: OK ({args.mode}): {len(families)} families, {histograms} histogram "
              f"series checked, {len(page.splitlines())} lines")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
