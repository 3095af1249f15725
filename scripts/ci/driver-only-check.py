#!/usr/bin/env python3
"""evr as a user with only the NVIDIA driver runs it: the installed package, no CUDA toolkit.

  driver-only-check.py --expect no-cuda     # CI: no driver, no toolkit: import, explain, simulate
  driver-only-check.py --expect gpu         # the GPU machine with the toolkit hidden: every import
                                            # order, waits on torch and CuPy streams
  driver-only-check.py ... --hidden DIR     # also fail if anything under DIR was loaded

Each check runs in a fresh interpreter per import order (evr first, then torch/CuPy; and the
reverse), since what one library loads first is what the other finds. Every child prints the
CUDA libraries its process mapped (from /proc/self/maps) and where they came from: evr's module
links the CUDA runtime statically and loads only the driver's libcuda.so.1 on its first CUDA call;
torch and CuPy load their own runtime wheels. Exit status 0 when every check passed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

CUDA_LIB = re.compile(r"/lib(cuda|cudart|cublas|cublasLt|nvrtc|nvJitLink|cupti|nvidia-ml|curand|"
                      r"cufft|cusparse|cusolver|cudnn|nccl)[^/]*\.so[^/]*$")


def loaded_cuda_libraries() -> list[str]:
    """The CUDA libraries mapped into this process, one path each."""
    paths = set()
    with open("/proc/self/maps", encoding="utf-8") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and CUDA_LIB.search(parts[5].strip()):
                paths.add(parts[5].strip())
    return sorted(paths)


def child(order: list[str], expect: str, hidden: str | None) -> int:
    """One fresh interpreter: imports in `order`, then the checks of `expect`."""
    import asyncio

    modules = {}
    for name in order:
        try:
            modules[name] = __import__(name)
        except ImportError as e:
            if name == "evr":
                raise
            print(f"  {name}: not installed ({e}); skipped")
    evr = modules["evr"]
    import evr.sim  # noqa: F401  (the simulated device: no CUDA needed)

    status = evr.cuda_status()
    print(f"  evr {evr.__version__} from {os.path.dirname(evr.__file__)}")
    print(f"  cuda_status: usable={status.usable} runtime={status.runtime_version} "
          f"driver={status.driver_version} devices={status.device_count}"
          + (f"\n  reason: {status.reason}" if status.reason else ""))
    failures = []

    # The simulated device works everywhere.
    dev = evr.sim.Device()
    reactor = evr.Reactor(device=dev)
    s = dev.stream()
    dev.launch_kernel(s, 0.001)

    async def simulated_wait():
        await asyncio.wait_for(evr.wait(s, reactor=reactor), 30)

    asyncio.run(simulated_wait())
    reactor.shutdown()
    dev.shutdown()
    print("  simulated device: await evr.wait(stream): done")

    if expect == "no-cuda":
        if status.usable:
            failures.append("cuda_status says usable on a machine meant to have no CUDA")
        if not status.reason:
            failures.append("cuda_status gives no reason")
        try:
            evr.wait_future(1)
            failures.append("the default reactor started without CUDA")
        except evr.EvrError as e:
            print(f"  default reactor refused: {e}")
    else:
        if not status.usable:
            failures.append(f"no usable GPU: {status.reason}")
        else:
            failures += gpu_waits(evr, modules)

    libs = loaded_cuda_libraries()
    print("  CUDA libraries this process loaded:" + ("" if libs else " none"))
    for path in libs:
        print(f"    {path}")
    if hidden:
        under = [p for p in libs if p.startswith(hidden.rstrip("/") + "/")]
        if under:
            failures.append(f"loaded from the hidden toolkit {hidden}: {under}")
    for f in failures:
        print(f"  FAILED: {f}")
    return 1 if failures else 0


def gpu_waits(evr, modules) -> list[str]:
    """await evr.wait on a torch stream, a recorded torch event and a CuPy stream, answers checked."""
    import asyncio

    failures = []
    torch = modules.get("torch")
    cupy = modules.get("cupy")

    async def torch_checks():
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            x = torch.full((1 << 20,), 2.0, device="cuda")
            y = (x * 3).sum()
        await evr.wait(s)
        got = y.item()  # already done: no wait in item()
        if got != 6.0 * (1 << 20):
            failures.append(f"torch stream: sum {got}")
        e = torch.cuda.Event()
        with torch.cuda.stream(s):
            z = x.cumsum(0)
            e.record(s)
        await evr.wait(e)
        if not e.query():
            failures.append("torch event: evr.wait returned before the event completed")
        print(f"  torch {torch.__version__}: await evr.wait(stream) and (event): answers right "
              f"({z[-1].item():.0f})")

    async def cupy_checks():
        s = cupy.cuda.Stream(non_blocking=True)
        with s:
            a = cupy.arange(1 << 20, dtype=cupy.float64)
            total = a.sum()
        await evr.wait(s)
        if s.done is not True:
            failures.append("cupy stream: evr.wait returned before the stream was done")
        expected = float((1 << 20) * ((1 << 20) - 1) // 2)
        if float(total.get()) != expected:
            failures.append(f"cupy stream: sum {float(total.get())}, expected {expected}")
        print(f"  cupy {cupy.__version__}: await evr.wait(stream): answer right")

    if torch is not None:
        asyncio.run(asyncio.wait_for(torch_checks(), 60))
    if cupy is not None:
        asyncio.run(asyncio.wait_for(cupy_checks(), 60))
    return failures


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--expect", choices=("no-cuda", "gpu"), required=True)
    p.add_argument("--hidden", help="the toolkit folder that must not be loaded from")
    p.add_argument("--order", help=argparse.SUPPRESS)  # the child's import order (comma list)
    a = p.parse_args()
    if a.order:
        return child(a.order.split(","), a.expect, a.hidden)

    others = ["torch", "cupy"] if a.expect == "gpu" else []
    orders = [["evr"] + others, others + ["evr"]] if others else [["evr"]]
    failed = 0
    for order in orders:
        print(f"== import {', '.join(order)}", flush=True)
        cmd = [sys.executable, os.path.abspath(__file__), "--expect", a.expect, "--order",
               ",".join(order)] + (["--hidden", a.hidden] if a.hidden else [])
        # From / so that a checkout's python/evr cannot shadow the installed package.
        rc = subprocess.call(cmd, cwd="/")
        print(f"   -> {'ok' if rc == 0 else f'FAILED (exit {rc})'}", flush=True)
        failed |= rc != 0
    print("driver-only-check: " + ("FAILED" if failed else "all passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
