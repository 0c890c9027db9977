"""A smoke test of an installed granary wheel, through the wheel's own `granary` command: pack a
small tree, verify it, read an epoch, and the Python API's round trips (Dataset,
IterableDataset, Writer). scripts/test-wheels.sh runs it in an arm64 chroot under qemu-user.
Exits non-zero, saying what differed, on any failure."""

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

import granary


def run(*args):
    p = subprocess.run(["granary", *map(str, args)], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"granary {' '.join(map(str, args))} failed ({p.returncode}): {p.stderr}")
    return p.stdout


def main():
    cli = shutil.which("granary")
    if cli is None:
        sys.exit("the wheel put no granary command on PATH")
    version = run("--version")
    if not version.startswith(f"granary {granary.__version__}\n"):
        sys.exit(f"granary --version says {version!r}, the module {granary.__version__}")
    tmp = tempfile.mkdtemp()
    rng = random.Random(7)
    files = {}
    for i in range(300):
        rel = f"c{i % 3}/f{i:04}.bin"
        data = rng.randbytes(rng.randint(100, 5000)) if i % 2 else b"abc " * rng.randint(1, 900)
        path = os.path.join(tmp, "src", rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        files[rel] = data
    ds = os.path.join(tmp, "ds")
    run("pack", os.path.join(tmp, "src"), "-o", ds, "--chunk-size", "64KiB", "--quiet")
    run("verify", ds)
    epochs = json.loads(run("read", ds, "--json", "--epochs", "2"))
    if [e["samples"] for e in epochs] != [len(files)] * 2:
        sys.exit(f"read delivered {[e['samples'] for e in epochs]} samples, not {len(files)}")

    d = granary.Dataset(ds)
    got = {d.path(i): d[i][0] for i in range(len(d))}
    if got != files:
        sys.exit("Dataset returned other bytes than were packed")
    seen = {d.path(s["id"]): bytes(s["data"]) for s in granary.IterableDataset(ds, seed=3)}
    if seen != files:
        sys.exit(f"IterableDataset delivered {len(seen)} distinct samples or other bytes, not the {len(files)} packed")

    out = os.path.join(tmp, "written")
    with granary.Writer(out, progress=False) as w:
        for rel, data in files.items():
            w.write(rel, data, label=rel.split("/")[0])
    d = granary.Dataset(out)
    if {d.path(i): d[i][0] for i in range(len(d))} != files:
        sys.exit("a dataset the Writer wrote reads back other bytes")
    shutil.rmtree(tmp)
    backends = granary.io_backends()
    print(f"wheel smoke test passed: {len(files)} samples; io_uring: {backends['io_uring']}"
          f" ({backends['io_uring_unavailable'] or 'available'})")


if __name__ == "__main__":
    main()
