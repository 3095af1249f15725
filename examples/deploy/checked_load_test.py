#!/usr/bin/env python3
"""The checked clients' own bookkeeping (checked_load.client), against scripted servers: a request
resent because its connection failed is counted by where it failed, since the deploy tests assert
on those counts (a failure on a kept-alive connection is a server's fault; one while connecting,
during a restart without tcp_migrate_req, is not).

    python3 examples/deploy/checked_load_test.py

Exit status 0 when every case held.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checked_load import Tally, busy_reference, client  # noqa: E402

SEEDS = {1: busy_reference(1)}


async def answer(reader, writer, keep_alive: bool) -> bool:
    """Reads one request head and answers it right; False when the client had closed."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return False
    seed = int(re.search(rb"seed=(\d+)", head).group(1))
    body = json.dumps({"result": SEEDS[seed]}).encode()
    connection = "keep-alive" if keep_alive else "close"
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: %s\r\n\r\n%s" %
                 (len(body), connection.encode(), body))
    await writer.drain()
    return True


async def run_case(name: str, serve, expected: dict, done) -> list[str]:
    """One client against a server whose connection handler is `serve(reader, writer, index,
    server)` (index: 1 for the first connection), until `done(tally)` holds (10 s at most); the
    resends counted must be `expected`."""
    accepted = 0
    handlers = set()

    async def on_connection(reader, writer):
        nonlocal accepted
        accepted += 1
        handlers.add(asyncio.current_task())
        try:
            await serve(reader, writer, accepted, server)
        finally:
            writer.close()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    tally, stop = Tally(), asyncio.Event()
    task = asyncio.create_task(client(port, "/busy", SEEDS, stop, tally, 0, retries=1))
    deadline = time.monotonic() + 10
    while not done(tally) and time.monotonic() < deadline:
        await asyncio.sleep(0.005)  # polls the condition; the bound only ends a broken case
    stop.set()
    server.close()
    await task  # the client has closed its connection: the handlers read its end and return
    await asyncio.wait_for(asyncio.gather(*handlers, return_exceptions=True), 10)
    seen = {k: v for k, v in tally.retried.items() if v}
    problems = []
    if not done(tally):
        problems.append(f"{name}: did not finish in 10 s (ok {tally.ok}, resent {seen})")
    if seen != expected:
        problems.append(f"{name}: resent {seen}, expected {expected} ({tally.first_retry})")
    if tally.wrong or tally.non2xx:
        problems.append(f"{name}: {tally.wrong} wrong, {tally.non2xx} non-2xx")
    print(f"{name}: ok {tally.ok}, resent {seen} (first errors {tally.first_retry})")
    return problems


async def main_async() -> list[str]:
    problems = []

    # The first connection answers once with Connection: close and the listening socket closes:
    # the client's next connect() is refused. That is a "connect" failure, not a "reused" one.
    async def close_listener_after_one(reader, writer, index, server):
        await answer(reader, writer, keep_alive=False)
        server.close()
    problems += await run_case("refused while connecting", close_listener_after_one,
                               {"connect": 1}, lambda t: t.ok >= 1 and t.socket_errors >= 1)

    # The first connection answers once (keep-alive), then closes with the second request
    # unanswered: "reused". Later connections answer every request.
    async def drop_second_request(reader, writer, index, server):
        keep_going = True
        while keep_going and await answer(reader, writer, keep_alive=True):
            keep_going = index > 1
    problems += await run_case("closed after an answer", drop_second_request, {"reused": 1},
                               lambda t: t.ok >= 3)

    # The first connection closes before its first answer: "fresh".
    async def drop_first_connection(reader, writer, index, server):
        while index > 1 and await answer(reader, writer, keep_alive=True):
            pass
    problems += await run_case("closed before any answer", drop_first_connection, {"fresh": 1},
                               lambda t: t.ok >= 2)
    return problems


def main() -> int:
    problems = asyncio.run(main_async())
    for p in problems:
        print("FAILED:", p)
    print("checked-load-test:", "FAILED" if problems else "passed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
