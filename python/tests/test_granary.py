"""The Python package without torch-specific behaviour (these run with or without torch)."""

import errno
import pickle
import random
import shutil

import pytest

import granary
from conftest import run


def test_map_style_equals_granary_cat(packed):
    path, files = packed
    ds = granary.Dataset(path)
    assert len(ds) == len(files)
    for i in range(0, len(ds), 7):
        data, label = ds[i]
        assert isinstance(data, bytes)
        want = run("cat", path, "--id", i).stdout
        assert data == want
        p = ds.path(i)
        assert files[p] == data
        assert ds.lookup(p) == i
        assert ds.classes[label] == p.split("/")[0]
    assert ds[-1] == ds[len(ds) - 1]
    assert memoryview(ds[0][0]).readonly
    with pytest.raises(IndexError):
        ds[len(ds)]
    with pytest.raises(TypeError):
        ds["0"]
    assert ds.lookup("no/such/file") is None
    assert ds.classes == ["c0", "c1", "c2"]


def epoch_ids(ds):
    return [s["id"] for s in ds]


def test_iteration_covers_every_sample_once_per_rank_set(packed):
    path, _ = packed
    for world in (1, 2, 3):
        shares = []
        for r in range(world):
            ds = granary.IterableDataset(path, seed=5, rank=r, world_size=world)
            ds.set_epoch(2)
            shares.append(epoch_ids(ds))
        assert len({len(s) for s in shares}) == 1, "ranks get equal counts"
        every = [i for s in shares for i in s]
        assert sorted(every) == list(range(240)), f"world {world}"
    # Deterministic per (seed, epoch); another epoch is another order.
    a = granary.IterableDataset(path, seed=5)
    b = granary.IterableDataset(path, seed=5)
    assert epoch_ids(a) == epoch_ids(b)
    b.set_epoch(1)
    assert epoch_ids(a) != epoch_ids(b)


def test_samples_carry_checked_bytes_and_labels(packed):
    path, files = packed
    m = granary.Dataset(path)
    for shuffle in ("chunkwise", "global", "sequential"):
        for s in granary.IterableDataset(path, shuffle=shuffle):
            assert s["data"] == files[m.path(s["id"])]
            assert s["label"] == m[s["id"]][1]


def test_batches(packed):
    path, _ = packed
    ds = granary.IterableDataset(path, batch_size=50)
    batches = list(ds)
    assert [len(b["id"]) for b in batches] == [50, 50, 50, 50, 40]
    ids = [int(i) for b in batches for i in b["id"]]
    assert ids == epoch_ids(granary.IterableDataset(path))
    assert all(len(b["data"]) == len(b["id"]) == len(b["label"]) for b in batches)


def as_bytes(x):
    """bytes of a bytearray slice, numpy array or torch tensor."""
    if hasattr(x, "numpy"):
        x = x.numpy()
    return x.tobytes() if hasattr(x, "tobytes") else bytes(x)


def test_packed_batches(packed):
    path, files = packed
    m = granary.Dataset(path)
    ds = granary.IterableDataset(path, batch_size=50, batch_format="tensor")
    ids = []
    for b in ds:
        off = [int(o) for o in b["offsets"]]
        assert len(off) == len(b["id"]) + 1 and off[0] == 0 and off[-1] == len(b["data"])
        for k, i in enumerate(b["id"]):
            assert as_bytes(b["data"][off[k]:off[k + 1]]) == files[m.path(int(i))]
            ids.append(int(i))
    assert ids == epoch_ids(granary.IterableDataset(path))
    with pytest.raises(ValueError):
        granary.IterableDataset(path, batch_format="arrow")


def test_a_stream_reports_what_passed_through_each_layer(packed, tmp_path):
    path, files = packed
    stream = granary.Stream(path, 0, 0, 1, 0, 1)
    data = sum(len(s[2]) for s in stream)
    assert data == sum(len(v) for v in files.values())
    (origin,) = stream.layers()
    assert origin["layer"] == "origin" and origin["errors"] == 0
    assert origin["opens"] >= 1 and origin["reads"] >= 1 and origin["wait_s"] >= 0
    # Each chunk is read once per epoch, not more (records are stored compressed or raw).
    chunks = sum(p.stat().st_size for p in path.glob("*.gchunk"))
    assert 0 < origin["bytes"] <= chunks
    tiered = granary.Stream(path, 0, 0, 1, 0, 1, cache_dir=str(tmp_path / "tier"),
                            cache_size=1 << 30)
    for _ in tiered:
        pass
    assert [x["layer"] for x in tiered.layers()] == ["tier", "origin"]


