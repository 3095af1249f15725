#!/usr/bin/env bash
# The CUDA runtime linked statically (EVR_CUDA_RUNTIME=static, the default) against the shared
# one it replaced, measured in one run on a GPU machine (figures of different runs do not
# compare). Both trees are this one; only the link differs:
#
#   scripts/gpu/stage-deps.sh                       # once (.deps: headers)
#   bash scripts/gpu/gpu-cudart-compare.sh RESULTS_DIR   # on the GPU machine
#
# On a GPU machine without a package registry, stage the headers on a machine that has one and copy
# the git-ignored .deps/ along.
#
# Steps (each under `timeout`, all within EVR_CMP_BUDGET_S, default 560 s):
#   build      build/gpu (static) and build/gpu-shared (shared): evr-bench, evr_python, and in
#              build/gpu the GPU tests
#   gpu-tests  ctest -R gpu in build/gpu: the GPU tests with the static runtime
#   calls      evr-bench calls: shared, static, shared, static (host ns per device call / submit)
#   idle       evr-bench idle (EVR_CMP_IDLE_ARGS): shared, then static
#   python     bench/python/bench_await.py on torch (EVR_CMP_PY_ARGS): shared module, static module
# Logs and JSON in RESULTS_DIR (packed into RESULTS_DIR/cudart-compare.tgz; the summary printed at the end).
set -uo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: $0 RESULTS_DIR" >&2
  exit 2
fi
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
mkdir -p "$1" && results_dir="$(cd "$1" && pwd)" || exit 2
work="$(mktemp -d)"
deadline=$((SECONDS + ${EVR_CMP_BUDGET_S:-560}))
python="$(command -v python3)"
idle_args=${EVR_CMP_IDLE_ARGS:-"--streams 1 --lengths-us 200,1000,5000,20000 --no-irregular --no-idle-case --lockstep-streams 16,64 --lockstep-lengths-us 1000,5000,20000 --methods default,signal --deliveries post --scale 0.5"}
py_args=${EVR_CMP_PY_ARGS:-"--kernels-us 200,1000,5000 --samples 200 --many 2000"}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
[[ -x /usr/local/cuda/bin/nvcc ]] && export PATH="/usr/local/cuda/bin:$PATH"
trap 'tar czf "$results_dir/cudart-compare.tgz" -C "$work" . 2>/dev/null' EXIT
status=()

run() {  # NAME LIMIT COMMAND...: logs into $work/NAME.log
  local name="$1" limit="$2" left=$((deadline - SECONDS))
  shift 2
  ((left < 10)) && { status+=("$name: skipped (no time)"); return 1; }
  ((limit > left)) && limit=$left
  echo "==> [cudart-compare] $name: $*"
  timeout --kill-after=10 "$limit" "$@" > "$work/$name.log" 2>&1
  local rc=$?
  status+=("$name: $([[ $rc -eq 0 ]] && echo ok || echo "FAIL (rc $rc)")")
  return $rc
}

configure() {  # DIR RUNTIME
  cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEVR_WITH_CUDA=ON -DEVR_CUDA_RUNTIME="$2" \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DEVR_THIRD_PARTY_INCLUDE_DIR="$PWD/.deps/include" \
    -DEVR_BUILD_PYTHON=ON -DPython3_EXECUTABLE="$python" -DEVR_BUILD_EXAMPLES=OFF
}
run build 300 bash -c "$(declare -f configure); configure build/gpu static && configure build/gpu-shared shared &&
  cmake --build build/gpu --target evr-bench evr_python evr_gpu_tests -j $(nproc) &&
  cmake --build build/gpu-shared --target evr-bench evr_python -j $(nproc)" || { printf '%s\n' "${status[@]}"; tail -30 "$work/build.log"; exit 1; }
for b in gpu gpu-shared; do
  echo "$b: evr-bench NEEDED $(readelf -d build/$b/bench/evr-bench | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
done | tee "$work/needed.txt"

run gpu-tests 120 ctest --test-dir build/gpu -R gpu --output-on-failure
grep -E "tests passed|Passed|Failed" "$work/gpu-tests.log" | tail -4

for round in 1 2; do
  run "calls-shared-$round" 60 build/gpu-shared/bench/evr-bench calls --json "$work/calls-shared-$round.json"
  run "calls-static-$round" 60 build/gpu/bench/evr-bench calls --json "$work/calls-static-$round.json"
done
# shellcheck disable=SC2086 # argument lists
{
  run idle-shared 200 build/gpu-shared/bench/evr-bench idle $idle_args --json "$work/idle-shared.json"
  run idle-static 200 build/gpu/bench/evr-bench idle $idle_args --json "$work/idle-static.json"
  run python-shared 150 env PYTHONPATH="$PWD/build/gpu-shared/python" "$python" bench/python/bench_await.py --device cuda $py_args --json "$work/python-shared.json"
  run python-static 150 env PYTHONPATH="$PWD/build/gpu/python" "$python" bench/python/bench_await.py --device cuda $py_args --json "$work/python-static.json"
}

echo "== calls (ns per call, p50): shared vs static, two rounds each"
"$python" - "$work" <<'PY'
import json, sys, os
w = sys.argv[1]
rows = {}
for name in ("shared-1", "static-1", "shared-2", "static-2"):
    p = os.path.join(w, f"calls-{name}.json")
    if os.path.exists(p):
        for r in json.load(open(p))["rows"]:
            rows.setdefault(r["call"], {})[name] = r["p50_ns"]
print(f"{'call':22}" + "".join(f"{n:>11}" for n in ("shared-1", "static-1", "shared-2", "static-2")))
for call, v in rows.items():
    print(f"{call:22}" + "".join(f"{v.get(n, float('nan')):11.1f}" for n in ("shared-1", "static-1", "shared-2", "static-2")))
PY
for b in shared static; do
  echo "== idle rows, $b runtime"
  grep -E "^  (evr default|evr signal|floor)|met|MISSED" "$work/idle-$b.log" | cut -c1-160 | head -60
done
for b in shared static; do
  echo "== python rows, $b runtime"
  grep -E "^(kernel|sync|evr|evr-nospin|executor) |goal" "$work/python-$b.log" | head -30
done
printf '%s\n' "${status[@]}"
