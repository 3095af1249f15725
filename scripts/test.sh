#!/usr/bin/env bash
# The test command: configure, build and test evr with a CMake preset (CMakePresets.json).
#
#   scripts/test.sh          # preset "release": Release, CUDA backend when the toolkit is found
#   scripts/test.sh asan     # ASan + UBSan, simulated device only (build/asan)
#   scripts/test.sh tsan     # ThreadSanitizer, simulated device only (build/tsan)
#   scripts/test.sh boost    # the tests against Boost.Asio (evr::evr_boost; libboost1.81-dev)
#   scripts/test.sh dev|sim-only|gpu
#   scripts/test.sh asan -R sim_   # anything after the preset goes to ctest
#
# Environment:
#   EVR_JOBS=N        parallel build jobs (default: nproc)
#   EVR_SKIP_DEPS=1   do not run scripts/install-deps.sh
#   EVR_FRESH=1       reconfigure from scratch (cmake --fresh)
#   EVR_BOOST_ROOT=D  preset boost: the Boost under D (D/include/boost, D/lib/.../cmake/Boost-*),
#                     not the system's (Debian 12 keeps Boost 1.74 beside python3-matplotlib)
#
# Exits non-zero when any step fails, a test included.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

preset="${1:-release}"
shift || true
case "$preset" in
  release | dev | sim-only | boost | asan | tsan | gpu) ;;
  -h | --help)
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "test.sh: unknown preset '$preset' (release, dev, sim-only, boost, asan, tsan, gpu)" >&2
    exit 2
    ;;
esac

jobs="${EVR_JOBS:-$(nproc 2>/dev/null || echo 2)}"
build_dir="build/$preset"
start=$SECONDS

step() { echo "==> [test.sh $preset] $*"; }

deps_args=()
cmake_args=()
if [[ "$preset" == boost && -n "${EVR_BOOST_ROOT:-}" ]]; then
  cmake_args=(-DBoost_ROOT="$EVR_BOOST_ROOT")
elif [[ "$preset" == boost ]]; then
  deps_args=(--boost)
fi
step "dependencies (scripts/install-deps.sh ${deps_args[*]})"
bash scripts/install-deps.sh "${deps_args[@]}"

fresh=()
if [[ "${EVR_FRESH:-0}" == 1 ]]; then
  fresh=(--fresh)
elif [[ -f "$build_dir/CMakeCache.txt" ]] && ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$build_dir/CMakeCache.txt"; then
  fresh=(--fresh)  # a build folder made with another generator cannot be reused
fi

step "configure: cmake --preset $preset ${fresh[*]} -> $build_dir"
cmake --preset "$preset" "${fresh[@]}" "${cmake_args[@]}"

step "build: cmake --build --preset $preset -j $jobs"
cmake --build --preset "$preset" -j "$jobs"

# ThreadSanitizer (gcc 12, clang 14) cannot map its shadow memory when the kernel randomizes mmap
# with more than 28 bits ("FATAL: ThreadSanitizer: unexpected memory mapping"); run the tests with
# address-space randomization off there.
runner=()
if [[ "$preset" == tsan ]]; then
  rnd_bits="$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 28)"
  if [[ "$rnd_bits" -gt 28 ]] && setarch "$(uname -m)" -R true 2>/dev/null; then
    runner=(setarch "$(uname -m)" -R)
    step "note: vm.mmap_rnd_bits=$rnd_bits, running the tests under setarch -R (no ASLR)"
  fi
fi

step "test: ctest --preset $preset --output-on-failure $*"
"${runner[@]}" ctest --preset "$preset" --output-on-failure "$@"

step "passed in $((SECONDS - start)) s"
