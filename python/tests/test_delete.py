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


def _ids(ds, k=None):
    it = iter(ds)
    out = []
    for x in it:
        out.append(int(x["id"]))
        if k is not None and len(out) == k:
            break
    return out


def test_an_epoch_checkpointed_before_a_deletion_resumes_without_the_deleted_samples(tmp_path):
    import pickle

    make_tree(tmp_path / "src", 300)
    ds = tmp_path / "ds"
    run("pack", tmp_path / "src", "-o", ds, "--chunk-size", "8KiB")
    full = _ids(granary.IterableDataset(ds, seed=5))
    it = granary.IterableDataset(ds, seed=5)
    first = _ids(it, 100)
    state = pickle.loads(pickle.dumps(it.state_dict()))
    # Deleted since: some already delivered, some still to come in this epoch.
    gone = set(first[:10]) | set(full[150:190])
    granary.delete(ds, ids=sorted(gone))
    again = granary.IterableDataset(ds, seed=5)
    again.load_state_dict(state)
    second = _ids(again, 60)
    # Checkpointed again inside the resumed epoch, and resumed once more.
    state2 = pickle.loads(pickle.dumps(again.state_dict()))
    third_ds = granary.IterableDataset(ds, seed=5)
    third_ds.load_state_dict(state2)
    third = _ids(third_ds)
    rest = second + third
    assert not set(rest) & gone, "a deleted sample was delivered"
    assert len(set(first + rest)) == len(first + rest), "a sample twice"
    assert set(first) | set(rest) == set(full) - (gone - set(first)), "a sample missing"
    # The rest of the epoch as planned, less what was deleted (cut again: shares stay equal).
    assert sorted(rest) == sorted(i for i in full[100:] if i not in gone)
    # The next epoch leaves them out from the start.
    nxt = granary.IterableDataset(ds, seed=5)
    nxt.set_epoch(1)
    assert sorted(_ids(nxt)) == sorted(set(full) - gone)
    # The same state resumed by two ranks after the deletion: the rest is cut between them,
    # nothing repeated, nothing deleted (an odd rest drops one sample: equal shares).
    parts = []
    for r in range(2):
        d = granary.IterableDataset(ds, seed=5, rank=r, world_size=2)
        d.load_state_dict(state)
        parts.append(_ids(d))
    got = parts[0] + parts[1]
    want = [i for i in full[100:] if i not in gone]
    assert len(parts[0]) == len(parts[1])
    assert len(set(got)) == len(got) and set(got) <= set(want) and len(got) >= len(want) - 1


def test_a_map_style_copy_refuses_another_generation(tmp_path):
    import pickle

    make_tree(tmp_path / "src", 60)
    ds = tmp_path / "ds"
    run("pack", tmp_path / "src", "-o", ds, "--chunk-size", "8KiB")
    d = granary.Dataset(ds)
    copy = pickle.dumps(d)  # as a DataLoader worker started by spawn gets it
    granary.delete(ds, paths=["c0/f0000.bin"])
    with pytest.raises(RuntimeError, match="changed since this Dataset was made"):
        pickle.loads(copy)[0]
    assert len(granary.Dataset(ds)) == 59


def test_compact_from_python_keeps_every_remaining_sample(tmp_path):
    want = make_tree(tmp_path / "src", 120)
    ds = tmp_path / "ds"
    run("pack", tmp_path / "src", "-o", ds, "--chunk-size", "8KiB")
    granary.delete(ds, paths=[f"c0/f{i:04}.bin" for i in range(0, 120, 6)])
    assert granary.compact(ds, min_dead=1.0)["generation"] is None
    s = granary.compact(ds, all=True, grace=0)
    assert s["records_removed"] == 20 and s["generation"] == 2 and s["files_removed"]
    d = granary.Dataset(ds)
    assert len(d) == 100
    assert all(bytes(d[i][0]) == want[d.path(i)] for i in range(len(d)))
    with pytest.raises(ValueError, match="not a number"):
        granary.compact(ds, grace=-1)


def test_ids_that_are_no_integers_are_refused_and_delete_nothing(tmp_path):
    make_tree(tmp_path / "src", 30)
    ds = tmp_path / "ds"
    run("pack", tmp_path / "src", "-o", ds, "--chunk-size", "8KiB")
    before = (ds / "snapshot.gsnap").read_bytes()
    for bad in ([1.5], ["3"], [True], [-1]):
        with pytest.raises(ValueError, match="not a sample id"):
            granary.delete(ds, ids=bad)
    with pytest.raises(ValueError, match="no sample given"):
        granary.delete(ds, ids=[])
    assert (ds / "snapshot.gsnap").read_bytes() == before
    # A single path is one path, not its characters.
    assert granary.delete(ds, paths="c0/f0000.bin")["deleted"] == 1


def test_purge_cache_from_python_removes_the_copies_of_deleted_records(tmp_path):
    make_tree(tmp_path / "src", 120)
    ds = tmp_path / "ds"
    run("pack", tmp_path / "src", "-o", ds, "--chunk-size", "8KiB", "--compress", "none")
    tier = tmp_path / "tier"
    run("read", ds, "--cache-dir", tier, "--cache-size", "64MiB")
    gone = "c1/f0001.bin"  # random bytes (every fourth file is repeated text)
    data = (tmp_path / "src" / gone).read_bytes()
    holds = lambda: any(data in p.read_bytes() for p in tier.rglob("*") if p.is_file())
    assert holds(), "the tier holds a copy of it"
    granary.delete(ds, paths=[gone])
    p = granary.purge_cache(ds, tier)
    assert p["entries_removed"] >= 1 and p["chunks_with_deleted_samples"] == 1
    assert not holds(), "a copy of a deleted sample's bytes is left"
    with pytest.raises(Exception, match="no such tier directory"):
        granary.purge_cache(ds, tmp_path / "typo")
