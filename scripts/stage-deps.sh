#!/usr/bin/env bash
# Copies the third-party headers evr builds against (Asio, concurrentqueue, doctest, CLI11) from the
# system into the git-ignored .deps/include, for machines without a package registry (the lent
# GPU machine: carry ".deps" and configure with -DEVR_THIRD_PARTY_INCLUDE_DIR=$PWD/.deps/include,
# which the "gpu" preset does).
#
#   scripts/stage-deps.sh [SOURCE_INCLUDE_DIR]   # default /usr/include
#
# Installs the Debian packages first when they are missing (scripts/install-deps.sh).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
src="${1:-/usr/include}"
dest=".deps/include"

if [[ "$src" == /usr/include ]]; then
  bash scripts/install-deps.sh
fi

need=("$src/asio.hpp" "$src/asio" "$src/concurrentqueue/concurrentqueue.h" "$src/doctest/doctest.h" "$src/CLI/CLI.hpp")
for path in "${need[@]}"; do
  if [[ ! -e "$path" ]]; then
    echo "stage-deps: $path is missing (Debian: apt-get install libasio-dev libconcurrentqueue-dev doctest-dev libcli11-dev)" >&2
    exit 1
  fi
done

rm -rf "$dest"
mkdir -p "$dest"
cp -a "$src/asio.hpp" "$src/asio" "$src/concurrentqueue" "$src/doctest" "$src/CLI" "$dest/"

echo "stage-deps: staged $(find "$dest" -type f | wc -l) files, $(du -sh "$dest" | cut -f1) in $dest"
if git check-ignore -q .deps 2>/dev/null; then
  echo "stage-deps: .deps is git-ignored; name it in the device tool's carry: [\".deps\"]"
else
  echo "stage-deps: warning: .deps is not git-ignored here (add /.deps/ to .gitignore)" >&2
fi
