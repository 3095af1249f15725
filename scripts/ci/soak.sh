#!/usr/bin/env bash
# The soak of the simulated device (tests/sim_soak_test.cpp, "soak: many reactor lifetimes ...")
# at a chosen size, in a preset already built by scripts/test.sh:
#
#   scripts/ci/soak.sh release 10000000   # what .ci/run runs (Release)
#   scripts/ci/soak.sh asan 1000000       # ASan + UBSan
#   scripts/ci/soak.sh tsan 1000000       # ThreadSanitizer
#
# Runs build/<preset>/tests/evr_tests with EVR_SOAK_COMPLETIONS=<waits> and the environment of
# the preset's ctest preset (the sanitizers' options, from CMakePresets.json), and prints the
# soak's summary line (waits, completed exactly once, lost, duplicated, seconds, seed). The whole
# output goes to build/<preset>/soak.log; its tail is printed when the soak fails.
#
# Environment:
#   EVR_SOAK_SEED=N        replay a run's random choices (the summary line prints the seed)
#   EVR_SOAK_TIMEOUT=S     give up after S seconds (default 3600): a hang fails instead of blocking
#
# Exits non-zero when the soak fails, times out or prints no summary.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

preset="${1:-}"
waits="${2:-}"
case "$preset" in
  release | dev | sim-only | asan | tsan | gpu) ;;
  *)
    echo "soak.sh: usage: scripts/ci/soak.sh <release|dev|sim-only|asan|tsan|gpu> <waits>" >&2
    exit 2
    ;;
esac
if ! [[ "$waits" =~ ^[0-9]+$ ]] || [[ "$waits" -lt 1 ]]; then
  echo "soak.sh: <waits> must be a positive number of waits, not '$waits'" >&2
  exit 2
fi
binary="build/$preset/tests/evr_tests"
if [[ ! -x "$binary" ]]; then
  echo "soak.sh: $binary is missing: build the preset first (scripts/test.sh $preset)" >&2
  exit 2
fi

# The ctest preset's environment (ASAN_OPTIONS, TSAN_OPTIONS, ...), ${sourceDir} expanded.
while IFS= read -r assignment; do
  [[ -n "$assignment" ]] && export "${assignment?}"
done < <(python3 - "$preset" "$PWD" <<'EOF'
import json, sys
preset, source_dir = sys.argv[1], sys.argv[2]
with open("CMakePresets.json") as f:
    presets = {p["name"]: p for p in json.load(f).get("testPresets", [])}
env, name = {}, preset
while name in presets:  # the preset's own values win over those it inherits
    p = presets[name]
    for k, v in p.get("environment", {}).items():
        env.setdefault(k, v)
    inherits = p.get("inherits", [])
    name = inherits[0] if isinstance(inherits, list) and inherits else inherits or None
for k, v in env.items():
    print(f"{k}={v.replace('${sourceDir}', source_dir)}")
EOF
)

# ThreadSanitizer cannot map its shadow memory when mmap is randomized with more than 28 bits
# (see scripts/test.sh): run without address-space randomization there.
runner=()
if [[ "$preset" == tsan ]]; then
  rnd_bits="$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 28)"
  if [[ "$rnd_bits" -gt 28 ]] && setarch "$(uname -m)" -R true 2>/dev/null; then
    runner=(setarch "$(uname -m)" -R)
  fi
fi

log="build/$preset/soak.log"
echo "==> [soak.sh $preset] EVR_SOAK_COMPLETIONS=$waits $binary -tc=\"soak: many*\" (log: $log)"
start=$SECONDS
rc=0
EVR_SOAK_COMPLETIONS="$waits" timeout "${EVR_SOAK_TIMEOUT:-3600}" \
  "${runner[@]}" "$binary" --test-case="soak: many*" >"$log" 2>&1 || rc=$?
summary="$(grep -m1 '^soak summary:' "$log" || true)"
if [[ $rc -ne 0 || -z "$summary" ]]; then
  tail -n 40 "$log" >&2
  [[ $rc -eq 124 ]] && echo "soak.sh: timed out after ${EVR_SOAK_TIMEOUT:-3600} s" >&2
  echo "==> [soak.sh $preset] FAILED (exit $rc) after $((SECONDS - start)) s" >&2
  exit $((rc == 0 ? 1 : rc))
fi
echo "==> [soak.sh $preset] $summary"
echo "==> [soak.sh $preset] passed in $((SECONDS - start)) s"
