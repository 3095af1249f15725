#!/usr/bin/env bash
# Stages this machine's HAProxy (Debian's haproxy package) and the shared libraries it needs,
# except glibc's own, into the git-ignored .tools/haproxy, for a GPU machine without HAProxy or a
# package registry (copy .tools along; scripts/gpu/gpu-fleet.sh uses it through
# EVR_HAPROXY=.tools/haproxy/haproxy, a wrapper that points the loader at the libraries).
#
#   scripts/gpu/stage-haproxy.sh         # once; needs haproxy installed (apt-get install haproxy)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
dest=.tools/haproxy
bin="$(command -v haproxy || true)"
if [[ -z "$bin" ]]; then
  echo "stage-haproxy: no haproxy here (Debian: apt-get install haproxy)" >&2
  exit 1
fi
rm -rf "$dest"
mkdir -p "$dest/lib"
cp "$(readlink -f "$bin")" "$dest/haproxy.bin"
ldd "$bin" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux*) continue ;;
  esac
  cp -L "$lib" "$dest/lib/"
done
cat >"$dest/haproxy" <<'WRAP'
#!/bin/sh
here="$(dirname "$(readlink -f "$0")")"
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/haproxy.bin" "$@"
WRAP
chmod +x "$dest/haproxy"
"$dest/haproxy" -v | head -n 1
echo "stage-haproxy: $(du -sh "$dest" | cut -f1) in $dest; copy .tools along to the GPU machine"
