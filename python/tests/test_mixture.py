"""``granary.Mixture``: several datasets in one epoch with DataLoader and StatefulDataLoader:
each source in its share, every sample with its source and right bytes, exact resume (also
under another world size), bad input refused."""

import collections
import os

import pytest

import granary

from conftest import run

torch = pytest.importorskip("torch")
DataLoader = torch.utils.data.DataLoader


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """Three datasets of 300, 120 and 60 files: [(path, {id: bytes})]."""
    root = tmp_path_factory.mktemp("mix")
    out = []
    for name, n in (("web", 300), ("books", 120), ("code", 60)):
        src = root / f"src-{name}"
        files = {}
        for i in range(n):
            rel = f"{name}/c{i % 3}/f{i:04}"
            p = src / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            data = os.urandom(40 + (i * 37) % 700)
            p.write_bytes(data)
            files[rel] = data
        ds = root / f"{name}.granary"
        r = run("pack", src, "-o", ds, "--chunk-size", "8KiB")
        assert r.returncode == 0, r.stderr
        d = granary.Dataset(ds)
        out.append((str(ds), {i: files[d.path(i)] for i in range(len(d))}))
    return out


def _pairs(item):
    """(source, id) of a per-sample item or of every sample of a batch."""
    if isinstance(item["id"], int):
        return [(int(item["source"]), int(item["id"]))]
    return list(zip(torch.as_tensor(item["source"]).tolist(), torch.as_tensor(item["id"]).tolist()))


@pytest.mark.parametrize("workers,batch", [(0, None), (2, None), (0, 16), (2, 16)])
def test_each_source_in_its_share_with_its_bytes(three, workers, batch):
    paths = [p for p, _ in three]
    mix = granary.Mixture(paths, weights=[0.5, 0.3, 0.2], seed=4, batch_size=batch)
    assert mix.counts == [240, 144, 96]
    seen = collections.Counter()
    for item in DataLoader(mix, batch_size=None, num_workers=workers):
        pairs = _pairs(item)
        data = [item["data"]] if batch is None else item["data"]
        for (s, i), d in zip(pairs, data):
            assert bytes(d.numpy() if hasattr(d, "numpy") else d) == three[s][1][i]
        seen.update(s for s, _ in pairs)
    # With workers, each worker's share of each source is cut on its own: at most one sample
    # per worker less of each.
    for s, want in enumerate([240, 144, 96]):
        assert want - workers <= seen[s] <= want, (s, seen)
    # repeat / choose: half of web (a different half next epoch), books twice, 50 of code.
    mix = granary.Mixture(paths, shares=["repeat=0.5", "repeat=2", "choose=50"])
    assert mix.counts == [150, 240, 50]
    got = [collections.Counter(p for item in mix for p in _pairs(item)) for _ in range(1)][0]
    assert len([k for k in got if k[0] == 0]) == 150
    assert all(c == 2 for k, c in got.items() if k[0] == 1) and len([k for k in got if k[0] == 1]) == 120
    mix.set_epoch(1)
    again = {k for item in mix for k in _pairs(item) if k[0] == 0}
    assert again != {k for k in got if k[0] == 0}


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_a_mixture_exactly(three, workers):
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    paths = [p for p, _ in three]

    def go(state=None, take=None):
        ds = granary.Mixture(paths, weights=[5, 3, 2], seed=9, batch_size=8)
        ds.set_epoch(1)
        dl = sdl.StatefulDataLoader(ds, batch_size=None, num_workers=workers)
        if state is not None:
            dl.load_state_dict(state)
        got = []
        for b in dl:
            got.extend(_pairs(b))
            if take is not None and len(got) == take:
                return got, dl.state_dict()
        return got, None

    full, _ = go()
    assert len(full) >= 480 - 2 * 8 * max(workers, 1)
    first, state = go(take=96)
    rest, _ = go(state=state)
    assert first + rest == full
    second, state2 = go(state=state, take=64)
    again, _ = go(state=state2)
    assert first + second + again == full


def test_a_mixture_resumes_under_another_world_size(three):
    paths = [p for p, _ in three]
    kw = dict(weights=[0.5, 0.3, 0.2], seed=2, batch_size=6)
    full = collections.Counter(
        k for r in range(2)
        for b in granary.Mixture(paths, rank=r, world_size=2, **kw) for k in _pairs(b))
    # Both ranks stop after 9 batches (lockstep); the job comes back with 3 ranks.
    got = collections.Counter()
    state = None
    for r in range(2):
        ds = granary.Mixture(paths, rank=r, world_size=2, **kw)
        it = iter(ds)
        for _ in range(9):
            got.update(_pairs(next(it)))
        state = ds.state_dict()
        del it
    for r in range(3):
        ds = granary.Mixture(paths, rank=r, world_size=3, **kw)
        ds.load_state_dict(state)
        got.update(k for b in ds for k in _pairs(b))
    # Nothing twice; what is missing is what the equal cut per rank drops of each source's
    # rest (fewer than 3 samples each).
    assert all(full[k] >= c for k, c in got.items())
    for s in range(3):
        missing = sum(c for k, c in full.items() if k[0] == s) - sum(
            c for k, c in got.items() if k[0] == s)
        assert 0 <= missing < 3, (s, missing)


