"""PyTorch integration: DataLoader workers, distributed ranks (explicit and torchrun/gloo),
state_dict resume. Skipped when torch is not importable."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

import granary  # noqa: E402


def ids_of(loader):
    out = []
    for item in loader:
        ids = item["id"]
        ids = ids.tolist() if hasattr(ids, "tolist") else ids
        out.extend(int(i) for i in (ids if isinstance(ids, list) else [ids]))
    return out


def test_subclasses_torch_datasets(packed):
    path, _ = packed
    assert isinstance(granary.Dataset(path), torch.utils.data.Dataset)
    assert isinstance(granary.IterableDataset(path), torch.utils.data.IterableDataset)


@pytest.mark.parametrize(
    "workers, context", [(0, None), (2, "fork"), (2, "spawn"), (2, "forkserver")]
)
def test_dataloader_covers_every_sample_exactly_once(packed, workers, context):
    path, _ = packed
    ds = granary.IterableDataset(path, seed=1, batch_size=32)
    ds.set_epoch(1)
    kw = {"multiprocessing_context": context} if workers else {}
    got = ids_of(DataLoader(ds, batch_size=None, num_workers=workers, **kw))
    assert sorted(got) == list(range(240))


@pytest.mark.parametrize("page_cache", [0, 1 << 30])
def test_the_page_cache_budget_reaches_the_workers_readers(packed, page_cache):
    # 0: nothing kept resident, no map kept; 1 GiB: every chunk kept. Both deliver every
    # sample once, with its bytes.
    path, files = packed
    ds = granary.IterableDataset(path, seed=2, batch_size=16, page_cache=page_cache)
    assert ds.page_cache == page_cache
    got = {}
    for b in DataLoader(ds, batch_size=None, num_workers=2):
        for i, d in zip(b["id"].tolist(), b["data"]):
            got[i] = bytes(d.numpy())
    assert sorted(got) == list(range(240))
    assert sorted(got.values()) == sorted(files.values())
    with pytest.raises((ValueError, TypeError, OverflowError)):
        granary.IterableDataset(path, page_cache=-1)


class ReadInWorker(torch.utils.data.IterableDataset):
    """Wraps ``inner`` inside the worker and reads each batch there, as a dataset that
    filters or logs would, before DataLoader sends it on."""

    def __init__(self, inner):
        self.inner = inner

    def __iter__(self):
        for b in self.inner:
            assert set(b.keys()) >= {"id", "label", "data"} and len(b["id"]) == len(b["label"])
            yield b


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
@pytest.mark.parametrize("batch_format", ["list", "tensor"])
def test_batches_cross_from_workers_in_a_reused_shared_memory_ring(packed, context, batch_format):
    from granary import _shm

    path, files = packed
    m = granary.Dataset(path)
    ds = granary.IterableDataset(path, seed=1, batch_size=4, batch_format=batch_format)
    before = set(_shm._attached)
    seen = []
    loader = DataLoader(
        ReadInWorker(ds), batch_size=None, num_workers=2, multiprocessing_context=context
    )
    for b in loader:
        assert b["id"].dtype == b["label"].dtype == torch.int64
        if batch_format == "tensor":
            data, off = b["data"], b["offsets"]
            assert data.dtype == torch.uint8 and off.dtype == torch.int64
            assert int(off[-1]) == len(data)
            samples = [data[off[k]:off[k + 1]] for k in range(len(b["id"]))]
        else:
            samples = b["data"]
            assert isinstance(samples, list) and len(samples) == len(b["id"])
        for i, x in zip(b["id"].tolist(), samples):
            assert x.dtype == torch.uint8
            assert bytes(x.numpy()) == files[m.path(i)]
            seen.append(i)
    assert sorted(seen) == list(range(240))
    # Each worker's batches came through its ring, and the ring reused its segments: 30
    # batches per worker, a handful of segments (the ones in flight at once).
    rings = [a for t, a in _shm._attached.items() if t not in before]
    assert len(rings) == 2
    for a in rings:
        assert a.segs and max(serial for serial, _ in a.segs.values()) <= 8


@pytest.fixture(scope="module")
def raw_packed(tmp_path_factory):
    """(dataset dir, {path: bytes}): 240 files stored raw (no zstd) in 16 KiB chunks, just
    written, so resident: every chunk is read through its map."""
    from conftest import make_tree, run

    tmp = tmp_path_factory.mktemp("raw")
    files = make_tree(tmp / "src", 240)
    out = tmp / "train.granary"
    run("pack", tmp / "src", "-o", out, "--chunk-size", "16KiB", "--compress", "none")
    return out, files


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_mapped_batches_cross_from_workers_without_a_copy(raw_packed, context):
    # Every sample lies in a mapped chunk: the batches arrive as places in the chunk files,
    # which this process maps itself; no ring is attached, every byte is the file's.
    from granary import _shm

    path, files = raw_packed
    m = granary.Dataset(path)
    # Resident first: pack writes chunks past the page cache, and this machine's kernel drops
    # pages nobody touched for a minute (a chunk not resident is read into the ring instead).
    for p in path.iterdir():
        p.read_bytes()
    before_rings = set(_shm._attached)
    ds = granary.IterableDataset(path, seed=3, batch_size=8)
    seen, mapped = [], set()
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context)
    for b in loader:
        mapped.update(os.path.basename(fm.path) for fm in _shm._in_use)
        for i, x in zip(b["id"].tolist(), b["data"]):
            assert x.dtype == torch.uint8
            assert bytes(x.numpy()) == files[m.path(i)]
            seen.append(i)
    assert sorted(seen) == list(range(240))
    assert set(_shm._attached) == before_rings
    assert mapped == {p.name for p in path.iterdir() if p.name.endswith(".gchunk")}
    del b, x
    assert _shm._live[0] == 0  # every map went with its batch
    # Writing into a sample changes this process's copy only: the next epoch reads the file.
    b = next(iter(DataLoader(ds, batch_size=None, num_workers=1)))
    x = b["data"][0]
    x.fill_(0xAB)
    again = {}
    for b in DataLoader(ds, batch_size=None, num_workers=1):
        again.update(zip(b["id"].tolist(), (bytes(x.numpy()) for x in b["data"])))
    assert all(again[i] == files[m.path(i)] for i in range(240))
    del b, x
    # Past the bound on maps alive (a loop that keeps many batches), batches are read instead.
    bound = _shm._MAX_LIVE
    _shm._MAX_LIVE = 0
    try:
        held = list(DataLoader(ds, batch_size=None, num_workers=2))
        assert _shm._live[0] == 0
        for b in held:
            for i, x in zip(b["id"].tolist(), b["data"]):
                assert bytes(x.numpy()) == files[m.path(i)]
    finally:
        _shm._MAX_LIVE = bound
    # zero_copy=False: through the ring.
    ds = granary.IterableDataset(path, seed=3, batch_size=8, zero_copy=False)
    assert sorted(ids_of(DataLoader(ds, batch_size=None, num_workers=2))) == list(range(240))
    assert len(set(_shm._attached) - before_rings) == 2


def test_a_replaced_or_cut_chunk_under_mapped_batches_is_an_error(tmp_path):
    # The training process maps the file the worker named only if it is that file (device and
    # inode); a file cut short under its maps is an error at the next batch, never a SIGBUS.
    import numpy as np
    from conftest import make_tree, run
    from granary import _shm

    files = make_tree(tmp_path / "src", 60)
    path = tmp_path / "train.granary"
    run("pack", tmp_path / "src", "-o", path, "--chunk-size", "16KiB", "--compress", "none")
    chunk = sorted(p for p in path.iterdir() if p.name.endswith(".gchunk"))[0]
    st = chunk.stat()
    offsets = np.array([0, 100, 300], np.int64)
    ids = np.array([0, 1], np.int64)

    def attach(ino):
        return _shm.attach_files([(str(chunk), st.st_dev, ino)], np.zeros(2, np.int32),
                                 np.array([64, 4096 * 3], np.int64), offsets, ids, ids, None,
                                 False)

    with pytest.raises(granary.DamagedError, match="not the file a DataLoader worker read"):
        attach(st.st_ino + 1)
    b = attach(st.st_ino)
    assert [len(x) for x in b["data"]] == [100, 200]
    assert bytes(b["data"][0].numpy()) == chunk.read_bytes()[64:164]
    with open(chunk, "r+b") as f:
        f.truncate(4096)
    assert int(b["data"][1].sum()) == 0  # past the new end: zeros, not SIGBUS
    with pytest.raises(granary.DamagedError, match="cut short"):
        attach(st.st_ino)
    _shm._in_use = []


def test_held_batches_are_never_overwritten(packed):
    # The training loop keeps every batch: their segments are not reused, and past the ring's
    # slots batches are pickled instead. Every byte still matches at the end.
    from granary import _shm

    path, files = packed
    m = granary.Dataset(path)
    ds = granary.IterableDataset(path, seed=5, batch_size=1)
    held = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert len(held) == 240 > 2 * _shm.SLOTS
    for b in held:
        assert bytes(b["data"][0].numpy()) == files[m.path(int(b["id"][0]))]
    # Once they are dropped, the slots are free again.
    rings = [a for a in _shm._attached.values()][-2:]
    del held, b
    import gc

    gc.collect()
    for a in rings:
        assert not any(a.ctl[s] for s in a.segs)


def checksum(x):
    return x.double().sum()


def test_transform_and_collate_in_workers(packed):
    # Decoding in the workers, as a JPEG pipeline does, with the batch stacked there.
    path, files = packed
    m = granary.Dataset(path)
    ds = granary.IterableDataset(path, batch_size=16, transform=checksum, collate=torch.stack)
    got = {}
    for b in DataLoader(ds, batch_size=None, num_workers=2):
        assert isinstance(b["data"], torch.Tensor) and b["data"].shape == (len(b["id"]),)
        got.update(zip(b["id"].tolist(), b["data"].tolist()))
    assert got == {i: float(sum(files[m.path(i)])) for i in range(240)}


def test_map_style_with_a_sampler(packed):
    path, files = packed
    ds = granary.Dataset(path)
    loader = DataLoader(ds, batch_size=16, shuffle=True, num_workers=2, collate_fn=list)
    seen = [data for batch in loader for data, _ in batch]
    assert sorted(seen) == sorted(files.values())


def test_two_explicit_ranks_are_disjoint_and_complete(packed):
    path, _ = packed
    shares = [
        ids_of(DataLoader(granary.IterableDataset(path, seed=2, rank=r, world_size=2), batch_size=None, num_workers=2))
        for r in range(2)
    ]
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == list(range(240))
    assert len(shares[0]) == len(shares[1])


def torchrun(script, nproc=2):
    """Runs ``script`` under torchrun with ``nproc`` ranks (gloo on 127.0.0.1)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=1",
            f"--nproc_per_node={nproc}",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            # torch 1.13's launcher turns the default "0" into None on Python 3.11 (enum.Flag
            # no longer iterates its zero member); any other value works.
            "--redirects=1",
            "--tee=1",
            str(script),
        ],
        check=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def test_torchrun_gloo_ranks_are_disjoint_and_complete(packed, tmp_path):
    path, _ = packed
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, os
            import torch.distributed as dist
            from torch.utils.data import DataLoader
            import granary
            dist.init_process_group("gloo")
            ds = granary.IterableDataset({str(path)!r}, seed=7, batch_size=10)
            ds.set_epoch(3)
            ids = [int(i) for b in DataLoader(ds, batch_size=None, num_workers=1) for i in b["id"]]
            with open(os.path.join({str(tmp_path)!r}, f"rank{{dist.get_rank()}}.json"), "w") as f:
                json.dump(ids, f)
            dist.destroy_process_group()
            """
        )
    )
    torchrun(script)
    shares = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == list(range(240))


def test_torchrun_ranks_share_their_tiers_through_job_peers(packed, tmp_path):
    """Each of 2 torchrun ranks plays a node: it starts `granary serve` on its own tier,
    job_peers() gathers both addresses with all_gather_object, and two epochs read through the
    shared tiers, complete and disjoint."""
    from conftest import granary_bin

    path, _ = packed
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, os, subprocess
            import torch.distributed as dist
            import granary
            dist.init_process_group("gloo")
            r = dist.get_rank()
            secret = granary.job_secret()  # before the server starts: it inherits it
            tier = os.path.join({str(tmp_path)!r}, f"tier{{r}}")
            os.makedirs(tier)
            server = subprocess.Popen([{granary_bin()!r}, "serve", {str(path)!r}, "--cache-dir",
                                       tier, "--listen", "127.0.0.1:0"],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            addr = server.stdout.readline().strip().removeprefix("listening on http://")
            peers = granary.job_peers(addr)
            ds = granary.IterableDataset({str(path)!r}, seed=5, cache_dir=tier,
                                         cache_size=1 << 20, peers=peers, peer_timeout=5)
            epochs = []
            for e in range(2):
                ds.set_epoch(e)
                epochs.append([int(s["id"]) for s in ds])
                dist.barrier()  # the owners hold their chunks before the next epoch
            server.kill()
            server.wait()
            with open(os.path.join({str(tmp_path)!r}, f"rank{{r}}.json"), "w") as f:
                json.dump({{"peers": peers, "addr": addr, "epochs": epochs, "secret": secret}}, f)
            dist.destroy_process_group()
            """
        )
    )
    torchrun(script)
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert got[0]["peers"] == got[1]["peers"] == [got[0]["addr"], got[1]["addr"]]
    assert got[0]["secret"] == got[1]["secret"] and len(got[0]["secret"]) == 64
    for e in range(2):
        a, b = got[0]["epochs"][e], got[1]["epochs"][e]
        assert not set(a) & set(b)
        assert sorted(a + b) == list(range(240))


