"""Shared fixtures: a small packed dataset made with the granary CLI."""

import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def granary_bin():
    """The CLI: $GRANARY_BIN, or the workspace's build (release preferred)."""
    env = os.environ.get("GRANARY_BIN")
    if env:
        return env
    for kind in ("release", "debug"):
        p = ROOT / "target" / kind / "granary"
        if p.exists():
            return str(p)
    found = shutil.which("granary")
    if found:
        return found
    pytest.skip("the granary CLI is not built (cargo build) and GRANARY_BIN is not set")


def run(*args, **kw):
    return subprocess.run([granary_bin(), *map(str, args)], check=True, capture_output=True, **kw)


def make_tree(root, n, classes=3, seed=0):
    """``n`` files c{i % classes}/f{i}.bin of 200..3000 pseudo-random bytes; returns
    {relative path: bytes}."""
    rng = random.Random(seed)
    files = {}
    for i in range(n):
        rel = f"c{i % classes}/f{i:04}.bin"
        data = rng.randbytes(rng.randint(200, 3000)) if i % 4 else b"text " * rng.randint(40, 600)
        p = Path(root) / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        files[rel] = data
    return files


@pytest.fixture(scope="session")
def packed(tmp_path_factory):
    """(dataset dir, {path: bytes}) — 240 files in 3 classes, 16 KiB chunks, mixed raw and
    zstd records."""
    tmp = tmp_path_factory.mktemp("ds")
    files = make_tree(tmp / "src", 240)
    out = tmp / "train.granary"
    run("pack", tmp / "src", "-o", out, "--chunk-size", "16KiB")
    return out, files
