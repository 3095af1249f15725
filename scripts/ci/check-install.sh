#!/usr/bin/env bash
# Checks evr's install, package config and pkg-config files, and its use as a sub-project, the ways
# a user meets them:
#   1. configure and build evr (sim-only preset, no tests/examples/bench) in build/install-check;
#   2. cmake --install into a temporary prefix, then move that prefix elsewhere (relocatable?);
#   3. find_package: tests/consumer with -DCMAKE_PREFIX_PATH=<moved prefix>, once per Asio flavour
#      (find_package(evr CONFIG REQUIRED COMPONENTS standalone|boost); evr::evr, evr::evr_boost);
#   4. pkg-config: tests/consumer/main.cpp built by plain g++ with
#      `pkg-config --cflags --libs evr` (and evr-boost), PKG_CONFIG_PATH=<moved prefix>/.../pkgconfig;
#   5. add_subdirectory: tests/consumer with evr's source tree as a sub-project (standalone Asio);
#   6. FetchContent: tests/consumer fetching an archive of evr's tree by URL file:// (no network;
#      Boost.Asio flavour);
#   7. with the CUDA toolkit: a CUDA build installed, its find_package and pkg-config consumers
#      linked with the static CUDA runtime (no libcudart NEEDED) and run with the toolkit hidden;
#   8. the README's program (examples/getting_started: its own CMake project) built against the
#      installed evr with find_package (sim-only and CUDA builds) and with FetchContent, and run.
# Every consumer links evr::sim (pkg-config: -levr_sim) and runs a wait on evr's simulated device
# through the Asio front end and one through on_complete, and must print OK.
# Needs Boost 1.78+ (Debian 12: libboost1.81-dev), installed by scripts/install-deps.sh --boost.
# Environment: EVR_JOBS=N (default nproc), EVR_KEEP_TMP=1 (keep the temporary folder),
#              EVR_SKIP_DEPS=1 (do not run scripts/install-deps.sh),
#              EVR_BOOST_ROOT=<prefix> (a Boost outside the system, e.g. a libboost1.81-dev unpacked
#              where python3-matplotlib keeps Boost 1.74 installed: <prefix>/include/boost and
#              <prefix>/lib/.../cmake/Boost-*; given to CMake as Boost_ROOT).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
src_dir="$PWD"
build_dir="build/install-check"
jobs="${EVR_JOBS:-$(nproc 2>/dev/null || echo 2)}"
step() { echo "==> [check-install.sh] $*"; }
fail() {
  echo "check-install: FAILED: $*" >&2
  exit 1
}

tmp="$(mktemp -d "${TMPDIR:-/tmp}/evr-install-check.XXXXXX")"
cleanup() {
  if [[ "${EVR_KEEP_TMP:-0}" == 1 ]]; then
    echo "check-install: kept $tmp"
  else
    rm -rf "$tmp"
  fi
}
trap cleanup EXIT

boost_cmake=()
boost_cxxflags=()
if [[ -n "${EVR_BOOST_ROOT:-}" ]]; then
  [[ -f "$EVR_BOOST_ROOT/include/boost/asio.hpp" ]] || fail "EVR_BOOST_ROOT: no include/boost/asio.hpp in $EVR_BOOST_ROOT"
  boost_cmake=(-DBoost_ROOT="$EVR_BOOST_ROOT")
  boost_cxxflags=(-isystem "$EVR_BOOST_ROOT/include")
  step "dependencies (scripts/install-deps.sh; Boost from EVR_BOOST_ROOT=$EVR_BOOST_ROOT)"
  bash scripts/install-deps.sh
else
  step "dependencies (scripts/install-deps.sh --boost)"
  bash scripts/install-deps.sh --boost
fi
command -v pkg-config >/dev/null || fail "pkg-config is missing (Debian: apt-get install pkg-config)"

