#!/usr/bin/env bash
# Compares evr-async-server's ways of waiting for the GPU under HTTP load, with the same number of
# server threads: --mode evr (requests co_await evr), --mode pool (each request blocks a pool
# thread until its GPU work is done) and, with --modes, the hand-written non-blocking waits
# (hostfunc: a host function posts the completion; poll: io threads query events) and --mode
# thread (a thread per connection). Prints requests/s and latency percentiles per mode and
# connection count in one table. For the whole study (every route, the best alternative, CPU
# use, plots, several GPUs) see scripts/study/server-study.py.
#
#   scripts/study/load-server.sh [--seconds S] [--connections "1 16 256"] [--device auto|cuda|sim]
#                          [--path /busy?us=2000] [--modes "evr pool"] [--threads N] [--builtin]
#                          [-- SERVER_ARGS...]
#
# Load: wrk (Debian package wrk; `scripts/install-deps.sh --extras` installs it; for a GPU machine
# without a package registry scripts/gpu/stage-tools.sh stages it in .tools/) against a server
# started on a free loopback port; otherwise the server's built-in load generator
# (--load-connections C --load-seconds S), which runs in the server's process on its own thread.
# --builtin forces the latter. The two tools differ (wrk is lighter): compare rows measured by the
# same tool.
# SERVER_ARGS go to every server (e.g. -- --streams 128 --devices 0; pool/thread only:
# --sync blocking-sync or --sync auto; evr only: --strategy fence).
#
# Build: reuses build/release (scripts/test.sh) or build/gpu (scripts/gpu/gpu-run.sh) when configured,
# else configures the release preset (or the gpu preset where only .deps/include has Asio).
#
# Environment: EVR_BUILD_DIR (a configured build folder), EVR_JOBS (build jobs, default nproc),
# EVR_WRK_THREADS (wrk threads, default 2, at most the connection count).
# Exit status: 0 when every run completed without errors.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

seconds=3
connections="1 16 256"
device=auto
path="/busy?us=2000"
modes="evr pool"
threads=1
builtin=0
server_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) seconds="${2:?--seconds needs a value}"; shift 2 ;;
    --connections) connections="${2:?--connections needs a value}"; shift 2 ;;
    --device) device="${2:?--device needs a value}"; shift 2 ;;
    --path) path="${2:?--path needs a value}"; shift 2 ;;
    --modes) modes="${2:?--modes needs a value}"; shift 2 ;;
    --threads) threads="${2:?--threads needs a value}"; shift 2 ;;
    --builtin) builtin=1; shift ;;
    --) shift; server_args=("$@"); break ;;
    -h | --help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "load-server.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || ((seconds < 1 || seconds > 600)); then
  echo "load-server.sh: --seconds takes a whole number from 1 to 600, not '$seconds'" >&2
  exit 2
fi
for c in $connections; do
  if ! [[ "$c" =~ ^[0-9]+$ ]] || ((c < 1 || c > 10000)); then
    echo "load-server.sh: --connections takes numbers from 1 to 10000, not '$c'" >&2
    exit 2
  fi
