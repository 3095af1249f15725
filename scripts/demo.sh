#!/usr/bin/env bash
# The demo command: install dependencies, build the release preset (build/release) and run the
# main demo, build/release/examples/evr-demo. Arguments are passed on to evr-demo.
#
# Environment: EVR_JOBS=N (build jobs, default nproc), EVR_SKIP_DEPS=1 (skip install-deps).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

preset=release
build_dir="build/$preset"
jobs="${EVR_JOBS:-$(nproc 2>/dev/null || echo 2)}"
step() { echo "==> [demo.sh] $*"; }

step "dependencies (scripts/install-deps.sh)"
bash scripts/install-deps.sh

step "configure: cmake --preset $preset -> $build_dir"
cmake --preset "$preset" >/dev/null

if ! cmake --build "$build_dir" --target help | grep -q '^evr-demo:'; then
  echo "demo.sh: the build has no target 'evr-demo' (examples/CMakeLists.txt does not define it yet," \
    "or EVR_BUILD_EXAMPLES is OFF)" >&2
  exit 1
fi

step "build: cmake --build --preset $preset --target evr-demo -j $jobs"
cmake --build --preset "$preset" --target evr-demo -j "$jobs"

step "run: $build_dir/examples/evr-demo $*"
exec "$build_dir/examples/evr-demo" "$@"
