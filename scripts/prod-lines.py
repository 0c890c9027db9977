#!/usr/bin/env python3
"""Lines of production Rust, by top-level directory: `.rs` files outside `tests/` directories,
`fuzz/` and `target/`, without `tests.rs` files and without the item after each
`#[cfg(test)]` (a test module or function). Blank lines and comments count: they are code a
reader reads.

    python3 scripts/prod-lines.py [ROOT]
"""

import os
import sys


def production_lines(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    n, i = 0, 0
    while i < len(lines):
        if lines[i].strip() != "#[cfg(test)]":
            n += 1
            i += 1
            continue
        # Skip the item that follows: one line ending in `;`, or up to its closing brace at the
        # item's own indentation.
        j = i + 1
        indent = len(lines[j]) - len(lines[j].lstrip())
        if not lines[j].rstrip().endswith(";"):
            j += 1
            while j < len(lines) and not (
                lines[j].startswith(" " * indent + "}")
                and len(lines[j]) - len(lines[j].lstrip()) == indent
            ):
                j += 1
        i = j + 1
    return n


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    per = {}
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in ("target", ".git", "tests", "fuzz")]
        for f in files:
            if f.endswith(".rs") and f != "tests.rs":
                p = os.path.join(d, f)
                top = os.path.relpath(p, root).split(os.sep)[0]
                per[top] = per.get(top, 0) + production_lines(p)
    for k in sorted(per):
        print(f"{k:12} {per[k]:>7}")
    print(f"{'total':12} {sum(per.values()):>7}")


if __name__ == "__main__":
    main()
