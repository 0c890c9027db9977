"""``IterableDataset``: chunk-wise shuffled epochs of a packed dataset for ``DataLoader``, with
resume states and the epoch box its workers share; the field helpers the datasets use."""

import os

from . import _types
from ._native import Dataset as _NativeDataset
from ._native import READER_DEFAULTS as _D
from ._native import IncompleteError, Scores, Stream
from ._native import check_reader_options as _check_reader_options
from ._torch import _IterBase, _tud


def _field_list(fields):
    if fields is None:
        return None
    if isinstance(fields, str):
        fields = [fields]
    fields = [str(f) for f in fields]
    if not fields:
        raise ValueError("fields names no field")
    return fields


def _split_fields(data, layout, wanted):
    """{name: value} for a sample's field layout [(name, offset, length, type)]: each field's
    slice of ``data`` decoded by its type (``raw``: layouts whose types are all bytes)."""
    return {n: _types.decode(data[o:o + k], t)
            for n, o, k, t in layout if wanted is None or n in wanted}


def _fields_of_batch(data, layouts, wanted):
    """{name: [per-sample value or None]} for a batch's per-sample payloads (a fixed-shape
    array field stacked into one array)."""
    return _types.batch_fields(data, layouts, wanted)


def _layouts_for(layouts, ids, wanted, sources):
    """The batch's field layouts, restricted to ``wanted``, or None without fields."""
    if layouts is None:
        return None
    lay = layouts([int(i) for i in ids], sources)
    if wanted is not None:
        lay = [[f for f in sample if f[0] in wanted] for sample in lay]
    return lay


def _asked_layouts(layouts, raw, images):
    """``layouts`` with every field's type the one it is read by (``raw``: ``bytes``;
    ``images="pil"``: images decoded)."""
    def asked(ids):
        return [[(n, o, k, _types.asked(t, raw, images)) for n, o, k, t in s]
                for s in layouts(ids)]
    return asked


def _index(i):
    if isinstance(i, bool) or not hasattr(i, "__index__"):
        raise TypeError(f"sample index must be an integer, not {type(i).__name__}")
    return i.__index__()


def _as_list(x, kind):
    """Lists, tuples, numpy arrays and torch tensors (any device) to a list of ``kind``."""
    if hasattr(x, "detach"):  # torch tensor
        x = x.detach().cpu()
    if hasattr(x, "tolist"):
        x = x.tolist()
    if not isinstance(x, (list, tuple)):
        x = [x]
    return [kind(v) for v in x]


# The reader's options a dataset takes as keywords and gives every stream (the library
# checks them, and knows every option and its default: READER_DEFAULTS; rank and world_size
# come per stream, lenient_scores is the loader's own).
_READER_OPTIONS = (
    "shuffle", "seed", "drop_last", "window", "memory", "page_cache", "io", "backend",
    "queue_depth", "range_gap", "cache_dir", "cache_size", "policy", "scores", "sampling",
    "alpha", "cache_boost", "locality", "peers", "node", "peer_timeout", "ownership_epoch",
    "peer_secret", "peer_ca",
)
# How an option is kept once checked (None stays None); the others as given.
_KEPT_AS = dict(
    seed=int, locality=float, alpha=float, cache_boost=float, peer_timeout=float,
    ownership_epoch=int, memory=int, page_cache=int, cache_size=int, node=int,
    queue_depth=int, range_gap=int, cache_dir=os.fspath, peer_ca=os.fspath, scores=os.fspath,
    peer_secret=str,
)


