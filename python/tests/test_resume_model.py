"""Resume that composes, checked against a model: hundreds of drawn cases of (loader, world
size, workers, checkpoint step, an append after the checkpoint, next world size, next workers,
a second checkpoint there), each
checked for "each sample of the epoch exactly once" (less what the equal cut per rank drops)
and "each epoch its own order". The loaders are played in process, as they call the dataset:
a plain loop (one state for the rank, ``state_dict()`` alone) and StatefulDataLoader (one
state per worker, taken in the worker after each batch it hands out, workers served round
robin, each restored into the worker of its index). Real loaders with worker processes are
tested in test_crossing.py; this is the breadth."""

import collections
import os
import random

import pytest

import granary

from conftest import make_tree, run

CASES = int(os.environ.get("GRANARY_RESUME_CASES", "300"))


class Shard(granary.IterableDataset):
    """The dataset as worker ``w`` of ``n`` of a rank sees it (get_worker_info() in a worker)."""

    def __init__(self, *a, worker=(0, 1), **kw):
        super().__init__(*a, **kw)
        self.as_worker = worker

    def _worker(self):
        return self.as_worker


class MixShard(granary.Mixture):
    def __init__(self, *a, worker=(0, 1), **kw):
        super().__init__(*a, **kw)
        self.as_worker = worker

    def _worker(self):
        return self.as_worker


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("model")
    out = []
    for name, n in (("a", 150), ("b", 90)):
        make_tree(tmp / name, n, seed=n)
        p = tmp / f"{name}.granary"
        run("pack", tmp / name, "-o", p, "--chunk-size", "2KiB")
        out.append(p)
    return out


def _pairs(item):
    src = item["source"] if "source" in item else [0] * len(item["id"])
    return list(zip([int(s) for s in src], [int(i) for i in item["id"]]))


class Run:
    """One rank's loader over ``make(worker=...)``: ``take(k)`` delivers k batches (round
    robin over the workers, as DataLoader hands them out) and returns them; ``state()`` is the
    checkpoint its loader would save."""

    def __init__(self, make, rank, world, workers, loader, states=None):
        self.loader = loader
        self.workers = workers
        self.shards = [make(rank=rank, world_size=world, worker=(w, workers))
                       for w in range(workers)]
        for w, ds in enumerate(self.shards):
            if states is not None:
                ds.load_state_dict(states[w] if isinstance(states, list) else states)
        self.iters = [iter(ds) for ds in self.shards]
        self.live = list(range(workers))
        self.turn = 0
        self.saved = [ds.state_dict() for ds in self.shards]

    def take(self, k=None):
        got = []
        while self.live and (k is None or k > 0):
            w = self.live[self.turn % len(self.live)]
            try:
                item = next(self.iters[w])
            except StopIteration:
                self.live.remove(w)
                continue
            got.extend(_pairs(item))
            # StatefulDataLoader asks the worker for its state after each batch it makes.
            self.saved[w] = self.shards[w].state_dict()
            self.turn += 1
            if k is not None:
                k -= 1
        return got

    def state(self):
        # One worker: the rank's state. Several: each worker's own (only StatefulDataLoader
        # can checkpoint workers mid-epoch), restored into the worker of its index.
        return self.saved[0] if self.workers == 1 else list(self.saved)


def _epoch(make, world, workers, loader, states=None, steps=None):
    got, checkpoint = [], None
    for rank in range(world):
        r = Run(make, rank, world, workers, loader, states)
        got += r.take(steps)
        if rank == 0:
            checkpoint = r.state()
    return got, checkpoint


def _appended_copy(src, tmp, case):
    """A copy of dataset ``src`` and a function that appends a few samples to it."""
    import shutil

    copy = tmp / f"case{case}.granary"
    shutil.copytree(src, copy)

    done = []

    def append():
        more = tmp / f"more{case}-{len(done)}"
        for k in range(5):
            (more / "c0").mkdir(parents=True, exist_ok=True)
            (more / "c0" / f"appended-{len(done)}-{k}.bin").write_bytes(b"appended %d" % k)
        run("append", copy, more, "--chunk-size", "2KiB")
        done.append(more)
    return copy, append


