#!/usr/bin/env python3
"""The README's programs cannot rot: every fenced block that a line `<!-- file: PATH -->` announces
must be exactly the file PATH of the repository (CI builds and runs those files: the C++ program
through scripts/ci/check-install.sh, find_package and FetchContent; the Python one through ctest
and scripts/ci/check-python-package.sh). Also checks that every repository path the README puts
in backticks exists.

    scripts/ci/check-readme.py [README.md ...]     exit 0: all match; 1: a block or path differs
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def blocks(text):
    """(path, block text) for each announced block."""
    out = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = re.fullmatch(r"<!-- file: (\S+) -->", lines[i].strip())
        if m:
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            k = j + 1
            while k < len(lines) and not lines[k].startswith("```"):
                k += 1
            out.append((m.group(1), "\n".join(lines[j + 1:k]) + "\n"))
            i = k
        i += 1
    return out


def main(argv):
    readmes = argv[1:] or ["README.md"]
    failed = 0
    for readme in readmes:
        with open(os.path.join(ROOT, readme)) as f:
            text = f.read()
        found = blocks(text)
        for path, block in found:
            full = os.path.join(ROOT, path)
            if not os.path.exists(full):
                print(f"{readme}: the block announced as {path}: no such file")
                failed += 1
                continue
            with open(full) as f:
                if f.read() != block:
                    print(f"{readme}: the block announced as {path} differs from the file "
                          "(copy the file into the README)")
                    failed += 1
        for path in sorted(set(re.findall(r"`((?:scripts|examples|docs|bench|python|tests|cmake)"
                                          r"/[A-Za-z0-9_./-]+)`", text))):
            if not os.path.exists(os.path.join(ROOT, path.rstrip("/"))):
                print(f"{readme}: names `{path}`, which does not exist")
                failed += 1
        print(f"check-readme: {readme}: {len(found)} announced blocks checked")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
