"""Grain (JAX's data loader) over granary: ``granary.grain.DataSource`` with Grain's sampler,
batching, worker processes and checkpointing, and JAX on CPU consuming the batches. Runs in
the venv scripts/python-tests.sh makes for it (python/requirements-grain.txt); elsewhere it
is skipped unless GRANARY_REQUIRE_GRAIN=1, which makes a missing Grain or JAX a failure."""

import os

import pytest

import granary
import granary.grain

from conftest import run

if os.environ.get("GRANARY_REQUIRE_GRAIN") == "1":
    import grain
    import jax.numpy as jnp
    import numpy as np
else:
    grain = pytest.importorskip("grain")
    jnp = pytest.importorskip("jax.numpy")
    np = pytest.importorskip("numpy")

# Grain reads its options from absl flags, which a program parses in absl.app.run(); outside
# one (pytest) they must be marked parsed before a DataLoader starts worker processes.
from absl import flags  # noqa: E402 (comes with Grain)

flags.FLAGS.mark_as_parsed()


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("grain")
    src = root / "src"
    want = {}
    for i in range(200):
        rel = f"c{i % 4}/f{i:04}.bin"
        p = src / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(64)
        p.write_bytes(data)
        want[rel] = data
    ds = root / "ds"
    r = run("pack", src, "-o", ds, "--chunk-size", "4KiB")
    assert r.returncode == 0, r.stderr
    return ds, want


def loader(src, seed=3, workers=0):
    sampler = grain.samplers.IndexSampler(
        num_records=len(src), shuffle=True, seed=seed, num_epochs=1,
        shard_options=grain.sharding.NoSharding())
    return grain.DataLoader(data_source=src, sampler=sampler,
                            operations=[grain.transforms.Batch(8, drop_remainder=False)],
                            worker_count=workers)


def test_a_dataset_is_a_grain_source_with_batches_jax_takes(packed):
    ds, want = packed
    src = granary.grain.DataSource(ds)
    assert isinstance(src, grain.sources.RandomAccessDataSource)
    assert len(src) == 200 and "dataset_id=" in repr(src)
    names = granary.Dataset(ds)
    seen = []
    for batch in loader(src):
        assert batch["data"].shape[1:] == (64,) and batch["data"].dtype == np.uint8
        for i, row in zip(batch["id"].tolist(), batch["data"]):
            assert bytes(row) == want[names.path(i)]
        seen.extend(batch["id"].tolist())
        # JAX on CPU takes the batch as it is.
        assert int(jnp.asarray(batch["data"]).astype(jnp.int32).sum()) == int(
            batch["data"].astype(np.int64).sum())
    assert sorted(seen) == list(range(200))
    # Grain's worker processes get the source pickled (configuration only).
    again = sorted(i for b in loader(src, workers=2) for i in b["id"].tolist())
    assert again == list(range(200))
    # The MapDataset API too.
    md = grain.MapDataset.source(src).shuffle(seed=1).batch(16)
    assert sorted(i for b in md for i in b["id"].tolist()) == list(range(200))
    with pytest.raises(IndexError):
        src[200]


def test_grain_checkpoints_resume_exactly(packed):
    ds, _ = packed
    src = granary.grain.DataSource(ds)
    full = [i for b in loader(src) for i in b["id"].tolist()]
    it = iter(loader(src))
    first = [i for _ in range(7) for i in next(it)["id"].tolist()]
    state = it.get_state()
    it2 = iter(loader(granary.grain.DataSource(ds)))
    it2.set_state(state)
    rest = [i for b in it2 for i in b["id"].tolist()]
    assert first + rest == full


def test_a_view_is_a_grain_source_of_its_samples(packed, tmp_path):
    ds, want = packed
    view = tmp_path / "c1.gview"
    r = run("view", ds, "-o", view, "--class", "c1")
    assert r.returncode == 0, r.stderr
    src = granary.grain.DataSource(view)
    assert len(src) == 50
    names = granary.Dataset(ds)
    got = sorted(names.path(i) for b in loader(src) for i in b["id"].tolist())
    assert got == sorted(k for k in want if k.startswith("c1/"))


def test_damage_read_in_grain_worker_processes_is_raised_not_a_hang(tmp_path):
    # Grain's worker processes send their exceptions pickled: a granary error must survive it.
    src_dir = tmp_path / "src"
    contents = []
    for i in range(400):
        p = src_dir / f"c{i % 4}" / f"f{i:04}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        contents.append(os.urandom(64))
        p.write_bytes(contents[-1])
    ds = tmp_path / "ds"
    run("pack", src_dir, "-o", ds, "--chunk-size", "4KiB", "--compress", "none")
    chunk = sorted(p for p in ds.iterdir() if p.name.endswith(".gchunk"))[1]
    # A byte of a sample's data (not of the chunk's footer, which readers do not use).
    body = chunk.read_bytes()
    at = next(body.find(c) for c in contents if body.find(c) >= 0) + 10
    with open(chunk, "r+b") as f:
        f.seek(at)
        f.write(bytes([body[at] ^ 0xFF]))
    with pytest.raises(Exception) as caught:
        for _ in loader(granary.grain.DataSource(ds), workers=2):
            pass
    # Grain re-raises the worker's exception itself, or wraps it naming it.
    text = f"{type(caught.value).__name__}: {caught.value} {caught.value.__cause__!r}"
    assert "DamagedError" in text and chunk.name in text, text
