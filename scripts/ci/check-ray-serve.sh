#!/usr/bin/env bash
# The served model on Ray Serve (examples/python/ray_serve_model.py), checked on the simulated
# device with a package index at hand:
#
#   scripts/ci/check-ray-serve.sh [more ray_serve_model_check.py arguments]
#
#   1. a fresh venv over Debian's Python (python3 -m venv, no system packages) and, from the
#      index, ray[serve] in the range below with NumPy and aiohttp;
#   2. evr into it: the wheel scripts/ci/check-python-package.sh left (in .ci/run it runs just
#      before), the repaired manylinux one or else the one it built, when one is of this version
#      and fits this Python; else pip install ./python (a build of the module, 35 s here);
#   3. examples/python/ray_serve_model_check.py in that venv: a local Ray, 2 simulated replicas,
#      32 clients with every answer checked, one replica SIGKILLed under the load and replaced
#      (see its docstring);
#   4. the same on a Ray cluster of 4 nodes on this machine (--nodes 4: a head and 3 workers of
#      one GPU each), a worker node that runs a replica removed under the load, its replica
#      restored on a surviving node.
#
# Prints each part's time. Ray Serve checks its replicas' health every second here
# (--health-check-s 1; Ray's default is 10 s), so that the dead one is replaced within seconds.
#
# Environment:
#   EVR_PYTHON=P        the Python of the venv (default /usr/bin/python3, Debian's)
#   EVR_RAY_DIR=D       where the venv and the logs go (default build/ray-serve; the venv is
#                       made again each run)
#   EVR_PKG_DIR=D       where scripts/ci/check-python-package.sh left its wheel (default
#                       build/python-package)
#   EVR_SKIP_DEPS=1     do not run scripts/install-deps.sh
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
repo="$PWD"
start=$SECONDS
# Ray Serve from 2.59: serve.batch's max_concurrent_batches (a batch per stream of a replica) is
# there from 2.48, but with today's protobuf (7) Serve fails to deploy before 2.57 (it reads the
# FieldDescriptor.label protobuf 7 removed), and 2.57-2.58.1 do not install jinja2, which
# `from ray import serve` needs. Below the next major release. Checked with 2.59.0 and 2.60.0.
ray_requirement='ray[serve]>=2.59,<3'
step() { echo "==> [check-ray-serve] $*"; }
fail() {
  echo "check-ray-serve: FAILED: $*" >&2
  exit 1
}
timings=()
timed() {  # timed NAME COMMAND...: runs it, records its wall time; its exit status
  local name="$1" t0=$SECONDS rc=0
  shift
  "$@" || rc=$?
  timings+=("$(printf '%4d s  %s' $((SECONDS - t0)) "$name")")
  return $rc
}

bash scripts/install-deps.sh --packaging

py="${EVR_PYTHON:-/usr/bin/python3}"
dir="${EVR_RAY_DIR:-build/ray-serve}"
pkg_dir="${EVR_PKG_DIR:-build/python-package}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
venv="$dir/venv"
version="$(sed -n 's/^project(evr VERSION \([0-9][0-9.]*\).*/\1/p' CMakeLists.txt)"
[[ -n "$version" ]] || fail "no project(evr VERSION ...) line in CMakeLists.txt"
unset PYTHONPATH

step "1. a fresh venv ($("$py" --version), $py), $ray_requirement from the package index"
rm -rf "$venv"  # a previous run's (not on a fresh clone)
timed "a fresh venv" "$py" -m venv "$venv"
pip_install() { "$venv/bin/pip" install --disable-pip-version-check -q "$@"; }
timed "pip install $ray_requirement numpy aiohttp" pip_install "$ray_requirement" numpy aiohttp ||
  fail "pip install $ray_requirement (a package index is needed)"
"$venv/bin/python" -c 'import ray; print("ray", ray.__version__)'

step "2. evr $version into the venv"
wheel_from=""
for wheels in "$pkg_dir/repaired" "$pkg_dir/dist"; do  # the manylinux wheel, else the one built
  if [[ -d "$wheels" ]] && timed "pip install evr==$version (a wheel in $wheels)" \
    pip_install --no-index --find-links "$wheels" "evr==$version" 2>/dev/null; then
    wheel_from="$wheels"
    break
  fi
done
if [[ -n "$wheel_from" ]]; then
  echo "evr: the wheel of scripts/ci/check-python-package.sh in $wheel_from"
else
  echo "evr: no fitting wheel in $pkg_dir/{repaired,dist}; pip install ./python (builds the module)"
  log="$dir/pip-install-evr.log"
  timed "pip install ./python" pip_install ./python > "$log" 2>&1 ||
    { tail -n 40 "$log"; fail "pip install ./python (log: $log)"; }
fi
(cd "$dir" && "$venv/bin/python" -c 'import evr; print("evr", evr.__version__, evr.__file__)')

step "3. examples/python/ray_serve_model_check.py: 2 simulated replicas, one killed under load"
check() { (cd "$dir" && "$venv/bin/python" "$repo/examples/python/ray_serve_model_check.py" \
  --health-check-s 1 "$@"); }
timed "ray_serve_model_check.py" check "$@" || fail "ray_serve_model_check.py (above)"

step "4. the same on a Ray cluster of 4 nodes on this machine: a worker node lost under load"
timed "ray_serve_model_check.py --nodes 4" check --nodes 4 --replicas 2 --before 1000 --after 500 ||
  fail "ray_serve_model_check.py --nodes 4 (above)"

step "times:"
printf '  %s\n' "${timings[@]}"
step "all passed in $((SECONDS - start)) s"