def test_state_dict_resume_mid_epoch(packed):
    path, _ = packed
    full = ids_of(DataLoader(granary.IterableDataset(path, seed=4, batch_size=8), batch_size=None))
    ds = granary.IterableDataset(path, seed=4, batch_size=8)
    it = iter(DataLoader(ds, batch_size=None))
    first = []
    for _ in range(12):
        first.extend(int(i) for i in next(it)["id"])
    state = ds.state_dict()
    del it
    resumed = granary.IterableDataset(path, seed=4, batch_size=8)
    resumed.load_state_dict(state)
    rest = ids_of(DataLoader(resumed, batch_size=None))
    assert first + rest == full


def test_state_dict_in_the_training_process_with_workers_restarts_the_epoch(packed):
    # Plain DataLoader workers keep their progress to themselves: the training process's
    # state knows the epoch only, and a resume from it reads that epoch whole (nothing skipped).
    path, _ = packed
    ds = granary.IterableDataset(path, seed=4, batch_size=8)
    ds.set_epoch(2)
    it = iter(DataLoader(ds, batch_size=None, num_workers=2))
    for _ in range(5):
        next(it)
    state = ds.state_dict()
    del it
    assert state["epoch"] == 2 and sum(state["consumed"]) == 0
    again = granary.IterableDataset(path, seed=4, batch_size=8)
    again.load_state_dict(state)
    got = ids_of(DataLoader(again, batch_size=None, num_workers=2))
    assert sorted(got) == list(range(240))