step "configure evr: cmake --preset sim-only -B $build_dir (tests, examples, bench off)"
cmake --preset sim-only -B "$build_dir" \
  -DEVR_BUILD_TESTS=OFF -DEVR_BUILD_EXAMPLES=OFF -DEVR_BUILD_BENCH=OFF >/dev/null

step "build evr: cmake --build $build_dir -j $jobs"
cmake --build "$build_dir" -j "$jobs"

step "install: cmake --install $build_dir --prefix $tmp/staged, then move it to $tmp/prefix"
cmake --install "$build_dir" --prefix "$tmp/staged" >/dev/null
mv "$tmp/staged" "$tmp/prefix"
prefix="$tmp/prefix"

config="$(find "$prefix" -name evrConfig.cmake -print -quit)"
[[ -n "$config" ]] || fail "no evrConfig.cmake under the prefix"
[[ -f "$(dirname "$config")/evrConfigVersion.cmake" ]] || fail "no evrConfigVersion.cmake"
[[ -f "$prefix/include/evr/device/error.hpp" ]] || fail "headers missing (include/evr/device/error.hpp)"
[[ -f "$prefix/include/evr/callbacks/detail/asio_forward.hpp" ]] ||
  fail "headers missing (include/evr/callbacks/detail/asio_forward.hpp)"
[[ -n "$(find "$prefix" -name 'libevr.*' -print -quit)" ]] || fail "no libevr.* under the prefix"
[[ -f "$prefix/include/evr/sim/device.hpp" ]] || fail "simulator header missing (include/evr/sim/device.hpp)"
[[ -f "$prefix/include/evr/device/signal.cuh" && -f "$prefix/include/evr/device/signal_ref.h" ]] ||
  fail "device-signalled wait headers missing (include/evr/device/signal.cuh, signal_ref.h)"
[[ -n "$(find "$prefix" -name 'libevr_sim.*' -print -quit)" ]] || fail "no libevr_sim.* under the prefix"
# The exported targets must not point back into the source or build tree.
if grep -rl -e "$src_dir" -e "$tmp/staged" "$(dirname "$config")"/evrTargets*.cmake; then
  fail "the exported targets above name the source, build or staging folder"
fi
# The compiled library links no Asio (both front ends are header-only layers over it).
if nm -C "$(find "$prefix" -name 'libevr.*' -print -quit)" | grep -q -e ' asio::' -e 'boost::asio'; then
  fail "libevr contains Asio symbols"
fi
pc_evr="$(find "$prefix" -name evr.pc -print -quit)"
pc_boost="$(find "$prefix" -name evr-boost.pc -print -quit)"
[[ -n "$pc_evr" && -n "$pc_boost" ]] || fail "evr.pc or evr-boost.pc missing under the prefix"
# Written at install time with the prefix installed to.
grep -qx "prefix=$tmp/staged" "$pc_evr" || fail "evr.pc does not say prefix=$tmp/staged: $(grep '^prefix=' "$pc_evr")"
# The license: its text beside the installed headers (copies of the source), its SPDX identifier
# in the package config (evr_LICENSE; the find_package consumers check it) and the .pc files.
cmp -s LICENSE "$prefix/share/doc/evr/LICENSE" || fail "share/doc/evr/LICENSE is not LICENSE"
grep -qx 'set(evr_LICENSE "BSL-1.0")' "$config" || fail "evrConfig.cmake does not set evr_LICENSE BSL-1.0"
for pc in "$pc_evr" "$pc_boost"; do
  grep -qx 'License: BSL-1.0' "$pc" || fail "$(basename "$pc") has no 'License: BSL-1.0'"
done
echo "check-install: installed $(find "$prefix" -type f | wc -l) files; package config at" \
  "${config#"$prefix"/}; pkg-config files at ${pc_evr#"$prefix"/}, ${pc_boost#"$prefix"/}"

