"""The kernel's TCP counters that tell where a request's second-long delay can come from: a dropped
SYN (retransmitted after 1 s), a full accept queue, a retransmission timeout (200 ms at least,
doubling), a packet dropped by a CPU's backlog before TCP saw it. Read before and after a point
of a benchmark; the difference says which of them happened during it.

    before = kernel_net.snapshot()
    ... run the point ...
    delta = kernel_net.since(before)      # {"TcpExt.ListenOverflows": 0, ...}
    kernel_net.describe(delta)            # "RetransSegs 12, TCPTimeouts 3" or "none"

TcpExt and Tcp are the network namespace's (/proc/net/netstat, /proc/net/snmp); the backlog
drops (softnet) are the machine's, summed over its CPUs. A counter the kernel lacks is left out.

And whether a load's connections were served alike (ss's byte counts per socket, twice):

    a = kernel_net.received_per_connection(port)   # the clients' sockets to 127.0.0.1:port
    ... later ...
    kernel_net.fairness(a, kernel_net.received_per_connection(port))
"""

from __future__ import annotations

import re
import subprocess

# The counters that explain a stall, and nothing else (the files hold about 150).
WATCHED = {
    "TcpExt": ("ListenOverflows", "ListenDrops", "TCPReqQFullDrop", "TCPReqQFullDoCookies",
               "SyncookiesSent", "TCPSynRetrans", "TCPTimeouts", "TCPLossProbes",
               "TCPSpuriousRTOs", "TCPBacklogDrop", "TCPRcvQDrop", "TCPZeroWindowDrop",
               "TCPMemoryPressures", "TCPAbortOnData", "TCPAbortOnClose", "EmbryonicRsts"),
    "Tcp": ("RetransSegs", "AttemptFails", "EstabResets", "OutRsts"),
}


def _read_pairs(path: str) -> dict[str, int]:
    """/proc/net/netstat and /proc/net/snmp: a line of names, then a line of values, per group."""
    values: dict[str, int] = {}
    try:
        with open(path, encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return values
    for names, numbers in zip(lines[::2], lines[1::2]):
        group, _, names = names.partition(":")
        for name, number in zip(names.split(), numbers.partition(":")[2].split()):
            if name in WATCHED.get(group, ()):
                try:
                    values[f"{group}.{name}"] = int(number)
                except ValueError:
                    pass
    return values


def _softnet() -> dict[str, int]:
    """Packets dropped because a CPU's input backlog was full (netdev_max_backlog), and the times
    the network softirq ran out of budget with work left: columns 2 and 3 of softnet_stat (hex,
    a line per CPU)."""
    dropped = squeezed = 0
    try:
        with open("/proc/net/softnet_stat", encoding="ascii") as f:
            for line in f:
                cols = line.split()
                if len(cols) >= 3:
                    dropped += int(cols[1], 16)
                    squeezed += int(cols[2], 16)
    except (OSError, ValueError):
        return {}
    return {"softnet.dropped": dropped, "softnet.time_squeeze": squeezed}


def snapshot() -> dict[str, int]:
    """The watched counters now."""
    values = _read_pairs("/proc/net/netstat")
    values.update(_read_pairs("/proc/net/snmp"))
    values.update(_softnet())
    return values


def since(before: dict[str, int]) -> dict[str, int]:
    """How much each watched counter grew since `before` (a snapshot())."""
    now = snapshot()
    return {k: now[k] - before[k] for k in now if k in before}


def describe(delta: dict[str, int]) -> str:
    """The counters that moved, by short name, or "none"."""
    moved = [f"{k.split('.', 1)[1]} {v}" for k, v in delta.items() if v]
    return ", ".join(moved) if moved else "none"


def received_per_connection(port: int) -> dict[str, int]:
    """The bytes each established client socket to 127.0.0.1:`port` has received (`ss -ti`), by its
    own address and port; {} without ss."""
    try:
        out = subprocess.run(["ss", "-tinH", "state", "established", f"( dport = :{port} )"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    counts: dict[str, int] = {}
    local = None
    for line in out.splitlines():
        if not line.startswith(("\t", " ")):  # the socket's line: recv-q send-q local peer
            cols = line.split()
            local = cols[2] if len(cols) >= 4 else None
        elif local is not None:
            m = re.search(r"\bbytes_received:(\d+)", line)
            counts[local] = int(m.group(1)) if m else 0
            local = None
    return counts


def fairness(before: dict[str, int], after: dict[str, int]) -> dict:
    """How evenly the connections open at both reads were answered between them (answers of one
    size, so bytes are answers): their count, the slowest tenth's and the median's bytes, and the
    busiest tenth's share of all. A slowest tenth well under the median: some connections were
    left waiting while others were served."""
    moved = sorted(after[k] - before[k] for k in after if k in before)
    if not moved:
        return {"connections": 0}
    n = len(moved)
    median = moved[n // 2]
    total = sum(moved) or 1
    tenth = max(1, n // 10)
    return {"connections": n, "slowest_tenth_bytes": moved[tenth - 1], "median_bytes": median,
            "busiest_tenth_share": sum(moved[-tenth:]) / total}


def describe_fairness(f: dict) -> str:
    if not f.get("connections"):
        return "connections: not read (ss missing, or none open at both reads)"
    ratio = f["slowest_tenth_bytes"] / f["median_bytes"] if f["median_bytes"] else float("nan")
    return (f"{f['connections']} connections: the slowest tenth got {ratio:.2f}x the median's "
            f"answers, the busiest tenth {f['busiest_tenth_share']:.0%} of all")
