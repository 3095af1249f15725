#!/usr/bin/env bash
# What runs ON a GPU machine: build, tests, benches and examples. On a machine without a package
# registry, stage the headers with scripts/gpu/stage-deps.sh on a machine that has one and copy the
# git-ignored .deps/ along:
#
#   scripts/gpu/stage-deps.sh                       # once: fills the git-ignored .deps/include
#   bash scripts/gpu/gpu-run.sh RESULTS_DIR              # on the GPU machine, .deps/ beside the tree
#
# Steps, each under `timeout` and inside one overall budget (EVR_GPU_BUDGET_S, default 500 s):
#   info       nvidia-smi -L, the device line, nvcc/cmake versions
#   configure  build/gpu: Release, EVR_WITH_CUDA=ON, sm_90, headers from .deps/include (= preset gpu)
#   build      all cores
#   ctest      everything, GPU tests included; a skipped test counts as a failure here (there is a
#              GPU), unless EVR_ALLOW_SKIP=1; EVR_SKIP_CTEST=1 skips the step
#   bench-*    build/gpu/bench/evr-bench pool --json RESULTS_DIR/pool.json, then latency, throughput and
#              cpu when `evr-bench --help` names them (or as listed in EVR_BENCH_SUBCOMMANDS)
#              (evr-bench idle, the work-length sweep, gets up to EVR_IDLE_TIMEOUT_S, default 420 s;
#              throughput 150 s, the others 90 s each; EVR_BENCH_TIMEOUT_S_<sub> overrides one;
#              EVR_BENCH_ARGS_<sub> adds arguments to one subcommand)
#   example-*  every executable in build/gpu/examples, no arguments (EVR_SKIP_EXAMPLES="a b" skips
#              some, EVR_SKIP_EXAMPLES=all every one)
# Each step's output is tee'd into RESULTS_DIR/<step>.log; a failing step is remembered and the run goes
# on (after a failed configure/build the rest is skipped). A summary table ends the output and is
# written to RESULTS_DIR/summary.txt. Exit status: 0 only if every step passed.
#
# To keep the output folder small, when RESULTS_DIR holds more than EVR_OUT_MAX_FILES files (default 8)
# the logs are packed into one archive, RESULTS_DIR/logs.tar.gz, and only the failed steps' logs (as
# many as fit) stay as plain files.
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 RESULTS_DIR" >&2
  exit 2
fi
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
mkdir -p "$1" || exit 2
results_dir="$(cd "$1" && pwd)"
root="$PWD"
build_dir="build/gpu"
budget="${EVR_GPU_BUDGET_S:-500}"
deadline=$((SECONDS + budget))
max_files="${EVR_OUT_MAX_FILES:-8}"
export PYTHONUNBUFFERED=1

if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

names=() states=() times=()
any_failed=0
failed_logs=()

record() {  # name state seconds
  names+=("$1") states+=("$2") times+=("$3")
  if [[ "$2" != ok && "$2" != "skipped (by request)" ]]; then
    any_failed=1
    [[ -f "$results_dir/$1.log" ]] && failed_logs+=("$1.log")
  fi
}

# run_step NAME BUDGET_S COMMAND... : runs it under timeout, tees into RESULTS_DIR/NAME.log.
run_step() {
  local name="$1" limit="$2"
  shift 2
  local left=$((deadline - SECONDS))
  if ((left < 5)); then
    echo "==> [gpu-run] $name: skipped, the overall budget (${budget} s) is spent"
    record "$name" "skipped (no time)" 0
    return 1
  fi
  ((limit > left)) && limit=$left
  echo "==> [gpu-run] $name: $* (timeout ${limit} s)"
  local t0=$SECONDS rc
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$results_dir/$name.log"
  rc=${PIPESTATUS[0]}
  local took=$((SECONDS - t0))
  if ((rc == 0)); then
    record "$name" ok "$took"
  elif ((rc == 124 || rc == 137)); then
    record "$name" "TIMEOUT (${limit} s)" "$took"
  else
    record "$name" "FAIL (rc $rc)" "$took"
  fi
  return "$rc"
}

skip_step() {  # name why
  echo "==> [gpu-run] $1: skipped ($2)"
  record "$1" "skipped ($2)" 0
}

# --- info ----------------------------------------------------------------------------------------
# shellcheck disable=SC2016  # expanded by the inner bash
run_step info 30 bash -c '
  nvidia-smi -L
  echo "device: $(nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader)"
  echo "nvcc: $(nvcc --version | tail -n 1)"
  echo "cmake: $(cmake --version | head -n 1), ninja $(ninja --version), $(c++ --version | head -n 1)"
  echo "cpus: $(nproc)"'

