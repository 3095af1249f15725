#!/usr/bin/env python3
"""A served model: an aiohttp endpoint that runs an MLP on the GPU in batches formed as requests
arrive, on a pool of CUDA streams, and waits for each batch in one of three ways (--mode):

  evr        await evr.wait(stream)                               the loop serves others meanwhile
  executor   await loop.run_in_executor(None, stream.synchronize) a thread of the default pool waits
  blocking   stream.synchronize()                                 the loop itself waits

  POST /predict   {"x": [IN floats]} -> {"y": [OUT floats]}: one row through the model
  GET  /stats     what the server did (requests, batches, rows, refusals, failures, the config)

  python3 served_model.py [--mode evr] [--port 8080]    serve until SIGTERM or SIGINT
  python3 served_model.py --self-test                   every mode: answers, bad input, shutdown

The model is made here, with real weights: linear layers IN -> HIDDEN x (LAYERS-1) -> OUT, ReLU
between them, He-initialised from a seeded NumPy generator, float32. Every client that knows the
seed and the sizes computes the same answers on the CPU in float64 (`forward_numpy`), which is how
the answers are checked (the server itself once at startup; the clients of
served_model_client.py: the self-test, served_model_load.py, the Ray Serve check).

Devices (--device): `cuda` runs the model in torch on the GPU (default sizes 256 -> 4096 x 5 ->
16); `sim` runs it on evr's simulated device: the forward pass is computed in float32 NumPy on
the CPU when the batch is launched and a simulated kernel of --sim-batch-us + --sim-row-us per
row plays the GPU's time; the stream, the wait, the modes and the HTTP path are the same (default
sizes 256 -> 256 x 2 -> 16). `auto` (default): cuda when evr has its CUDA backend and torch sees
a GPU.

Batching (served_model_batcher.py): a request's row joins a queue. One batcher task launches a
batch when a stream of the pool is free and either --max-batch rows are queued or --window-ms has
passed since the oldest queued row arrived; so at most --streams batches are on the GPU at once,
and rows that arrive meanwhile wait for the next free stream (batches grow with the load). Each
launched batch gets a task that waits for its stream (the mode), then answers its rows and gives
the stream back.

Shutdown (SIGTERM, SIGINT): new requests are refused with 503; the queued rows are launched at
once, the batches on the GPU finish, and every request already accepted is answered; then the
listener and the connections close. One line `served_model: shutdown {json}` tells how many
requests were in flight and what became of them. Exit status 0 when none failed or was left.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import sys

import numpy as np

import evr
import evr.sim

from served_model_batcher import MODES, Batcher, Refused  # beside this file


# --- the model ------------------------------------------------------------------------------------

def layer_dims(d_in, hidden, layers, d_out):
    """The widths from input to output: `layers` linear layers."""
    if layers < 1:
        raise ValueError("layers must be >= 1")
    return [d_in] + [hidden] * (layers - 1) + [d_out]


def make_weights(dims, seed=0):
    """[(W, b)] per layer, float32, W of shape (fan_in, fan_out): He initialisation, so that the
    activations keep their scale through the ReLUs and the outputs are of order 1."""
    rng = np.random.default_rng(seed)
    out = []
    for a, b in zip(dims, dims[1:]):
        w = rng.standard_normal((a, b), dtype=np.float32) * np.float32(math.sqrt(2.0 / a))
        bias = rng.standard_normal(b, dtype=np.float32) * np.float32(0.1)
        out.append((w, bias))
    return out


def forward_numpy(x, weights, dtype):
    """The model on the CPU in `dtype` (float32: the simulated device's answer; float64: the
    reference)."""
    h = np.asarray(x, dtype=dtype)
    for i, (w, b) in enumerate(weights):
        h = h @ w.astype(dtype, copy=False) + b.astype(dtype, copy=False)
        if i + 1 < len(weights):
            np.maximum(h, 0, out=h)
    return h


def answers_match(y, ref):
    """A float32 answer against the float64 reference, elementwise within 1e-3 * (1 + |ref|)
    (NumPy's float32 forward pass of the default model is within 5.2e-6: the bound leaves room
    for any order of summation, not for TF32)."""
    y = np.asarray(y, dtype=np.float64)
    return y.shape == ref.shape and bool(np.all(np.abs(y - ref) <= 1e-3 * (1.0 + np.abs(ref))))


def input_rows(n, d_in, seed):
    """n request rows, float32 values (what a client sends, exactly representable)."""
    return np.random.default_rng(seed).standard_normal((n, d_in), dtype=np.float32)


# --- the stream pool: one slot per stream ---------------------------------------------------------

class SimSlot:
    """A stream of evr's simulated device. launch() computes the batch in float32 NumPy and
    enqueues a kernel that plays its GPU time; result() is valid once the stream is done."""

    def __init__(self, dev, weights, batch_s, row_s):
        self.dev, self.weights, self.batch_s, self.row_s = dev, weights, batch_s, row_s
        self.stream = dev.stream()
        self._y = None

    def launch(self, x):
        self._y = forward_numpy(x, self.weights, np.float32)
        self.dev.launch_kernel(self.stream, self.batch_s + self.row_s * len(x))

    def result(self, n):
        return self._y[:n]


class TorchSlot:
    """A torch CUDA stream with pinned input and output buffers of --max-batch rows. launch()
    copies the rows into the pinned input, then enqueues on the stream: host -> device, the
    layers, device -> pinned output; nothing waits. The buffers are reused only after the batch
    was waited for (the batcher gives a slot back then), so no copy overtakes the GPU."""

    def __init__(self, torch, weights, max_batch, d_in, d_out):
        self.torch, self.weights = torch, weights
        self.stream = torch.cuda.Stream()
        self.x_host = torch.empty((max_batch, d_in), dtype=torch.float32, pin_memory=True)
        self.y_host = torch.empty((max_batch, d_out), dtype=torch.float32, pin_memory=True)
        self.x_np, self.y_np = self.x_host.numpy(), self.y_host.numpy()

    def launch(self, x):
        t, n = self.torch, len(x)
        self.x_np[:n] = x
        with t.inference_mode(), t.cuda.stream(self.stream):
            h = self.x_host[:n].to("cuda", non_blocking=True)
            for i, (w, b) in enumerate(self.weights):
                h = t.addmm(b, h, w)
                if i + 1 < len(self.weights):
                    h.relu_()
            self.y_host[:n].copy_(h, non_blocking=True)
        # The intermediates are freed here; torch's caching allocator hands their memory only to
        # later work on this same stream, which runs after this batch.

    def result(self, n):
        return self.y_np[:n]


def make_backend(args, weights):
    """(description, [slots], gpu_batch_seconds or None) for --device."""
    if args.device == "sim":
        dev = evr.sim.Device()
        batch_s, row_s = args.sim_batch_us * 1e-6, args.sim_row_us * 1e-6
        slots = [SimSlot(dev, weights, batch_s, row_s) for _ in range(args.streams)]
        return ("SIMULATED (evr.sim.Device; the forward pass in float32 NumPy, a simulated kernel "
                f"of {args.sim_batch_us:g} us + {args.sim_row_us:g} us per row)"), slots, None
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # float32 GEMMs: the answers are checked
    ws = [(torch.from_numpy(w).cuda(), torch.from_numpy(b).cuda()) for w, b in weights]
    slots = [TorchSlot(torch, ws, args.max_batch, args.d_in, args.d_out)
             for _ in range(args.streams)]
    torch.cuda.synchronize()
    # A full batch, timed on the GPU (after two warm-ups: cuBLAS picks its kernels on the first).
    x = input_rows(args.max_batch, args.d_in, seed=12345)
    s = slots[0]
    for _ in range(2):
        s.launch(x)
        s.stream.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(s.stream)
    s.launch(x)
    end.record(s.stream)
    end.synchronize()
    gpu_s = start.elapsed_time(end) * 1e-3
    if not answers_match(s.result(len(x)), forward_numpy(x, weights, np.float64)):
        raise SystemExit("served_model: the GPU's answer to a full batch differs from the float64 "
                         "reference; refusing to serve")
    name = (f"CUDA: {torch.cuda.get_device_name()} (torch {torch.__version__}, "
            f"{args.streams} streams)")
    return name, slots, gpu_s


# --- the HTTP endpoint ----------------------------------------------------------------------------

def parse_row(body, d_in):
    """The row of a /predict body ({"x": [d_in numbers]}) as float32; ValueError says what is
    wrong."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ValueError("the body is not JSON") from None
    x = doc.get("x") if isinstance(doc, dict) else None
    if not isinstance(x, list) or len(x) != d_in:
        raise ValueError(f'expected {{"x": [{d_in} numbers]}}')
    try:
        row = np.asarray(x, dtype=np.float32)
    except (TypeError, ValueError):
        raise ValueError("x must hold numbers only") from None
    if row.shape != (d_in,) or not np.all(np.isfinite(row)):
        raise ValueError("x must hold finite numbers only")
    return row


