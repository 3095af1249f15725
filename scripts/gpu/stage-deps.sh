#!/usr/bin/env bash
# Copies the third-party headers evr builds against (Asio, concurrentqueue, doctest, CLI11,
# http_parser) from the system into the git-ignored .deps/include, and http_parser's shared library
# (the one compiled dependency, of examples/async_server only) into .deps/lib, for machines without
# a package registry (a GPU machine without one: run this on a machine that has one, copy the
# git-ignored .deps/ along and configure there with
# -DEVR_THIRD_PARTY_INCLUDE_DIR=$PWD/.deps/include, which the "gpu" preset does; the example
# finds the library in the lib folder beside it and its RPATH names that folder).
#
#   scripts/gpu/stage-deps.sh [SOURCE_INCLUDE_DIR]   # default /usr/include
#
# Installs the Debian packages first when they are missing (scripts/install-deps.sh).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
src="${1:-/usr/include}"
dest=".deps/include"

if [[ "$src" == /usr/include ]]; then
  bash scripts/install-deps.sh
fi

# The shared library as its soname names it (libhttp_parser.so.2.9): a plain file, not a symlink,
# so that it survives being carried to another machine.
lib_src="${EVR_HTTP_PARSER_LIB:-/usr/lib/x86_64-linux-gnu/libhttp_parser.so.2.9}"
lib_dest=".deps/lib"

need=("$src/asio.hpp" "$src/asio" "$src/concurrentqueue/concurrentqueue.h" "$src/doctest/doctest.h" "$src/CLI/CLI.hpp" "$src/http_parser.h" "$lib_src")
for path in "${need[@]}"; do
  if [[ ! -e "$path" ]]; then
    echo "stage-deps: $path is missing (Debian: apt-get install libasio-dev libconcurrentqueue-dev doctest-dev libcli11-dev libhttp-parser-dev)" >&2
    exit 1
  fi
done

rm -rf "$dest" "$lib_dest"
mkdir -p "$dest" "$lib_dest"
cp -a "$src/asio.hpp" "$src/asio" "$src/concurrentqueue" "$src/doctest" "$src/CLI" "$src/http_parser.h" "$dest/"
cp -L "$lib_src" "$lib_dest/libhttp_parser.so.2.9"
# pybind11 (the Python binding): used on the GPU machine only when its Python has no pybind11 of
# its own (python3 -m pybind11 wins; see cmake/evrPython.cmake).
if [[ -f "$src/pybind11/pybind11.h" ]]; then
  cp -a "$src/pybind11" "$dest/"
fi

echo "stage-deps: staged $(find "$dest" -type f | wc -l) files, $(du -sh "$dest" | cut -f1) in $dest; $(ls "$lib_dest") in $lib_dest"
if git check-ignore -q .deps 2>/dev/null; then
  echo "stage-deps: .deps is git-ignored; copy it along with the working tree to the GPU machine"
else
  echo "stage-deps: warning: .deps is not git-ignored here (add /.deps/ to .gitignore)" >&2
fi
