#!/usr/bin/env bash
# The demo command: installs what the demo needs, builds the example server in build/demo and
# runs it: the async HTTP server of examples/async_server. First its self-test: malformed
# requests, 2000 checked requests over every route (/busy kernels of known length, /mlp inference
# in dynamic batches on cuBLAS, /saxpy, /sum), a shutdown with requests in flight. Then one line
# that compares evr with a blocking thread pool on a GPU-bound route, same thread count, same
# load (GET /busy?us=2000, 256 connections, 1 server thread each). Runs on the GPU when there is
# one, on the simulated device otherwise, and says which. Arguments replace the default ones.
#
# Environment: EVR_JOBS=N (build jobs, default nproc), EVR_SKIP_DEPS=1 (skip install-deps).
# With a .deps/include folder (scripts/gpu/stage-deps.sh: machines without a package registry)
# its headers are used and nothing is installed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

build_dir=build/demo
jobs="${EVR_JOBS:-$(nproc 2>/dev/null || echo 2)}"
target=evr-async-server
step() { echo "==> [demo.sh] $*"; }

configure_args=(-DCMAKE_BUILD_TYPE=Release -DEVR_BUILD_TESTS=OFF -DEVR_BUILD_BENCH=OFF
  -DEVR_BUILD_PYTHON=OFF)
if [[ -d .deps/include ]]; then
  step "dependencies: staged headers in .deps/include"
  configure_args+=(-DEVR_THIRD_PARTY_INCLUDE_DIR="$PWD/.deps/include")
elif [[ "${EVR_SKIP_DEPS:-0}" != 1 ]]; then
  step "dependencies (scripts/install-deps.sh --demo)"
  bash scripts/install-deps.sh --demo
fi
command -v ninja >/dev/null && configure_args+=(-G Ninja)

step "configure: $build_dir (Release; the library and the examples)"
cmake -S . -B "$build_dir" "${configure_args[@]}" >/dev/null

step "build: $target (-j $jobs)"
cmake --build "$build_dir" --target "$target" -j "$jobs"

args=("$@")
if [[ ${#args[@]} -eq 0 ]]; then
  args=(--self-test 2000 --connections 16 --compare)
fi
step "run: $build_dir/examples/$target ${args[*]}"
exec "$build_dir/examples/$target" "${args[@]}"
