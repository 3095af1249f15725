#!/usr/bin/env bash
# The test suite of a preset (its ctest run: evr_tests, the examples' self-tests, the allocation
# test, the Python tests, ...) run several times while a competing load keeps every core busy, so
# that a check that holds only on an idle machine fails here instead of now and then in CI:
#
#   scripts/ci/test-under-load.sh                   # release, 5 runs
#   scripts/ci/test-under-load.sh asan 5            # any preset of scripts/test.sh
#   scripts/ci/test-under-load.sh tsan 10 -R evr_   # anything after <runs> goes to ctest
#
# Builds the preset once (scripts/test.sh <preset> -N: configure, build, list the tests), then
# starts one load process per core (by default a busy loop: a plain shell spinning, at the
# tests' own priority, killed on exit) and runs `ctest --preset <preset> --output-on-failure`
# <runs> times beside them. Each run's output is kept in build/<preset>/under-load/run-<i>.log.
# At the end it prints a summary:
# each run's result and time, then every case that failed — the ctest test, and inside it the
# doctest test case with its first failed assertion, or the pytest test — with the number of
# runs it failed in.
#
# Busy loops take the cores but leave the caches and the memory bus alone. A compiler does not:
# with EVR_LOAD_KIND=compile each load process compiles one of the preset's test files again and
# again instead (as a CI machine that builds the next change beside the tests). The predictive
# scout case failed a CI run beside a parallel build, and passed this script's runs beside busy
# loops; beside a build its first attempt missed 4 times in 25.
#
# Environment:
#   EVR_LOAD_SPINNERS=N  load processes beside the tests (default: nproc; 0: no load)
#   EVR_LOAD_KIND=K      spin (default: busy loops) or compile (compilers, as said above)
#   EVR_LOAD_NO_BUILD=1  use the build folder as it is (built earlier)
#   EVR_JOBS, EVR_SKIP_DEPS, EVR_FRESH, EVR_BOOST_ROOT: as for scripts/test.sh (the build)
#
# Exits 0 when every run passed, 1 when any failed, 2 on bad arguments.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

preset="${1:-release}"
runs="${2:-5}"
shift 2 || shift $# || true
case "$preset" in
  release | dev | sim-only | boost | asan | tsan | gpu) ;;
  -h | --help)
    sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "test-under-load.sh: unknown preset '$preset' (release, dev, sim-only, boost, asan, tsan, gpu)" >&2
    exit 2
    ;;
esac
if ! [[ "$runs" =~ ^[0-9]+$ ]] || [[ "$runs" -lt 1 ]]; then
  echo "test-under-load.sh: <runs> must be a positive number, not '$runs'" >&2
  exit 2
fi
cores="$(nproc 2>/dev/null || echo 2)"
spinners="${EVR_LOAD_SPINNERS:-$cores}"
load_kind="${EVR_LOAD_KIND:-spin}"
if [[ "$load_kind" != spin && "$load_kind" != compile ]]; then
  echo "test-under-load.sh: EVR_LOAD_KIND must be spin or compile, not '$load_kind'" >&2
  exit 2
fi
name="test-under-load.sh $preset"
step() { echo "==> [$name] $*"; }

# The build, once: scripts/test.sh with ctest's -N lists the tests instead of running them.
if [[ "${EVR_LOAD_NO_BUILD:-0}" != 1 ]]; then
  step "build: scripts/test.sh $preset -N"
  bash scripts/test.sh "$preset" -N >/dev/null
fi
[[ -f "build/$preset/CTestTestfile.cmake" ]] ||
  { echo "test-under-load.sh: build/$preset is not built (scripts/test.sh $preset)" >&2; exit 2; }

# As scripts/test.sh: ThreadSanitizer needs address-space randomization off where the kernel
# randomizes mmap with more than 28 bits.
runner=()
if [[ "$preset" == tsan ]]; then
  rnd_bits="$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 28)"
  if [[ "$rnd_bits" -gt 28 ]] && setarch "$(uname -m)" -R true 2>/dev/null; then
    runner=(setarch "$(uname -m)" -R)
  fi
fi

# The competing load: one process per core, same priority as the tests, each in a process group
# of its own (a compiler it started goes with it). Killed on any exit.
load_command='while :; do :; done'
load_dir="build/$preset/under-load-objects"
if [[ "$load_kind" == compile ]]; then
  # The build's own command for one test file, its object and depfile sent elsewhere.
  compile="$(ninja -C "build/$preset" -t commands tests/evr_tests 2>/dev/null |
    grep -m1 '/sim_reactor_test\.cpp\.o ' || true)"
  [[ -n "$compile" ]] ||
    { echo "test-under-load.sh: no compile command for tests/sim_reactor_test.cpp in build/$preset" >&2; exit 2; }
  compile="$(sed -E 's/ -MD -MT [^ ]+ -MF [^ ]+//; s/ -o [^ ]+/ -o "$load_object"/' <<<"$compile")"
  mkdir -p "$load_dir"
  load_command="cd build/$preset && while :; do $compile >/dev/null 2>&1; done"