done
case "$device" in auto | cuda | sim) ;; *) echo "load-server.sh: --device takes auto, cuda or sim" >&2; exit 2 ;; esac
if [[ "$path" != /* || "$path" =~ [[:space:]] ]]; then
  echo "load-server.sh: --path takes a path starting with '/', like /busy?us=2000" >&2
  exit 2
fi
if ! [[ "$threads" =~ ^[0-9]+$ ]] || ((threads < 1 || threads > 1024)); then
  echo "load-server.sh: --threads takes a whole number from 1 to 1024, not '$threads'" >&2
  exit 2
fi
for m in $modes; do
  case "$m" in evr | hostfunc | poll | pool | thread) ;; *) echo "load-server.sh: --modes takes evr, hostfunc, poll, pool and thread, not '$m'" >&2; exit 2 ;; esac
done

step() { echo "==> [load-server.sh] $*"; }
jobs="${EVR_JOBS:-$(nproc 2>/dev/null || echo 2)}"
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

# --- build ---------------------------------------------------------------------------------------
build_dir="${EVR_BUILD_DIR:-}"
if [[ -z "$build_dir" ]]; then
  if [[ -f build/release/CMakeCache.txt ]]; then
    build_dir=build/release
  elif [[ -f build/gpu/CMakeCache.txt ]]; then
    build_dir=build/gpu
  elif [[ -f /usr/include/asio.hpp ]]; then
    step "configure: cmake --preset release"
    cmake --preset release >/dev/null
    build_dir=build/release
  elif [[ -f .deps/include/asio.hpp ]]; then
    step "configure: cmake --preset gpu (headers from .deps/include)"
    cmake --preset gpu >/dev/null
    build_dir=build/gpu
  else
    echo "load-server.sh: no Asio headers: run scripts/install-deps.sh (or scripts/gpu/stage-deps.sh)" >&2
    exit 1
  fi
fi
step "build: cmake --build $build_dir --target evr-async-server -j $jobs"
cmake --build "$build_dir" --target evr-async-server -j "$jobs" >/dev/null
bin="$build_dir/examples/evr-async-server"
[[ -x "$bin" ]] || { echo "load-server.sh: $bin was not built" >&2; exit 1; }

tool=builtin
wrk=(wrk)
if ((builtin == 0)); then
  if command -v wrk >/dev/null 2>&1; then
    tool=wrk
  elif [[ -x .tools/usr/bin/wrk ]]; then  # staged by scripts/gpu/stage-tools.sh
    tool=wrk
    wrk=(env "LD_LIBRARY_PATH=$PWD/.tools/usr/lib/x86_64-linux-gnu:$PWD/.tools/fallback/usr/lib/x86_64-linux-gnu" .tools/usr/bin/wrk)
  else
    step "wrk not found (scripts/install-deps.sh --extras installs it): using the server's built-in load generator"
  fi
fi

# --- helpers -------------------------------------------------------------------------------------
logdir="$(mktemp -d "${TMPDIR:-/tmp}/evr-load-server.XXXXXX")"
server_pid=""
stop_server() {
  [[ -n "$server_pid" ]] || return 0
  kill -TERM "$server_pid" 2>/dev/null || true
  for _ in $(seq 1 100); do  # up to 10 s for in-flight requests to finish
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}
trap 'stop_server; rm -rf "$logdir"' EXIT

# wrk prints "350.12us", "4.47ms", "1.20s": to microseconds.
to_us() {
  awk -v v="$1" 'BEGIN {
    if (v ~ /us$/) { sub(/us$/, "", v); printf "%.1f", v }
    else if (v ~ /ms$/) { sub(/ms$/, "", v); printf "%.1f", v * 1000 }
    else if (v ~ /m$/) { sub(/m$/, "", v); printf "%.1f", v * 60e6 }
    else if (v ~ /s$/) { sub(/s$/, "", v); printf "%.1f", v * 1e6 }
    else printf "?" }'
}

rows=()
failed=0
add_row() {  # mode connections rps p50 p90 p99 errors
  rows+=("$(printf '%-20s %6s %11s %10s %10s %10s %7s' "$@")")
  [[ "$7" == 0 ]] || failed=1
}

wrk_threads="${EVR_WRK_THREADS:-2}"
device_line=""

# The server arguments of a mode: the same thread count for every mode but thread (one per
# connection, no --threads).
mode_args() {  # mode
  if [[ "$1" == thread ]]; then
    echo --mode thread
  else
    echo --mode "$1" --threads "$threads"
  fi
}

run_with_wrk() {  # mode
  local mode="$1" log="$logdir/server-$1.log" port="" c
  local margs
  read -r -a margs <<<"$(mode_args "$mode")"
  step "start: $bin ${margs[*]} --device $device --port 0 ${server_args[*]}"
  "$bin" "${margs[@]}" --device "$device" --port 0 "${server_args[@]}" >"$log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 300); do  # up to 30 s (CUDA initialisation can take a while)
    port="$(sed -n 's|^listening on http://[^ ]*:\([0-9][0-9]*\)/.*|\1|p' "$log")"
    [[ -n "$port" ]] && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [[ -z "$port" ]]; then
    echo "load-server.sh: the $mode server did not start:" >&2
    cat "$log" >&2
    stop_server
    failed=1
    return
  fi
  [[ -n "$device_line" ]] || device_line="$(head -n 1 "$log")"
  for c in $connections; do
    local t=$((c < wrk_threads ? c : wrk_threads)) run_out="$logdir/wrk-$mode-$c.txt"
    step "wrk -t$t -c$c -d${seconds}s --latency http://127.0.0.1:$port$path"
    if ! timeout $((seconds + 60)) "${wrk[@]}" -t"$t" -c"$c" -d"${seconds}s" --timeout 10s --latency \
      "http://127.0.0.1:$port$path" >"$run_out" 2>&1; then
      echo "load-server.sh: wrk failed:" >&2
      cat "$run_out" >&2
      add_row "$mode" "$c" - - - - 1
      continue
    fi
    local rps p50 p90 p99 non2xx sock
    rps="$(awk '/^Requests\/sec:/ {print $2}' "$run_out")"
    p50="$(to_us "$(awk '$1 == "50%" {print $2}' "$run_out")")"
    p90="$(to_us "$(awk '$1 == "90%" {print $2}' "$run_out")")"
    p99="$(to_us "$(awk '$1 == "99%" {print $2}' "$run_out")")"
    non2xx="$(awk '/Non-2xx or 3xx responses:/ {print $NF}' "$run_out")"
    sock="$(awk '/Socket errors:/ {gsub(/,/, ""); print $4 + $6 + $8 + $10}' "$run_out")"
    add_row "$mode" "$c" "${rps:-?}" "$p50" "$p90" "$p99" "$((${non2xx:-0} + ${sock:-0}))"
  done
  stop_server
  # The server checks every answer against the CPU: wrong answers or GPU errors are 500s.
  local summary
  summary="$(grep '^server: .* respons' "$log" || true)"
  echo "    $mode server: ${summary#server: }"
  if [[ "$summary" != *"(0 failures"* ]]; then
    echo "load-server.sh: the $mode server reported failures:" >&2
    tail -n 5 "$log" >&2
    failed=1
  fi
}

run_builtin() {  # mode
  local mode="$1" c run_out
  local margs
  read -r -a margs <<<"$(mode_args "$mode")"
  for c in $connections; do
    run_out="$logdir/builtin-$mode-$c.txt"
    step "$bin ${margs[*]} --device $device --load-connections $c --load-seconds $seconds --load-path '$path' ${server_args[*]}"
    timeout $((seconds + 90)) "$bin" "${margs[@]}" --device "$device" --load-connections "$c" \
      --load-seconds "$seconds" --load-path "$path" "${server_args[@]}" >"$run_out" 2>&1 || true
    [[ -n "$device_line" ]] || device_line="$(head -n 1 "$run_out")"
    local line
    line="$(grep '^load-result ' "$run_out" || true)"
    if [[ -z "$line" ]]; then
      echo "load-server.sh: the built-in load run failed:" >&2
      tail -n 20 "$run_out" >&2
      add_row "$mode" "$c" - - - - 1
      continue
    fi
    field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$line"; }
    local errors
    errors="$(field errors)"
    if ! grep -q '(0 failures' "$run_out"; then
      errors=$((errors + 1))
      grep '^server: .* respons' "$run_out" >&2 || true
    fi
    add_row "$mode" "$c" "$(field rps)" "$(field p50_us)" "$(field p90_us)" "$(field p99_us)" "$errors"
  done
}

# --- run -----------------------------------------------------------------------------------------
for mode in $modes; do
  if [[ "$tool" == wrk ]]; then
    run_with_wrk "$mode"
  else
    run_builtin "$mode"
  fi
done

echo
echo "evr-async-server under load: GET $path, ${seconds} s per row, $(nproc) CPUs"
echo "${device_line:-device: ?}"
if [[ "$tool" == wrk ]]; then
  echo "load: wrk (up to $wrk_threads threads), another process"
else
  echo "load: the server's built-in generator (one client thread in the server's process)"
fi
echo "server threads: $threads (evr, hostfunc, poll, pool; thread mode: one per connection); server arguments: ${server_args[*]:-none}"
printf '%-20s %6s %11s %10s %10s %10s %7s\n' mode conns "requests/s" "p50 us" "p90 us" "p99 us" errors
for row in "${rows[@]}"; do echo "$row"; done
exit "$failed"
