#!/usr/bin/env python3
"""An aiohttp server whose handlers run GPU work and await it through evr, so one event loop
keeps many requests on the GPU without a thread per request.

  GET /sum?n=N     sum of 2*i for i < N, computed on the GPU (torch or CuPy; on the simulated
                   device: a 1 ms kernel, then the answer on the CPU)
  GET /mlp?rows=R  a small torch MLP's forward pass on R rows; checked against the CPU (torch only)

  python3 aiohttp_server.py [--port 8080]          serve
  python3 aiohttp_server.py --self-test            serve on a free port, send checked requests, exit
  python3 aiohttp_server.py --self-test --load 10  ... and keep 64 clients busy for 10 s

Runs on torch (or CuPy) when there is a GPU, else on evr's simulated device; the first line
printed says which.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time

import evr
import evr.sim
from aiohttp import ClientSession, web


class SimBackend:
    name = "SIMULATED (no GPU found): evr.sim.Device"

    def __init__(self, streams=16):
        self.dev = evr.sim.Device()
        self.streams = [self.dev.stream() for _ in range(streams)]
        self.next = 0

    async def sum2(self, n):
        s = self.streams[self.next % len(self.streams)]
        self.next += 1
        self.dev.launch_kernel(s, 0.001)  # plays the kernel
        await evr.wait(s)
        return n * (n - 1)

    async def mlp(self, rows):
        raise web.HTTPNotImplemented(text="/mlp needs torch on a GPU\n")


class TorchBackend:
    def __init__(self, torch, streams=16):
        self.torch = torch
        self.name = f"CUDA: {torch.cuda.get_device_name()} (torch {torch.__version__})"
        self.streams = [torch.cuda.Stream() for _ in range(streams)]
        self.next = 0
        g = torch.Generator().manual_seed(0)
        self.w_cpu = [torch.randn(256, 256, generator=g) / 16 for _ in range(3)]
        self.w = [w.cuda() for w in self.w_cpu]
        torch.cuda.synchronize()

    def _stream(self):
        s = self.streams[self.next % len(self.streams)]
        self.next += 1
        return s

    async def sum2(self, n):
        t = self.torch
        s = self._stream()
        with t.cuda.stream(s):
            y = t.arange(n, device="cuda", dtype=t.float64).mul_(2).sum()
            host = t.empty((), dtype=t.float64, pin_memory=True)
            host.copy_(y, non_blocking=True)
        await evr.wait(s)
        return int(host.item())

    async def mlp(self, rows):
        t = self.torch
        s = self._stream()
        g = t.Generator().manual_seed(rows)
        x_cpu = t.randn(rows, 256, generator=g)
        with t.cuda.stream(s):
            x = x_cpu.pin_memory().cuda(non_blocking=True)
            for w in self.w:
                x = t.relu(x @ w)
            out = t.empty(x.shape, dtype=x.dtype, pin_memory=True)
            out.copy_(x, non_blocking=True)
        await evr.wait(s)
        ref = x_cpu
        for w in self.w_cpu:
            ref = t.relu(ref @ w)
        return {"rows": rows, "checksum": float(out.sum()), "ok": bool(t.allclose(out, ref, rtol=1e-3, atol=1e-3))}


class CupyBackend:
    def __init__(self, cp, streams=16):
        self.cp = cp
        self.name = f"CUDA: CuPy {cp.__version__}"
        self.streams = [cp.cuda.Stream(non_blocking=True) for _ in range(streams)]
        self.next = 0

    async def sum2(self, n):
        cp = self.cp
        s = self.streams[self.next % len(self.streams)]
        self.next += 1
        with s:
            y = (cp.arange(n, dtype=cp.float64) * 2).sum()
        await evr.wait(s)
        return int(y.get(stream=s))  # the work is done: a short copy, no waiting on the kernel

    async def mlp(self, rows):
        raise web.HTTPNotImplemented(text="/mlp needs torch\n")


def pick_backend():
    if evr.cuda_available():
        try:
            import torch

            if torch.cuda.is_available():
                return TorchBackend(torch)
        except ImportError:
            pass
        try:
            import cupy

            return CupyBackend(cupy)
        except ImportError:
            pass
    return SimBackend()


def make_app(backend):
    async def sum_handler(request):
        try:
            n = int(request.query.get("n", "1000"))
        except ValueError:
            raise web.HTTPBadRequest(text="n must be an integer\n")
        if not 0 <= n <= 10_000_000:
            raise web.HTTPBadRequest(text="n must be in [0, 10000000]\n")
        return web.json_response({"n": n, "sum": await backend.sum2(n)})

    async def mlp_handler(request):
        rows = int(request.query.get("rows", "64"))
        if not 1 <= rows <= 4096:
            raise web.HTTPBadRequest(text="rows must be in [1, 4096]\n")
        return web.json_response(await backend.mlp(rows))

    app = web.Application()
    app.router.add_get("/sum", sum_handler)
    app.router.add_get("/mlp", mlp_handler)
    return app


async def self_test(backend, load_s):
    runner = web.AppRunner(make_app(backend))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    print(f"server: {base}/ (self-test)")
    failures = 0
    lat = []
    rng = random.Random(1)
    async with ClientSession() as session:
        async def check(n):
            nonlocal failures
            t0 = time.perf_counter()
            async with session.get(f"{base}/sum?n={n}") as r:
                body = await r.json()
            lat.append(time.perf_counter() - t0)
            if r.status != 200 or body["sum"] != n * (n - 1):
                failures += 1
                print(f"wrong answer for n={n}: {r.status} {body}")

        t0 = time.perf_counter()
        await asyncio.gather(*(check(rng.randrange(0, 100_000)) for _ in range(400)))
        took = time.perf_counter() - t0
        async with session.get(f"{base}/sum?n=abc") as r:
            if r.status != 400:
                failures += 1
                print(f"/sum?n=abc answered {r.status}, expected 400")
        if isinstance(backend, TorchBackend):
            for rows in (1, 64, 512):
                async with session.get(f"{base}/mlp?rows={rows}") as r:
                    body = await r.json()
                    if not body.get("ok"):
                        failures += 1
                        print(f"/mlp?rows={rows} wrong: {body}")
        print(f"self-test: 400 concurrent /sum requests in {took:.3f} s ({400 / took:.0f} requests/s), "
              f"{failures} failures")
        if load_s > 0:
            done = 0
            end = time.perf_counter() + load_s

            async def client():
                nonlocal done
                while time.perf_counter() < end:
                    await check(rng.randrange(0, 100_000))
                    done += 1

            lat.clear()
            await asyncio.gather(*(client() for _ in range(64)))
            lat.sort()
            print(f"load: 64 clients for {load_s} s: {done} requests ({done / load_s:.0f} requests/s), "
                  f"p50 {lat[len(lat) // 2] * 1e3:.2f} ms, p99 {lat[int(len(lat) * 0.99)] * 1e3:.2f} ms, "
                  f"{failures} failures")
    await runner.cleanup()
    return failures


def main():
    ap = argparse.ArgumentParser(description="aiohttp + evr: await GPU work per request")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--load", type=float, default=0.0, metavar="SECONDS")
    args = ap.parse_args()
    backend = pick_backend()
    print(f"device: {backend.name}", flush=True)
    if args.self_test:
        failures = asyncio.run(self_test(backend, args.load))
        print("result:", "OK" if failures == 0 else f"FAILED ({failures})")
        evr.shutdown()
        return 0 if failures == 0 else 1
    web.run_app(make_app(backend), port=args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
