#!/usr/bin/env python3
"""The served model of served_model.py as a Ray Serve deployment: one replica per GPU, each with
a pool of CUDA streams; Ray Serve's HTTP proxy takes the requests, `@serve.batch` gathers them
into batches, and a batch's coroutine awaits its stream through evr (`await evr.wait(stream)`),
so the replica's event loop serves other requests while the GPU works.

  POST /predict   {"x": [IN floats]} -> {"y": [OUT floats], "replica": ID}: one row
  GET  /stats     the replica that answers: its id, process, counts and the model's config

  python3 ray_serve_model.py [--replicas N] [--port 8000] [--device auto|cuda|sim] [model options]

starts a local Ray (or joins one: --address), deploys the model and serves until SIGTERM or
SIGINT. The model, the stream slots, the input's parsing and the answers' check are
served_model.py's (imported), so the answers are the same and are checked the same way
(ray_serve_model_check.py, served_model_client.Checker).

Devices: `cuda` gives each replica one GPU (`ray_actor_options={"num_gpus": 1}`; --replicas
defaults to the GPUs Ray sees) and runs the model in torch; `sim` gives each replica its own
evr.sim.Device (a simulated GPU, the forward pass in float32 NumPy): the local Ray is started with
as many logical GPUs as replicas, so the scheduling (one replica per GPU) is the same. `auto`:
cuda when evr has its CUDA backend and torch sees a GPU here.

Batching: `serve.batch` with --max-batch rows, a --window-ms wait for a batch to fill, and
--streams batches at once per replica (max_concurrent_batches), each on a stream of the
replica's pool; so each replica accepts up to max-batch x streams requests at once
(max_ongoing_requests) and Ray's proxy queues the rest.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report to Ray's servers

import numpy as np  # noqa: E402
import ray  # noqa: E402
from ray import serve  # noqa: E402

import evr  # noqa: E402
import served_model  # noqa: E402  (beside this file)

APP = "served_model"
LISTENING = "ray_serve_model: listening on "


@serve.deployment(ray_actor_options={"num_gpus": 1})
class ServedModel:
    """One replica: the model on its GPU (or simulated device) and a pool of streams. Runs on the
    replica's event loop: at most `streams` batches are in `_run_batch` at once, each holding a
    slot of `free` from its launch until its stream is done."""

    def __init__(self, config):
        args = argparse.Namespace(**config)
        self.config = dict(config)
        self.config["dims"] = dims = served_model.layer_dims(args.d_in, args.hidden, args.layers,
                                                             args.d_out)
        self.device, slots, gpu_s = served_model.make_backend(args,
                                                              served_model.make_weights(dims,
                                                                                        args.seed))
        self.config["gpu_ms_full_batch"] = None if gpu_s is None else round(gpu_s * 1e3, 4)
        self.free = collections.deque(slots)
        # serve.batch applied here rather than as a decorator: its sizes come from the options,
        # and max_concurrent_batches cannot be changed once decorated.
        self.predict = serve.batch(max_batch_size=args.max_batch,
                                   batch_wait_timeout_s=args.window_ms * 1e-3,
                                   max_concurrent_batches=len(slots))(self._run_batch)
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.counts = collections.Counter(
            dict.fromkeys(("requests", "batches", "rows", "refused", "failed"), 0))

    async def _run_batch(self, rows):
        """A batch of rows (float32 arrays) -> their answers (lists of floats)."""
        slot = self.free.popleft()  # serve.batch runs at most len(slots) of these at once
        try:
            slot.launch(np.stack(rows))
            await evr.wait(slot.stream)
            self.counts["batches"] += 1
            self.counts["rows"] += len(rows)
            return slot.result(len(rows)).tolist()
        finally:
            self.free.append(slot)

    async def __call__(self, request):
        from starlette.responses import JSONResponse

        path = request.url.path.rstrip("/")
        if request.method == "GET" and path == "/stats":
            return self.stats()
        if request.method != "POST" or path != "/predict":
            return JSONResponse({"error": "POST /predict or GET /stats"}, status_code=404)
        self.counts["requests"] += 1
        try:
            row = served_model.parse_row(await request.body(), self.config["d_in"])
        except ValueError as e:
            self.counts["refused"] += 1
            return JSONResponse({"error": str(e)}, status_code=400)
        try:
            y = await self.predict(row)
        except Exception as e:  # noqa: BLE001 - a failed batch (evr.CudaError, launch errors)
            self.counts["failed"] += 1
            return JSONResponse({"error": f"{type(e).__name__}: {e}"}, status_code=500)
        return {"y": y, "replica": self.replica}

    def stats(self):
        return dict(self.counts, replica=self.replica, pid=os.getpid(), device=self.device,
                    streams_free=len(self.free), config=self.config)


def model_config(args):
    """What each replica is built from: the model's, the device's and the batching's options."""
    keys = ("device", "streams", "max_batch", "window_ms", "d_in", "hidden", "layers", "d_out",
            "seed", "sim_batch_us", "sim_row_us")
    return {k: getattr(args, k) for k in keys}


