#!/usr/bin/env bash
# Many streams, before and after a change, in one run on a GPU machine (figures of different
# runs do not compare): the GPU tests of this tree, then `evr-bench idle` of the tree
# before (1 stream and 16 / 64 streams in lockstep: default posted, plain and inline, the
# thread-per-stream baselines), of this tree (the same, plus device-signalled waits and the
# default with host_event_waits off), and of this tree with CUDA_DEVICE_MAX_CONNECTIONS=32.
#
#   git archive -o .prev/before.tgz REV           # the tree before (git-ignored); its bench/ must
#                                                 # have the lockstep rows (this tree's will do)
#   scripts/gpu/stage-deps.sh                     # once: headers in .deps
#   bash scripts/gpu/gpu-many-streams.sh RESULTS_DIR   # on the GPU machine
#
# On a GPU machine without a package registry, stage the headers on a machine that has one and
# copy .deps and .prev along (both git-ignored).
#
# Writes RESULTS_DIR/{build,gpu-tests,before,after,conn32}.log and the three JSON files (8 files in
# all), and prints the rows side by side (scripts/study/idle-compare.py) and the goals.
set -u
if [[ $# -ne 1 || ! -f .prev/before.tgz ]]; then
  echo "usage: $0 RESULTS_DIR   (with .prev/before.tgz made by git archive)" >&2
  exit 2
fi
results_dir=$1; root=$PWD; mkdir -p "$results_dir"
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi -L
cfg() { cmake -S "$1" -B "$1/build/b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEVR_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DEVR_THIRD_PARTY_INCLUDE_DIR="$root/.deps/include" \
    -DEVR_BUILD_PYTHON=OFF -DEVR_BUILD_EXAMPLES=OFF "${@:2}"; }
mkdir -p /tmp/before && tar xzf .prev/before.tgz -C /tmp/before
t0=$SECONDS
{ (cfg /tmp/before -DEVR_BUILD_TESTS=OFF && cmake --build /tmp/before/build/b --target evr-bench -j 8) > /tmp/bb.log 2>&1 & pb=$!
  (cfg "$root" -DEVR_BUILD_TESTS=ON && cmake --build "$root/build/b" --target evr-bench evr_gpu_tests -j 12) > /tmp/ba.log 2>&1
  ra=$?; wait $pb; rb=$?
  echo "builds: after rc $ra, before rc $rb, $((SECONDS - t0)) s"; tail -n 3 /tmp/ba.log /tmp/bb.log; } 2>&1 | tee "$results_dir/build.log"
A=$root/build/b/bench/evr-bench; B=/tmp/before/build/b/bench/evr-bench
(cd build/b && timeout 150 ./tests/evr_gpu_tests 2>&1; echo "evr_gpu_tests rc $?"
 timeout 60 ./tests/evr_gpu_tests --test-suite=poisons_process --no-skip 2>&1; echo "fault suite rc $?") > "$results_dir/gpu-tests.log" 2>&1
grep -E "test cases|rc " "$results_dir/gpu-tests.log"
common="--streams 1 --lengths-us 200,1000,5000,20000 --lockstep-streams 16,64 --deliveries post,plain"
run() { local name=$1 limit=$2; shift 2; local t=$SECONDS
  timeout "$limit" "$@" --json "$results_dir/$name.json" > "$results_dir/$name.log" 2>&1; echo "$name rc $? $((SECONDS - t)) s"; }
run before 200 "$B" idle $common --methods default,blocking-sync,host-func-promise
run after 260 "$A" idle $common --methods default,signal,blocking-sync,host-func-promise --variant no-host-events:host_events=0
CUDA_DEVICE_MAX_CONNECTIONS=32 run conn32 90 "$A" idle --streams 1 --lengths-us 1000 --no-irregular --lockstep-streams 16,64 --methods default,signal --deliveries post,plain --no-idle-case
python3 scripts/study/idle-compare.py "$results_dir/before.json" "$results_dir/after.json" "$results_dir/conn32.json" 2>&1 | cut -c1-400
for f in before after; do echo "== $f goals"; sed -n '/^goals/,$p' "$results_dir/$f.log" | cut -c1-220; done
