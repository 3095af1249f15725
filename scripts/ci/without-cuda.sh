#!/usr/bin/env bash
# Runs a command as on a machine without CUDA: in a private mount namespace (unshare -m) in which
# an empty folder is mounted over the CUDA toolkit (the real folder behind /usr/local/cuda, or
# EVR_CUDA_HIDE), so neither its libraries nor the loader's cache entries into it can be found.
# The command then sees no toolkit and, on a machine without a GPU driver, no libcuda.so.1 either.
#
#   scripts/ci/without-cuda.sh python3 -c 'import evr; print(evr.cuda_status())'
#
# Needs root (or unprivileged user namespaces: then unshare -r -m is used). Exit status: the
# command's, or 3 when the toolkit could not be hidden.
set -euo pipefail

if [[ $# -eq 0 ]]; then
  echo "usage: $0 COMMAND [ARG...]" >&2
  exit 2
fi
toolkit="${EVR_CUDA_HIDE:-$(readlink -f /usr/local/cuda 2>/dev/null || true)}"
if [[ -z "$toolkit" || ! -d "$toolkit" ]]; then
  echo "without-cuda: no CUDA toolkit at ${EVR_CUDA_HIDE:-/usr/local/cuda}: nothing to hide"
  exec "$@"
fi
empty="$(mktemp -d)"
as_root=()
[[ "$(id -u)" -eq 0 ]] || as_root=(-r)
# The inner shell mounts, checks that the toolkit is gone, then becomes the command.
exec unshare "${as_root[@]}" -m bash -c '
  toolkit="$1"; empty="$2"; shift 2
  mount --make-rprivate / 2>/dev/null || true
  if ! mount --bind "$empty" "$toolkit"; then
    echo "without-cuda: could not mount over $toolkit (needs root or user namespaces)" >&2
    exit 3
  fi
  # The loader cache still lists the toolkit'"'"'s libraries (and links to them elsewhere): none of
  # those paths may lead to a file now.
  reachable=()
  for lib in $(ldconfig -p | sed -n "s/^.*libcudart\.so.* => //p"); do
    [[ -e "$lib" ]] && reachable+=("$lib")
  done
  if [[ -n "$(ls -A "$toolkit")" || ${#reachable[@]} -gt 0 ]]; then
    echo "without-cuda: the CUDA runtime is still reachable: $toolkit ${reachable[*]}" >&2
    exit 3
  fi
  driver=none
  for lib in $(ldconfig -p | sed -n "s/^.*libcuda\.so\.1 .* => //p"); do
    [[ -e "$lib" ]] && driver="$lib"
  done
  echo "without-cuda: $toolkit hidden (an empty folder over it); no libcudart reachable; the driver (libcuda.so.1): $driver"
  exec "$@"' _ "$toolkit" "$empty" "$@"