def test_report_accepts_tensors(packed, tmp_path):
    path, _ = packed
    ds = granary.IterableDataset(path, cache_dir=tmp_path, cache_size=1 << 20, batch_size=32)
    for b in DataLoader(ds, batch_size=None, num_workers=2):
        ids = torch.as_tensor(b["id"])
        losses = torch.rand(len(ids), requires_grad=True)
        ds.report(ids, losses)
    ds.flush_scores()
    table = granary.Scores(path, tmp_path)
    assert all(table.score(i) > 2.0 for i in range(240))


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_mid_epoch_exactly(packed, workers):
    # torchdata's real StatefulDataLoader (torch 2): it keeps each worker's state_dict() as
    # of the last batch handed out, and restores every worker from its own.
    sdl = pytest.importorskip("torchdata.stateful_dataloader")

    def run(state=None, take=None):
        ds = granary.IterableDataset(_path[0], seed=9, batch_size=8)
        ds.set_epoch(1)
        dl = sdl.StatefulDataLoader(ds, batch_size=None, num_workers=workers)
        if state is not None:
            dl.load_state_dict(state)
        got = []
        for b in dl:
            got.extend(b["id"].tolist())
            if take is not None and len(got) == take:
                return got, dl.state_dict()
        return got, None

    _path = packed
    full, _ = run()
    assert sorted(full) == list(range(240))
    first, state = run(take=88)  # 11 of 30 batches, workers well ahead of the training loop
    rest, _ = run(state=state)
    assert first + rest == full
    # A second checkpoint taken after a resume resumes exactly too.
    second, state2 = run(state=state, take=64)
    again, _ = run(state=state2)
    assert first + second + again == full