def test_resume_composes_across_loaders_world_sizes_and_workers(sources, tmp_path):
    rng = random.Random(62)
    stats = collections.Counter()
    largest = [0, 0]
    for case in range(CASES):
        mixture = rng.random() < 0.3
        loader = rng.choice(["plain", "sdl"])
        world, world2 = rng.randint(1, 4), rng.randint(1, 4)
        workers = 1 if loader == "plain" else rng.randint(1, 3)
        # A plain loop's state (one for the rank) resumes with any worker count; one
        # worker's own state (StatefulDataLoader) with as many workers.
        workers2 = rng.randint(1, 3) if loader == "plain" else workers
        epoch, seed = rng.randint(0, 3), rng.randint(0, 9)
        kw = dict(seed=seed, batch_size=rng.choice([3, 7]),
                  shuffle=rng.choice(["chunkwise", "global", "sequential"]))
        # An append between the checkpoint and its resume (to a copy): the epoch resumes as
        # it was planned; the appended samples wait for the next epoch.
        appended = rng.random() < 0.1
        srcs, append = list(sources), None
        if appended:
            srcs[0], append = _appended_copy(sources[0], tmp_path, case)

        def make(worker, **more):
            if mixture:
                ds = MixShard(srcs, weights=[0.7, 0.3], worker=worker, **kw, **more)
            else:
                ds = Shard(srcs[0], worker=worker, **kw, **more)
            ds.set_epoch(epoch)
            return ds

        full = collections.Counter(_epoch(make, world, workers, "plain" if workers == 1 else loader)[0])
        steps = rng.randint(0, 12)
        first, state = _epoch(make, world, workers, loader, steps=steps)
        if append is not None:
            append()
            stats["appended"] += 1
        steps2 = rng.randint(0, 8)
        second, state2 = _epoch(make, world2, workers2, loader, states=state, steps=steps2)
        rest, _ = _epoch(make, world2, workers2, loader, states=state2)
        got = collections.Counter(first + second + rest)
        what = (f"case {case}: {'mixture' if mixture else 'dataset'} {loader} {world}x{workers} "
                f"-> {world2}x{workers2}, steps {steps}/{steps2}, {kw}"
                f"{', appended between' if appended else ''}")
        twice = {k: c for k, c in got.items() if c > full[k]}
        assert not twice, f"{what}: {len(twice)} delivered twice"
        missing = sum(full.values()) - sum(got.values())
        # drop_last: the equal cut per rank leaves out fewer than one sample per new rank of
        # each worker column's and each source's rest.
        assert 0 <= missing < world2 * workers2 * 2, f"{what}: {missing} missing"
        stats["cases"] += 1
        stats["missing"] += missing
        largest = [max(largest[0], world, world2), max(largest[1], workers, workers2)]
    # Each epoch its own order: the same dataset, seed and configuration, two epochs.
    a = Shard(sources[0], seed=1, batch_size=5)
    b = Shard(sources[0], seed=1, batch_size=5)
    b.set_epoch(1)
    ea = [p for item in a for p in _pairs(item)]
    eb = [p for item in b for p in _pairs(item)]
    assert sorted(ea) == sorted(eb) and ea != eb
    print(f"resume model: {stats['cases']} cases ({stats['appended']} with an append between "
          f"checkpoint and resume), largest world size {largest[0]}, largest worker count "
          f"{largest[1]}, 0 duplicates, {stats['missing']} left out by equal cuts (drop_last)")


def test_a_state_resumes_only_what_it_was_taken_of(sources, tmp_path):
    a = granary.IterableDataset(sources[0], seed=1)
    it = iter(a)
    for _ in range(10):
        next(it)
    state = a.state_dict()
    assert state["kind"] == "dataset" and state["of"]["dataset"] == a._identity()["dataset"]
    with pytest.raises(ValueError, match="the state resumes dataset"):
        granary.IterableDataset(sources[1], seed=1).load_state_dict(state)
    mix = granary.Mixture(sources, weights=[1, 1])
    with pytest.raises(ValueError, match="not a mixture's"):
        mix.load_state_dict(state)
    m_it = iter(mix)
    next(m_it)
    with pytest.raises(ValueError, match="the state resumes mixture"):
        granary.IterableDataset(sources[0], seed=1).load_state_dict(mix.state_dict())
    # A view of the dataset is another thing to resume.
    view = tmp_path / "c0.gview"
    run("view", sources[0], "-o", view, "--class", "c0")
    v = granary.IterableDataset(view, seed=1)
    with pytest.raises(ValueError, match="the state resumes dataset"):
        v.load_state_dict(state)
    # A state that names nothing is refused.
    with pytest.raises(ValueError, match="made by an earlier granary"):
        a.load_state_dict({k: v for k, v in state.items() if k not in ("kind", "of")})
    # After an append the state resumes its epoch as planned (the new samples wait for the
    # next epoch); after two, the generation it was taken of cannot be proven an ancestor.
    copy, append = _appended_copy(sources[0], tmp_path, "x")
    b = granary.IterableDataset(copy, seed=1, batch_size=4)
    whole = [int(i) for item in b for i in item["id"]]
    it = iter(b)
    first = [int(i) for _ in range(5) for i in next(it)["id"]]
    state = b.state_dict()
    append()
    c = granary.IterableDataset(copy, seed=1, batch_size=4)
    c.load_state_dict(state)
    rest = [int(i) for item in c for i in item["id"]]
    assert sorted(first + rest) == sorted(whole)
    assert c.state_dict()["of"] == state["of"]  # still that epoch
    c.set_epoch(1)
    assert len([int(i) for item in c for i in item["id"]]) == len(whole) + 5
    append()
    with pytest.raises(ValueError, match="'generation': 2.*or after one append"):
        granary.IterableDataset(copy, seed=1).load_state_dict(state)
