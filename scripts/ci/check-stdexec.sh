#!/usr/bin/env bash
# Builds and runs evr's sender against NVIDIA's stdexec on the simulated device:
#
#   scripts/ci/check-stdexec.sh PATH [COMPILER]
#
# PATH: a stdexec checkout (its include/ holds stdexec/ and exec/); evr never vendors or fetches
# it. COMPILER: g++ (default) or clang++. The program (tests/stdexec/main.cpp, built with evr as a
# sub-project in build/stdexec-<compiler>) checks that stdexec takes evr::async_wait as a sender,
# then runs sync_wait, when_all of 64 waits, then chains, continues_on an exec::static_thread_pool,
# stop through a stop source (pending, and before start), exec::when_any, when_all with a failing
# sibling, a refusal as set_error, and 20 000 waits whose stop races their completion. It prints
# one line per check and "stdexec check: OK"; exits non-zero on any failure.
#
# The commit printed is `git -C PATH rev-parse HEAD`, or $EVR_STDEXEC_COMMIT when PATH is not a
# git checkout (an exported tree). Environment: EVR_JOBS=N (default 2).
# Checked with stdexec e92245d5 (2026-08-20): g++ 12 builds it; clang 14 does not (stdexec needs
# clang 16: its README).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

if [[ $# -lt 1 || "$1" == -h || "$1" == --help ]]; then
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
  [[ $# -ge 1 ]] && exit 0
  exit 2
fi
stdexec_dir="$(cd "$1" && pwd)"
compiler="${2:-g++}"
jobs="${EVR_JOBS:-2}"
if [[ ! -f "$stdexec_dir/include/stdexec/execution.hpp" ]]; then
  echo "check-stdexec: $stdexec_dir has no include/stdexec/execution.hpp" >&2
  exit 2
fi
commit="${EVR_STDEXEC_COMMIT:-}"
if [[ -z "$commit" ]]; then
  commit="$(git -C "$stdexec_dir" rev-parse HEAD 2>/dev/null || echo unknown)"
fi

build_dir="build/stdexec-$(basename "$compiler")"
mkdir -p build
echo "==> [check-stdexec.sh] stdexec $commit in $stdexec_dir, $compiler, $build_dir"
cmake -S tests/stdexec -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$compiler" -DSTDEXEC_DIR="$stdexec_dir" -DSTDEXEC_COMMIT="$commit" \
  >"$build_dir.configure.log" 2>&1 || {
  cat "$build_dir.configure.log" >&2
  exit 1
}
cmake --build "$build_dir" -j "$jobs" --target evr_stdexec_check
"$build_dir/evr_stdexec_check"
