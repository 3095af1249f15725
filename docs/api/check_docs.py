#!/usr/bin/env python3
"""Checks the API reference that scripts/docs.sh built.

usage: check_docs.py SOURCE_DIR DOCS_OUT

1. Warnings: every Doxygen warning (DOCS_OUT/warnings.log) is an error, except those listed in
   docs/api/known-undocumented.txt (members of headers that could not be edited when the reference
   was set up; each line is a warning without its line number). A listed warning that no longer
   occurs is an error too, so the list only shrinks.
2. Names: every public name that include/evr/evr.hpp's comment lists (evr::...) must be in the
   reference (Doxygen's tag file, DOCS_OUT/evr.tag), as a class, namespace or member.
Prints a summary; exits 1 on any failure.
"""
import re
import sys
import xml.etree.ElementTree as ET


def normalized(line, source_dir):
    line = line.strip().replace(source_dir.rstrip("/") + "/", "")
    return re.sub(r"^([^:]+):\d+: ", r"\1: ", line)


def main():
    source_dir, out = sys.argv[1], sys.argv[2]
    failures = 0

    with open(f"{out}/warnings.log", encoding="utf-8") as f:
        warnings = sorted({normalized(l, source_dir) for l in f if l.strip()})
    with open(f"{source_dir}/docs/api/known-undocumented.txt", encoding="utf-8") as f:
        known = {l.strip() for l in f if l.strip() and not l.startswith("#")}
    new = [w for w in warnings if w not in known]
    gone = sorted(known - set(warnings))
    for w in new:
        print(f"docs: error: {w}")
    for w in gone:
        print(f"docs: error: no longer warned, remove it from docs/api/known-undocumented.txt: {w}")
    failures += len(new) + len(gone)
    print(f"docs: {len(warnings)} Doxygen warnings, {len(warnings) - len(new)} of them known "
          f"(docs/api/known-undocumented.txt), {len(new)} new")

    names = set()
    for c in ET.parse(f"{out}/evr.tag").getroot().iter("compound"):
        scope = c.findtext("name")
        names.add(scope)
        for m in c.iter("member"):
            names.add(f"{scope}::{m.findtext('name')}")
    # The inline namespace of the Asio flavour is part of the documented names only.
    names |= {n.replace("evr::asio_s::", "evr::") for n in names}
    with open(f"{source_dir}/include/evr/evr.hpp", encoding="utf-8") as f:
        head = []
        for line in f:
            if not line.startswith("//"):
                break
            head.append(line)
    public = []
    for line in head:
        if "Everything in namespace evr::detail" in line:
            break  # the rest of the comment names internals
        public += re.findall(r"evr::[A-Za-z_][A-Za-z_0-9:]*", line)
    # A name whose only documentation gap is a known one (listed above) counts as known.
    known_names = set()
    for w in known:
        m = re.search(r"Member (\w+)\b.* of (?:namespace|class|struct) ([\w:]+)", w)
        if m:
            known_names.add(f"{m.group(2)}::{m.group(1)}")
        m = re.search(r"Compound ([\w:]+)", w)
        if m:
            known_names.add(m.group(1))
    known_names |= {n.replace("evr::asio_s::", "evr::") for n in known_names}
    missing = sorted({p for p in public if p not in names and p not in known_names})
    undocumented = sorted({p for p in public if p not in names and p in known_names})
    for p in undocumented:
        print(f"docs: known gap: {p} is not documented yet (docs/api/known-undocumented.txt)")
    for p in missing:
        print(f"docs: error: {p} (named public in include/evr/evr.hpp) is not in the reference")
    failures += len(missing)
    print(f"docs: {len(set(public))} public names of include/evr/evr.hpp: "
          f"{len(set(public)) - len(missing) - len(undocumented)} in the reference, "
          f"{len(undocumented)} known gaps, {len(missing)} missing")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
