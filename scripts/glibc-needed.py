"""Prints the newest glibc symbol version an ELF file needs (its GLIBC_x.y version needs), e.g.
2.17: the oldest glibc it can run on. Used by scripts/build-wheel.sh to hold a wheel's tag to
what its files need. Needs pyelftools (installed with auditwheel in the build venv)."""

import sys

from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection


def glibc_needed(path):
    newest = (0,)
    with open(path, "rb") as f:
        elf = ELFFile(f)
        for section in elf.iter_sections():
            if not isinstance(section, GNUVerNeedSection):
                continue
            for _, auxes in section.iter_versions():
                for aux in auxes:
                    name = aux.name
                    if name.startswith("GLIBC_") and name[6:7].isdigit():
                        newest = max(newest, tuple(int(p) for p in name[6:].split(".")))
    return newest


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: glibc-needed.py ELF_FILE")
    v = glibc_needed(sys.argv[1])
    if v == (0,):
        sys.exit(f"{sys.argv[1]}: needs no versioned glibc symbol (not a glibc-linked ELF file?)")
    print(".".join(map(str, v)))