def make_app(batcher, config):
    from aiohttp import web

    active = {"handlers": 0}

    async def predict(request):
        active["handlers"] += 1
        try:
            try:
                row = parse_row(await request.read(), config["d_in"])
            except ValueError as e:
                return web.json_response({"error": str(e)}, status=400)
            try:
                y = await batcher.submit(row)
            except Refused:
                return web.json_response({"error": "shutting down"}, status=503)
            except Exception as e:  # noqa: BLE001 - a failed batch (evr.CudaError, launch errors)
                return web.json_response({"error": f"{type(e).__name__}: {e}"}, status=500)
            return web.json_response({"y": y})
        finally:
            active["handlers"] -= 1

    async def stats(request):
        return web.json_response(dict(batcher.stats(), config=config))

    app = web.Application(client_max_size=1 << 20)
    app.router.add_post("/predict", predict)
    app.router.add_get("/stats", stats)
    app["active"] = active
    return app


async def serve(args):
    from aiohttp import web

    dims = layer_dims(args.d_in, args.hidden, args.layers, args.d_out)
    weights = make_weights(dims, args.seed)
    name, slots, gpu_s = make_backend(args, weights)
    batcher = Batcher(slots, args.mode, args.max_batch, args.window_ms * 1e-3, args.sigterm_after)
    params = sum(w.size + b.size for w, b in weights)
    config = {"mode": args.mode, "device": args.device, "dims": dims, "seed": args.seed,
              "d_in": args.d_in, "d_out": args.d_out, "params": params, "streams": args.streams,
              "max_batch": args.max_batch, "window_ms": args.window_ms,
              "loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
              "gpu_ms_full_batch": None if gpu_s is None else round(gpu_s * 1e3, 4)}
    app = make_app(batcher, config)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, backlog=4096)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    timing = "" if gpu_s is None else f", a full batch {gpu_s * 1e3:.3f} ms on the GPU"
    print(f"served_model: device {name}", flush=True)
    print(f"served_model: model {'-'.join(map(str, dims))} ({params / 1e6:.1f} M weights), mode "
          f"{args.mode}, {config['loop']} loop, {args.streams} streams, batches of up to "
          f"{args.max_batch} rows, {args.window_ms:g} ms window{timing}", flush=True)
    print(f"served_model: listening on http://{args.host}:{port}/", flush=True)
    await stop.wait()

    report = await batcher.close(args.shutdown_timeout)
    # The answered requests' handlers write their responses on their next turn; then close.
    deadline = loop.time() + 2.0
    while app["active"]["handlers"] and loop.time() < deadline:
        await asyncio.sleep(0.005)
    report["handlers_left"] = app["active"]["handlers"]
    await runner.cleanup()
    report["totals"] = batcher.stats()
    # Requests go on arriving, and being refused, until the site stops (runner.cleanup), after
    # close() returned: counted up to here.
    report["refused_since"] = report["totals"]["refused"] - report.pop("refused_before")
    print(f"served_model: shutdown {json.dumps(report, sort_keys=True)}", flush=True)
    evr.shutdown()
    return 0 if report["failed"] == 0 and report["left"] == 0 else 1


