#!/usr/bin/env bash
# A change that claims "no behaviour change" (or a speed-up), measured against the tree before it
# in one run on a GPU machine (figures of different runs do not compare: the machine drifts):
#
#   git archive -o .prev/before.tgz REV          # the tree before the change (git-ignored)
#   scripts/gpu/stage-deps.sh                     # once: headers for the GPU machine
#   bash scripts/gpu/gpu-before-after.sh RESULTS_DIR   # on the GPU machine
#
# On a GPU machine without a package registry, stage the headers with scripts/gpu/stage-deps.sh on
# a machine that has one; copy .deps and .prev along (both git-ignored).
#
# Steps: scripts/gpu/gpu-run.sh on this tree (build, ctest, evr-bench latency, idle, throughput; no
# examples), then the before tree's evr-bench alone (built from .prev/before.tgz), then the
# benches alternately: idle before, idle after again, latency before, throughput before (the
# after tree's latency and throughput come from gpu-run.sh). Everything is packed into
# RESULTS_DIR/before-after.tgz (one archive, to keep the output folder small). The idle rows of the
# three idle runs are printed at the end. Settings: EVR_BA_IDLE_ARGS, EVR_BA_LATENCY_ARGS,
# EVR_BA_THROUGHPUT_ARGS (defaults below), EVR_GPU_BUDGET_S for gpu-run.sh (default 330).
set -u
if [[ $# -ne 1 || ! -f .prev/before.tgz ]]; then
  echo "usage: $0 RESULTS_DIR   (with .prev/before.tgz made by git archive)" >&2
  exit 2
fi
results_dir=$1; root=$PWD; work=$(mktemp -d); mkdir -p "$results_dir"
idle_args=${EVR_BA_IDLE_ARGS:-"--lengths-us 200,1000,5000,20000 --streams 1,64 --methods default --no-idle-case --deliveries post,plain"}
latency_args=${EVR_BA_LATENCY_ARGS:-"--samples 200"}
throughput_args=${EVR_BA_THROUGHPUT_ARGS:-"--inflight-waits 5000"}
trap 'tar czf "$results_dir/before-after.tgz" -C "$work" .' EXIT

export EVR_SKIP_EXAMPLES=all EVR_GPU_BUDGET_S=${EVR_GPU_BUDGET_S:-330}
export EVR_BENCH_SUBCOMMANDS="latency idle throughput"
export EVR_IDLE_TIMEOUT_S=80 EVR_BENCH_TIMEOUT_S_throughput=80 EVR_BENCH_TIMEOUT_S_latency=60
export EVR_BENCH_ARGS_idle="$idle_args" EVR_BENCH_ARGS_latency="$latency_args"
export EVR_BENCH_ARGS_throughput="$throughput_args"
bash scripts/gpu/gpu-run.sh "$work/after" > "$work/after.log" 2>&1
tail -12 "$work/after.log"

mkdir -p "$work/before-tree" && tar xzf .prev/before.tgz -C "$work/before-tree"
(cd "$work/before-tree" &&
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DEVR_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DEVR_THIRD_PARTY_INCLUDE_DIR="$root/.deps/include" \
    -DEVR_BUILD_PYTHON=OFF -DEVR_BUILD_TESTS=OFF -DEVR_BUILD_EXAMPLES=OFF > "$work/before-build.log" 2>&1 &&
  cmake --build build --target evr-bench -j "$(nproc)" >> "$work/before-build.log" 2>&1) ||
  { echo "before: build failed"; tail -20 "$work/before-build.log"; exit 1; }

before=$work/before-tree/build/bench/evr-bench
after=build/gpu/bench/evr-bench
# shellcheck disable=SC2086  # the argument strings are word lists
{
  timeout 80 "$before" idle $idle_args --json "$work/idle-before.json" > "$work/idle-before.log" 2>&1
  timeout 80 "$after" idle $idle_args --json "$work/idle-after-2.json" > "$work/idle-after-2.log" 2>&1
  timeout 60 "$before" latency $latency_args --json "$work/latency-before.json" > "$work/latency-before.log" 2>&1
  timeout 80 "$before" throughput $throughput_args --json "$work/throughput-before.json" > "$work/throughput-before.log" 2>&1
}
cp "$work/after/bench-idle.log" "$work/idle-after-1.log" 2>/dev/null
for f in "$work"/idle-before.log "$work"/idle-after-1.log "$work"/idle-after-2.log; do
  echo "== $(basename "$f")"
  grep -E "^  evr default.*(post|plain|inline) " "$f" | cut -c1-150
done
