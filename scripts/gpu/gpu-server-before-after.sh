#!/usr/bin/env bash
# The example server before and after a change, measured in one run on a GPU machine (figures of
# different runs do not compare):
#
#   git archive -o .prev/before.tgz REV                        # the tree before the change
#   scripts/gpu/stage-deps.sh && scripts/gpu/stage-tools.sh    # once: headers and wrk
#   bash scripts/gpu/gpu-server-before-after.sh RESULTS_DIR         # on the GPU machine
#
# On a GPU machine without a package registry, stage the headers and wrk on a machine that has one
# and copy .deps, .tools and .prev along (all git-ignored).
#
# Builds evr-async-server from .prev/before.tgz and from this tree (Release, CUDA, sm_90, headers
# from .deps/include), then measures both with scripts/study/server-study.py, alternating before, after,
# before, after so that drift between rounds shows: the servers EVR_SBA_SERVERS (labels separated
# by ';', default "evr N=1;evr N=4;pool auto N=4"), the routes EVR_SBA_ROUTES (default
# "/busy?us=1000 /mlp?seed=1"), EVR_SBA_CONNECTIONS (default "256 1024"), EVR_SBA_SECONDS per
# point (default 2), EVR_SBA_ROUNDS (default 2). Prints one row per point: requests/s, p99 and server CPU per request of each
# round, and after/before (the rounds' means), also into compare.txt. All of it goes into
# RESULTS_DIR/server-before-after.tgz (one archive, to keep the output folder small). EVR_SBA_DEVICE=sim
# runs it on the simulated device (a test of this script, without CUDA).
set -uo pipefail
if [[ $# -ne 1 || ! -f .prev/before.tgz ]]; then
  echo "usage: $0 RESULTS_DIR   (with .prev/before.tgz made by git archive)" >&2
  exit 2
fi
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
root=$PWD
mkdir -p "$1" && results_dir="$(cd "$1" && pwd)"
work="$(mktemp -d)"
trap 'tar czf "$results_dir/server-before-after.tgz" -C "$work" .' EXIT
device="${EVR_SBA_DEVICE:-auto}"
IFS=';' read -r -a servers <<<"${EVR_SBA_SERVERS:-evr N=1;evr N=4;pool auto N=4}"
read -r -a routes <<<"${EVR_SBA_ROUTES:-/busy?us=1000 /mlp?seed=1}"
read -r -a connections <<<"${EVR_SBA_CONNECTIONS:-256 1024}"
seconds="${EVR_SBA_SECONDS:-2}"
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

# build SIDE SOURCE: evr-async-server of the tree in SOURCE, in build/sba-SIDE.
build() {
  local side=$1 src=$2 flags=(-DCMAKE_BUILD_TYPE=Release -DEVR_BUILD_TESTS=OFF
    -DEVR_BUILD_BENCH=OFF -DEVR_BUILD_PYTHON=OFF)
  [[ -f "$root/.deps/include/asio.hpp" ]] && flags+=(-DEVR_THIRD_PARTY_INCLUDE_DIR="$root/.deps/include")
  if [[ "$device" != sim ]]; then
    flags+=(-DEVR_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
  else
    flags+=(-DEVR_WITH_CUDA=OFF)
  fi
  { cmake -S "$src" -B "build/sba-$side" -G Ninja "${flags[@]}" &&
    cmake --build "build/sba-$side" --target evr-async-server -j "$(nproc)"; } \
    >"$work/build-$side.log" 2>&1 || { echo "$side: the build failed"; tail -20 "$work/build-$side.log"; exit 1; }
}
rm -rf build/sba-before-tree && mkdir -p build/sba-before-tree &&
  tar xzf .prev/before.tgz -C build/sba-before-tree
build before build/sba-before-tree
build after "$root"

rounds="${EVR_SBA_ROUNDS:-2}"
for round in $(seq 1 "$rounds"); do
  for side in before after; do
    echo "==> round $round, $side"
    python3 scripts/study/server-study.py run --bin "build/sba-$side/examples/evr-async-server" \
      --device "$device" --servers "${servers[@]}" --routes "${routes[@]}" \
      --connections "${connections[@]}" --seconds "$seconds" --budget 240 --no-plot \
      --out "$work/$side-$round" >"$work/$side-$round.log" 2>&1 ||
      echo "($side, round $round: server-study.py reported errors: see $side-$round.log)"
  done
done

python3 - "$work" "$rounds" <<'EOF' | tee "$work/compare.txt"
import json, os, sys
work, rounds = sys.argv[1], int(sys.argv[2])
names = [f"{side}-{r}" for r in range(1, rounds + 1) for side in ("before", "after")]
runs = {}
for name in names:
    path = os.path.join(work, name, "server-study.json")
    if os.path.exists(path):
        with open(path) as f:
            runs[name] = {(p["server"], p["route"], p["connections"]): p
                          for p in json.load(f)["points"] if "rps" in p}
keys = sorted({k for r in runs.values() for k in r})
def cell(run, key, field, scale=1.0):
    p = runs.get(run, {}).get(key)
    v = p.get(field) if p else None
    return v * scale if v is not None else None
def mean(vals):
    vals = [v for v in vals if v is not None]
    return sum(vals) / len(vals) if vals else None
fmt = lambda v, d=0: "-" if v is None else f"{v:.{d}f}"
short = " ".join(n[0] + n.split("-")[1] for n in names)
print(f"{'server':16} {'route':14} {'conns':>5} | req/s: {' '.join(names)} "
      f"after/before | p99 ms: {short} | cpu us/req: {short} after/before")
for k in keys:
    rps = [cell(r, k, "rps") for r in names]
    p99 = [cell(r, k, "p99_us", 1e-3) for r in names]
    cpu = [cell(r, k, "cpu_us_per_request") for r in names]
    b, a = mean(rps[0::2]), mean(rps[1::2])
    ratio = fmt(a / b, 3) if a and b else "-"
    cb, ca = mean(cpu[0::2]), mean(cpu[1::2])
    cpu_ratio = fmt(ca / cb, 3) if ca and cb else "-"
    print(f"{k[0]:16} {k[1]:14} {k[2]:>5} | {' '.join(fmt(v) for v in rps)} {ratio} | "
          f"{' '.join(fmt(v, 2) for v in p99)} | {' '.join(fmt(v, 1) for v in cpu)} {cpu_ratio}")
EOF