def test_batches_gather_into_the_callers_buffer(packed):
    np = pytest.importorskip("numpy")
    path, files = packed
    m = granary.Dataset(path)
    stream = granary.Stream(path, 0, 0, 1, 0, 1)
    asked = []

    def alloc(n):
        asked.append(n)
        return np.full(n + 7, 0xEE, dtype=np.uint8)  # larger than asked: the tail is left alone

    ids, labels, buf, off, _, _ = stream.next_batch_into(20, alloc)
    assert len(ids) == 20 and asked == [int(off[-1])] and len(buf) == asked[0] + 7
    assert (buf[asked[0]:] == 0xEE).all()
    for k, i in enumerate(ids):
        assert bytes(buf[off[k]:off[k + 1]]) == files[m.path(i)]
        assert labels[k] == m[i][1]
    for bad, why in [
        (lambda n: bytearray(n), "numpy uint8 array"),
        (lambda n: np.zeros(n, dtype=np.int32), "numpy uint8 array"),
        (lambda n: np.zeros(max(n - 1, 0), dtype=np.uint8), "only"),
        (lambda n: np.zeros(2 * n, dtype=np.uint8)[::2], "strided"),
        (lambda n: np.zeros((n, 1), dtype=np.uint8), "numpy uint8 array"),
        (lambda n: np.frombuffer(bytes(n), dtype=np.uint8), "cannot be written"),
    ]:
        with pytest.raises(ValueError, match=why):
            stream.next_batch_into(5, bad)
    with pytest.raises(ZeroDivisionError):
        stream.next_batch_into(5, lambda n: 1 / 0)


def test_resume_mid_epoch_exact_and_redistributed(packed):
    path, _ = packed
    full = epoch_ids(granary.IterableDataset(path, seed=3))
    ds = granary.IterableDataset(path, seed=3)
    it = iter(ds)
    first = [next(it)["id"] for _ in range(97)]
    state = ds.state_dict()
    assert state["consumed"] == [97]
    del it
    again = granary.IterableDataset(path, seed=3)
    again.load_state_dict(pickle.loads(pickle.dumps(state)))
    rest = epoch_ids(again)
    assert first + rest == full, "same configuration: exact continuation"
    # The same state read by two ranks: the rest is split between them, nothing repeated.
    # (A single-rank state is widened to two ranks that each consumed 97.)
    two = {**state, "world_size": 1}
    parts = []
    for r in range(2):
        d = granary.IterableDataset(path, seed=3, rank=r, world_size=2)
        d.load_state_dict(two)
        parts.append(epoch_ids(d))
    got = first + parts[0] + parts[1]
    assert len(set(got)) == len(got)
    assert len(got) >= len(full) - 1
    with pytest.raises(ValueError):
        again.load_state_dict({"epoch": 0})
    with pytest.raises(ValueError):
        granary.IterableDataset(path, seed=4).load_state_dict(state)


class AsWorker(granary.IterableDataset):
    """The dataset as DataLoader worker ``w`` of ``n`` sees it (what get_worker_info() gives
    inside a worker process), to play StatefulDataLoader's per-worker protocol in process."""

    def __init__(self, *a, worker=(0, 1), **kw):
        super().__init__(*a, **kw)
        self.as_worker = worker

    def _worker(self):
        return self.as_worker


