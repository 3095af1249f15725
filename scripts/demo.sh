#!/usr/bin/env bash
# The demo command: install dependencies, build the release preset (build/release) and run the
# main demo: the async HTTP server (examples/async_server) under a short built-in load. Each
# request launches GPU work (copy in, kernel, copy out), co_awaits it through evr on one server
# thread, and checks the answer against the CPU. Runs on the GPU when there is one, on the
# simulated device otherwise, and says which. Arguments replace the default load arguments.
#
# Environment: EVR_JOBS=N (build jobs, default nproc), EVR_SKIP_DEPS=1 (skip install-deps).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

preset=release
build_dir="build/$preset"
jobs="${EVR_JOBS:-$(nproc 2>/dev/null || echo 2)}"
target=evr-async-server
step() { echo "==> [demo.sh] $*"; }

step "dependencies (scripts/install-deps.sh)"
bash scripts/install-deps.sh

step "configure: cmake --preset $preset -> $build_dir"
cmake --preset "$preset" >/dev/null

step "build: cmake --build --preset $preset --target $target -j $jobs"
cmake --build --preset "$preset" --target "$target" -j "$jobs"

args=("$@")
if [[ ${#args[@]} -eq 0 ]]; then
  args=(--self-test 2000 --connections 16)
fi
step "run: $build_dir/examples/$target ${args[*]}"
exec "$build_dir/examples/$target" "${args[@]}"