# consumer NAME [cmake args...]: configures, builds and runs tests/consumer in $tmp/NAME.
consumer() {
  local name="$1"
  shift
  step "consumer '$name': cmake -S tests/consumer $*"
  cmake -S tests/consumer -B "$tmp/$name" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON "$@" >"$tmp/$name.configure.log" ||
    { cat "$tmp/$name.configure.log"; fail "configuring consumer '$name'"; }
  grep 'evr_consumer:' "$tmp/$name.configure.log" || true
  cmake --build "$tmp/$name" -j "$jobs" >"$tmp/$name.build.log" ||
    { cat "$tmp/$name.build.log"; fail "building consumer '$name'"; }
  "$tmp/$name/evr_consumer" || fail "consumer '$name' did not print OK"
}

consumer find_package_standalone -DCMAKE_PREFIX_PATH="$prefix" -DEVR_CONSUMER_FLAVOUR=standalone
consumer find_package_boost -DCMAKE_PREFIX_PATH="$prefix" -DEVR_CONSUMER_FLAVOUR=boost "${boost_cmake[@]}"

# pkg-config: a moved prefix is found through --define-variable=prefix=... (the .pc files name
# the prefix installed to, as usual).
export PKG_CONFIG_PATH
PKG_CONFIG_PATH="$(dirname "$pc_evr")"
for pc in evr evr-boost; do
  step "pkg-config consumer: g++ -std=c++20 tests/consumer/main.cpp \$(pkg-config --cflags --libs $pc)"
  flags="$(pkg-config --define-variable=prefix="$prefix" --cflags --libs "$pc")" ||
    fail "pkg-config --cflags --libs $pc"
  echo "check-install: pkg-config $pc: $flags"
  version="$(pkg-config --modversion "$pc")"
  extra=()
  if [[ "$pc" == evr-boost ]]; then extra=("${boost_cxxflags[@]}"); fi
  # shellcheck disable=SC2086 # the flags are words
  g++ -std=c++20 -O1 -o "$tmp/pkg-config-$pc" tests/consumer/main.cpp "${extra[@]}" $flags \
    -DEVR_CONSUMER_FOUND_VERSION="\"$version\"" -DEVR_CONSUMER_HOW="\"pkg-config $pc\"" ||
    fail "building tests/consumer/main.cpp with pkg-config $pc"
  "$tmp/pkg-config-$pc" || fail "the pkg-config consumer ($pc) did not print OK"
done

consumer add_subdirectory -DEVR_CONSUMER_MODE=add_subdirectory -DEVR_SOURCE="$src_dir" \
  -DEVR_CONSUMER_FLAVOUR=standalone

# FetchContent from an archive of the files git would carry (tracked, and untracked but not
# ignored): what a release tarball of this tree holds.
step "FetchContent: archive of the source tree at $tmp/evr-src.tar.gz"
git ls-files -z --cached --others --exclude-standard |
  tar --null -T - --ignore-failed-read -czf "$tmp/evr-src.tar.gz" --transform 's,^,evr/,'
consumer fetchcontent -DEVR_CONSUMER_MODE=fetchcontent -DEVR_SOURCE="file://$tmp/evr-src.tar.gz" \
  -DEVR_CONSUMER_FLAVOUR=boost -DFETCHCONTENT_FULLY_DISCONNECTED=OFF "${boost_cmake[@]}"

# The README's program, as a user builds it (examples/getting_started: find_package, or
# FetchContent with -DEVR_FETCH=URL), and runs it: on the simulated device here.
getting_started() {  # NAME [cmake args...]
  local name="$1"
  shift
  step "the README's program '$name': cmake -S examples/getting_started $*"
  cmake -S examples/getting_started -B "$tmp/$name" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON "$@" >"$tmp/$name.configure.log" ||
    { cat "$tmp/$name.configure.log"; fail "configuring the README's program ($name)"; }
  cmake --build "$tmp/$name" -j "$jobs" >"$tmp/$name.build.log" ||
    { cat "$tmp/$name.build.log"; fail "building the README's program ($name)"; }
  "$tmp/$name/getting_started" | tee "$tmp/$name.out"
  [[ $(grep -c '^request [0-9]: GPU work done' "$tmp/$name.out") -eq 3 ]] ||
    fail "the README's program ($name) did not finish its three requests"
}
getting_started getting_started_find_package -DCMAKE_PREFIX_PATH="$prefix"
getting_started getting_started_fetchcontent -DEVR_FETCH="file://$tmp/evr-src.tar.gz" \
  -DFETCHCONTENT_FULLY_DISCONNECTED=OFF

