#!/usr/bin/env bash
# The example server's HTTP parsing under libFuzzer: builds build/fuzz-http/fuzz-http from
# examples/async_server/fuzz_http.cpp and http.cpp with clang-14 (-fsanitize=fuzzer,address,
# undefined; Debian's clang-14 and libclang-rt-14-dev, Debian's http_parser), then runs it for a
# fixed number of executions, starting from the seed corpus examples/async_server/fuzz/http/
# (requests and responses of the server's edge cases). Any crash, sanitizer report, broken
# invariant of fuzz_http.cpp, leak or input slower than 10 s fails it (exit status not 0), and
# libFuzzer leaves the input that did it in build/fuzz-http/ (crash-*, timeout-*, leak-*).
#
#   scripts/ci/fuzz-http.sh [RUNS]    # RUNS executions, default 1000000 (what .ci/run runs)
#
# Environment:
#   EVR_FUZZ_SEED=N    libFuzzer's random seed (default 1: the same inputs on every run)
#   EVR_FUZZ_CXX=C     the compiler (default clang++-14)
#
# Replay an input: build/fuzz-http/fuzz-http build/fuzz-http/crash-<sha1>
set -euo pipefail

runs="${1:-1000000}"
if ! [[ "$runs" =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz-http.sh: RUNS must be a whole number of executions, not '$runs'" >&2
  exit 2
fi
seed="${EVR_FUZZ_SEED:-1}"
cxx="${EVR_FUZZ_CXX:-clang++-14}"

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
src=examples/async_server
results_dir=build/fuzz-http
if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "fuzz-http.sh: $cxx not found (Debian: apt-get install clang-14 libclang-rt-14-dev," \
    "or scripts/install-deps.sh)" >&2
  exit 2
fi
mkdir -p "$results_dir"
"$cxx" -std=c++20 -O1 -g -Wall -Wextra -fsanitize=fuzzer,address,undefined \
  -fno-sanitize-recover=undefined -fno-omit-frame-pointer \
  "$src/fuzz_http.cpp" "$src/http.cpp" -lhttp_parser -o "$results_dir/fuzz-http"

# A fresh working corpus each time (what libFuzzer adds), the committed seeds read only.
rm -rf "$results_dir/corpus"
mkdir -p "$results_dir/corpus"
start=$SECONDS
rc=0
(cd "$results_dir" && ./fuzz-http -runs="$runs" -seed="$seed" -max_len=9000 -timeout=10 \
  -rss_limit_mb=2048 -print_final_stats=1 corpus "../../$src/fuzz/http") >"$results_dir/last-run.log" 2>&1 ||
  rc=$?
grep -E "^(INFO: Seed|#[0-9]+ +DONE|stat::number_of_executed_units|==[0-9]+==ERROR|SUMMARY|fuzz_http:)" \
  "$results_dir/last-run.log" || true
if [[ "$rc" != 0 ]]; then
  echo "fuzz-http.sh: FAILED (exit $rc): see $results_dir/last-run.log and the crash-*/timeout-*/leak-* input in $results_dir" >&2
  exit 1
fi
echo "fuzz-http.sh: $runs executions without a finding in $((SECONDS - start)) s (seed $seed)"
