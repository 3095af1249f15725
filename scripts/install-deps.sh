#!/usr/bin/env bash
# Installs what a fresh Debian 12 (or Ubuntu) machine needs to build and test evr.
#
#   scripts/install-deps.sh            # the build + test set
#   scripts/install-deps.sh --demo     # only what the demo needs (scripts/demo.sh)
#   scripts/install-deps.sh --extras   # also the extras (python3-matplotlib: plots)
#   scripts/install-deps.sh --boost    # also Boost (libboost1.81-dev: the Boost.Asio front end)
#   scripts/install-deps.sh --packaging  # also what building the Python sdist/wheel offline needs
#                                        # (scripts/ci/check-python-package.sh)
#   scripts/install-deps.sh --check    # only report what is missing; exit 1 if anything is
#
# Environment:
#   EVR_DEPS_EXTRAS=1  same as --extras
#   EVR_SKIP_DEPS=1    do nothing (headers staged elsewhere, e.g. .deps/ from
#                      scripts/gpu/stage-deps.sh on a machine without a package registry)
#   EVR_DEPS_ALLOW_REMOVE=1  let apt remove packages that conflict (a disposable CI machine);
#                      by default nothing is removed (see --no-remove below)
#
# Idempotent: asks dpkg first and only runs `apt-get update && apt-get install` when a package is
# missing. Needs root, or sudo that works without a password; otherwise it names the packages and
# exits 1. Never reads stdin (CI=true, no terminal).
set -euo pipefail

# libhttp-parser-dev: the HTTP layer of examples/async_server; python3-prometheus-client: the ctest
# that parses its /metrics page (run with Debian's /usr/bin/python3). python3-dev, pybind11-dev: the
# Python binding (python/); pytest, pytest-asyncio, aiohttp, uvloop: its tests, example and bench;
# numpy and wrk: the served-model example (its model, and the load on it).
# doxygen: the API reference (scripts/docs.sh). clang-14, libclang-rt-14-dev: libFuzzer for the
# example server's HTTP parsing (scripts/ci/fuzz-http.sh). haproxy: the balancer of the rolling-restart
# test (examples/deploy/).
readonly base_packages=(cmake ninja-build g++ libasio-dev libconcurrentqueue-dev doctest-dev libcli11-dev
  libhttp-parser-dev python3-prometheus-client python3-dev pybind11-dev python3-pytest
  python3-pytest-asyncio python3-aiohttp python3-uvloop python3-numpy wrk doxygen clang-14
  libclang-rt-14-dev haproxy)
readonly extra_packages=(python3-matplotlib)
# The demo (scripts/demo.sh): the library and the example server, nothing else.
readonly demo_packages=(cmake ninja-build g++ libasio-dev libconcurrentqueue-dev libcli11-dev
  libhttp-parser-dev)
# Debian 12 has Boost 1.74 (libboost-dev) and 1.81; 1.74's Asio (1.18) is older than evr needs.
# One libboost*-dev at a time (see --no-remove below).
readonly boost_packages=(libboost1.81-dev)
# The Python package built and installed the way users do, offline (python/README.md): build
# (python3 -m build), venv, and the build requirements of python/pyproject.toml from Debian.
readonly packaging_packages=(python3-build python3-venv python3-wheel python3-setuptools python3-pybind11)

want_extras="${EVR_DEPS_EXTRAS:-0}"
want_demo_only=0
want_boost=0
want_packaging=0
check_only=0
for arg in "$@"; do
  case "$arg" in
    --extras) want_extras=1 ;;
    --demo) want_demo_only=1 ;;
    --boost) want_boost=1 ;;
    --packaging) want_packaging=1 ;;
    --check) check_only=1 ;;
    -h | --help)
      sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "install-deps: unknown argument '$arg' (try --help)" >&2
      exit 2
      ;;
  esac
done

if [[ "${EVR_SKIP_DEPS:-0}" == 1 ]]; then
  echo "install-deps: EVR_SKIP_DEPS=1, skipping"
  exit 0
fi

packages=("${base_packages[@]}")
if [[ "$want_demo_only" == 1 ]]; then
  packages=("${demo_packages[@]}")
fi
if [[ "$want_extras" == 1 ]]; then
  packages+=("${extra_packages[@]}")
fi
if [[ "$want_boost" == 1 ]]; then
  packages+=("${boost_packages[@]}")
fi
if [[ "$want_packaging" == 1 ]]; then
  packages+=("${packaging_packages[@]}")
fi

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "install-deps: no dpkg here (not Debian/Ubuntu); make sure these are installed:" \
    "${packages[*]} (or stage headers with scripts/gpu/stage-deps.sh)" >&2
  exit 0
fi

missing=()
for pkg in "${packages[@]}"; do
  status="$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)"
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$pkg")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all present (${packages[*]})"
  exit 0
fi

if [[ "$check_only" == 1 ]]; then
  echo "install-deps: missing: ${missing[*]}" >&2
  exit 1
fi

if [[ "$(id -u)" -eq 0 ]]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  echo "install-deps: missing packages: ${missing[*]}" >&2
  echo "install-deps: installing them needs root. Run:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  echo "(or set EVR_SKIP_DEPS=1 if the headers come from elsewhere)" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null
# --no-remove: never take other packages away to make room. On Debian 12 libboost1.81-dev and
# libboost1.74-dev (libboost-dev) exclude each other, and python3-matplotlib needs the latter
# (python3-scipy -> python3-pythran -> libboost-dev): installing one side would silently remove
# the other.
no_remove=(--no-remove)
if [[ "${EVR_DEPS_ALLOW_REMOVE:-0}" == 1 ]]; then
  no_remove=()
fi
if ! "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${no_remove[@]}" \
  --no-install-recommends "${missing[@]}" </dev/null; then
  echo "install-deps: apt-get could not install ${missing[*]} (see apt's messages above)" >&2
  if [[ " ${missing[*]} " == *" libboost1.81-dev "* || " ${missing[*]} " == *" python3-matplotlib "* ]]; then
    echo "install-deps: (Debian 12 has one Boost at a time: libboost1.81-dev, which the Boost.Asio" >&2
    echo "  tests need, replaces libboost1.74-dev, which python3-matplotlib pulls in). Choose one and" >&2
    echo "  run apt-get install yourself (or set EVR_DEPS_ALLOW_REMOVE=1), or point CMake at another" >&2
    echo "  Boost (EVR_BOOST_ROOT for scripts/test.sh boost and scripts/ci/check-install.sh)." >&2
  fi
  echo "install-deps: without a package registry, stage the headers elsewhere with" \
    "scripts/gpu/stage-deps.sh and copy .deps/ here" >&2
  exit 1
fi
echo "install-deps: done"
