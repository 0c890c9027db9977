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


class SharedInWorker(torch.utils.data.IterableDataset):
    """Yields each batch of ``inner`` with whether its bytes were already in shared memory
    inside the worker, before DataLoader handed it over."""

    def __init__(self, inner):
        self.inner = inner

    def __iter__(self):
        for b in self.inner:
            yield b, b["data"].is_shared()


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_packed_batches_cross_from_workers_in_shared_memory(packed, context):
    path, files = packed
    m = granary.Dataset(path)
    ds = granary.IterableDataset(path, seed=1, batch_size=32, batch_format="tensor")
    seen = []
    loader = DataLoader(
        SharedInWorker(ds), batch_size=None, num_workers=2, multiprocessing_context=context
    )
    for b, shared_in_worker in loader:
        data, off = b["data"], b["offsets"]
        assert data.dtype == torch.uint8 and off.dtype == torch.int64
        # Gathered straight into shared memory in the worker: it crossed as a descriptor,
        # not as a copy DataLoader made.
        assert shared_in_worker
        assert int(off[-1]) == len(data)
        for k, i in enumerate(b["id"].tolist()):
            assert bytes(data[off[k]:off[k + 1]].numpy()) == files[m.path(i)]
            seen.append(i)
    assert sorted(seen) == list(range(240))


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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=1",
            "--nproc_per_node=2",
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
    shares = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == list(range(240))


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