def test_resume_per_worker_as_stateful_dataloader_does(packed):
    # StatefulDataLoader keeps one dataset state per worker, taken inside that worker, and on
    # resume loads each worker's own state into that worker's copy of the dataset.
    path, _ = packed
    workers, rank_world = 3, [(0, 2), (1, 2)]
    for rank, world in rank_world:
        kw = dict(seed=5, rank=rank, world_size=world, batch_size=7)
        full = {w: [int(i) for b in AsWorker(path, worker=(w, workers), **kw) for i in b["id"]]
                for w in range(workers)}
        states, first = {}, {}
        for w, steps in zip(range(workers), (0, 2, 5)):
            ds = AsWorker(path, worker=(w, workers), **kw)
            it = iter(ds)
            first[w] = [int(i) for _ in range(steps) for i in next(it)["id"]]
            states[w] = pickle.loads(pickle.dumps(ds.state_dict()))
            del it
        for w in range(workers):
            again = AsWorker(path, worker=(w, workers), **kw)
            again.load_state_dict(states[w])
            rest = [int(i) for b in again for i in b["id"]]
            assert first[w] + rest == full[w], f"worker {w} of rank {rank}"
    union = [i for rank, world in rank_world for w in range(workers)
             for b in AsWorker(path, worker=(w, workers), seed=5, rank=rank, world_size=world,
                               batch_size=7) for i in b["id"]]
    assert len(union) == len(set(union)) and len(union) >= 240 - 2 * workers * 7


def test_report_by_id_feeds_the_shared_table(packed, tmp_path):
    path, _ = packed
    cache = tmp_path / "tier"
    ds = granary.IterableDataset(path, cache_dir=cache, cache_size=1 << 20, policy="importance")
    ids = list(range(240))
    random.Random(1).shuffle(ids)
    batch = ids[:64]
    losses = [float(i % 5) for i in range(64)]
    ds.report(batch, losses)
    with pytest.raises(ValueError):
        ds.report([240], [1.0])
    with pytest.raises(ValueError):
        ds.report([1, 2], [1.0])
    ds.flush_scores()
    scores = granary.Scores(path, cache)
    order = sorted(range(64), key=lambda k: losses[k])
    import math

    for rank0, k in enumerate(order):
        # Ties keep batch order; every reported sample got ln(10 + its rank).
        assert abs(scores.score(batch[k]) - math.log(10 + rank0 + 1)) < 1e-5
    # Importance sampling now works and hands out weights; the tier fills.
    ds2 = granary.IterableDataset(
        path, cache_dir=cache, cache_size=1 << 20, policy="importance", sampling="importance", alpha=0.8
    )
    got = list(ds2)
    assert len(got) == 240
    assert all(s["weight"] > 0 for s in got)
    assert any(abs(s["weight"] - 1.0) > 1e-3 for s in got)


def test_importance_from_epoch_0_with_one_object(packed, tmp_path):
    """No table yet: epoch 0 draws uniformly (weights 1). Losses reported through the same
    object reach the table at set_epoch(), and epoch 1 samples by them: no flush, no second
    object."""
    path, _ = packed
    ds = granary.IterableDataset(
        path, cache_dir=tmp_path / "tier", cache_size=1 << 20, sampling="importance", alpha=0.9,
        cache_boost=1.0, batch_size=16,
    )
    seen = []
    for b in ds:
        seen.extend(int(i) for i in b["id"])
        assert all(abs(w - 1.0) < 1e-6 for w in b["weight"]), "epoch 0 is uniform"
        # Samples 0..59 are hard (loss 10), the rest easy.
        ds.report(b["id"], [10.0 if int(i) < 60 else 0.1 for i in b["id"]])
    assert len(seen) == 240
    ds.set_epoch(1)
    w = {int(i): float(x) for b in ds for i, x in zip(b["id"], b["weight"])}
    reported = set(seen)
    hard = [x for i, x in w.items() if i < 60 and i in reported]
    easy = [x for i, x in w.items() if i >= 60 and i in reported]
    # Scores are ranks within a batch (SHADE), so the hard samples reported in epoch 0 are
    # drawn more often in epoch 1 and carry smaller loss weights 1/(N p) than easy ones.
    assert hard and easy
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    assert mean(hard) < 0.95 * mean(easy), (mean(hard), mean(easy))


