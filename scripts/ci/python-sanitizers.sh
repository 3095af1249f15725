#!/usr/bin/env bash
# evr's Python module under the sanitizers: builds the module alone (the library and the binding;
# no tests, examples or bench) with the flags of the asan preset (AddressSanitizer +
# UndefinedBehaviorSanitizer) in build/py-asan and of the tsan preset (ThreadSanitizer) in
# build/py-tsan, then runs python/tests against each build on the simulated device, the soak
# (test_soak.py: random waits, cancellation, faults, loops closed and shutdown from two loop
# threads) at a larger size. The interpreter is not instrumented: the sanitizer's runtime is
# preloaded into it, so what is checked is the module's own C++ (the reactor, the loop sinks, the
# completions crossing from the reactor's thread to the loops'). A sanitizer report or a failed
# test fails it. About a minute per sanitizer on a 2-core machine, most of it the build.
#
#   scripts/ci/python-sanitizers.sh [asan|tsan|both]     # default both
#
# Environment:
#   EVR_PY_SOAK_ROUNDS=N   the soak's rounds (default 60 here; 6 in the ordinary test run)
#   EVR_JOBS=N             build jobs (default: the number of cores)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
which="${1:-both}"
case "$which" in
  asan | tsan) kinds=("$which") ;;
  both) kinds=(asan tsan) ;;
  *)
    echo "python-sanitizers.sh: usage: scripts/ci/python-sanitizers.sh [asan|tsan|both]" >&2
    exit 2
    ;;
esac
# The interpreter the module is built for and tested with: the first that can import pytest
# (as python/CMakeLists.txt chooses for ctest).
python=""
for candidate in /usr/bin/python3 "$(command -v python3 || true)"; do
  if [[ -n "$candidate" ]] && "$candidate" -c "import pytest" 2>/dev/null; then
    python="$candidate"
    break
  fi
done
if [[ -z "$python" ]]; then
  echo "python-sanitizers.sh: no python3 that imports pytest (scripts/install-deps.sh)" >&2
  exit 2
fi
export EVR_PY_SOAK_ROUNDS="${EVR_PY_SOAK_ROUNDS:-60}"
jobs="${EVR_JOBS:-$(nproc)}"

runtime_of() {  # the sanitizer runtimes to preload, for a build kind
  case "$1" in
    asan) echo "$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)" ;;
    tsan) gcc -print-file-name=libtsan.so ;;
  esac
}

for kind in "${kinds[@]}"; do
  build="build/py-$kind"
  echo "==> [python-sanitizers.sh] $kind: building the module in $build"
  mkdir -p "$build"
  cmake --preset "$kind" -B "$build" -DEVR_BUILD_PYTHON=ON -DEVR_BUILD_TESTS=OFF \
    -DEVR_BUILD_EXAMPLES=OFF -DEVR_BUILD_BENCH=OFF -DPython3_EXECUTABLE="$python" >"$build/configure.log" 2>&1 ||
    {
      tail -20 "$build/configure.log"
      exit 1
    }
  cmake --build "$build" -j "$jobs" --target evr_python
  echo "==> [python-sanitizers.sh] $kind: python/tests (soak: $EVR_PY_SOAK_ROUNDS rounds)"
  # ASan: CPython's memory at exit is no leak of evr's. TSan: the preset's options, the pool's
  # suppressions and the module's own (python/tsan-suppressions.txt). Each stops at its first
  # report, which fails the run. Reports go to files ($build/report.<pid>): pytest captures the
  # tests' stderr, and a report that ends the process would be lost with it.
  root="$PWD"
  { cat pool/tsan-suppressions.txt; echo; cat python/tsan-suppressions.txt; } >"$build/tsan-suppressions.txt"
  rm -f "$build"/report.*
  rc=0
  (
    cd python/tests || exit 1
    LD_PRELOAD="$(runtime_of "$kind")" \
      ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:log_path=$root/$build/report" \
      UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$root/$build/report" \
      TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:history_size=4:suppressions=$root/$build/tsan-suppressions.txt:log_path=$root/$build/report" \
      PYTHONPATH="$root/$build/python" PYTHONDONTWRITEBYTECODE=1 \
      "$python" -m pytest -q -p no:cacheprovider .
  ) || rc=$?
  if compgen -G "$build/report.*" >/dev/null; then
    echo "==> [python-sanitizers.sh] $kind: sanitizer report(s):" >&2
    cat "$build"/report.* >&2
    rc=1
  fi
  if [[ $rc -ne 0 ]]; then
    echo "==> [python-sanitizers.sh] $kind: FAILED (exit $rc)" >&2
    exit "$rc"
  fi
  echo "==> [python-sanitizers.sh] $kind: passed"
done
