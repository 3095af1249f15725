#!/usr/bin/env bash
# Checks that evr's Python module (in a wheel, or a .so given directly) needs nothing of the CUDA
# toolkit where it runs: no NEEDED entry for a CUDA library (the runtime is linked statically and
# loads the driver's libcuda.so.1 itself), no RPATH/RUNPATH into a toolkit, and none of the
# runtime's symbols exported (they stay inside the module: --exclude-libs). Prints what it read.
#
#   scripts/ci/check-python-module-deps.sh dist/evr-0.1.0-cp311-cp311-linux_x86_64.whl
#   scripts/ci/check-python-module-deps.sh build/release/python/evr/_evr.cpython-311-x86_64-linux-gnu.so
set -euo pipefail

if [[ $# -ne 1 || ! -f "$1" ]]; then
  echo "usage: $0 WHEEL|MODULE.so" >&2
  exit 2
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
module="$1"
if [[ "$1" == *.whl ]]; then
  python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); n = [m for m in z.namelist() if m.startswith("evr/_evr") and m.endswith(".so")]; assert len(n) == 1, n; open(sys.argv[2], "wb").write(z.read(n[0]))' "$1" "$work/_evr.so"
  module="$work/_evr.so"
fi

dynamic="$(readelf -d "$module")"
needed="$(sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' <<<"$dynamic")"
paths="$(sed -n 's/.*(R\(UN\)\{0,1\}PATH).*\[\(.*\)\]/\2/p' <<<"$dynamic")"
echo "module $(basename "$1"): NEEDED $(tr '\n' ' ' <<<"$needed")"
echo "module $(basename "$1"): RPATH/RUNPATH ${paths:-none}"
bad=0
if grep -Eq '^lib(cuda|cudart|cublas|nvrtc|nvJitLink)' <<<"$needed"; then
  echo "check-python-module-deps: the module NEEDs a CUDA library: $(grep -E '^lib(cuda|cudart|cublas|nvrtc|nvJitLink)' <<<"$needed" | tr '\n' ' ')" >&2
  bad=1
fi
if grep -qi cuda <<<"$paths"; then
  echo "check-python-module-deps: the module's RPATH/RUNPATH names a CUDA folder: $paths" >&2
  bad=1
fi
exported="$(nm -D --defined-only "$module" | awk '{print $3}' | grep -E '^(cuda|cu)[A-Z]' | head -n 5 || true)"
if [[ -n "$exported" ]]; then
  echo "check-python-module-deps: the module exports CUDA runtime symbols (link with --exclude-libs): $(tr '\n' ' ' <<<"$exported")" >&2
  bad=1
fi
if grep -q 'cudaGetDriverEntryPoint\|cudaEventQuery' <(strings "$module"); then
  echo "module $(basename "$1"): the CUDA runtime is inside it (static)"
else
  echo "module $(basename "$1"): no CUDA runtime inside (a build without the CUDA backend)"
fi
exit "$bad"
