"""Deleting samples from Python (``granary.delete``): the map-style dataset and streams of the
new generation hold every remaining sample once and no deleted one; bad input deletes nothing."""

import pytest

import granary

from conftest import make_tree, run

torch = pytest.importorskip("torch")


def test_deleted_samples_are_gone_and_the_rest_is_read_once(tmp_path):
    want = make_tree(tmp_path / "src", 200)
    ds = tmp_path / "ds"
    run("pack", tmp_path / "src", "-o", ds, "--chunk-size", "16KiB")
    before = (ds / "snapshot.gsnap").read_bytes()
    # Bad input changes nothing: a path not there with strict=True, an id past the end.
    with pytest.raises(KeyError):
        granary.delete(ds, paths=["c0/f0000.bin", "no/such.bin"], strict=True)
    with pytest.raises(ValueError, match="of a dataset of 200"):
        granary.delete(ds, ids=[5, 200])
    assert (ds / "snapshot.gsnap").read_bytes() == before
    # Before any deletion, positions are sample ids.
    d0 = granary.Dataset(ds)
    i7, i8 = d0.lookup("c1/f0007.bin"), d0.lookup("c2/f0008.bin")
    s = granary.delete(ds, paths=["c0/f0000.bin", b"c1/f0001.bin", "no/such.bin"],
                       ids=[i7, i7, i8])
    assert (s["deleted"], s["generation"], s["samples"]) == (4, 1, 196)
    assert s["missing"] == ["no/such.bin"]
    with pytest.raises(ValueError, match="nothing to delete"):
        granary.delete(ds, ids=[i7])
    gone = {"c0/f0000.bin", "c1/f0001.bin", "c1/f0007.bin", "c2/f0008.bin"}
    keep = sorted(k for k in want if k not in gone)
    d = granary.Dataset(ds)
    assert len(d) == len(keep)
    assert sorted(d.path(i) for i in range(len(d))) == keep
    for i in range(len(d)):
        assert bytes(d[i][0]) == want[d.path(i)]
    assert d.lookup("c0/f0000.bin") is None
    for workers in (0, 2):
        items = [bytes(x["data"]) for x in torch.utils.data.DataLoader(
            granary.IterableDataset(ds, seed=1), batch_size=None, num_workers=workers)]
        assert len(items) == len(keep), workers
        assert sorted(items) == sorted(want[k] for k in keep), workers
