#!/usr/bin/env bash
# Stages this machine's `perf` (Debian's linux-perf) and the shared libraries it needs, except
# glibc's own, into the git-ignored .tools/perf, for a GPU machine without perf or a package
# registry (copy .tools along; scripts/gpu/gpu-profile.sh uses it). The binary runs there with the
# libraries staged beside it and that machine's own C library, which must be at least as new as
# this machine's (Debian 12's, say).
#
#   scripts/gpu/stage-perf.sh            # once; needs perf installed (apt-get install linux-perf)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
dest=.tools/perf
perf_bin="$(readlink -f "$(command -v perf || true)")"
if [[ ! -x "$perf_bin" ]]; then
  echo "stage-perf: no perf here (Debian: apt-get install linux-perf)" >&2
  exit 1
fi
rm -rf "$dest"
mkdir -p "$dest/lib"
cp "$perf_bin" "$dest/perf"
# Every library perf links, but the C library's (the GPU machine's own must win).
ldd "$perf_bin" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux*) continue ;;
  esac
  cp -L "$lib" "$dest/lib/"
done
LD_LIBRARY_PATH="$PWD/$dest/lib" "$dest/perf" --version
echo "stage-perf: $(du -sh "$dest" | cut -f1) in $dest; copy .deps and .tools along to the GPU machine"
