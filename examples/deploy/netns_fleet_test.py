#!/usr/bin/env python3
"""The fleet across hosts: what a client sees when a host's link drops, a host's server is
killed, the servers restart host by host, or the balancer restarts.

    sudo python3 examples/deploy/netns_fleet_test.py --bin build/release/examples/evr-async-server
        [--device sim|cuda] [--connections 32] [--out DIR]

The hosts are network namespaces this test makes itself (`ip netns`), each joined by a veth pair
to a bridge of its own on this machine, with addresses of its own (10.213.N.0/24): nothing leaves
the machine. Two server hosts run an evr-async-server each on port 8080; a third runs HAProxy
(haproxy.cfg.in, as fleet.py writes it) in front of them. The clients run here, --connections
keep-alive connections in closed loops of GET /busy through the balancer, every answer checked
(a /busy answer is a hash of its seed, computed here too). A request that fails (its connection
refused, reset or closed without an answer, or a 502/503/504 from the balancer) is sent again,
as a client may send an idempotent request again, until it is answered or 30 s have passed.

Under that load, one after the other:
  1. link: host b's link is cut for 2 s (its bridge port down), then restored;
  2. kill: host a's server is killed (SIGKILL), then started again;
  3. rolling restart: each host's server gets SIGTERM (it drains), is started again and must be
     back in the balancer's rotation before the next host's;
  4. balancer: HAProxy is stopped and started again on its address.
Asserted: 0 wrong answers, 0 requests left unanswered, and both hosts answer again after each
fault. Reported per fault: the requests answered, how many needed another try, and the longest a
request took to be answered (what a client waits through the fault).

Needs root (network namespaces), iproute2 and haproxy: without them it says why and exits 77
(ctest: skipped). Exit status 0 when every assertion held, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fleet import DEFAULT_BIN, HAProxy, ServerProcess  # noqa: E402
from checked_load import busy_references, finish, read_response, results_folder  # noqa: E402

SKIP = 77
PORT = 8080
RETRY_STATUSES = (502, 503, 504)
GIVE_UP_S = 30.0


def run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


class Network:
    """A bridge here and one namespace per host, each joined to the bridge by a veth pair."""

    def __init__(self, hosts: list[str]):
        tag = os.getpid() % 10000
        self.subnet = f"10.213.{os.getpid() % 200 + 20}"
        self.bridge = f"evrb{tag}"
        self.netns = {h: f"evr-{tag}-{h}" for h in hosts}
        self.port = {h: f"evr{tag}{h}" for h in hosts}  # the bridge's side of each veth
        self.address = {h: f"{self.subnet}.{10 + i}" for i, h in enumerate(hosts)}
        self.made: list[tuple[str, str]] = []

    def up(self) -> None:
        run("ip", "link", "add", self.bridge, "type", "bridge")
        self.made.append(("link", self.bridge))
        run("ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        run("ip", "link", "set", self.bridge, "up")
        for h, ns in self.netns.items():
            run("ip", "netns", "add", ns)
            self.made.append(("netns", ns))
            inner = f"{self.port[h]}i"
            run("ip", "link", "add", self.port[h], "type", "veth", "peer", "name", inner)
            self.made.append(("link", self.port[h]))
            run("ip", "link", "set", inner, "netns", ns)
            run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.address[h]}/24", "dev", inner)
            run("ip", "netns", "exec", ns, "ip", "link", "set", inner, "up")
            run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            run("ip", "link", "set", self.port[h], "master", self.bridge)
            run("ip", "link", "set", self.port[h], "up")

    def cut(self, host: str, down: bool) -> None:
        run("ip", "link", "set", self.port[host], "down" if down else "up")

    def down(self) -> None:
        for kind, name in reversed(self.made):
            cmd = ["ip", "netns", "del", name] if kind == "netns" else ["ip", "link", "del", name]
            subprocess.run(cmd, capture_output=True)


def why_not_here() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if not shutil.which("ip"):
        return "needs iproute2's ip"
    if not shutil.which(os.environ.get("EVR_HAPROXY", "haproxy")):
        return "needs haproxy (scripts/install-deps.sh installs it)"
    probe = f"evr-probe-{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"ip netns add failed here: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class Phase:
    """What the clients saw while one fault was under way: the requests that began in it, and
    those that began earlier and first failed in it."""

    def __init__(self, name: str):
        self.name = name
        self.answered = self.retried = self.tries = self.wrong = self.lost = self.bad = 0
        self.longest_s = 0.0
        self.first_problem = ""
        self.causes: dict[str, int] = {}  # why tries failed: an HTTP status or an exception's type

    def report(self) -> dict:
        return {"fault": self.name, "answered": self.answered, "needed another try": self.retried,
                "extra tries": self.tries, "why tries failed": self.causes,
                "longest wait s": round(self.longest_s, 3), "wrong": self.wrong,
                "unanswered": self.lost, "other errors": self.bad}


class Load:
    """--connections clients in closed loops through the balancer, retrying failed requests."""

    def __init__(self, host: str, connections: int):
        self.host, self.connections = host, connections
        self.seeds = busy_references()
        self.phase = Phase("warm-up")
        self.phases: list[Phase] = []
        self.stop = asyncio.Event()
        self.backends: dict[str, int] = {}

    def begin(self, name: str) -> Phase:
        self.phase = Phase(name)
        self.phases.append(self.phase)
        return self.phase

    async def one(self, conn: list, seed: int) -> tuple[int, dict, bytes]:
        if conn[0] is None:
            conn[0] = await asyncio.wait_for(asyncio.open_connection(self.host, PORT), 5)
        reader, writer = conn[0]
        writer.write(f"GET /busy?us=2000&seed={seed} HTTP/1.1\r\nHost: fleet\r\n\r\n".encode())
        return await asyncio.wait_for(read_response(reader), 20)

    async def client(self, idx: int) -> None:
        conn: list = [None]
        keys = list(self.seeds)
        n = idx
        while not self.stop.is_set():
            seed = keys[n % len(keys)]
            n += 7
            phase, t0, tries = self.phase, time.monotonic(), 0
            while True:
                tries += 1
                try:
                    status, headers, body = await self.one(conn, seed)
                    if headers.get("connection", "").lower() == "close":
                        conn[0][1].close()
                        conn[0] = None
                    if status in RETRY_STATUSES:
                        raise ConnectionError(f"HTTP {status}")
                    if status != 200:
                        phase.bad += 1
                        phase.first_problem = phase.first_problem or f"{status} {body[:100]!r}"
                    elif json.loads(body).get("result") != self.seeds[seed]:
                        phase.wrong += 1
                        phase.first_problem = phase.first_problem or f"wrong answer: {body[:100]!r}"
                    else:
                        phase.answered += 1
                        b = headers.get("x-evr-backend", "?")
                        self.backends[b] = self.backends.get(b, 0) + 1
                    break
                except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as e:
                    if tries == 1:
                        phase = self.phase  # its trouble belongs to the fault under way now
                    cause = str(e) if str(e).startswith("HTTP ") else type(e).__name__
                    phase.causes[cause] = phase.causes.get(cause, 0) + 1
                    if conn[0] is not None:
                        conn[0][1].close()
                        conn[0] = None
                    if time.monotonic() - t0 > GIVE_UP_S or self.stop.is_set():
                        phase.lost += 1
                        phase.first_problem = phase.first_problem or f"unanswered: {e!r}"
                        break
                    await asyncio.sleep(0.05)
            if tries > 1:
                phase.retried += 1
                phase.tries += tries - 1
            phase.longest_s = max(phase.longest_s, time.monotonic() - t0)
        if conn[0] is not None:
            conn[0][1].close()

    async def answered_by(self, name: str, timeout: float = 20) -> bool:
        """Until the server named `name` has answered a request of the clients since now."""
        before = self.backends.get(name, 0)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.backends.get(name, 0) > before:
                return True
            await asyncio.sleep(0.05)
        return False


async def scenario(load: Load, net: Network, servers: dict, haproxy: HAProxy, problems: list) -> None:
    async def settle(seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def both_answer(after: str) -> None:
        for host, s in servers.items():
            if not await load.answered_by(s.name):
                problems.append(f"after {after}: host {host} ({s.name}) answered nothing for 20 s")

    await settle(1.0)
    # 1. A host's link cut for 2 s.
    load.begin("link of host b cut for 2 s")
    net.cut("b", down=True)
    await settle(2.0)
    net.cut("b", down=False)
    await asyncio.to_thread(haproxy.wait_state, servers["b"].name, True, 30)
    await both_answer("the link came back")
    # 2. A host's server killed.
    load.begin("server of host a killed (SIGKILL), started again")
    servers["a"].signal(signal.SIGKILL)
    servers["a"].wait_exit(timeout=30)
    await asyncio.to_thread(haproxy.wait_state, servers["a"].name, False, 30)
    servers["a"].start()
    await asyncio.to_thread(servers["a"].wait_listening)
    await asyncio.to_thread(haproxy.wait_state, servers["a"].name, True, 30)
    await both_answer("the killed server was back")
    # 3. Rolling restart, host by host.
    load.begin("rolling restart, host by host (SIGTERM, drain, start)")
    for host in ("a", "b"):
        s = servers[host]
        s.signal(signal.SIGTERM)
        rc = await asyncio.to_thread(s.wait_exit, 60)
        if rc != 0:
            problems.append(f"rolling restart: {s.name} exited {rc} after SIGTERM (see {s.log_path})")
        s.start()
        await asyncio.to_thread(s.wait_listening)
        await asyncio.to_thread(haproxy.wait_state, s.name, True, 30)
    await both_answer("the rolling restart")
    # 4. The balancer restarted.
    load.begin("balancer stopped and started again")
    haproxy.stop()
    await settle(0.5)
    haproxy.start()
    for s in servers.values():
        await asyncio.to_thread(haproxy.wait_state, s.name, True, 30)
    await both_answer("the balancer's restart")
    load.begin("after the faults")
    await settle(1.0)


async def run_load(load: Load, *parts) -> None:
    tasks = [asyncio.create_task(load.client(i)) for i in range(load.connections)]
    try:
        await scenario(load, *parts)
    finally:
        load.stop.set()
        await asyncio.gather(*tasks)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", default=DEFAULT_BIN)
    p.add_argument("--device", default="sim", choices=["auto", "cuda", "sim"])
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--out")
    a = p.parse_args()
    if not os.access(a.bin, os.X_OK):
        p.error(f"--bin {a.bin}: not an executable")
    if a.connections < 1:
        p.error("--connections takes 1 or more")
    why = why_not_here()
    if why:
        print(f"netns-fleet-test: skipped: {why}")
        return SKIP
    workdir = results_folder(a.out, "evr-netns-fleet.")
    net = Network(["lb", "a", "b"])
    problems: list[str] = []
    servers: dict[str, ServerProcess] = {}
    haproxy = None
    load = Load(net.address["lb"], a.connections)
    try:
        net.up()
        args = ["--device", a.device, "--drain-seconds", "10"]
        for host in ("a", "b"):
            servers[host] = ServerProcess(f"s{host}", a.bin, PORT, args, workdir,
                                          host=net.address[host], netns=net.netns[host])
            servers[host].start()
        for s in servers.values():
            s.wait_listening()
        haproxy = HAProxy(PORT, list(servers.values()), workdir, bind=net.address["lb"],
                          netns=net.netns["lb"])
        haproxy.start()
        for s in servers.values():
            haproxy.wait_state(s.name, up=True)
        print(f"netns-fleet-test: hosts lb {net.address['lb']}, a {net.address['a']}, "
              f"b {net.address['b']} (namespaces {', '.join(net.netns.values())}); "
              f"{a.connections} clients through the balancer")
        asyncio.run(run_load(load, net, servers, haproxy, problems))
    except (RuntimeError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", "") or ""
        problems.append(f"{e} {detail}".strip())
    finally:
        if haproxy:
            haproxy.stop()
        for s in servers.values():
            if s.proc and s.proc.poll() is None:
                s.signal(signal.SIGKILL)
                s.wait_exit(timeout=30)
        net.down()
    report = [ph.report() for ph in load.phases]
    for ph in load.phases:
        r = ph.report()
        print(f"  {r['fault']}: {r['answered']} answered, {r['needed another try']} needed another "
              f"try ({r['extra tries']} tries more: {r['why tries failed'] or 'none'}), longest wait "
              f"{r['longest wait s']:.2f} s; "
              f"{r['wrong']} wrong, {r['unanswered']} unanswered, {r['other errors']} other errors")
        if ph.wrong or ph.lost or ph.bad:
            problems.append(f"{ph.name}: {ph.wrong} wrong, {ph.lost} unanswered, {ph.bad} other "
                            f"errors (first: {ph.first_problem})")
        if ph.answered == 0:
            problems.append(f"{ph.name}: no request answered")
    print(f"  answered per server: {load.backends}")
    return finish("netns-fleet-test", workdir, "netns-fleet.json",
                  {"phases": report, "backends": load.backends, "problems": problems}, problems)


if __name__ == "__main__":
    sys.exit(main())
