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
