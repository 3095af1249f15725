#!/usr/bin/env bash
# Stages the load generator wrk (and the libraries it needs that a fresh Ubuntu lacks) into the
# git-ignored .tools/, for machines without a package registry (a GPU machine without one: run
# this on a machine that has one and copy .tools along, next to .deps).
#
#   scripts/gpu/stage-tools.sh          # once (needs apt-get: Debian/Ubuntu with a registry)
#
# What it does: `apt-get download` the .debs of wrk and LuaJIT (wrk's scripting engine), plus
# OpenSSL 3 as a fallback, and unpacks them with `dpkg-deb -x` (no install, no root needed for
# that part):
#   .tools/usr/bin/wrk
#   .tools/usr/lib/x86_64-linux-gnu/libluajit-5.1.so.2     (Ubuntu 24.04 has no LuaJIT by default)
#   .tools/fallback/usr/lib/x86_64-linux-gnu/libssl.so.3, libcrypto.so.3
#                                                           (only if the machine lacks OpenSSL 3)
# scripts/study/server-study.py finds wrk there by itself. By hand:
#   LD_LIBRARY_PATH=$PWD/.tools/usr/lib/x86_64-linux-gnu .tools/usr/bin/wrk --version
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
dest=.tools
packages=(wrk libluajit-5.1-2 libluajit-5.1-common)
fallback_packages=(libssl3)

if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-deb >/dev/null 2>&1; then
  echo "stage-tools: needs apt-get and dpkg-deb (Debian or Ubuntu with a package registry)" >&2
  exit 1
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/evr-stage-tools.XXXXXX")"
trap 'rm -rf "$work"' EXIT

download() {  # package...: into $work, running apt-get update once if the lists are stale
  if ! (cd "$work" && apt-get download "$@" >/dev/null 2>"$work/download.err"); then
    echo "stage-tools: apt-get download failed; updating the package lists and retrying" >&2
    if [[ "$(id -u)" -eq 0 ]]; then
      apt-get update -q >/dev/null
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo -n apt-get update -q >/dev/null
    fi
    if ! (cd "$work" && apt-get download "$@" >/dev/null); then
      cat "$work/download.err" >&2
      echo "stage-tools: could not download: $*" >&2
      exit 1
    fi
  fi
}

download "${packages[@]}"
rm -rf "$dest"
mkdir -p "$dest/fallback"
for deb in "$work"/*.deb; do
  dpkg-deb -x "$deb" "$dest"
done
rm -f "$work"/*.deb
download "${fallback_packages[@]}"
for deb in "$work"/*.deb; do
  dpkg-deb -x "$deb" "$dest/fallback"
done
# Documentation and lintian overrides are not needed on the GPU machine.
rm -rf "$dest/usr/share" "$dest/fallback/usr/share"

lib="$PWD/$dest/usr/lib/x86_64-linux-gnu"
# `wrk --version` prints its version and the usage, and exits 1.
version="$(LD_LIBRARY_PATH="$lib" "$dest/usr/bin/wrk" --version 2>&1 || true)"
if [[ "$version" != wrk\ * ]]; then
  echo "stage-tools: the staged wrk does not run here:" >&2
  echo "$version" | head -n 3 >&2
  LD_LIBRARY_PATH="$lib" ldd "$dest/usr/bin/wrk" >&2 || true
  exit 1
fi
echo "stage-tools: staged $(head -n 1 <<<"$version" | cut -d' ' -f1-2)"
echo "stage-tools: $(find "$dest" -type f | wc -l) files, $(du -sh "$dest" | cut -f1) in $dest"
if git check-ignore -q "$dest" 2>/dev/null; then
  echo "stage-tools: $dest is git-ignored; copy it along with the working tree (next to .deps) to the GPU machine"
else
  echo "stage-tools: warning: $dest is not git-ignored here (add /$dest/ to .gitignore)" >&2
fi
echo "stage-tools: use it there: LD_LIBRARY_PATH=\$PWD/$dest/usr/lib/x86_64-linux-gnu $dest/usr/bin/wrk ..."
echo "stage-tools: (if that machine lacks OpenSSL 3, append :\$PWD/$dest/fallback/usr/lib/x86_64-linux-gnu;"
echo "stage-tools:  scripts/study/server-study.py does both by itself)"
