"""A point of the server study (scripts/study/server-study.py): the routes it loads, and the figures of a
measured point as the tables read them (clean or not, requests/s per core, numbers as text)."""
import math

BUSY200, BUSY1000, BUSY5000 = "/busy?us=200", "/busy?us=1000", "/busy?us=5000"
MLP, SAXPY = "/mlp?seed=1", "/saxpy?n=65536"
HEALTHZ = "/healthz"  # no GPU work: the HTTP path alone, the limit the GPU routes are held to
ROUTES = [BUSY200, BUSY1000, BUSY5000, MLP, SAXPY, HEALTHZ]
# The last word of an evr server's label whose /busy waits on the stream (--no-busy-signal)
# rather than on the kernel's signal slot.
STREAM_WAITS = "stream-waits"
EAGER_MLP = "eager-mlp"  # a label's last word: the server runs /mlp call by call (--no-mlp-graphs)
BUSY_GRAPH = "busy-graph"  # a label's last word: /busy runs as a CUDA graph per lane (--busy-graph)
# a label's last word (evr only): past the hardware queues, stream waits' fence words are written
# by evr's fence kernel (--kernel-fences)
KERNEL_FENCES = "kernel-fences"


def fmt(v, digits):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def ms(us):
    return None if us is None else us / 1000.0


def usable(p):
    """A point measured cleanly: no skip, no errors, requests/s and cores known."""
    return "skipped" not in p and not p.get("errors") and p.get("rps") and p.get("server_cores")


def per_core(p):
    return p["rps"] / p["server_cores"] if p and p.get("rps") and p.get("server_cores") else None


def ratio(a, b):
    return a / b if a is not None and b else None
