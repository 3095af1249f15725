#!/usr/bin/env bash
# Checks evr's install + package config the way a user meets them:
#   1. configure and build evr (sim-only preset, no tests/examples/bench) in build/install-check;
#   2. cmake --install into a temporary prefix, then move that prefix elsewhere (relocatable?);
#   3. configure, build and run tests/consumer (find_package(evr CONFIG REQUIRED), evr::evr)
#      with -DCMAKE_PREFIX_PATH=<moved prefix>.
# Environment: EVR_JOBS=N (default nproc), EVR_KEEP_TMP=1 (keep the temporary folder).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
src_dir="$PWD"
build_dir="build/install-check"
jobs="${EVR_JOBS:-$(nproc 2>/dev/null || echo 2)}"
step() { echo "==> [check-install.sh] $*"; }

tmp="$(mktemp -d "${TMPDIR:-/tmp}/evr-install-check.XXXXXX")"
cleanup() {
  if [[ "${EVR_KEEP_TMP:-0}" == 1 ]]; then
    echo "check-install: kept $tmp"
  else
    rm -rf "$tmp"
  fi
}
trap cleanup EXIT

step "configure evr: cmake --preset sim-only -B $build_dir (tests, examples, bench off)"
cmake --preset sim-only -B "$build_dir" \
  -DEVR_BUILD_TESTS=OFF -DEVR_BUILD_EXAMPLES=OFF -DEVR_BUILD_BENCH=OFF >/dev/null

step "build evr: cmake --build $build_dir -j $jobs"
cmake --build "$build_dir" -j "$jobs"

step "install: cmake --install $build_dir --prefix $tmp/staged, then move it to $tmp/prefix"
cmake --install "$build_dir" --prefix "$tmp/staged" >/dev/null
mv "$tmp/staged" "$tmp/prefix"
prefix="$tmp/prefix"

fail() {
  echo "check-install: FAILED: $*" >&2
  exit 1
}
config="$(find "$prefix" -name evrConfig.cmake -print -quit)"
[[ -n "$config" ]] || fail "no evrConfig.cmake under the prefix"
[[ -f "$(dirname "$config")/evrConfigVersion.cmake" ]] || fail "no evrConfigVersion.cmake"
[[ -f "$prefix/include/evr/device/error.hpp" ]] || fail "headers missing (include/evr/device/error.hpp)"
[[ -n "$(find "$prefix" -name 'libevr.*' -print -quit)" ]] || fail "no libevr.* under the prefix"
# The exported targets must not point back into the source or build tree.
if grep -rl -e "$src_dir" -e "$tmp/staged" "$(dirname "$config")"/evrTargets*.cmake; then
  fail "the exported targets above name the source, build or staging folder"
fi
echo "check-install: installed $(find "$prefix" -type f | wc -l) files; package config at ${config#"$prefix"/}"

step "configure the consumer: cmake -S tests/consumer -DCMAKE_PREFIX_PATH=$prefix"
cmake -S tests/consumer -B "$tmp/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON

step "build the consumer"
cmake --build "$tmp/consumer" -j "$jobs"

step "run the consumer"
"$tmp/consumer/evr_consumer"

step "passed"