@pytest.mark.parametrize("workers", [0, 2])
def test_fields_per_batch_cross_from_dataloader_workers(tmp_path, workers):
    """Samples with named fields: each batch's item["fields"] ({name: [view or None]}) is built
    from the worker's shared-memory ring in the training process."""
    import random

    rng = random.Random(1)
    out = tmp_path / "f.granary"
    want = {}
    with granary.Writer(out, chunk_size=32 << 10, progress=False) as w:
        for i in range(300):
            f = {"jpg": rng.randbytes(rng.randint(50, 2000)), "txt": b"c%d" % i}
            if i % 3 == 0:
                f["json"] = b"{}"
            w.write(f"s{i:04d}", f, label=i % 2)
            want[f"s{i:04d}"] = f
    ds = granary.Dataset(out)
    by_id = {i: want[ds.path(i)] for i in range(len(ds))}
    seen = 0
    it = granary.IterableDataset(out, batch_size=16, seed=1)
    for batch in DataLoader(it, batch_size=None, num_workers=workers):
        ids = [int(i) for i in batch["id"]]
        assert set(batch["fields"]) <= {"jpg", "json", "txt"}
        for name, col in batch["fields"].items():
            assert len(col) == len(ids)
            for i, v in zip(ids, col):
                exp = by_id[i].get(name)
                got = None if v is None else bytes(v.numpy() if hasattr(v, "numpy") else v)
                assert got == exp, (name, i)
        seen += len(ids)
    assert seen == 300
