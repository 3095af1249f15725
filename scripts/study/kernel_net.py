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
"""

from __future__ import annotations

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