def test_bad_mixtures_are_refused(three):
    paths = [p for p, _ in three]
    for kw, want in [
        (dict(weights=[0.5, -1, 1]), "not a positive number"),
        (dict(weights=[0.5, float("nan"), 1]), "not a positive number"),
        (dict(weights=[1, 1]), "2 shares for 3 sources"),
        (dict(shares=["repeat=1", "often=2", "choose=3"]), "unknown share"),
        (dict(weights=[1, 1, 1], shares=["1", "1", "1"]), "weights or shares"),
        (dict(weights=[1, 1, 1], sampling="importance"), "needs cache_dir"),
        (dict(weights=[1, 1, 1], locality=0.5), "not supported for mixtures yet"),
    ]:
        with pytest.raises(ValueError, match=want):
            granary.Mixture(paths, **kw)
    with pytest.raises(ValueError, match="same samples of one dataset"):
        granary.Mixture([paths[0], paths[0]])
    with pytest.raises(ValueError, match="a list of datasets"):
        granary.Mixture(paths[0])
    mix = granary.Mixture(paths, weights=[1, 1, 1])
    single = granary.IterableDataset(paths[0]).state_dict()
    with pytest.raises(ValueError, match="not a mixture's"):
        mix.load_state_dict(single)
    # The state of another mixture (its sources in another order) is refused.
    other = granary.Mixture(list(reversed(paths)), weights=[1, 1, 1])
    with pytest.raises(ValueError, match="the state resumes mixture"):
        mix.load_state_dict(other.state_dict())


def test_importance_sampling_per_source(three, tmp_path):
    paths = [p for p, _ in three]
    tier = tmp_path / "tier"
    mix = granary.Mixture(paths[:2], weights=[0.5, 0.5], batch_size=32, cache_dir=tier,
                          cache_size=64 << 20, sampling="importance", alpha=0.9, cache_boost=1.0)
    assert mix.counts == [210, 210]
    # The samples of c0 lose much more than the others, in both sources.
    names = [granary.Dataset(p) for p in paths[:2]]
    for epoch in range(3):
        mix.set_epoch(epoch)
        for b in mix:
            ids, srcs = b["id"].tolist(), b["source"].tolist()
            losses = [9.0 if "/c0/" in names[s].path(i) else 0.1 for i, s in zip(ids, srcs)]
            mix.report(ids, losses, sources=srcs)
    mix.flush_scores()
    mix.set_epoch(5)
    seen = collections.Counter()
    w = {True: [], False: []}
    for b in mix:
        for i, s, wt in zip(b["id"].tolist(), b["source"].tolist(), b["weight"].tolist()):
            seen[s] += 1
            w["/c0/" in names[s].path(i)].append(wt)
    assert seen == {0: 210, 1: 210}
    # Each source's table now scores c0 above the rest (SHADE's rank weights: ln(10 + rank)),
    # so c0's samples are drawn with a higher probability: a lower loss weight 1/(N p).
    mean = {k: sum(v) / len(v) for k, v in w.items()}
    assert mean[True] < mean[False], mean
    for s in (0, 1):
        table = granary.Scores(paths[s], tier)
        n = len(names[s])
        hi = [table.score(i) for i in range(n) if "/c0/" in names[s].path(i)]
        lo = [table.score(i) for i in range(n) if "/c0/" not in names[s].path(i)]
        assert sum(hi) / len(hi) > sum(lo) / len(lo) + 0.3, s
    with pytest.raises(ValueError, match="each sample's source"):
        mix.report([0], [1.0])


@pytest.mark.parametrize("workers", [0, 2])
def test_fields_come_from_each_samples_own_source(three, tmp_path, workers):
    out = tmp_path / "f.granary"
    want = {}
    with granary.Writer(out, chunk_size=16 << 10, progress=False) as w:
        for i in range(90):
            f = {"jpg": os.urandom(100 + i), "txt": b"caption %d" % i}
            w.write(f"s{i:03d}", f, label=i % 2)
            want[f"s{i:03d}"] = f
    names = granary.Dataset(out)
    plain = three[2][0]
    mix = granary.Mixture([str(out), plain], shares=["repeat=1", "repeat=1"], batch_size=16, seed=2)
    seen = collections.Counter()
    for b in DataLoader(mix, batch_size=None, num_workers=workers):
        fields = b["fields"]
        for k, (s, i) in enumerate(_pairs(b)):
            seen[s] += 1
            if s == 0:
                exp = want[names.path(i)]
                assert bytes(fields["txt"][k]) == exp["txt"] or fields["txt"][k] == exp["txt"].decode()
            else:
                assert all(col[k] is None for col in fields.values())
    assert seen == {0: 90, 1: 60}
