"""Views (``granary view``) in Python: the map-style dataset indexes the view's samples, and a
stream of a view delivers each of them once, on any number of DataLoader workers."""

import os

import pytest

import granary

from conftest import run

torch = pytest.importorskip("torch")


def test_a_view_is_a_dataset_of_its_samples(tmp_path):
    src = tmp_path / "src"
    want = {}
    for i in range(300):
        rel = f"class{i % 4}/f{i:04}.{'jpg' if i % 3 else 'txt'}"
        p = src / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(50 + i)
        p.write_bytes(data)
        want[rel] = data
    ds = tmp_path / "ds"
    assert run("pack", src, "-o", ds, "--chunk-size", "16KiB").returncode == 0
    view = tmp_path / "v.gview"
    r = run("view", ds, "-o", view, "--class", "class1,class2", "--glob", "**/*.jpg")
    assert r.returncode == 0, r.stderr
    keep = sorted(k for k in want if k.startswith(("class1/", "class2/")) and k.endswith(".jpg"))
    full = granary.Dataset(ds)
    v = granary.Dataset(view)
    assert len(v) == len(keep) and len(full) == len(want)
    got = sorted(v.path(i) for i in range(len(v)))
    assert got == keep
    for i in range(len(v)):
        data, label = v[i]
        assert bytes(data) == want[v.path(i)]
        assert v.classes[label] == v.path(i).split("/")[0]
    assert v.lookup(keep[0]) is not None and v.lookup("class0/f0001.jpg") is None
    for workers in (0, 2):
        it = granary.IterableDataset(view, seed=3)
        loader = torch.utils.data.DataLoader(it, batch_size=None, num_workers=workers)
        seen = [full.path(int(item["id"])) for item in loader]
        assert sorted(seen) == keep, workers


def test_make_view_by_mask_scores_keys_and_npy(tmp_path):
    np = pytest.importorskip("numpy")
    src = tmp_path / "src"
    for i in range(120):
        p = src / f"c{i % 3}" / f"s{i:03}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(bytes([i]) * (i + 1))
    ds = tmp_path / "ds"
    assert run("pack", src, "-o", ds, "--chunk-size", "4KiB").returncode == 0
    full = granary.Dataset(ds)
    n = len(full)
    # A score per sample id, kept from 0.75 up (from an array and from a .npy file).
    scores = np.linspace(0, 1, n)
    np.save(tmp_path / "scores.npy", scores)
    for given in (scores, tmp_path / "scores.npy"):
        out = tmp_path / "hi.gview"
        m = granary.make_view(ds, out, scores=given, min_score=0.75)
        v = granary.Dataset(out)
        assert m == len(v) == int((scores >= 0.75).sum())
        assert sorted(v.lookup(v.path(i)) for i in range(len(v))) == list(range(len(v)))
        assert {full.lookup(v.path(i)) for i in range(len(v))} == set(np.nonzero(scores >= 0.75)[0])
    # A mask keyed by path.
    keys = [f"c1/s{i:03}.bin" for i in range(1, 120, 3)]
    m = granary.make_view(ds, tmp_path / "c1.gview", mask=[k.endswith("0.bin") for k in keys],
                          keys=keys)
    v = granary.Dataset(tmp_path / "c1.gview")
    assert sorted(v.path(i) for i in range(len(v))) == sorted(k for k in keys if k.endswith("0.bin"))
    # Ids and paths; refusals.
    assert granary.make_view(ds, tmp_path / "ids.gview", ids=[5, 3, 5]) == 2
    assert granary.make_view(ds, tmp_path / "p.gview", paths=["c0/s000.bin"]) == 1
    with pytest.raises(ValueError, match="one per sample"):
        granary.make_view(ds, tmp_path / "x.gview", mask=[True, False])
    with pytest.raises(ValueError, match="exactly one"):
        granary.make_view(ds, tmp_path / "x.gview", ids=[1], mask=[True] * n)
    with pytest.raises(KeyError, match="no sample"):
        granary.make_view(ds, tmp_path / "x.gview", paths=["nope"])
    with pytest.raises(ValueError, match="selects no sample"):
        granary.make_view(ds, tmp_path / "x.gview", mask=[False] * n)
    assert not (tmp_path / "x.gview").exists()
