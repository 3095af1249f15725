#!/usr/bin/env bash
# Where the reactor thread's CPU goes during an evr-bench run on a GPU machine: perf
# samples the process on the cpu-clock (no hardware counters needed), and the report keeps the
# reactor thread alone (it is named "evr-reactor").
#
#   scripts/gpu/stage-deps.sh; scripts/gpu/stage-perf.sh        # once: headers and perf
#   bash scripts/gpu/gpu-profile.sh RESULTS_DIR idle --device cuda --streams 64 --lengths-us 1000 ...
#
# perf comes from .tools/perf (scripts/gpu/stage-perf.sh). On a GPU machine without a package
# registry, run both staging scripts on a machine that has one and copy .deps and .tools along
# (both git-ignored).
#
# Builds build/gpu (as scripts/gpu/gpu-run.sh does) when its evr-bench is missing. Writes
# RESULTS_DIR/profile.txt (flat, by symbol and library; then by library) and RESULTS_DIR/bench.log.
# EVR_PROFILE_CALLERS=1 adds the callers (DWARF unwinding, bigger and slower).
set -uo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 RESULTS_DIR SUBCOMMAND [evr-bench arguments...]" >&2
  exit 2
fi
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
mkdir -p "$1" || exit 2
results_dir="$(cd "$1" && pwd)"
shift
perf_dir="$PWD/.tools/perf"
if [[ ! -x "$perf_dir/perf" ]]; then
  echo "gpu-profile: $perf_dir/perf is missing: stage it with scripts/gpu/stage-perf.sh and copy .tools along" >&2
  exit 2
fi
perf() { LD_LIBRARY_PATH="$perf_dir/lib" "$perf_dir/perf" "$@"; }
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
bench=build/gpu/bench/evr-bench
if [[ ! -x "$bench" ]]; then
  cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DEVR_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DEVR_THIRD_PARTY_INCLUDE_DIR="$PWD/.deps/include" >/dev/null &&
    cmake --build build/gpu -j "$(nproc)" --target evr-bench >/dev/null || exit 1
fi
callers=()
[[ "${EVR_PROFILE_CALLERS:-0}" == 1 ]] && callers=(--call-graph dwarf,16384)
freq=10000
[[ ${#callers[@]} -gt 0 ]] && freq=2000
perf record -q -e cpu-clock -F "$freq" "${callers[@]}" -o "$results_dir/perf.data" -- \
  "$bench" "$@" >"$results_dir/bench.log" 2>&1
rc=$?
{
  echo "# evr-bench $* (exit $rc); the reactor thread only (comm evr-reactor)"
  perf report -i "$results_dir/perf.data" --comms evr-reactor --no-children --sort dso --stdio 2>/dev/null |
    grep -v '^$' | head -n 30
  perf report -i "$results_dir/perf.data" --comms evr-reactor --no-children --sort sym,dso --stdio \
    2>/dev/null | grep -v '^$' | head -n "${EVR_PROFILE_LINES:-120}"
} >"$results_dir/profile.txt"
rm -f "$results_dir/perf.data"
cat "$results_dir/profile.txt"
exit "$rc"