def test_locality_pad_and_transform(packed):
    path, files = packed
    by_id = granary.Dataset(path)

    def share(rank, world, epoch, q, **kw):
        ds = granary.IterableDataset(path, rank=rank, world_size=world, locality=q, seed=3, **kw)
        ds.set_epoch(epoch)
        return [s["id"] for s in ds]

    # locality=0 keeps every rank on its home chunks in every epoch (up to the samples moved
    # to equalise counts); 1 reshuffles them (a quarter in common by chance).
    def kept(q):
        a, b = set(share(1, 4, 0, q)), set(share(1, 4, 1, q))
        return len(a & b) / len(a)

    assert kept(0.0) > 0.85, kept(0.0)
    assert kept(1.0) < 0.6, kept(1.0)
    # Every epoch still covers each sample at most once across ranks.
    union = [i for r in range(7) for i in share(r, 7, 2, 0.3)]
    assert len(union) == len(set(union)) == 240 // 7 * 7
    # pad=True fills the remainder by repeating samples: all 240 appear.
    padded = [i for r in range(7) for i in share(r, 7, 2, 0.3, pad=True)]
    assert len(padded) == 7 * -(-240 // 7) and set(padded) == set(range(240))
    with pytest.raises(ValueError):
        granary.IterableDataset(path, pad=True, drop_last=True)
    with pytest.raises(ValueError):
        granary.IterableDataset(path, locality=1.5)

    # transform runs on every sample's bytes, per sample and in list batches.
    for kw in ({}, {"batch_size": 32}):
        got = {}
        for item in granary.IterableDataset(path, transform=lambda d: (len(d), d[:4]), **kw):
            ids = item["id"] if "batch_size" in kw else [item["id"]]
            datas = item["data"] if "batch_size" in kw else [item["data"]]
            for i, d in zip(ids, datas):
                got[int(i)] = d
        assert len(got) == 240
        for i, (n, head) in got.items():
            data = files[by_id.path(i)]
            assert (n, as_bytes(head)) == (len(data), data[:4])
    # collate turns a list batch's (transformed) samples into one object.
    batches = list(granary.IterableDataset(path, batch_size=32, transform=len,
                                           collate=lambda xs: ("sizes", xs)))
    assert all(b["data"][0] == "sizes" and len(b["data"][1]) == len(b["id"]) for b in batches)
    assert {int(i): n for b in batches for i, n in zip(b["id"], b["data"][1])} == {
        i: len(files[by_id.path(i)]) for i in range(240)}
    for bad in ({"collate": 3, "batch_size": 8}, {"collate": len},
                {"collate": len, "batch_size": 8, "batch_format": "tensor"}):
        with pytest.raises(ValueError):
            granary.IterableDataset(path, **bad)
    m = granary.Dataset(path, transform=len)
    assert m[5] == (len(files[m.path(5)]), by_id[5][1])
    assert pickle.loads(pickle.dumps(m))[5] == m[5]
    with pytest.raises(ValueError):
        granary.IterableDataset(path, transform=len, batch_size=8, batch_format="tensor")
    with pytest.raises(ValueError):
        granary.Dataset(path, transform=3)


def test_arguments_are_checked(packed, tmp_path):
    path, _ = packed
    with pytest.raises(ValueError):
        granary.IterableDataset(path, sampling="importance")
    with pytest.raises(ValueError):
        granary.IterableDataset(path, shuffle="random")
    with pytest.raises(ValueError):
        granary.IterableDataset(path, rank=2, world_size=2)
    with pytest.raises(ValueError):
        granary.IterableDataset(path, cache_dir=tmp_path)
    with pytest.raises(ValueError):
        granary.IterableDataset(path).report([0], [1.0])
    with pytest.raises(granary.GranaryError) as missing:
        granary.Dataset(tmp_path / "missing")
    assert missing.value.errno == errno.ENOENT
    assert not isinstance(missing.value, granary.DamagedError)


def test_pickling_keeps_configuration_only(packed):
    path, _ = packed
    ds = granary.IterableDataset(path, seed=9, batch_size=16)
    ds.set_epoch(4)
    it = iter(ds)
    next(it)
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.epoch == 4 and clone.seed == 9
    fresh = granary.IterableDataset(path, seed=9, batch_size=16)
    fresh.set_epoch(4)
    assert [list(b["id"]) for b in clone] == [list(b["id"]) for b in fresh]
    m = pickle.loads(pickle.dumps(granary.Dataset(path)))
    assert m[3] == granary.Dataset(path)[3]


def test_damaged_chunk_is_an_error_never_wrong_bytes(packed, tmp_path):
    path, _ = packed
    copy = tmp_path / "copy.granary"
    shutil.copytree(path, copy)
    chunk = sorted(copy.glob("chunk-*.gchunk"))[0]
    b = bytearray(chunk.read_bytes())
    b[100] ^= 0xFF
    chunk.write_bytes(bytes(b))
    ds = granary.Dataset(copy)
    bad = [i for i in range(len(ds)) if _raises(ds, i)]
    assert bad, "a flipped byte inside a record must fail its CRC"
    with pytest.raises(granary.DamagedError):
        for _ in granary.IterableDataset(copy, shuffle="sequential"):
            pass
    # Another dataset's chunk under this one's name: damaged too, not a system error.
    other = tmp_path / "other"
    shutil.copytree(path, other)
    first = sorted(other.glob("chunk-*.gchunk"))
    shutil.copy(first[1], first[0])
    with pytest.raises(granary.DamagedError, match="holds chunk id|bytes, the snapshot says"):
        for _ in granary.IterableDataset(other, shuffle="sequential"):
            pass


def _raises(ds, i):
    try:
        ds[i]
    except granary.DamagedError:
        return True
    return False


def test_stream_arguments_by_position_or_name_and_unknown_ones_refused(packed):
    path, files = packed
    by_position = [s[0] for s in granary.Stream(path, 0, 0, 1, 0, 1, seed=3)]
    by_name = [s[0] for s in granary.Stream(path, 0, rank=0, world_size=1, worker=0,
                                            num_workers=1, seed=3)]
    assert by_position == by_name and len(by_position) == len(files)
    with pytest.raises(TypeError, match="unexpected keyword argument 'sede'"):
        granary.Stream(path, 0, 0, 1, 0, 1, sede=3)
    with pytest.raises(TypeError, match="missing required argument: 'num_workers'"):
        granary.Stream(path, 0, 0, 1, 0)
    with pytest.raises(TypeError, match="argument seed"):
        granary.Stream(path, 0, 0, 1, 0, 1, seed="three")
    with pytest.raises(ValueError, match="unknown sampling"):
        granary.Stream(path, 0, 0, 1, 0, 1, sampling="sideways")


def test_every_reader_option_is_a_loader_keyword_with_the_librarys_default(packed):
    """The library declares the reader's options once (READER_DEFAULTS: every option and its
    default); the loader takes each as a keyword (rank and world_size per stream, as
    torch.distributed says), defaulting to the library's
    value or to None (the library's default, for backend GRANARY_IO's), and hands them to
    every stream."""
    import inspect

    from granary import _iterable

    defaults = granary._native.READER_DEFAULTS
    params = inspect.signature(granary.IterableDataset.__init__).parameters
    assert set(_iterable._READER_OPTIONS) <= set(defaults)
    assert "lenient_scores" not in defaults  # the loader's own, not an option
    for name, value in defaults.items():
        assert name in params, f"reader option {name} is not a loader keyword"
        assert params[name].default in (value, None), (name, params[name].default, value)
    for name in set(defaults) - {"rank", "world_size"}:
        assert name in _iterable._READER_OPTIONS, f"{name} is not handed to streams"
    path, files = packed
    ds = granary.IterableDataset(path, io="buffered", backend="pread", queue_depth=4,
                                 range_gap=0)
    assert sorted(len(s["data"]) for s in ds) == sorted(len(b) for b in files.values())
    with pytest.raises(ValueError, match="queue_depth"):
        granary.IterableDataset(path, queue_depth=0)


def test_granary_io_is_taken_as_granary_read_takes_it(packed, monkeypatch):
    """GRANARY_IO chooses the backend when the call does not; a value `granary read` refuses
    (empty included) is refused here too, naming the variable."""
    path, files = packed
    monkeypatch.setenv("GRANARY_IO", "pread")
    assert sum(1 for _ in granary.IterableDataset(path)) == len(files)
    for bad in ("", "sideways"):
        monkeypatch.setenv("GRANARY_IO", bad)
        with pytest.raises(ValueError, match="GRANARY_IO"):
            list(granary.IterableDataset(path))
    assert sum(1 for _ in granary.IterableDataset(path, backend="pread")) == len(files)