class IterableDataset(_IterBase):
    """Chunk-wise shuffled epochs of a packed dataset, for ``torch.utils.data.DataLoader``.

    Yields ``{"id", "label", "data"}`` per sample (``data`` as ``bytes``), or with
    ``batch_size`` one dict per batch, the fast path: ``"id"`` and ``"label"`` as int64
    tensors, ``"data"`` a list with each sample's bytes as a uint8 tensor, plus ``"weight"``
    (the loss weight 1/(N·p)) under importance sampling. The reader gathers a batch's bytes
    into one buffer and the samples are zero-copy views of it (``torchvision.io.decode_jpeg(x)``
    takes one as it is; PIL takes ``io.BytesIO(x.numpy())``). Inside DataLoader workers that
    buffer is a segment of the worker's shared-memory ring, reused batch after batch: the batch
    crosses to the training process as a small record, not as pickled bytes, and the segment
    is reused once the last view of it is gone. Without torch the samples are numpy uint8
    views; without numpy, ``bytes``. ``batch_format="tensor"`` gives the same buffer whole
    (``"data"``, one uint8 tensor) with ``"offsets"`` (sample i is
    ``data[offsets[i]:offsets[i + 1]]``).

    ``rank``/``world_size`` come from ``torch.distributed`` when it is initialised, otherwise
    from the arguments (default 0 of 1). DataLoader workers split their rank's share. Call
    ``set_epoch(e)`` before each epoch (a different shuffle per epoch; the same seed gives the
    same epochs everywhere). Every rank gets the same number of samples: the remainder is
    dropped (``drop_last=True``, the default) or, with ``pad=True``, filled by repeating
    samples. ``locality=Q`` (0..1, default 1: fully random) keeps each rank on a home set of
    chunks and reassigns only a seeded fraction Q of chunks between ranks per epoch (partial
    local shuffling), so node-local tiers stay useful; the CLI's ``--locality``.

    ``transform``, if given, is applied to every sample in the process that reads them (a
    DataLoader worker): ``item["data"] = transform(data)``, per sample also in list batches
    (where it gets the sample's uint8 view), not with ``batch_format="tensor"``. ``collate``,
    if given, turns a list batch's samples (after ``transform``) into one object in that same
    process, e.g. ``torch.stack``: as DataLoader's own batching does in its workers, so that one
    tensor per batch crosses to the training process instead of one per sample.

    ``cache_dir``/``cache_size`` put a tier on local storage in front of the dataset
    (``policy``: ``"lru"``, ``"static"`` or ``"importance"``); ``report(ids, losses)`` feeds the
    node's shared score table next to it, which ``policy="importance"`` (hot chunks of the most
    important samples) and ``sampling="importance"`` (probability (1-alpha)/N + alpha x score
    share, favouring what the tier holds) use. ``sampling="importance"`` works from the first
    epoch: until losses are reported every sample has the mean score (uniform draws, as SHADE
    starts). Reported losses are merged into the table by ``set_epoch()``, at the start and end
    of every iteration (and every 2 s in the background), so the next epoch uses them, from the
    same object; ``flush_scores()`` merges them at once.

    ``peers`` shares the tiers of the job's nodes (DIESEL's task-grained cache): every node's
    ``granary serve`` address (``"host:port"``), in node order, this node's included (ranks are
    numbered node by node, as torchrun does; ``job_peers()`` gathers the list through
    ``torch.distributed``). Each node computes the same ownership from the plan of
    ``ownership_epoch``; a chunk this node's tier lacks is asked of its owner before origin
    storage, every copy checked against the snapshot, and a peer that does not answer within
    ``peer_timeout`` seconds is skipped for the epoch. ``node`` overrides this node's number.
    Needs ``cache_dir``. Every request to a peer is signed with the job's secret
    (``peer_secret``, default the ``GRANARY_PEER_SECRET`` variable, which ``job_secret()``
    sets on every rank); ``granary serve`` refuses requests without it. ``peer_ca`` (a PEM
    file) reaches peers over TLS (``granary serve --tls-cert``), checking their certificates.

    ``memory`` is each reader's read-buffer budget in bytes (one reader per DataLoader worker;
    default ``None``: the library's 128 MiB). The shuffle window follows from it unless
    ``window`` (chunks) is given. ``page_cache`` (bytes; default ``None``: half the node's
    memory, or of the cgroup's limit) is the page cache a reader keeps the dataset's chunks
    resident in, and bounds the maps of resident chunks each worker keeps from one epoch to
    the next (they show in its RSS as file pages); ``0`` keeps none. ``io`` (``"auto"``,
    ``"direct"``, ``"buffered"``), ``backend`` (``"auto"``, ``"uring"``, ``"pread"``; default
    ``None``: the ``GRANARY_IO`` variable, else ``"auto"``),
    ``queue_depth`` (reads in flight per reader) and ``range_gap`` (bytes) are ``granary
    read``'s flags of the same names, with the same defaults; ``scores`` names a score table
    file instead of the node's shared one next to the tier (the table ``report()`` feeds through
    ``granary.Scores`` is such a file: a copy of it serves another job).

    ``zero_copy`` (default True): a DataLoader worker's batch (``batch_format="list"``, no
    ``transform`` or ``collate`` in the worker, no tier) whose samples all lie in chunk files
    it keeps mapped (a resident local dataset) crosses to the training process as places in
    those files, which that process maps itself, privately: its per-sample tensors are views
    of the page cache, checked by the worker, copied by nobody (writing into one changes that
    process's copy only). Other batches, and all with ``False``, are gathered into the worker's
    shared-memory ring.

    ``waits=True`` (with ``batch_size``) adds ``"waits"`` to every batch: the seconds the
    process that made it (a DataLoader worker) spent on it, by what the reader waited on
    (``tier_s``, ``peers_s``, ``origin_s``, ``check_s``, ``plan_s``, ``other_s``) and
    ``python_s`` (gathering, assembling, ``transform``); ``granary.WaitMeter`` turns them into
    where the training loop waits.
    """

    # A mixture of datasets (``granary.Mixture``): samples carry their source.
    _mixture = False

    def __init__(
        self,
        path,
        shuffle=_D["shuffle"],
        seed=_D["seed"],
        rank=None,
        world_size=None,
        drop_last=None,
        batch_size=None,
        cache_dir=None,
        cache_size=None,
        policy=_D["policy"],
        sampling=_D["sampling"],
        alpha=_D["alpha"],
        cache_boost=_D["cache_boost"],
        window=None,
        memory=None,
        page_cache=None,
        io=_D["io"],
        backend=None,
        queue_depth=_D["queue_depth"],
        range_gap=_D["range_gap"],
        scores=None,
        zero_copy=True,
        batch_format="list",
        pad=False,
        locality=_D["locality"],
        transform=None,
        collate=None,
        peers=None,
        node=None,
        peer_timeout=_D["peer_timeout"],
        ownership_epoch=_D["ownership_epoch"],
        peer_secret=None,
        peer_ca=None,
        fields=None,
        raw=False,
        images="bytes",
        waits=False,
    ):
        if batch_size is not None and batch_size < 1:
            raise ValueError("batch_size must be a positive integer")
        if batch_format not in ("list", "tensor"):
            raise ValueError(f"batch_format must be list or tensor, not {batch_format!r}")
        if pad and drop_last:
            raise ValueError("pad=True fills the remainder that drop_last=True drops: pick one")
        if transform is not None and not callable(transform):
            raise ValueError("transform must be callable")
        if waits and batch_size is None:
            raise ValueError("waits are reported per batch: they need batch_size")
        if transform is not None and batch_format == "tensor":
            raise ValueError(
                "transform applies per sample; batch_format='tensor' packs a batch's bytes "
                "(decode data[offsets[i]:offsets[i + 1]] yourself, or use batch_format='list')"
            )
        if collate is not None and not callable(collate):
            raise ValueError("collate must be callable")
        if collate is not None and (batch_size is None or batch_format == "tensor"):
            raise ValueError("collate applies to the list of a batch's samples: it needs "
                             "batch_size and batch_format='list'")
        if peers is not None:
            if isinstance(peers, str):
                peers = [p for p in peers.split(",") if p]
            peers = [str(p) for p in peers]
        if (rank is None) != (world_size is None):
            raise ValueError("rank and world_size go together")
        if world_size is not None and not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, {world_size})")
        drop_last = not pad if drop_last is None else bool(drop_last)
        # The reader's own options (_READER_OPTIONS), checked by the library as every stream
        # will be: now, in the process that makes the dataset, not later in a DataLoader
        # worker; then kept as attributes, as _KEPT_AS says.
        given = locals()
        options = {name: given[name] for name in _READER_OPTIONS if given[name] is not None}
        _check_reader_options(**options)
        if sampling == "importance" and cache_dir is None and scores is None:
            # report() feeds the node's score table next to the tier.
            raise ValueError("sampling='importance' needs cache_dir (the score table report() "
                             "feeds lives there) or a score table file (scores=)")
        self.root = os.fspath(path)
        self.fields = _field_list(fields)
        self.raw = bool(raw)
        self.images = _types.check_images(images)
        self.report_waits = bool(waits)
        self._layout_ds = None
        for name in _READER_OPTIONS:
            value, keep = given[name], _KEPT_AS.get(name)
            setattr(self, name, value if keep is None or value is None else keep(value))
        self.rank = rank
        self.world_size = world_size
        self.transform = transform
        self.collate = collate
        self.batch_size = batch_size
        self.zero_copy = bool(zero_copy)
        self.batch_format = batch_format
        self.epoch = 0
        self._resume = None
        self._consumed = 0
        self._shard = None
        self._redistributed = False
        self._scores = None
        self._reported = False  # losses reported since the last merge
        _NativeDataset(self.root)  # fail early on a bad path
        self._box = _EpochBox()

    # -- configuration -------------------------------------------------------------------

    def set_epoch(self, epoch):
        """Selects the epoch the next iteration streams (its own shuffle), and merges the
        losses reported so far into the score table so that it samples and caches by them."""
        self._box.check_workers()
        self._merge_reported()
        self._set_epoch(int(epoch))
        self._box.publish(self.epoch)

    def _set_epoch(self, epoch):
        if epoch != self.epoch:
            self._resume = None
            self._epoch_of = None
            self._consumed = 0
        self.epoch = epoch

    def _follow(self):
        """In a persistent DataLoader worker: takes up the epoch the training process set since
        this copy was made (``set_epoch`` there cannot reach here otherwise)."""
        changed = self._box.changed()
        if changed is not None:
            self._set_epoch(changed)

    def _rank_world(self):
        if _tud is not None:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return dist.get_rank(), dist.get_world_size()
        if self.world_size is not None:
            return self.rank, self.world_size
        return 0, 1

    def _worker(self):
        if _tud is not None:
            info = _tud.get_worker_info()
            if info is not None:
                return info.id, info.num_workers
        return 0, 1

    # -- iteration -----------------------------------------------------------------------

    def _stream_options(self):
        """The reader's keyword options of this dataset's streams."""
        # None is the library's default (for backend: GRANARY_IO, else auto).
        options = ((name, getattr(self, name)) for name in _READER_OPTIONS)
        return {name: v for name, v in options if v is not None}

    def _stream(self):
        rank, world = self._rank_world()
        worker, workers = self._worker()
        self._shard = (rank, world, worker, workers)
        st = self._resumed_state()
        resume = None
        if st is not None:
            then = st.get("then")
            of = st.get("of")
            earlier = of is not None and of != self._identity()
            resume = (st["epoch"], st["world_size"], st["num_workers"], st["consumed"],
                      st.get("worker"),
                      None if then is None else (then["world_size"], then["num_workers"],
                                                 then["consumed"]),
                      of["chunks"] if earlier else None)
        return Stream(self.root, self.epoch, rank, world, worker, workers, resume=resume,
                      **self._stream_options())

    def _resumed_state(self):
        """The loaded resume state, if it is of the epoch about to be read."""
        st = self._resume
        return st if st is not None and st["epoch"] == self.epoch else None

    def __iter__(self):
        self._follow()
        # Losses reported through this object reach the table before the epoch is planned.
        self._merge_reported()
        try:
            yield from self._iterate()
        except Exception as e:
            # Told to the training process through shared memory too: an error that a
            # DataLoader's queue failed to carry cannot pass as the end of this share.
            self._box.fail(self.epoch, e)
            raise
        finally:
            # ... and those reported during it (here, or in this worker) before the next one.
            self._merge_reported()

    def _iterate(self):
        stream = self._stream()
        rank, world, worker, workers = self._shard
        # What this iteration's epoch was planned over (a resumed state's, which may be of the
        # previous generation), for the states taken of it.
        st = self._resumed_state()
        self._epoch_of = None if st is None else st.get("of")
        self._consumed = 0
        self._redistributed = False
        self._pending = False
        st = self._resumed_state()
        if st is not None:
            then = st.get("then")
            slot = rank * workers + worker
            # A state of the previous generation resumes the epoch as it was planned, less the
            # samples deleted since: counted from the start of the resumed plan, as below.
            of = st.get("of")
            earlier = of is not None and of != self._identity()
            same = (st["world_size"], st["num_workers"]) == (world, workers)
            if then is None and same and not earlier:
                self._consumed = st["consumed"][slot]
            else:
                # Resumed under another configuration: counted from the start of the
                # resumed plan (or from where it was checkpointed at this configuration).
                self._redistributed = True
                if then is not None and (then["world_size"], then["num_workers"]) == (world, workers):
                    self._consumed = then["consumed"][slot]
        weighted = self.sampling == "importance"
        transform = self.transform
        layouts = self._layouts()
        mixture = self._mixture
        if self.batch_size is None:
            for i, label, data, weight, source in stream:
                self._consumed += 1
                item = {"id": i, "label": label}
                if mixture:
                    item["source"] = source
                if layouts is not None:
                    item["fields"] = _split_fields(data, layouts([i], [source])[0], self.fields)
                if transform is not None:
                    data = transform(data)
                item["data"] = data
                if weighted:
                    item["weight"] = weight
                yield item
        elif not self.report_waits:
            for n, item in self._batches(stream, weighted, transform, self.collate, layouts):
                self._consumed += n
                yield item
        else:
            yield from self._timed_batches(stream, weighted, transform, layouts)
        # The resumed remainder is done; the epoch's next iteration starts it afresh.
        self._resume = None
        self._redistributed = False

    def _timed_batches(self, stream, weighted, transform, layouts):
        """The batches, each with ``"waits"``: the seconds this process spent making it, by
        what it waited on (the reader's parts, see ``Stream.waits()``) and ``python_s``, the
        rest of its time on that batch (gathering, assembling, ``transform``/``collate``)."""
        import time

        from . import _shm

        keys = ("tier_s", "peers_s", "origin_s", "check_s", "plan_s", "other_s")
        last = stream.waits()
        t = time.perf_counter()
        for n, item in self._batches(stream, weighted, transform, self.collate, layouts):
            made = time.perf_counter() - t
            now = stream.waits()
            parts = {k: now[k] - last[k] for k in keys}
            waited = now["waited_s"] - last["waited_s"]
            parts["python_s"] = max(made - waited, 0.0)
            parts["made_s"] = made
            last = now
            self._consumed += n
            yield _shm.with_extra(item, {"waits": parts})
            t = time.perf_counter()

    def _layouts(self):
        """None for a dataset without fields; else (ids, sources) -> each sample's field layout
        (``sources``, each sample's source in a mixture, unused here)."""
        if self._layout_ds is None:
            self._layout_ds = _NativeDataset(self.root)
            if self.fields is not None and not self._layout_ds.has_fields:
                raise ValueError(f"{self.root}: the samples have no named fields to choose from")
        if not self._layout_ds.has_fields:
            return None
        layouts = self._layout_ds.field_layouts
        if self.raw or self.images != "bytes":
            layouts = _asked_layouts(layouts, self.raw, self.images)
        return lambda ids, sources=None: layouts(ids)

    def _batches(self, stream, weighted, transform, collate, layouts=None):
        """(samples, item) per batch of ``stream``. With numpy the batch is gathered into one
        buffer and its samples are views of it; inside a DataLoader worker that buffer is a
        segment of the worker's shared-memory ring and the item a record that becomes the
        batch in the training process (see ``_shm``)."""
        try:
            import numpy as np
        except ImportError:
            np = None
        packed = self.batch_format == "tensor"
        n = self.batch_size
        if np is None:  # bytes objects, or one bytearray with its offsets
            while True:
                batch = stream.next_batch_packed(n) if packed else stream.next_batch(n)
                if batch is None:
                    return
                if packed:
                    ids, labels, data, offsets, weights, sources = batch
                else:
                    ids, labels, data, weights, sources = batch
                    if transform is not None:
                        data = [transform(d) for d in data]
                    if collate is not None:
                        data = collate(data)
                item = {"id": ids, "label": labels, "data": data}
                if layouts is not None:
                    if packed:
                        views = [data[offsets[j]:offsets[j + 1]] for j in range(len(ids))]
                    else:
                        views = data
                    item["fields"] = _fields_of_batch(views, layouts(list(ids), sources),
                                                      self.fields)
                if packed:
                    item["offsets"] = offsets
                if weighted:
                    item["weight"] = weights
                if self._mixture:
                    item["source"] = sources
                yield len(ids), item
        from . import _shm  # needs numpy

        in_worker = _tud is not None and _tud.get_worker_info() is not None
        if in_worker and transform is None and collate is None:
            # Per-sample views of chunk files that are not the tier's (which may evict
            # them) cross without a copy when they are mapped.
            zero_copy = self.zero_copy and not packed and self.cache_dir is None
            yield from _shm.worker_batches(stream, n, packed, weighted, layouts, self.fields,
                                           self._mixture, zero_copy)
            return
        while True:
            batch = stream.next_batch_array(n)
            if batch is None:
                return
            ids, labels, arr, offsets, weights, sources = batch
            item = _shm.assemble(arr, offsets, np.asarray(ids, np.int64),
                                 np.asarray(labels, np.int64),
                                 np.asarray(weights, np.float32) if weighted else None, packed,
                                 _layouts_for(layouts, ids, self.fields, sources),
                                 np.asarray(sources, np.int64) if self._mixture else None)
            if transform is not None:
                item["data"] = [transform(d) for d in item["data"]]
            if collate is not None:
                item["data"] = collate(item["data"])
            yield len(ids), item

    # -- resume (torchdata StatefulDataLoader protocol) ----------------------------------

    def state_dict(self):
        """Where this share stands: what it resumes (``"of"``: the dataset's id, generation
        and sample count, and a view's selection; a mixture's sources), the epoch, the seed and
        shuffle, the configuration (``world_size``, ``num_workers``) and the samples consumed.

        Ranks are taken to advance in lockstep (equal shares, the same number of steps), so
        this rank's count stands for every rank. Inside DataLoader workers each worker reports
        its own count (``"worker"``: StatefulDataLoader keeps one state per worker and restores
        each into the worker of the same index); such a state resumes at any world size with
        the same worker count. An epoch resumed under another configuration can be
        checkpointed again (``"then"``: how far it got there) and resumed at that
        configuration. Called in the training process while plain DataLoader workers do the
        iterating, it knows only the epoch: a resume from it restarts that epoch. In the
        training process it raises ``IncompleteError`` if a DataLoader worker failed since the
        last check (``set_epoch`` checks too), so no checkpoint passes over a failed share."""
        self._box.check_workers()
        pending = self._resumed_state()
        if pending is not None and getattr(self, "_pending", False):
            # Loaded, not read yet (StatefulDataLoader asks a worker as it starts): the state
            # is still the one loaded.
            return {k: v for k, v in pending.items()}
        rank, world, worker, workers = self._shard or (*self._rank_world(), *self._worker())
        own = [0] * (world * workers)
        for r in range(world):
            own[r * workers + worker] = self._consumed
        column = worker if workers > 1 else None
        st = self._resumed_state() if self._redistributed else None
        if st is not None:
            state = {k: v for k, v in st.items() if k != "then"}
            state["then"] = {"world_size": world, "num_workers": workers, "consumed": own}
            return state
        # An epoch resumed from a state of the previous generation is still that epoch: its
        # state names what it was planned over.
        of = (pending or {}).get("of") or getattr(self, "_epoch_of", None) or self._identity()
        return {
            "kind": self._kind(),
            "of": of,
            "epoch": self.epoch,
            "world_size": world,
            "num_workers": workers,
            "consumed": own,
            "worker": column,
            "seed": self.seed,
            "shuffle": self.shuffle,
        }

    def _kind(self):
        return self._identity()["kind"]

    def _identity(self):
        """What a resume state of this object resumes (see ``state_dict``)."""
        if getattr(self, "_ident", None) is None:
            self._ident = dict(_NativeDataset(self.root).identity)
        return self._ident

    def load_state_dict(self, state):
        """Resumes from ``state_dict()``: the next iteration streams what is left of that
        epoch (exactly, with the same world size and workers; redistributed otherwise, with
        nothing repeated or skipped). A state of anything else (another dataset, generation,
        view or a mixture) is refused, naming both."""
        for k in ("epoch", "world_size", "num_workers", "consumed"):
            if k not in state:
                raise ValueError(f"state has no {k!r}")
        self._check_state_identity(state)
        if state.get("seed", self.seed) != self.seed or state.get("shuffle", self.shuffle) != self.shuffle:
            raise ValueError("state comes from a dataset with another seed or shuffle")
        st = dict(state)
        st["consumed"] = [int(c) for c in state["consumed"]]
        world, workers = int(state["world_size"]), int(state["num_workers"])
        if world < 1 or workers < 1 or len(st["consumed"]) != world * workers:
            raise ValueError(f"state lists {len(st['consumed'])} counts for {world} ranks x {workers} workers")
        worker = state.get("worker")
        if worker is not None and not 0 <= int(worker) < workers:
            raise ValueError(f"state of worker {worker} of {workers}")
        then = state.get("then")
        if then is not None:
            tw, tk = int(then["world_size"]), int(then["num_workers"])
            tc = [int(c) for c in then["consumed"]]
            if tw < 1 or tk < 1 or len(tc) != tw * tk:
                raise ValueError(f"state's 'then' lists {len(tc)} counts for {tw} ranks x {tk} workers")
            st["then"] = {"world_size": tw, "num_workers": tk, "consumed": tc}
        st.update(epoch=int(state["epoch"]), world_size=world, num_workers=workers,
                  worker=None if worker is None else int(worker))
        self.epoch = st["epoch"]
        self._resume = st
        self._pending = True
        self._consumed = 0
        self._box.publish(self.epoch, resumed=True)

    def _check_state_identity(self, state):
        """Refuses a state of anything but this dataset (view, mixture): its snapshot, or for
        a dataset its parent (one append since: that epoch resumes as it was planned)."""
        kind = state.get("kind")
        if kind is None:
            raise ValueError(
                "the state names nothing it resumes (no 'kind' and 'of': made by an earlier "
                "granary); resume at the next epoch (set_epoch) instead"
            )
        mine = self._identity()
        of = state.get("of")
        if kind != mine["kind"] or not _resumable(of, mine):
            why = ""
            if kind == mine["kind"] and _changed_since(of, mine):
                why = (" (it changed since the state was taken: a state resumes on its own "
                       "snapshot, or after one append; resume at the next epoch instead)")
            raise ValueError(
                f"the state resumes {kind} {of}, not this {mine['kind']} {mine} "
                f"({self.root}){why}: its counts would skip or repeat other samples"
            )

    # -- importance ------------------------------------------------------------------

    def report(self, ids, losses):
        """Per-sample losses of a batch, keyed by sample id (lists, numpy arrays or torch
        tensors). Non-blocking: ranked and queued, merged into the node's shared score table
        in the background. Needs ``cache_dir``."""
        if self.cache_dir is None:
            raise ValueError("report() needs cache_dir: the score table lives next to the tier")
        if self._scores is None:
            self._scores = Scores(self.root, self.cache_dir)
        self._scores.report(_as_list(ids, int), _as_list(losses, float))
        self._reported = True

    def flush_scores(self):
        """Merges reported losses into the shared table now (also done every 2 s)."""
        if self._scores is not None:
            self._scores.flush()
            self._reported = False

    def _merge_reported(self):
        """flush_scores() if anything was reported since the last one: the automatic merges
        at set_epoch() and around iteration cost nothing when there is nothing to merge."""
        if self._reported:
            self.flush_scores()

    # -- pickling: configuration only ------------------------------------------------------

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_layout_ds"] = None
        state["_scores"] = None
        state["_reported"] = False
        state["_shard"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        if "_box" not in state:  # pickled by an older version
            self._box = _EpochBox()

    def __repr__(self):
        return (
            f"granary.IterableDataset({self.root!r}, shuffle={self.shuffle!r}, seed={self.seed}, "
            f"epoch={self.epoch})"
        )


def _resumable(of, mine):
    """Whether a state taken of ``of`` resumes on ``mine`` (identities as ``state_dict``
    records them): the same snapshot, or a dataset's next generation (its parent is the
    state's snapshot: an append keeps every chunk and sample id, so the epoch is resumed as it
    was planned, over the chunks it had). A mixture: each source so."""
    if of == mine:
        return True
    if not isinstance(of, dict) or of.get("kind") != mine.get("kind"):
        return False
    if mine["kind"] == "mixture":
        a, b = of.get("sources") or [], mine["sources"]
        return len(a) == len(b) and all(_resumable(x, y) for x, y in zip(a, b))
    return (mine["kind"] == "dataset" and of.get("dataset") == mine["dataset"]
            and of.get("snapshot") is not None and mine.get("parent") == of["snapshot"])


def _changed_since(of, mine):
    """Whether ``mine`` is the dataset (each source of the mixture) ``of`` was taken of, at
    another snapshot: the same dataset ids, other contents."""
    if not isinstance(of, dict):
        return False
    if mine["kind"] == "mixture":
        a, b = of.get("sources") or [], mine["sources"]
        return len(a) == len(b) and all(x.get("dataset") == y["dataset"] for x, y in zip(a, b))
    return of.get("dataset") == mine["dataset"] and of.get("snapshot") != mine["snapshot"]


class _EpochBox:
    """The epoch a dataset's training-process copy is at, shared with its DataLoader workers.

    A persistent worker (``DataLoader(persistent_workers=True)``) keeps the copy of the dataset
    it was started with; ``set_epoch()`` in the training process changes only that process's
    copy. The box is shared memory those workers inherit (fork) or receive as they start
    (spawn): the process that made it writes the epoch there, and each copy, at the start of an
    iteration, takes up an epoch written since it last looked. A resume state loaded in the
    training process after its persistent workers started cannot reach them (their copies hold
    the old one): such an iteration is an error, never an epoch read twice. Pickled other than
    for a starting process (a copy, Ray, Spark) the box stays behind: the copy is on its own.
    """

    def __init__(self):
        from multiprocessing.sharedctypes import RawArray

        self.owner = os.getpid()
        self.shared = RawArray("q", 3)  # epoch, resume states loaded, worker failures
        self.failure = RawArray("c", 1024)  # the last worker failure, in words
        self.seen = (0, 0)
        self.failures_seen = 0

    def publish(self, epoch, resumed=False):
        if self.shared is None or os.getpid() != self.owner:
            return  # a worker's copy: its epoch is its own (StatefulDataLoader restores it)
        self.shared[0] = epoch
        if resumed:
            self.shared[1] += 1
        self.seen = (self.shared[0], self.shared[1])

    def fail(self, epoch, error):
        """In a worker: records that its share of ``epoch`` ended with ``error``."""
        if self.shared is None or os.getpid() == self.owner:
            return  # in the training process the error is raised where it happens
        pid = os.getpid()
        what = f"{type(error).__name__} in the worker process {pid}, epoch {epoch}: {error}"
        self.failure.value = what.encode("utf-8", "replace")[:1023]
        self.shared[2] += 1

    def check_workers(self):
        """In the training process: raises ``IncompleteError`` once for each worker failure
        recorded since the last check, even if the worker's own error reached the caller
        (the epoch it belonged to is incomplete either way)."""
        if self.shared is None or os.getpid() != self.owner:
            return
        failures = self.shared[2]
        if failures != self.failures_seen:
            self.failures_seen = failures
            raise IncompleteError(
                f"a DataLoader worker failed ({failures} so far; the last: "
                f"{self.failure.value.decode('utf-8', 'replace')}): the epoch it belonged to is "
                "incomplete, even if no error reached this process; resume from the last "
                "checkpoint")

    def changed(self):
        """The epoch set in the owning process since this copy last looked, or None."""
        if self.shared is None or os.getpid() == self.owner:
            return None
        now = (self.shared[0], self.shared[1])
        if now == self.seen:
            return None
        if now[1] != self.seen[1]:
            raise RuntimeError(
                "load_state_dict() was called in the training process after this DataLoader's "
                "persistent workers started, and their copies of the dataset cannot see it: "
                "load the state before the DataLoader's first iteration, or make a new DataLoader"
            )
        self.seen = now
        return now[0]

    def __getstate__(self):
        from multiprocessing import context

        state = dict(self.__dict__)
        if context.get_spawning_popen() is None:
            state["shared"] = None  # not for a process being started: nothing to share
            state["failure"] = None
        return state