fi
spinner_pids=()
stop_load() {
  local pid
  for pid in "${spinner_pids[@]}"; do
    kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
  done
  for pid in "${spinner_pids[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  spinner_pids=()
}
trap stop_load EXIT
trap 'exit 130' INT TERM
for ((i = 0; i < spinners; i++)); do
  load_object="$PWD/$load_dir/load-$i.o" setsid bash -c "$load_command" &
  spinner_pids+=($!)
done

logs="build/$preset/under-load"
rm -rf "$logs"
mkdir -p "$logs"
load_name="$([[ $load_kind == spin ]] && echo "busy loops" || echo "compilers")"
step "$runs runs of ctest --preset $preset $*, beside $spinners $load_name on $cores cores (logs: $logs)"
results=()
failed_runs=0
for ((run = 1; run <= runs; run++)); do
  for pid in "${spinner_pids[@]}"; do
    kill -0 "$pid" 2>/dev/null || { echo "test-under-load.sh: a load process died" >&2; exit 1; }
  done
  start=$SECONDS
  rc=0
  "${runner[@]}" ctest --preset "$preset" --output-on-failure "$@" >"$logs/run-$run.log" 2>&1 || rc=$?
  tests="$(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\1 of \2 tests failed/p' "$logs/run-$run.log")"
  [[ $rc -ne 0 ]] && failed_runs=$((failed_runs + 1))
  results+=("run $run: $([[ $rc -eq 0 ]] && echo passed || echo "FAILED (exit $rc)") in $((SECONDS - start)) s${tests:+: $tests}")
  step "${results[-1]}"
done
stop_load

step "summary: $runs runs, $failed_runs failed; $spinners $load_name on $cores cores"
printf '  %s\n' "${results[@]}"
# Each failed case with the runs it failed in. ctest --output-on-failure prints a failed test's
# output after its status line; inside it doctest names the case ("TEST CASE:  ...") before its
# failed assertions ("...: ERROR: ..."), pytest lists "FAILED <test> - <reason>", and a
# sanitizer's report starts with "ERROR: <X>Sanitizer" or "WARNING: ThreadSanitizer".
python3 - "$runs" "$logs"/run-*.log <<'EOF'
import re, sys
runs = int(sys.argv[1])
failed = {}  # case -> {"runs": set(), "first": first error line}
def note(case, run, line):
    entry = failed.setdefault(case, {"runs": set(), "first": line})
    fresh = run not in entry["runs"] and len(entry["runs"]) == 0
    entry["runs"].add(run)
    return entry if fresh else None
status = re.compile(r"^\s*\d+/\d+ Test\s+#\d+: (\S+) \.*\s*(.*)$")
for path in sys.argv[2:]:
    run = int(re.search(r"run-(\d+)\.log$", path).group(1))
    test, case, case_noted = None, None, False
    last = None  # the entry noted last: doctest's "values:" line that follows is added to it
    for raw in open(path, errors="replace"):
        line = raw.rstrip("\n")
        if last is not None and line.strip().startswith("values:"):
            last["first"] += "  " + line.strip()
        last = None
        m = status.match(line)
        if m:
            test, case = m.group(1), None
            verdict = m.group(2).strip()
            if "Passed" not in verdict and "Skipped" not in verdict and "Not Run" not in verdict:
                note(test, run, verdict)
            continue
        if test is None:
            continue
        if line.startswith("TEST CASE:"):
            case, case_noted = line[len("TEST CASE:"):].strip(), False
        elif case and not case_noted and (": ERROR:" in line or "FATAL ERROR" in line
                                          or ": WARNING:" in line):
            last = note(f"{test} :: {case}", run, line.strip())
            case_noted = True  # the first failed assertion of the case, per run
        elif line.startswith("FAILED ") and " - " in line or re.match(r"^FAILED \S+::\S+", line):
            note(f"{test} :: {line[len('FAILED '):].split(' - ')[0]}", run, line.strip())
        elif re.match(r"^(==\d+==)?(ERROR: \w*Sanitizer|WARNING: ThreadSanitizer|SUMMARY: \w*Sanitizer)", line) or "runtime error:" in line:
            note(f"{test} :: {case or '(sanitizer)'} [sanitizer]", run, line.strip())
if not failed:
    print("no failures")
else:
    print("failures by case (runs it failed in / runs; its first error):")
    for case, entry in sorted(failed.items(), key=lambda kv: (-len(kv[1]["runs"]), kv[0])):
        print(f"  {len(entry['runs'])}/{runs}  {case}")
        print(f"        {entry['first'][:300]}")
EOF
[[ $failed_runs -eq 0 ]]
