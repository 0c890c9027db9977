"""ChunkwiseSampler and Dataset.plan, over a packed tree and over a real `granary mount` (where
FUSE mounts are possible here)."""

import os
import subprocess
from pathlib import Path

import pytest

import granary

from conftest import granary_bin, run


def required(switch):
    """A prerequisite a CI run must have: its GRANARY_REQUIRE_* switch, or CI=true."""
    return os.environ.get(switch) == "1" or os.environ.get("CI") == "true"


def fuse_unavailable():
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if os.geteuid() != 0 and subprocess.run(["sh", "-c", "command -v fusermount3"],
                                             capture_output=True).returncode != 0:
        return "not root and no fusermount3"
    return None


@pytest.fixture
def mounted(packed, tmp_path):
    why = fuse_unavailable()
    if why and required("GRANARY_REQUIRE_FUSE"):
        pytest.fail(f"GRANARY_REQUIRE_FUSE=1 (or CI=true) but FUSE mounts are not possible: {why}")
    if why:
        pytest.skip(f"FUSE mounts are not possible here: {why}")
    ds, files = packed
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run("mount", ds, mnt, "--log", tmp_path / "mount.log")
    try:
        yield mnt, ds, files
    finally:
        run("umount", mnt)


def test_plan_is_every_sample_once_in_chunk_order(packed):
    ds_path, files = packed
    ds = granary.Dataset(ds_path)
    order = ds._ds.plan(0, seed=3, window=1)
    assert sorted(order) == list(range(len(files)))
    assert order == ds._ds.plan(0, seed=3, window=1)
    assert order != ds._ds.plan(1, seed=3, window=1)
    halves = [ds._ds.plan(0, seed=3, rank=r, world_size=2) for r in (0, 1)]
    assert not set(halves[0]) & set(halves[1])
    assert len(halves[0]) == len(halves[1]) == len(files) // 2
    with pytest.raises(ValueError):
        ds._ds.plan(0, shuffle="sideways")
    # Locality is a plan's own option; options that only reading uses are refused, not ignored.
    homes = [ds._ds.plan(0, seed=3, rank=r, world_size=2, locality=0.0) for r in (0, 1)]
    assert sorted(homes[0] + homes[1]) == sorted(halves[0] + halves[1])
    for bad in ({"cache_dir": "/tmp/x"}, {"io": "direct"}, {"prefetch": 2}):
        with pytest.raises(TypeError, match="does not use"):
            ds._ds.plan(0, **bad)


def test_sampler_over_a_mount_orders_an_image_folder_style_list(mounted):
    mnt, ds_path, files = mounted
    paths = sorted(str(p) for p in Path(mnt).rglob("*") if p.is_file())
    assert len(paths) == len(files)
    s = granary.ChunkwiseSampler(paths, seed=1)
    assert os.path.samefile(s.dataset, ds_path)
    e0, e1 = list(s), list(s)  # advances one epoch per iteration
    assert sorted(e0) == sorted(e1) == list(range(len(paths)))
    assert e0 != e1
    s.set_epoch(0)
    assert list(s) == e0
    # The order follows the dataset's plan: the same ids as Dataset.plan, mapped to indices.
    native = granary.Dataset(ds_path)._ds
    rel = [os.fsencode(os.path.relpath(p, mnt)) for p in paths]
    assert [native.lookup(rel[i]) for i in e0] == native.plan(0, seed=1)
    # Every file read through the mount in that order has its bytes.
    for i in e0[:50]:
        with open(paths[i], "rb") as f:
            assert f.read() == files[os.path.relpath(paths[i], mnt)]
    # Ranks split an epoch.
    parts = [granary.ChunkwiseSampler(paths, rank=r, world_size=2).order(0) for r in (0, 1)]
    assert not set(parts[0]) & set(parts[1])
    assert len(parts[0]) + len(parts[1]) == len(paths)
    # Statistics of the mount as an extended attribute.
    stats = __import__("json").loads(os.getxattr(mnt, "user.granary.stats"))
    assert stats["samples"] == len(files)
    assert stats["samples_from_origin"] >= 50


def test_sampler_needs_a_mount_or_a_dataset(packed, tmp_path):
    ds_path, files = packed
    with pytest.raises(ValueError, match="not on a granary mount"):
        granary.ChunkwiseSampler([str(tmp_path / "x" / "y.bin")])
    with pytest.raises(ValueError, match="no .root"):
        granary.ChunkwiseSampler([str(tmp_path / "x" / "y.bin")], dataset=ds_path)

    class Folder:  # what ImageFolder offers: .root and .samples
        def __init__(self, root, rels):
            self.root = str(root)
            self.samples = [(os.path.join(self.root, r), 0) for r in rels]

    rels = sorted(files)
    s = granary.ChunkwiseSampler(Folder(tmp_path / "src", rels), dataset=ds_path)
    assert sorted(s.order(0)) == list(range(len(rels)))
    with pytest.raises(ValueError, match="is not in dataset"):
        granary.ChunkwiseSampler(Folder(tmp_path / "src", rels + ["c9/missing.bin"]),
                                 dataset=ds_path)


def test_sampler_pickles(packed, tmp_path):
    import pickle

    ds_path, files = packed

    class Folder:
        root = str(tmp_path)
        samples = [(os.path.join(str(tmp_path), r), 0) for r in sorted(files)]

    s = granary.ChunkwiseSampler(Folder(), dataset=ds_path, seed=5)
    t = pickle.loads(pickle.dumps(s))
    assert t.order(2) == s.order(2)
    assert granary_bin()
