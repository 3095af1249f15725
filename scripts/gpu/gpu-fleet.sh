#!/usr/bin/env bash
# The fleet on a GPU machine (docs/deploy.md, "On the GPU"): two server processes sharing the GPU
# (or a process per GPU) behind HAProxy and on one port, against one process with the same io
# threads (scripts/study/fleet-bench.py), then the rolling-restart tests under that load
# (examples/deploy/rolling_restart_test.py, one_port_test.py).
#
#   scripts/gpu/stage-deps.sh && scripts/gpu/stage-tools.sh && scripts/gpu/stage-haproxy.sh  # once
#   bash scripts/gpu/gpu-fleet.sh RESULTS_DIR                                       # on the GPU machine
#
# On a GPU machine without a package registry, stage the headers, wrk and HAProxy on a machine that
# has one and copy .deps and .tools along (both git-ignored).
#
# EVR_FLEET_BIN: a built evr-async-server (e.g. the one scripts/gpu/gpu-server-before-after.sh
# built on the same machine, build/sba-after/...); otherwise it is built here (Release, CUDA,
# sm_90).
# EVR_FLEET_DEVICE (default cuda; sim: a test of this script without a GPU), EVR_FLEET_SECONDS
# per fleet-bench point (default 6), EVR_FLEET_ROUNDS (default 2), EVR_FLEET_HAPROXY_THREADS
# (HAProxy's nbthread per fleet row, default "auto,0": a quarter of the CPUs, and HAProxy's own
# default), EVR_FLEET_HAPROXY_MODES (http, tcp or http,tcp; default http), EVR_FLEET_ROLLING_MODES
# (the rolling restarts' HAProxy modes, "http tcp"; default http), EVR_FLEET_SKIP_ROLLING=1 (the
# bench only). EVR_FLEET_PER_GPU=1: a process per GPU (--devices i) against one process serving
# every GPU, EVR_FLEET_THREADS io threads in all (default 2; per GPU: 4 a GPU), routes
# EVR_FLEET_ROUTES (default "/busy?us=1000"; per GPU also /mlp), EVR_FLEET_CONNECTIONS (256; per
# GPU 1024), wrk threads EVR_FLEET_WRK_THREADS (4; per GPU 8), EVR_FLEET_WARM_CONNECTIONS (the
# warm-up's connections, 32: every process behind the port gets some). Logs and JSON under
# RESULTS_DIR.
set -uo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: $0 RESULTS_DIR" >&2
  exit 2
fi
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
mkdir -p "$1" && results_dir="$(cd "$1" && pwd)"
device="${EVR_FLEET_DEVICE:-cuda}"
if [[ -z "${EVR_HAPROXY:-}" ]]; then
  if [[ -x .tools/haproxy/haproxy ]]; then
    export EVR_HAPROXY="$PWD/.tools/haproxy/haproxy"
  elif ! command -v haproxy >/dev/null; then
    echo "gpu-fleet: no HAProxy (stage it with scripts/gpu/stage-haproxy.sh, then copy .tools along)" >&2
    exit 2
  fi
fi
bin="${EVR_FLEET_BIN:-}"
if [[ -z "$bin" ]]; then
  flags=(-DCMAKE_BUILD_TYPE=Release -DEVR_BUILD_TESTS=OFF -DEVR_BUILD_BENCH=OFF -DEVR_BUILD_PYTHON=OFF)
  [[ -f .deps/include/asio.hpp ]] && flags+=(-DEVR_THIRD_PARTY_INCLUDE_DIR="$PWD/.deps/include")
  if [[ "$device" == sim ]]; then
    flags+=(-DEVR_WITH_CUDA=OFF)
  else
    flags+=(-DEVR_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
  fi
  { cmake -S . -B build/fleet -G Ninja "${flags[@]}" &&
    cmake --build build/fleet --target evr-async-server -j "$(nproc)"; } >"$results_dir/build.log" 2>&1 ||
    { echo "gpu-fleet: the build failed"; tail -20 "$results_dir/build.log"; exit 1; }
  bin=build/fleet/examples/evr-async-server
fi
rc=0
per_gpu=() processes=2 threads=${EVR_FLEET_THREADS:-2} routes=${EVR_FLEET_ROUTES:-"/busy?us=1000"}
connections=${EVR_FLEET_CONNECTIONS:-256} wrk_threads=${EVR_FLEET_WRK_THREADS:-4}
if [[ "${EVR_FLEET_PER_GPU:-0}" == 1 ]]; then
  if [[ "$device" == sim ]]; then
    processes=2
    per_gpu=(--per-gpu --server-args "--sim-devices 2")
  else
    processes=$(nvidia-smi -L | grep -c '^GPU')
    per_gpu=(--per-gpu)
  fi
  threads=${EVR_FLEET_THREADS:-$((4 * processes))}
  routes=${EVR_FLEET_ROUTES:-"/busy?us=1000 /mlp"}
  connections=${EVR_FLEET_CONNECTIONS:-1024}
  wrk_threads=${EVR_FLEET_WRK_THREADS:-8}
fi
for route in $routes; do
  name=$(echo "$route" | tr -c 'a-z0-9\n' '-' | sed 's/^-*//; s/-*$//')
  echo "==> fleet-bench $route: $processes processes behind HAProxy (and on one port) vs 1 process, $threads io threads in all${per_gpu:+, a process per GPU}"
  python3 scripts/study/fleet-bench.py --bin "$bin" --device "$device" --processes "$processes" \
    --threads "$threads" --route "$route" --connections "$connections" \
    --wrk-threads "$wrk_threads" --seconds "${EVR_FLEET_SECONDS:-6}" \
    --rounds "${EVR_FLEET_ROUNDS:-2}" --haproxy-threads "${EVR_FLEET_HAPROXY_THREADS:-auto,0}" \
    --haproxy-modes "${EVR_FLEET_HAPROXY_MODES:-http}" \
    --warm-connections "${EVR_FLEET_WARM_CONNECTIONS:-32}" \
    "${per_gpu[@]}" --out "$results_dir/fleet-$name" 2>&1 | tee "$results_dir/fleet-$name.log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
done
[[ "${EVR_FLEET_SKIP_ROLLING:-0}" == 1 ]] && exit $rc
for mode in ${EVR_FLEET_ROLLING_MODES:-http}; do
  echo "==> rolling restart under /busy?us=1000 at 256 connections, HAProxy in mode $mode"
  python3 examples/deploy/rolling_restart_test.py --bin "$bin" --device "$device" \
    --route "/busy?us=1000" --connections 256 --seconds 20 \
    --haproxy-mode "$mode" --out "$results_dir/rolling-$mode" 2>&1 | tee "$results_dir/rolling-$mode.log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
done
echo "==> rolling restart on one port (--reuse-port, no balancer) under the same load"
python3 examples/deploy/one_port_test.py --bin "$bin" --device "$device" \
  --route "/busy?us=1000" --connections 256 --seconds 10 --only-ambient \
  --out "$results_dir/rolling-one-port" 2>&1 | tee "$results_dir/rolling-one-port.log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
exit $rc
