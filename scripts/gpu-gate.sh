#!/usr/bin/env bash
# The GPU gate: one command that shows what a change did. It builds the tree under test and a
# baseline, runs the whole ctest of the tree on the GPU, then measures a fixed set of rows (one
# stream at 200 us-20 ms, 16 and 64 streams in lockstep with 8 and 32 hardware queues, irregular
# work on 1, 16 and 64 streams, the example server against the poll mode at 256 and at 32
# connections, Python on torch) with
# baseline and tree alternated over
# rounds, and prints one table: row, baseline, now, ratio, the rounds' spread and a verdict
# (better / same / WORSE). About 12 minutes on a 16-core machine with one GPU (every group, three
# rounds; a fresh server's unmeasured first second at load adds about 25 s a round).
#
#   scripts/gpu-gate.sh                     # against the tree of the last gate in docs/bench/gate/
#   scripts/gpu-gate.sh --baseline 68abb84  # against a commit (or a .tgz of a tree: git archive)
#   scripts/gpu-gate.sh --all-gpus          # the server rows over every GPU of the host
#   scripts/gpu-gate.sh --sim --baseline self   # the same machinery on the simulated device
#                                               # against itself (CI: the gate cannot rot)
#   scripts/gpu-gate.sh --prepare [REV]     # on a checkout with git: writes .gate/ (the baseline's
#                                           # tree and both commits' names) for a GPU machine
#                                           # that has the working tree but not its history
# Options: --rounds N (3), --budget-s S (660: the whole run, builds included), --out DIR
# (build/gate/out), --tree-build DIR (an existing build of this tree: only the baseline is built),
# --no-ctest, --no-record, --jobs N, --groups A,B (only these groups of rows: idle, "idle, 32
# queues", irregular, server, "server, few connections", python; for a change that cannot reach the
# others, which the record then lacks; and, only when named, lockstep: idle's lockstep rows alone,
# to run them over more rounds); EVR_GATE_CTEST_ARGS: more arguments for ctest (-R, -E).
#
# Writes DIR/gate.{json,md} and the logs (--out); unless --sim or --no-record, also
# docs/bench/gate/DATE-COMMIT.{json,md} (the newest record there is the next gate's default
# baseline). Headers come from .deps/include when present (scripts/gpu/stage-deps.sh: machines
# without a package registry) and wrk from PATH or .tools (scripts/gpu/stage-tools.sh).
# Exit status: 0; 1 a row is WORSE; 2 a row could not be measured; 3 ctest failed (a GPU test
# skipped on a machine with a GPU counts as failed); 4 a build failed; 64 bad arguments.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 64
root=$PWD
t0=$SECONDS
command_line="scripts/gpu-gate.sh $*"

