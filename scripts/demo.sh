#!/usr/bin/env bash
# The demo command: install dependencies, build the release preset (build/release) and run the
# main demo: the async HTTP server (examples/async_server). First its self-test: malformed
# requests, 2000 checked requests over every route (/busy kernels of known length, /mlp inference
# in dynamic batches on cuBLAS, /saxpy, /sum), a shutdown with requests in flight. Then one line
# that compares evr with a blocking thread pool on a GPU-bound route, same thread count, same
# load (GET /busy?us=2000, 256 connections, 1 server thread each). Runs on the GPU when there is
# one, on the simulated device otherwise, and says which. Arguments replace the default ones.
#
# Environment: EVR_JOBS=N (build jobs, default nproc), EVR_SKIP_DEPS=1 (skip install-deps).
# With a .deps/include folder (scripts/stage-deps.sh) its headers are used and nothing is installed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

preset=release
build_dir="build/$preset"
jobs="${EVR_JOBS:-$(nproc 2>/dev/null || echo 2)}"
target=evr-async-server
step() { echo "==> [demo.sh] $*"; }

# A machine without a package registry (the lent GPU machine) brings the headers staged by
# scripts/stage-deps.sh in .deps/include: use them instead of apt.
configure_args=()
if [[ -d .deps/include ]]; then
  step "dependencies: staged headers in .deps/include (scripts/stage-deps.sh)"
  configure_args=(-DEVR_THIRD_PARTY_INCLUDE_DIR="$PWD/.deps/include")
elif [[ "${EVR_SKIP_DEPS:-0}" != 1 ]]; then
  step "dependencies (scripts/install-deps.sh)"
  bash scripts/install-deps.sh
fi

step "configure: cmake --preset $preset -> $build_dir"
cmake --preset "$preset" "${configure_args[@]}" >/dev/null

step "build: cmake --build --preset $preset --target $target -j $jobs"
cmake --build --preset "$preset" --target "$target" -j "$jobs"

args=("$@")
if [[ ${#args[@]} -eq 0 ]]; then
  args=(--self-test 2000 --connections 16 --compare)
fi
step "run: $build_dir/examples/$target ${args[*]}"
exec "$build_dir/examples/$target" "${args[@]}"