# The CUDA build as C++ users link it: the installed evr::core carries CUDA::cudart_static and
# evr.pc -lcudart_static -ldl -lrt (EVR_CUDA_RUNTIME=static, the default), so a consumer needs no
# libcudart where it runs: its NEEDED entries are checked, and it runs (a wait on the simulated
# device, the CUDA backend reporting no driver) with the toolkit hidden (scripts/ci/without-cuda.sh).
cuda_consumer_checks() {  # BINARY HOW
  local needed
  needed="$(readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
  echo "check-install: $2: NEEDED $needed"
  if grep -Eq 'libcuda|libcudart' <<<"$needed"; then fail "$2 NEEDs a CUDA library: $needed"; fi
  bash scripts/ci/without-cuda.sh "$1" || fail "$2 did not run with the CUDA toolkit hidden"
}
if command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  step "CUDA build: EVR_WITH_CUDA=ON, EVR_CUDA_RUNTIME=static (the default) in $build_dir-cuda"
  cmake -S . -B "$build_dir-cuda" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEVR_WITH_CUDA=ON \
    -DEVR_BUILD_TESTS=OFF -DEVR_BUILD_EXAMPLES=OFF -DEVR_BUILD_BENCH=OFF -DEVR_BUILD_PYTHON=OFF \
    >"$tmp/cuda.configure.log" || { cat "$tmp/cuda.configure.log"; fail "configuring the CUDA build"; }
  cmake --build "$build_dir-cuda" -j "$jobs" >"$tmp/cuda.build.log" ||
    { tail -n 30 "$tmp/cuda.build.log"; fail "building the CUDA build"; }
  cmake --install "$build_dir-cuda" --prefix "$tmp/cuda-prefix" >/dev/null
  grep -q 'CUDA::cudart_static' "$(find "$tmp/cuda-prefix" -name 'evrTargets.cmake' -print -quit)" ||
    fail "the installed evr::core does not link CUDA::cudart_static"
  consumer cuda_find_package -DCMAKE_PREFIX_PATH="$tmp/cuda-prefix" -DEVR_CONSUMER_FLAVOUR=standalone
  cuda_consumer_checks "$tmp/cuda_find_package/evr_consumer" "the find_package consumer (CUDA build)"
  flags="$(PKG_CONFIG_PATH="$(dirname "$(find "$tmp/cuda-prefix" -name evr.pc -print -quit)")" \
    pkg-config --define-variable=prefix="$tmp/cuda-prefix" --cflags --libs evr)"
  echo "check-install: pkg-config evr (CUDA build): $flags"
  [[ "$flags" == *-lcudart_static* ]] || fail "evr.pc of the CUDA build does not link -lcudart_static"
  # shellcheck disable=SC2086 # the flags are words
  g++ -std=c++20 -O1 -o "$tmp/pkg-config-cuda" tests/consumer/main.cpp $flags \
    -DEVR_CONSUMER_FOUND_VERSION="\"$(pkg-config --modversion evr)\"" \
    -DEVR_CONSUMER_HOW="\"pkg-config evr (CUDA build)\"" || fail "building the pkg-config consumer (CUDA)"
  cuda_consumer_checks "$tmp/pkg-config-cuda" "the pkg-config consumer (CUDA build)"
  getting_started getting_started_cuda -DCMAKE_PREFIX_PATH="$tmp/cuda-prefix"
  cuda_consumer_checks "$tmp/getting_started_cuda/getting_started" "the README's program (CUDA build)"
else
  step "CUDA build: skipped (no CUDA toolkit here)"
fi

step "passed"
