#!/usr/bin/env bash
# ctest: the server's self-test on a GPU (every answer compared with the CPU's), in the mode its
# arguments name. Skipped (exit 77) on a machine without a usable CUDA device; failed when a route
# meant to run as a CUDA graph fell back to eager launches (the server says so on stderr), since
# the test is then not testing the graph.
#   cuda_self_test.sh SERVER [ARGS...]
set -uo pipefail
server=$1
shift
out=$("$server" --device cuda "$@" 2>&1)
rc=$?
printf '%s\n' "$out" | tail -n 4
if [[ $rc -ne 0 && $out == *"no usable CUDA device"* ]]; then
  echo "cuda_self_test: skipped: no usable CUDA device"
  exit 77
fi
if [[ $out == *"as a CUDA graph failed"* ]]; then
  echo "cuda_self_test: FAILED: a capture failed, so its route ran eagerly"
  exit 1
fi
exit $rc
