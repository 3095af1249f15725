#!/usr/bin/env bash
# The test command: configure, build and test evr with a CMake preset (CMakePresets.json).
#
#   scripts/test.sh          # preset "release": Release, CUDA backend when the toolkit is found
#   scripts/test.sh asan     # ASan + UBSan, simulated device only (build/asan)
#   scripts/test.sh tsan     # ThreadSanitizer, simulated device only (build/tsan)
#   scripts/test.sh boost    # the tests against Boost.Asio (evr::evr_boost; libboost1.81-dev)
#   scripts/test.sh clang    # Clang 14 (clang++-14), simulated device (build/clang)
#   scripts/test.sh dev|sim-only|gpu
#   scripts/test.sh asan -R sim_   # anything after the preset goes to ctest
#   scripts/test.sh asio=DIR # the whole suite (library, tests, examples, bench, Python) against
#                            # the standalone Asio in DIR (DIR/asio.hpp: an unpacked release's
#                            # include/, or /usr/include for Debian's), preset sim-only, in
#                            # build/asio-<version>; then the demo (self-test + compare line)
#
# Environment:
#   EVR_JOBS=N        parallel build jobs (default: nproc)
#   EVR_TEST_JOBS=N   tests run at once by ctest (default: EVR_JOBS); the tests hold under a full
#                     competing load (scripts/ci/test-under-load.sh), so running them side by side
#                     only shortens the run
#   EVR_ASIO_PRESET=P mode asio=DIR: the preset it starts from (sim-only, release or dev; default
#                     sim-only), build/asio-<version>-P when not sim-only
#   EVR_SKIP_DEPS=1   do not run scripts/install-deps.sh
#   EVR_FRESH=1       reconfigure from scratch (cmake --fresh)
#   EVR_WERROR=1      warnings of evr's own code fail the build (-DEVR_WARNINGS_AS_ERRORS=ON; CI)
#   EVR_BOOST_ROOT=D  preset boost: the Boost under D (D/include/boost, D/lib/.../cmake/Boost-*),
#                     not the system's (Debian 12 keeps Boost 1.74 beside python3-matplotlib)
#
# Exits non-zero when any step fails, a test included.
set -euo pipefail

preset="${1:-release}"
shift || true

# Mode asio=DIR: a preset (EVR_ASIO_PRESET, default sim-only) with -DEVR_ASIO_INCLUDE=DIR, in a
# build folder of its own named after the Asio version, so that Debian's Asio (build/release ...)
# and another one (build/asio-1.38.2) are kept side by side.
asio_dir=""
if [[ "$preset" == asio=* ]]; then
  asio_dir="${preset#asio=}"
  if [[ ! -f "$asio_dir/asio/version.hpp" ]]; then
    echo "test.sh: asio=$asio_dir: no asio/version.hpp there (give the folder that holds asio.hpp)" >&2
    exit 2
  fi
  asio_dir="$(cd "$asio_dir" && pwd)"  # before the cd below: DIR may be relative to the caller
  preset="${EVR_ASIO_PRESET:-sim-only}"
  case "$preset" in
    sim-only | release | dev) ;;
    *)
      echo "test.sh: EVR_ASIO_PRESET=$preset: mode asio=DIR starts from sim-only, release or dev" >&2
      exit 2
      ;;
  esac
fi

cd "$(dirname "${BASH_SOURCE[0]}")/.."

case "$preset" in
  release | dev | sim-only | clang | boost | asan | tsan | gpu) ;;
  -h | --help)
    sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "test.sh: unknown preset '$preset' (release, dev, sim-only, clang, boost, asan, tsan, gpu, asio=DIR)" >&2
    exit 2
    ;;
esac

jobs="${EVR_JOBS:-$(nproc 2>/dev/null || echo 2)}"
test_jobs="${EVR_TEST_JOBS:-$jobs}"
build_dir="build/$preset"
start=$SECONDS
name="$preset"

cmake_args=()
if [[ -n "$asio_dir" ]]; then
  # "#define ASIO_VERSION 103802 // 1.38.2"
  asio_number="$(sed -n 's/^# *define ASIO_VERSION \([0-9][0-9]*\).*/\1/p' "$asio_dir/asio/version.hpp")"
  asio_version="$((asio_number / 100000)).$((asio_number / 100 % 1000)).$((asio_number % 100))"
  build_dir="build/asio-$asio_version"
  [[ "$preset" == sim-only ]] || build_dir+="-$preset"
  name="asio=$asio_dir"
  cmake_args=(-B "$build_dir" -DEVR_ASIO_INCLUDE="$asio_dir")
fi

step() { echo "==> [test.sh $name] $*"; }

deps_args=()
if [[ "$preset" == boost && -n "${EVR_BOOST_ROOT:-}" ]]; then
  cmake_args+=(-DBoost_ROOT="$EVR_BOOST_ROOT")
elif [[ "$preset" == boost ]]; then
  deps_args=(--boost)
fi
if [[ "${EVR_WERROR:-0}" == 1 ]]; then
  cmake_args+=(-DEVR_WARNINGS_AS_ERRORS=ON)
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

if [[ -n "$asio_dir" ]]; then
  step "build: cmake --build $build_dir -j $jobs"
  cmake --build "$build_dir" -j "$jobs"
else
  step "build: cmake --build --preset $preset -j $jobs"
  cmake --build --preset "$preset" -j "$jobs"
fi

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

if [[ -n "$asio_dir" ]]; then
  # The test presets' settings (release, sim-only, dev: no environment), on this build folder.
  step "test: ctest --test-dir $build_dir --output-on-failure --no-tests=error -j $test_jobs $*"
  ctest --test-dir "$build_dir" --output-on-failure --no-tests=error -j "$test_jobs" "$@"
  # The demo as scripts/demo.sh runs it (its self-test, then the compare line): non-zero unless
  # its last line says "result: OK".
  demo=("$build_dir/examples/evr-async-server" --self-test 2000 --connections 16 --compare)
  step "demo: ${demo[*]}"
  "${demo[@]}"
else
  step "test: ctest --preset $preset --output-on-failure -j $test_jobs $*"
  "${runner[@]}" ctest --preset "$preset" --output-on-failure -j "$test_jobs" "$@"
fi

step "passed in $((SECONDS - start)) s"