sim=0 all_gpus=0 baseline="" tree_build="" groups="" rounds=3 budget=660 results_dir=build/gate/out ctest=1 record=1 prepare=0
jobs=$(nproc 2>/dev/null || echo 2)
need() { [[ $# -ge 2 && -n "$2" ]] || { echo "gpu-gate: $1 needs a value" >&2; exit 64; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --sim) sim=1 ;;
    --all-gpus) all_gpus=1 ;;
    --baseline) need "$@"; baseline=$2; shift ;;
    --rounds) need "$@"; rounds=$2; shift ;;
    --budget-s) need "$@"; budget=$2; shift ;;
    --out) need "$@"; results_dir=$2; shift ;;
    --tree-build) need "$@"; tree_build=$2; shift ;;
    --jobs) need "$@"; jobs=$2; shift ;;
    --groups) need "$@"; groups=$2; shift ;;
    --no-ctest) ctest=0 ;;
    --no-record) record=0 ;;
    --prepare) prepare=1; [[ $# -ge 2 && "$2" != --* ]] && { baseline=$2; shift; } ;;
    -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu-gate: unknown argument '$1' (try --help)" >&2; exit 64 ;;
  esac
  shift
done
for n in "$rounds" "$budget" "$jobs"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "gpu-gate: --rounds, --budget-s and --jobs take a whole number >= 1, not '$n'" >&2; exit 64; }
done
if [[ $sim -eq 0 ]] && ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
have_git=0
git rev-parse --git-dir >/dev/null 2>&1 && have_git=1

# The baseline: a commit, a tarball, "self" (the tree's own build), or by default the tree of
# the newest record in docs/bench/gate/ (its "tree" field names the commit). Newest: the latest
# date, and of one date's records the one whose commit is the latest in the history (their
# names sort by commit hash, not by time); without the history, the last name.
last_record() {
  python3 - "$have_git" docs/bench/gate/*.json <<'PY'
import json, os, subprocess, sys
have_git, files = sys.argv[1] == "1", sorted(f for f in sys.argv[2:] if os.path.isfile(f))
def commit_time(rev):
    if not have_git:
        return 0
    r = subprocess.run(["git", "log", "-1", "--format=%ct", rev], capture_output=True, text=True)
    return int(r.stdout.strip() or 0) if r.returncode == 0 else 0
records = []
for f in files:
    d = json.load(open(f))
    records.append((d.get("date", ""), commit_time(d["tree"]), f, d["tree"]))
if records:
    print(max(records)[3])
PY
}
[[ -z "$baseline" ]] && baseline=$(last_record)
tree_label() {
  # .gate/tree.rev (written by --prepare) names the tree on a machine that has the files without
  # their history: a copy of the files may hold a .git of another state. Run --prepare again
  # after new commits.
  if [[ -f .gate/tree.rev ]]; then cat .gate/tree.rev
  elif ((have_git)); then
    local rev; rev=$(git rev-parse --short=7 HEAD)
    [[ -n "$(git status --porcelain --untracked-files=no)" ]] && rev+="-dirty"
    echo "$rev"
  else echo tree; fi
}

if ((prepare)); then
  ((have_git)) || { echo "gpu-gate: --prepare needs a git checkout" >&2; exit 64; }
  [[ -n "$baseline" ]] || { echo "gpu-gate: --prepare: no baseline named and no record in docs/bench/gate/" >&2; exit 64; }
  mkdir -p .gate
  rm -f .gate/tree.rev
  git archive -o .gate/baseline.tgz "$baseline" || exit 64
  git rev-parse --short=7 "$baseline" >.gate/baseline.rev
  label=$(tree_label) # before the redirection: it creates the file tree_label reads first
  echo "$label" >.gate/tree.rev
  echo "gpu-gate: .gate/ holds the tree of $(cat .gate/baseline.rev) and names this tree $(cat .gate/tree.rev);"
  echo "gpu-gate: on a machine with these files but not their git history, copy .gate (git-ignored) there too and run scripts/gpu-gate.sh"
  exit 0
fi

mkdir -p build/gate "$results_dir" || exit 64
results_dir=$(cd "$results_dir" && pwd)
base_src="" base_label=""
case "$baseline" in
  "") echo "gpu-gate: no baseline: name one with --baseline (no record in docs/bench/gate/)" >&2; exit 64 ;;
  self) base_label=self ;;
  *.tgz | *.tar.gz)
    [[ -f "$baseline" ]] || { echo "gpu-gate: --baseline $baseline: no such file" >&2; exit 64; }
    base_src=$baseline; base_label=$(basename "$baseline" | sed 's/\.t\(ar\.\)\{0,1\}gz$//')
    # --prepare's tarball: the commit it was made from.
    [[ "$baseline" -ef .gate/baseline.tgz && -f .gate/baseline.rev ]] && base_label=$(cat .gate/baseline.rev) ;;
  *)
    if ((have_git)); then
      base_label=$(git rev-parse --short=7 "$baseline^{commit}" 2>/dev/null) ||
        { echo "gpu-gate: --baseline $baseline names no commit here" >&2; exit 64; }
      git archive -o build/gate/baseline.tgz "$baseline" && base_src=build/gate/baseline.tgz
    elif [[ -f .gate/baseline.tgz ]]; then
      base_src=.gate/baseline.tgz; base_label=$(cat .gate/baseline.rev 2>/dev/null || echo "$baseline")
    else
      echo "gpu-gate: no git here to fetch $baseline: run scripts/gpu-gate.sh --prepare $baseline where there is, and copy .gate here" >&2
      exit 64
    fi ;;
esac
tree_rev=$(tree_label)
echo "gpu-gate: tree $tree_rev against $base_label; $(nproc) cores; $( ((sim)) && echo 'simulated device' || nvidia-smi -L 2>/dev/null | tr '\n' ' ')"

# --- build ---------------------------------------------------------------------------------------
flags=(-G Ninja -DCMAKE_BUILD_TYPE=Release)
[[ -f .deps/include/asio.hpp ]] && flags+=(-DEVR_THIRD_PARTY_INCLUDE_DIR="$root/.deps/include")
if ((sim)); then
  flags+=(-DEVR_WITH_CUDA=OFF)
else
  flags+=(-DEVR_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${EVR_GATE_CUDA_ARCH:-90}")
fi
command -v ninja >/dev/null || flags=("${flags[@]:2}")
build() {  # SIDE SOURCE EXTRA_FLAGS...: configure and build into build/gate/SIDE
  local side=$1 src=$2
  shift 2
  { cmake -S "$src" -B "build/gate/$side" "${flags[@]}" "$@" &&
    cmake --build "build/gate/$side" -j "$jobs"; } >"$results_dir/build-$side.log" 2>&1
}
tb=$SECONDS
if [[ -n "$tree_build" ]]; then
  [[ -x "$tree_build/bench/evr-bench" ]] || { echo "gpu-gate: --tree-build $tree_build holds no bench/evr-bench" >&2; exit 64; }
  tree_build=$(cd "$tree_build" && pwd)
  true &
else
  tree_build=build/gate/tree
  build tree "$root" -DEVR_BUILD_TESTS=ON &
fi
tree_pid=$!
base_build=$tree_build
if [[ -n "$base_src" ]]; then
  rm -rf build/gate/base-src && mkdir -p build/gate/base-src &&
    tar xzf "$base_src" -C build/gate/base-src || exit 4
  build base build/gate/base-src -DEVR_BUILD_TESTS=OFF &
  base_pid=$!
  base_build=build/gate/base
fi
build_failed=0
wait "$tree_pid" || { echo "gpu-gate: the tree's build failed:"; tail -n 30 "$results_dir/build-tree.log"; build_failed=1; }
if [[ -n "$base_src" ]]; then
  wait "$base_pid" || { echo "gpu-gate: the baseline's build failed:"; tail -n 30 "$results_dir/build-base.log"; build_failed=1; }
fi
((build_failed)) && exit 4
echo "gpu-gate: built in $((SECONDS - tb)) s"

# --- ctest ---------------------------------------------------------------------------------------
ctest_status="not run"
ctest_rc=0
if ((ctest)); then
  tc=$SECONDS
  left=$((budget - (SECONDS - t0) - 150))
  ((left < 60)) && left=60
  timeout --kill-after=10 "$left" ctest --test-dir "$tree_build" -j "$(( (jobs + 1) / 2 ))" \
    --timeout 300 --output-on-failure ${EVR_GATE_CTEST_ARGS:-} >"$results_dir/ctest.log" 2>&1
  ctest_rc=$?
  summary=$(grep -E "tests passed|tests failed" "$results_dir/ctest.log" | tail -n 1)
  skipped=$(grep -cE "\*\*\*Skipped|Not Run" "$results_dir/ctest.log")
  if ((ctest_rc == 124 || ctest_rc == 137)); then
    summary="stopped after ${left} s (the gate's budget): ${summary:-no summary}"
  fi
  if ((sim == 0 && skipped > 0 && ctest_rc == 0)); then
    ctest_rc=1
    summary+="; $skipped skipped on a machine with a GPU (counted as failed)"
  fi
  ctest_status="${summary:-no summary (exit $ctest_rc)} in $((SECONDS - tc)) s"
  echo "gpu-gate: ctest: $ctest_status"
  if ((ctest_rc != 0)); then
    grep -E "\*\*\*Failed|\*\*\*Timeout|\*\*\*Skipped|Not Run|\(Failed\)|\(Timeout\)" "$results_dir/ctest.log" | head -n 20
  fi
fi

# --- rows ----------------------------------------------------------------------------------------
gate_args=(--base "$base_build" --tree "$tree_build" --base-label "$base_label"
  --tree-label "$tree_rev" --out "$results_dir" --rounds "$rounds"
  --budget-s "$((budget - (SECONDS - t0) - 5))" --ctest "$ctest_status")
((sim)) && gate_args+=(--sim)
[[ -n "$groups" ]] && gate_args+=(--groups "$groups")
((all_gpus)) && gate_args+=(--all-gpus)
((record && !sim)) && gate_args+=(--record docs/bench/gate)
EVR_GATE_COMMAND="$command_line" python3 scripts/gate/gate.py "${gate_args[@]}"
rows_rc=$?
echo "gpu-gate: done in $((SECONDS - t0)) s; table in $results_dir/gate.md"
((ctest_rc != 0)) && exit 3
exit "$rows_rc"