# --- main -----------------------------------------------------------------------------------------

def detect_device():
    if evr.cuda_available():
        try:
            import torch

            if torch.cuda.is_available():
                return "cuda"
        except ImportError:
            pass
    return "sim"


def add_model_arguments(ap):
    """The model's, the device's and the batching's options (served_model.py and
    ray_serve_model.py take the same); settle_model_arguments() fills in their defaults."""
    ap.add_argument("--device", choices=("auto", "cuda", "sim"), default="auto")
    ap.add_argument("--streams", type=int, default=4, help="the pool of CUDA streams")
    ap.add_argument("--max-batch", type=int, default=64, help="rows per batch at most")
    ap.add_argument("--window-ms", type=float, default=1.0,
                    help="how long the oldest queued row waits for more before its batch leaves")
    ap.add_argument("--in", dest="d_in", type=int, default=256, help="input features")
    ap.add_argument("--hidden", type=int, default=None, help="hidden width (cuda 4096, sim 256)")
    ap.add_argument("--layers", type=int, default=None, help="linear layers (cuda 6, sim 3)")
    ap.add_argument("--out", dest="d_out", type=int, default=16, help="outputs")
    ap.add_argument("--seed", type=int, default=0, help="the weights' seed")
    ap.add_argument("--sim-batch-us", type=float, default=1000.0,
                    help="simulated device: a batch's kernel time")
    ap.add_argument("--sim-row-us", type=float, default=10.0,
                    help="simulated device: kernel time per row")


