#!/usr/bin/env bash
# The fleet on a GPU machine (issue 40; docs/deploy.md, "On the GPU"): two server processes
# sharing the GPU behind HAProxy against one process with the same io threads (scripts/study/fleet-bench.py),
# then the rolling-restart test under that load (examples/deploy/rolling_restart_test.py).
#
#   scripts/gpu/stage-deps.sh && scripts/gpu/stage-tools.sh && scripts/gpu/stage-haproxy.sh  # once
#   bash scripts/gpu/gpu-fleet.sh OUTDIR                                       # on the GPU machine
#
# On a GPU machine without a package registry, stage the headers, wrk and HAProxy on a machine that
# has one and copy .deps and .tools along (both git-ignored).
#
# EVR_FLEET_BIN: a built evr-async-server (e.g. the one scripts/gpu/gpu-server-before-after.sh
# built on the same machine, build/sba-after/...); otherwise it is built here (Release, CUDA,
# sm_90).
# EVR_FLEET_DEVICE (default cuda; sim: a test of this script without a GPU), EVR_FLEET_SECONDS
# per fleet-bench point (default 6), EVR_FLEET_ROUNDS (default 2), EVR_FLEET_HAPROXY_THREADS
# (HAProxy's nbthread per fleet row, default "0,4"; 0: its default), EVR_FLEET_SKIP_ROLLING=1 (the
# bench only). Logs and JSON under OUTDIR.
set -uo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
mkdir -p "$1" && out="$(cd "$1" && pwd)"
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
    cmake --build build/fleet --target evr-async-server -j "$(nproc)"; } >"$out/build.log" 2>&1 ||
    { echo "gpu-fleet: the build failed"; tail -20 "$out/build.log"; exit 1; }
  bin=build/fleet/examples/evr-async-server
fi
rc=0
echo "==> fleet-bench: 2 processes x 1 io thread behind HAProxy (and on one port) vs 1 process x 2 io threads"
python3 scripts/study/fleet-bench.py --bin "$bin" --device "$device" --processes 2 --threads 2 \
  --route "/busy?us=1000" --connections 256 --seconds "${EVR_FLEET_SECONDS:-6}" \
  --rounds "${EVR_FLEET_ROUNDS:-2}" --haproxy-threads "${EVR_FLEET_HAPROXY_THREADS:-0,4}" \
  --out "$out/fleet-bench" 2>&1 | tee "$out/fleet-bench.log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
[[ "${EVR_FLEET_SKIP_ROLLING:-0}" == 1 ]] && exit $rc
echo "==> rolling restart under /busy?us=1000 at 256 connections"
python3 examples/deploy/rolling_restart_test.py --bin "$bin" --device "$device" \
  --route "/busy?us=1000" --connections 256 --seconds 20 --skip-reuse-port \
  --out "$out/rolling" 2>&1 | tee "$out/rolling.log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
exit $rc