# --- configure + build -----------------------------------------------------------------------------
deps_dir="$root/.deps/include"
if [[ ! -f "$deps_dir/asio.hpp" ]]; then
  echo "gpu-run: $deps_dir/asio.hpp is missing: stage it with scripts/gpu/stage-deps.sh and copy .deps along" >&2
fi
built=0
if run_step configure 90 cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DEVR_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DEVR_THIRD_PARTY_INCLUDE_DIR="$deps_dir"; then
  if run_step build 300 cmake --build "$build_dir" -j "$(nproc)"; then
    built=1
  fi
else
  skip_step build "configure failed"
fi

# --- tests ---------------------------------------------------------------------------------------
if ((built)) && [[ "${EVR_SKIP_CTEST:-0}" == 1 ]]; then
  skip_step ctest "by request"  # EVR_SKIP_CTEST=1: not a failure
elif ((built)); then
  if run_step ctest 240 ctest --test-dir "$build_dir" --output-on-failure; then
    if [[ "${EVR_ALLOW_SKIP:-0}" != 1 ]] && grep -qE '\*\*\*Skipped|Not Run|SKIPPED:' "$results_dir/ctest.log"; then
      echo "gpu-run: a test was skipped on the GPU machine (see ctest.log); counting that as a failure"
      states[${#states[@]} - 1]="FAIL (test skipped)"
      any_failed=1
      failed_logs+=(ctest.log)
    fi
  fi
else
  skip_step ctest "no build"
fi

# --- bench ---------------------------------------------------------------------------------------
bench="$build_dir/bench/evr-bench"
if ((built)) && [[ -x "$bench" ]]; then
  subcommands=(pool)
  if [[ -n "${EVR_BENCH_SUBCOMMANDS:-}" ]]; then
    read -r -a subcommands <<<"$EVR_BENCH_SUBCOMMANDS"
  else
    help="$(timeout 10 "$bench" --help 2>&1 || true)"
    for sub in latency throughput cpu idle; do
      if grep -qw -- "$sub" <<<"$help"; then
        subcommands+=("$sub")
      fi
    done
  fi
  for sub in "${subcommands[@]}"; do
    limit=90
    [[ "$sub" == throughput ]] && limit=150
    [[ "$sub" == idle ]] && limit="${EVR_IDLE_TIMEOUT_S:-420}"
    timeout_var="EVR_BENCH_TIMEOUT_S_${sub}"
    limit="${!timeout_var:-$limit}"
    # Extra arguments per subcommand: EVR_BENCH_ARGS_<sub>, e.g. EVR_BENCH_ARGS_idle="--variant ...".
    extra_var="EVR_BENCH_ARGS_${sub}"
    read -r -a extra <<<"${!extra_var:-}"
    run_step "bench-$sub" "$limit" "$bench" "$sub" "${extra[@]}" --json "$results_dir/$sub.json"
  done
elif ((built)); then
  echo "==> [gpu-run] bench: $bench not built, nothing to run"
fi

# --- examples ------------------------------------------------------------------------------------
if ((built)) && [[ -d "$build_dir/examples" ]] && [[ "${EVR_SKIP_EXAMPLES:-}" != all ]]; then
  while IFS= read -r example; do
    name="$(basename "$example")"
    if [[ " ${EVR_SKIP_EXAMPLES:-} " == *" $name "* ]]; then
      skip_step "example-$name" "by request"
      continue
    fi
    run_step "example-$name" 60 "$example"
  done < <(find "$build_dir/examples" -maxdepth 1 -type f -perm -u+x | sort)
fi

# --- summary -------------------------------------------------------------------------------------
{
  printf '%-28s %-30s %6s\n' step result seconds
  printf '%-28s %-30s %6s\n' ---- ------ -------
  for i in "${!names[@]}"; do
    printf '%-28s %-30s %6s\n' "${names[$i]}" "${states[$i]}" "${times[$i]}"
  done
  if ((any_failed)); then
    echo "gpu-run: FAILED ($SECONDS s)"
  else
    echo "gpu-run: all passed ($SECONDS s)"
  fi
} | tee "$results_dir/summary.txt"

# Keep the output folder small (at most EVR_OUT_MAX_FILES files): the logs go into one archive.
file_count="$(find "$results_dir" -type f | wc -l)"
if ((file_count > max_files)); then
  (cd "$results_dir" && tar -czf logs.tar.gz ./*.log)
  keep=()
  room=$((max_files - $(find "$results_dir" -type f ! -name '*.log' | wc -l)))
  for log in "${failed_logs[@]}"; do
    ((${#keep[@]} < room)) && keep+=("$log")
  done
  for log in "$results_dir"/*.log; do
    [[ " ${keep[*]} " == *" $(basename "$log") "* ]] || rm -f "$log"
  done
  echo "gpu-run: $file_count files in $results_dir; logs packed into logs.tar.gz${keep[*]:+, kept ${keep[*]}}"
fi

exit "$any_failed"