def settle_model_arguments(args):
    """--device auto becomes cuda or sim (detect_device); the sizes left open get the device's
    defaults."""
    if args.device == "auto":
        args.device = detect_device()
    if args.hidden is None:
        args.hidden = 4096 if args.device == "cuda" else 256
    if args.layers is None:
        args.layers = 6 if args.device == "cuda" else 3


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=MODES, default="evr", help="how a batch is waited for")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default=None,
                    help="the event loop (default: uvloop when installed)")
    add_model_arguments(ap)
    ap.add_argument("--shutdown-timeout", type=float, default=10.0,
                    help="how long a shutdown waits for the requests in flight")
    ap.add_argument("--sigterm-after", type=int, default=0, metavar="N",
                    help="send itself SIGTERM when the N-th request is queued (the self-test)")
    ap.add_argument("--self-test", action="store_true",
                    help="start a server per mode, check answers, bad input and a shutdown")
    ap.add_argument("--modes", default=",".join(MODES),
                    help="--self-test: the modes (comma-separated)")
    return ap


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.self_test:
        args.modes = [m for m in args.modes.split(",") if m]
        bad = set(args.modes) - set(MODES)
        if bad:
            raise SystemExit(f"--modes: unknown {sorted(bad)}; choose from {MODES}")
        # The servers get the options given here, less the self-test's own.
        extra, skip = [], {"--self-test": 0, "--modes": 1, "--mode": 1, "--device": 1, "--port": 1,
                           "--sigterm-after": 1}
        i = 0
        while i < len(argv):
            name = argv[i].split("=", 1)[0]
            if name in skip:
                i += 1 + (skip[name] if "=" not in argv[i] else 0)
                continue
            extra.append(argv[i])
            i += 1
        import served_model_client  # beside this file: the client side, and the self-test

        return served_model_client.self_test(args, extra)
    settle_model_arguments(args)
    if args.loop is None or args.loop == "uvloop":
        try:
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        except ImportError:
            if args.loop == "uvloop":
                raise SystemExit("--loop uvloop: uvloop is not installed")
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
