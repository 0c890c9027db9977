"""granary: packed, checksummed datasets read fast, for PyTorch training loops.

``Dataset(path)`` is map-style (``ds[i] -> (data, label)``). ``IterableDataset(path, ...)``
streams chunk-wise shuffled epochs, split across distributed ranks (from ``torch.distributed``
when it is initialised) and DataLoader workers (from ``get_worker_info()``), resumable with
``state_dict()`` / ``load_state_dict()``, and feeds per-sample losses to the node's
importance-aware local tier with ``report(ids, losses)``.

Both subclass the ``torch.utils.data`` classes when torch is importable and work without it.
They pickle as configuration only: files, threads and caches are opened lazily in each process
(fork, spawn and forkserver all work). The GIL is released during every read.

Errors: ``ValueError`` for impossible arguments; ``DamagedError`` for damaged or mismatching
data (never returned); ``IncompleteError`` when a reader thread failed (the epoch is incomplete);
``GranaryError`` (an ``OSError`` with ``errno``, base of the other two) for failing system calls.
"""

import os

from ._native import Dataset as _NativeDataset
from ._native import DamagedError, GranaryError, IncompleteError, Scores, Stream, __version__
from ._native import io_backends
from ._dataset import Dataset
from ._iterable import IterableDataset
from .mixture import Mixture
from .parquet import from_parquet
from .views import compact, delete, make_view, purge_cache
from .waits import WaitMeter
from .writer import Writer, from_webdataset, merge
from ._torch import _SamplerBase, _tud

__all__ = [
    "ChunkwiseSampler",
    "DamagedError",
    "Dataset",
    "GranaryError",
    "IncompleteError",
    "IterableDataset",
    "Scores",
    "Stream",
    "Writer",
    "__version__",
    "from_parquet",
    "from_webdataset",
    "io_backends",
    "job_peers",
    "job_secret",
    "compact",
    "delete",
    "make_view",
    "purge_cache",
    "merge",
    "Mixture",
    "WaitMeter",
]