def start(args):
    """Starts (or joins) Ray, then Serve's proxy on args.host:args.port, and deploys the model
    with args.replicas replicas (None: one per GPU Ray sees). Returns the number of replicas."""
    served_model.settle_model_arguments(args)
    # The replicas import served_model (and evr, when it comes from PYTHONPATH) as this process
    # does.
    path = os.pathsep.join([HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                     if p])
    init = {"runtime_env": {"env_vars": {"PYTHONPATH": path}}, "include_dashboard": False,
            "log_to_driver": args.ray_logs}
    if args.address:
        init.pop("include_dashboard")  # the cluster's own choice
        ray.init(address=args.address, **init)
    elif args.device == "sim":
        # One logical GPU per simulated replica: the same one-replica-per-GPU scheduling.
        ray.init(address="local", num_gpus=args.replicas or 2, **init)
    else:
        ray.init(address="local", **init)
    replicas = args.replicas or int(ray.cluster_resources().get("GPU", 0))
    if replicas < 1:
        raise SystemExit("ray_serve_model: Ray sees no GPU; --device sim serves on simulated "
                         "replicas")
    # The proxy's and the replicas' logs at --serve-log-level (below INFO: no line per request).
    logging = {"log_level": args.serve_log_level}
    # One proxy, on the head node: several nodes of one machine (a local multi-node cluster) would
    # each bind the same port otherwise; a real cluster puts a balancer in front of every node's.
    proxies = {"proxy_location": "HeadOnly"} if getattr(args, "head_proxy_only", False) else {}
    serve.start(http_options={"host": args.host, "port": args.port}, logging_config=logging,
                **proxies)
    app = ServedModel.options(num_replicas=replicas,
                              max_ongoing_requests=args.max_batch * args.streams,
                              health_check_period_s=args.health_check_s).bind(model_config(args))
    serve.run(app, name=APP, route_prefix="/", logging_config=logging)
    return replicas


def stop():
    serve.shutdown()
    ray.shutdown()


def add_arguments(ap):
    ap.add_argument("--replicas", type=int, default=None,
                    help="replicas (default: one per GPU; --device sim: 2)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="Ray Serve's HTTP port")
    ap.add_argument("--address", default=None,
                    help="a running Ray cluster to join (default: start a local one)")
    ap.add_argument("--ray-logs", action="store_true",
                    help="show the workers' output here (Ray's log_to_driver)")
    ap.add_argument("--health-check-s", type=float, default=10.0,
                    help="how often Ray Serve checks each replica (health_check_period_s): a "
                         "replica that died is replaced after the next check")
    ap.add_argument("--serve-log-level", default="WARNING",
                    help="Ray Serve's log level (proxy, replicas)")
    served_model.add_model_arguments(ap)


def check_arguments(ap, args):
    for name in ("replicas", "streams", "max_batch"):
        value = getattr(args, name)
        if value is not None and value < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.window_ms < 0:
        ap.error(f"--window-ms must be >= 0, got {args.window_ms:g}")
    if args.health_check_s <= 0:
        ap.error(f"--health-check-s must be > 0, got {args.health_check_s:g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    args = ap.parse_args()
    check_arguments(ap, args)
    replicas = start(args)
    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    print(f"ray_serve_model: {replicas} replicas, device {args.device}, "
          f"Ray {ray.__version__}", flush=True)
    print(f"{LISTENING}http://{args.host}:{args.port}/", flush=True)
    stopped.wait()
    stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
