"""The normal clients of hostile_test.py: processes of their own that send a normal request on a
fresh connection every PROBE_PERIOD_S while an attack runs, and the check of what they saw
against the bounds (hostile_test.py's docstring derives them). Standard library only."""
import multiprocessing
import time

from hostile_client import ask, get

HEALTHZ_BOUND_MS = 100
ABANDON_BUSY_BOUND_MS = 300
PROBE_PERIOD_S = 0.02


def probe_loop(port, path, stop, ready, out):
    """Another process: a fresh connection and `path` every PROBE_PERIOD_S until `stop` (`ready`
    once the first has been answered or failed); then puts the list of (sent at, milliseconds,
    status) on `out` at once."""
    got = []
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            status, _, _ = ask(port, get(path), timeout=10)
        except (OSError, ValueError, IndexError) as e:
            status = f"error: {e}"
        got.append((t0, (time.monotonic() - t0) * 1000, status))
        ready.set()
        time.sleep(PROBE_PERIOD_S)
    out.put(got)


class Prober:
    """Normal clients in processes of their own (the attacks' work never delays them), started
    fresh (spawn): they inherit none of the attack's sockets."""
    live = []  # not stopped yet: an attack that broke off leaves its prober to main()

    def __init__(self, port, paths):
        Prober.live.append(self)
        ctx = multiprocessing.get_context("spawn")
        self.stop_event = ctx.Event()
        self.queues = {p: ctx.Queue() for p in paths}
        ready = [ctx.Event() for _ in paths]
        self.procs = [ctx.Process(target=probe_loop, args=(port, p, self.stop_event, r, q),
                                  daemon=True) for (p, q), r in zip(self.queues.items(), ready)]
        for p in self.procs:
            p.start()
        for r in ready:  # probing before the attack starts
            r.wait(timeout=60)

    def stop(self):
        Prober.live.remove(self)
        self.stop_event.set()
        samples = {path: q.get(timeout=60) for path, q in self.queues.items()}
        for p in self.procs:
            p.join(timeout=60)
        return samples


def check_probes(samples, bounds, failures, since=0.0, label="", windows=None, required=True):
    """Every probe sent after `since` (or inside one of `windows`, (start, end) pairs) answered 200
    within its path's bound, and (`required`) there was one; returns a summary."""
    parts = []
    for path, got in samples.items():
        got = [g for g in got if (any(a <= g[0] < b for a, b in windows) if windows
                                  else g[0] >= since)]
        if not got:
            if required:
                failures.append(f"{label}{path}: no probe completed")
            continue
        worst = max(ms for _, ms, _ in got)
        bad = [s for _, _, s in got if s != 200]
        if bad:
            failures.append(f"{label}{path}: {len(bad)} of {len(got)} probes not answered 200: "
                            f"{bad[0]}")
        if worst > bounds[path]:
            failures.append(f"{label}{path}: a probe took {worst:.1f} ms (bound "
                            f"{bounds[path]} ms)")
        parts.append(f"{path} {len(got)} probes, max {worst:.1f} ms")
    return "; ".join(parts)


NORMAL = {"/healthz": HEALTHZ_BOUND_MS, "/busy?us=100": HEALTHZ_BOUND_MS}