def job_secret(group=None):
    """The job's secret for shared tiers, the same on every rank: rank 0 draws 32 random bytes
    and ``torch.distributed.broadcast_object_list`` hands them to the others (a collective:
    every rank calls it). It is also put in ``GRANARY_PEER_SECRET``, so that a ``granary
    serve`` started afterwards (a subprocess inherits it), DataLoader workers and
    ``IterableDataset(peers=...)`` all use it without being told. Call it before starting the
    node's server."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("job_secret() needs torch.distributed initialised (init_process_group)")
    box = [os.urandom(32).hex() if dist.get_rank(group) == 0 else None]
    src = 0 if group is None else dist.get_global_rank(group, 0)
    dist.broadcast_object_list(box, src=src, group=group)
    secret = str(box[0])
    os.environ["GRANARY_PEER_SECRET"] = secret
    return secret


def job_peers(address, group=None):
    """Every node's ``granary serve`` address, in node order, for ``IterableDataset(peers=...)``:
    each rank passes its own node's address (``"host:port"``) and the list is gathered with
    ``torch.distributed.all_gather_object`` (a collective: every rank calls it). Ranks are taken
    to be numbered node by node, as torchrun numbers them; ranks of one node must pass the
    same address."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("job_peers() needs torch.distributed initialised (init_process_group)")
    got = [None] * dist.get_world_size(group)
    dist.all_gather_object(got, str(address), group=group)
    nodes = []
    for a in got:
        if not nodes or nodes[-1] != a:
            if a in nodes:
                raise ValueError(
                    f"ranks of node {a} are not numbered together: {got} (ranks must be "
                    "numbered node by node)"
                )
            nodes.append(a)
    if len(got) % len(nodes) != 0 or any(
        got[i] != nodes[i // (len(got) // len(nodes))] for i in range(len(got))
    ):
        raise ValueError(f"nodes do not have the same number of ranks: {got}")
    return nodes


def _mount_root(path):
    """(dataset path, mount root) of the ``granary mount`` holding ``path``, or None."""
    p = os.path.abspath(path)
    while True:
        try:
            ds = os.getxattr(p, "user.granary.dataset")
            return os.fsdecode(ds), p
        except OSError:
            pass
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent


class ChunkwiseSampler(_SamplerBase):
    """Indices of a map-style dataset over a ``granary mount`` (torchvision's ``ImageFolder``
    or any ``DatasetFolder``) in granary's chunk-wise epoch order: chunks in a seeded random
    order, samples shuffled within windows of chunks. The mount then reads each chunk once
    per epoch in large reads, and a local tier smaller than the dataset is filled and used
    chunk by chunk instead of thrashing. Pass it as ``DataLoader(..., sampler=...)`` in place
    of ``shuffle=True``; the training code is otherwise unchanged.

    ``data_source``: a dataset with ``.samples`` (``(path, target)`` pairs) and ``.root``, or
    a list of file paths. ``dataset``: the packed dataset; by default found from the mount
    (its root's ``user.granary.dataset``). Each epoch's order is a pure function of ``seed``
    and the epoch (``set_epoch(e)``, or advanced by one per iteration); ``rank`` and
    ``world_size`` (from ``torch.distributed`` when initialised) give each rank its share, as
    ``DistributedSampler`` does. Files of ``data_source`` missing from the dataset are a
    ``ValueError``; files of the dataset that ``data_source`` does not list are skipped.
    """

    def __init__(self, data_source, dataset=None, *, seed=0, window=None, rank=None,
                 world_size=None, drop_last=True):
        paths = [p for p, _ in data_source.samples] if hasattr(data_source, "samples") \
            else [os.fspath(p) for p in data_source]
        if not paths:
            raise ValueError("ChunkwiseSampler: data_source has no files")
        found = _mount_root(os.path.dirname(paths[0]))
        if dataset is None:
            if found is None:
                raise ValueError(
                    f"ChunkwiseSampler: {paths[0]!r} is not on a granary mount; pass dataset="
                )
            dataset = found[0]
        root = found[1] if found is not None else getattr(data_source, "root", None)
        if root is None:
            raise ValueError(
                f"ChunkwiseSampler: {paths[0]!r} is not on a granary mount and data_source has "
                "no .root to take paths relative to"
            )
        self.dataset = os.fspath(dataset)
        self.seed, self.window, self.drop_last = int(seed), window, bool(drop_last)
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        ds = _NativeDataset(self.dataset)
        n = len(ds)
        index = [-1] * n
        for i, p in enumerate(paths):
            rel = os.fsencode(os.path.relpath(p, root))
            sid = ds.lookup(rel)
            if sid is None:
                raise ValueError(f"ChunkwiseSampler: {p!r} is not in dataset {self.dataset!r}")
            index[sid] = i
        self._index = index
        self._ds = ds
        self._cached = None

    def _rank_world(self):
        if _tud is not None:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return dist.get_rank(), dist.get_world_size()
        if self.world_size is not None:
            return self.rank or 0, self.world_size
        return 0, 1

    def set_epoch(self, epoch):
        self.epoch = int(epoch)

    def order(self, epoch):
        """The indices of ``epoch`` for this rank."""
        rank, world = self._rank_world()
        key = (int(epoch), rank, world)
        if self._cached is not None and self._cached[0] == key:
            return self._cached[1]
        ids = self._ds.plan(epoch, seed=self.seed, window=self.window, rank=rank,
                            world_size=world, drop_last=self.drop_last)
        idx = self._index
        order = [idx[i] for i in ids if idx[i] >= 0]
        self._cached = (key, order)
        return order

    def __iter__(self):
        order = self.order(self.epoch)
        self.epoch += 1
        return iter(order)

    def __len__(self):
        return len(self.order(self.epoch))

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_ds"] = None
        state["_cached"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._ds = _NativeDataset(self.dataset)
