"""The system calls of a server's threads, counted with perf stat on the syscall tracepoints
(scripts/study/server-profile.py --syscalls). Needs tracefs and root (or a low
kernel.perf_event_paranoid)."""
import subprocess

SYSCALLS = ("epoll_wait", "epoll_pwait", "futex", "read", "write", "recvfrom", "sendto", "writev",
            "ioctl", "sched_yield", "clock_nanosleep", "nanosleep", "timerfd_settime")


def start_count(perf, pid, out_file):
    """perf stat counting the syscalls' entry tracepoints of every thread of `pid`, per thread,
    into `out_file`, until it gets SIGINT. `perf`: (command list, environment)."""
    events = ",".join(f"syscalls:sys_enter_{name}" for name in SYSCALLS)
    # An epoll_wait that found nothing ready: a turn of the loop with no I/O in it.
    empty = ["-e", "syscalls:sys_exit_epoll_wait", "--filter", "ret == 0"]
    return subprocess.Popen(perf[0] + ["stat", "--per-thread", "-x,", "-e", events] + empty +
                            ["-p", str(pid), "-o", out_file], env=perf[1],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def per_request(stat_file, requests, group_of):
    """{group: {syscall: count a request}} from start_count's output, whose lines read
    "comm-tid,count,,event,..."; `group_of(comm)` names a thread's group. Calls made less than
    once in a hundred requests are left out."""
    counts = {}
    with open(stat_file) as f:
        for line in f:
            fields = line.strip().split(",")
            if len(fields) < 4 or not fields[1].isdigit():
                continue
            comm = fields[0].rsplit("-", 1)[0]
            name = fields[3].replace("syscalls:sys_enter_", "").replace(
                "syscalls:sys_exit_epoll_wait", "epoll_wait that found nothing")
            group = counts.setdefault(group_of(comm), {})
            group[name] = group.get(name, 0) + int(fields[1])
    if not requests:
        return {}
    return {g: {name: n / requests for name, n in sorted(calls.items()) if n / requests >= 0.01}
            for g, calls in sorted(counts.items())}
