#!/usr/bin/env python3
"""Doxygen input filter for evr's public headers (docs/api/Doxyfile, INPUT_FILTER).

evr's headers open with a plain `//` comment that states the file's contract (what it is for,
thread safety, lifetime, errors) and is written as preformatted text. Doxygen ignores `//`
comments; this filter hands that first comment block to Doxygen as the file's documentation,
verbatim, without touching the headers: line 1 becomes the brief, the rest a verbatim block, and
`@file` is added on the block's last line (one C-style comment, as many lines as before). Every other line is passed through unchanged, so line
numbers in Doxygen's warnings stay those of the header.

usage: filter.py FILE   (prints the filtered text)
"""
import sys


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        lines = f.read().split("\n")
    end = 0
    while end < len(lines) and lines[end].startswith("//") and not lines[end].startswith("///"):
        end += 1
    if end == 0:
        sys.stdout.write("\n".join(lines))
        return
    # A C-style block: Doxygen keeps the `///` of line comments inside @verbatim. A `*/` in the
    # text would end the block early: it is shown as `* /`.
    text = [l[2:].replace("*/", "* /") for l in lines[:end]]
    out = []
    if end == 1:
        out.append("/**" + text[0] + " @file */")
    else:
        out.append("/**" + text[0])
        for i, t in enumerate(text[1:], start=1):
            prefix = "@verbatim" if i == 1 else ""
            suffix = " @endverbatim @file */" if i == end - 1 else ""
            out.append(prefix + t + suffix)
    sys.stdout.write("\n".join(out + lines[end:]))


if __name__ == "__main__":
    main()
