#!/usr/bin/env bash
# Builds the API reference: HTML in build/docs/html (open build/docs/html/index.html).
#
#   scripts/docs.sh
#
# * C++: Doxygen (Debian's doxygen) over the public headers only (docs/api/Doxyfile: what
#   include/evr/evr.hpp names public, the sender headers, <evr/sim/device.hpp>; evr::detail and
#   detail/ folders excluded). Each header's opening comment is its file page (docs/api/filter.py).
# * Python: `pydoc -w` of the evr package (docstrings) into build/docs/html/python/, and a page
#   "Python API" with the type stubs (python/evr/__init__.pyi) verbatim. pydoc imports the built
#   package: the first of build/{release,sim-only,dev}/python that has evr/_evr*.so, else the
#   module is built here (build/docs-python, simulated device only).
# * Checks (docs/api/check_docs.py): any Doxygen warning — an undocumented public member
#   (WARN_IF_UNDOCUMENTED) or a broken reference — fails, except those listed in
#   docs/api/known-undocumented.txt (and a listed one that is gone fails too); every public name
#   of include/evr/evr.hpp must be in the reference. With that list empty, Doxygen itself runs with
#   WARN_AS_ERROR=FAIL_ON_WARNINGS.
#
# Environment: EVR_JOBS=N (building the Python module; default 2), EVR_SKIP_DEPS=1 (do not
# install doxygen). Exits non-zero when a step or a check fails.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
src_dir="$PWD"
docs_dir="$src_dir/build/docs"
jobs="${EVR_JOBS:-2}"
step() { echo "==> [docs.sh] $*"; }

if ! command -v doxygen >/dev/null 2>&1; then
  if [[ "${EVR_SKIP_DEPS:-0}" != 1 && "$(id -u)" == 0 ]]; then
    step "installing doxygen (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q doxygen >/dev/null ||
      { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q doxygen >/dev/null; }
  else
    echo "docs.sh: doxygen is missing (Debian: apt-get install doxygen, or scripts/install-deps.sh)" >&2
    exit 1
  fi
fi

rm -rf "$docs_dir"
mkdir -p "$docs_dir/html/python"

# ---- Python: the built package, its docstrings (pydoc) and its stubs --------------------------
python_dir=""
for b in release sim-only dev; do
  if compgen -G "build/$b/python/evr/_evr*.so" >/dev/null; then
    python_dir="build/$b/python"
    python_exe="$(sed -n 's/^Python3_EXECUTABLE:FILEPATH=//p' "build/$b/CMakeCache.txt")"
    break
  fi
done
if [[ -z "$python_dir" ]]; then
  step "no built Python module: building it in build/docs-python (simulated device only)"
  cmake -S . -B build/docs-python -G Ninja -DCMAKE_BUILD_TYPE=Release -DEVR_WITH_CUDA=OFF \
    -DEVR_BUILD_PYTHON=ON -DEVR_BUILD_TESTS=OFF -DEVR_BUILD_EXAMPLES=OFF -DEVR_BUILD_BENCH=OFF \
    >"$docs_dir/python-configure.log"
  cmake --build build/docs-python -j "$jobs" --target evr_python
  python_dir="build/docs-python/python"
  python_exe="$(sed -n 's/^Python3_EXECUTABLE:FILEPATH=//p' build/docs-python/CMakeCache.txt)"
fi
python_exe="${python_exe:-python3}"
step "pydoc -w evr evr.sim (the package in $python_dir, $python_exe)"
(cd "$docs_dir/html/python" && PYTHONPATH="$src_dir/$python_dir" PYTHONDONTWRITEBYTECODE=1 \
  "$python_exe" -m pydoc -w evr evr.sim >/dev/null)
for page in evr.html evr.sim.html; do
  [[ -s "$docs_dir/html/python/$page" ]] || { echo "docs.sh: pydoc wrote no $page" >&2; exit 1; }
done
{
  echo "# Python API {#python_api}"
  echo
  echo "The \`evr\` package: \`await evr.wait(stream)\` for asyncio, \`evr.wait_future\`,"
  echo "\`evr.release_after\`, \`evr.Reactor\`, and \`evr.sim\` (the simulated device). The guide is"
  echo "\`docs/python.md\`."
  echo
  echo "* <a href=\"python/evr.html\">evr</a>: every function and class with its docstring (pydoc)"
  echo "* <a href=\"python/evr.sim.html\">evr.sim</a>: the simulated device (pydoc)"
  echo
  echo "## Type stubs (python/evr/__init__.pyi)"
  echo
  echo '```{.py}'
  cat python/evr/__init__.pyi
  echo '```'
} >"$docs_dir/python.md"

# ---- C++: Doxygen ---------------------------------------------------------------------------
known="$(grep -cv '^\(#\|$\)' docs/api/known-undocumented.txt || true)"
warn_as_error=NO
if [[ "$known" == 0 ]]; then
  warn_as_error=FAIL_ON_WARNINGS
fi
step "doxygen docs/api/Doxyfile ($(doxygen --version); WARN_AS_ERROR=$warn_as_error, $known known gaps)"
EVR_DOCS_OUT="$docs_dir" EVR_SOURCE_DIR="$src_dir" EVR_DOCS_WARN_AS_ERROR="$warn_as_error" \
  doxygen docs/api/Doxyfile
step "checks (docs/api/check_docs.py)"
python3 docs/api/check_docs.py "$src_dir" "$docs_dir"
step "done: $docs_dir/html/index.html"
