#!/usr/bin/env bash
# The Python binding on a GPU machine whose Python has torch, CuPy, aiohttp, uvloop and pytest
# (e.g. python3 3.12 + pybind11 3.1; pytest-asyncio and a package registry are not needed):
#
#   scripts/gpu/stage-deps.sh                              # once: .deps/include (+ pybind11)
#   scripts/gpu/stage-tools.sh                             # once: .tools (wrk; the served step)
#   bash scripts/gpu/gpu-python.sh RESULTS_DIR                             # on the GPU machine
#   EVR_GPU_PY_STEPS=served bash scripts/gpu/gpu-python.sh RESULTS_DIR     # the served model (wrk)
#
# On a GPU machine without a package registry, stage the headers (and wrk) on a machine that has
# one and copy .deps (and .tools) along (git-ignored).
#
# Steps (each under `timeout`, all within EVR_GPU_PY_BUDGET_S, default 300 s), logs in RESULTS_DIR:
#   configure  build/gpu-python: Release, CUDA on, sm_90, the Python binding only (target evr_python)
#   build      evr_python (nothing to do when an earlier run on the same machine built it)
# then those of EVR_GPU_PY_STEPS (default "pytest bench example"; "served" is the served model's):
#   pytest     python/tests incl. test_gpu.py (torch, CuPy); a skipped GPU test is a failure
#              unless EVR_ALLOW_SKIP=1
#   bench      bench/python/bench_await.py on torch --json RESULTS_DIR/bench_await.json (more arguments:
#              EVR_BENCH_PY_ARGS, e.g. "--kernels-us 1000,5000 --loop uvloop")
#   example    examples/python/aiohttp_server.py --self-test --load 10
#   wheel      the package as a user with only the driver gets it (scripts/gpu/gpu-wheel-as-user.sh;
#              copy .whl from scripts/gpu/stage-wheel-tools.sh and .tools along): the wheel
#              built and repaired here, installed, the toolkit hidden: import orders, torch and
#              CuPy streams, the served model under load; files in RESULTS_DIR/wheel
#   served     examples/python/served_model.py --self-test on torch (answers, bad input, shutdown
#              with requests in flight; step served-test), then served_model_load.py: wrk at
#              16/64/256 connections per mode into RESULTS_DIR/served (step served-load; seconds per
#              point: EVR_SERVED_DURATION, default 8; the servers' arguments, one string:
#              EVR_SERVED_SERVER_ARGS, e.g. "--hidden 8192 --streams 8"; the load script's own:
#              EVR_SERVED_ARGS); its table is printed again at the end
# Files: the steps' logs, bench_await.json, summary.txt; served/ (JSON, table, server logs).
# Exit status 0 only if every step passed.
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 RESULTS_DIR" >&2
  exit 2
fi
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
mkdir -p "$1" || exit 2
results_dir="$(cd "$1" && pwd)"
build_dir="build/gpu-python"
budget="${EVR_GPU_PY_BUDGET_S:-300}"
steps=" ${EVR_GPU_PY_STEPS:-pytest bench example} "
deadline=$((SECONDS + budget))
python="${EVR_PYTHON:-$(command -v python3)}"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

summary=()
failed=0
step() {  # name limit command...
  local name="$1" limit="$2"
  shift 2
  local left=$((deadline - SECONDS))
  if ((left < 5)); then
    summary+=("$(printf '%-10s %s' "$name" "skipped (no time left)")")
    failed=1
    return 1
  fi
  ((limit > left)) && limit=$left
  echo "==> [gpu-python] $name: $* (timeout ${limit} s)"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$results_dir/$name.log"
  local rc=${PIPESTATUS[0]}
  local state=ok
  if ((rc == 124 || rc == 137)); then state="TIMEOUT"; elif ((rc != 0)); then state="FAIL (rc $rc)"; fi
  summary+=("$(printf '%-10s %-16s %4d s' "$name" "$state" $((SECONDS - t0)))")
  [[ "$state" == ok ]] || failed=1
  return "$rc"
}

echo "gpu-python: $("$python" --version) at $python; pybind11 $("$python" -m pybind11 --version 2>/dev/null || echo 'not in this Python')"
ok=0
if step configure 60 cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEVR_WITH_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DEVR_THIRD_PARTY_INCLUDE_DIR="$PWD/.deps/include" \
  -DEVR_BUILD_PYTHON=ON -DEVR_BUILD_TESTS=OFF -DEVR_BUILD_EXAMPLES=OFF -DEVR_BUILD_BENCH=OFF \
  -DPython3_EXECUTABLE="$python"; then
  step build 150 cmake --build "$build_dir" --target evr_python -j "$(nproc)" && ok=1
fi
if ((ok)); then
  export PYTHONPATH="$PWD/$build_dir/python"
  if [[ "$steps" == *" pytest "* ]] &&
    step pytest 90 "$python" -m pytest -q -rs -p no:cacheprovider python/tests; then
    if [[ "${EVR_ALLOW_SKIP:-0}" != 1 ]] && grep -q "SKIPPED.*test_gpu" "$results_dir/pytest.log"; then
      echo "gpu-python: a GPU test was skipped on the GPU machine (see pytest.log): counted as a failure"
      summary[${#summary[@]} - 1]="$(printf '%-10s %s' pytest "FAIL (GPU test skipped)")"
      failed=1
    fi
  fi
  for s in $steps; do
    case "$s" in
      pytest) ;;  # above
      bench)
        # shellcheck disable=SC2086 # EVR_BENCH_PY_ARGS is a list of arguments
        step bench 150 "$python" bench/python/bench_await.py --device cuda \
          --json "$results_dir/bench_await.json" ${EVR_BENCH_PY_ARGS:-}
        ;;
      example) step example 60 "$python" examples/python/aiohttp_server.py --self-test --load 10 ;;
      wheel) step wheel 300 bash scripts/gpu/gpu-wheel-as-user.sh "$results_dir/wheel" ;;
      served)
        step served-test 120 "$python" examples/python/served_model.py --self-test --device cuda
        # The load script stops starting points 20 s before the step's own limit.
        left=$((deadline - SECONDS))
        # shellcheck disable=SC2086 # EVR_SERVED_ARGS is a list of arguments
        step served-load "$left" "$python" examples/python/served_model_load.py --device cuda \
          --out "$results_dir/served" --duration "${EVR_SERVED_DURATION:-8}" --budget $((left - 20)) \
          --server-args="${EVR_SERVED_SERVER_ARGS:-}" ${EVR_SERVED_ARGS:-}
        ;;
      *)
        echo "gpu-python: unknown step '$s' in EVR_GPU_PY_STEPS (pytest bench example served wheel)"
        failed=1
        ;;
    esac
  done
fi
if [[ -f "$results_dir/served/served_model_load.md" ]]; then
  cat "$results_dir/served/served_model_load.md"
fi
{
  printf '%s\n' "${summary[@]}"
  if ((failed)); then echo "gpu-python: FAILED ($SECONDS s)"; else echo "gpu-python: all passed ($SECONDS s)"; fi
} | tee "$results_dir/summary.txt"
exit "$failed"
