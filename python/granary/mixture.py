"""``Mixture``: one epoch over several datasets, each in its share, for DataLoader."""

import os

from ._iterable import IterableDataset
from ._native import Stream, mixture_info


class Mixture(IterableDataset):
    """Chunk-wise shuffled epochs over several datasets at once, for ``DataLoader``.

    ``sources``: datasets (paths, URLs or view files). Each epoch holds from each source its
    share: ``weights`` (relative: ``[0.5, 0.3, 0.2]``; the epoch then has ``epoch_size``
    samples, by default all sources' samples together), or per source in ``shares`` a weight
    or ``"repeat=R"`` (R times its samples per epoch; 0.5 takes a different half every epoch)
    or ``"choose=N"`` (N samples). Without either, every sample of every source once.

    Every item carries ``"source"``, the index of the source it came from (per sample, or a
    tensor per batch), and ``"id"``, the sample's id in that source. Each source is read
    chunk-wise in windows of its own, with ``memory`` of read buffers (per source: a worker
    holds up to that many times the sources) and a share of the tier's ``cache_size`` (half
    split evenly, half by epoch counts); the sources read ahead in the order the epoch needs
    them. The sources' samples are interleaved evenly, so any part of an epoch holds every
    source in its share. Every rank gets the same number of samples of every source.

    ``state_dict()`` / ``load_state_dict()`` resume an epoch exactly, also under another world
    size or worker count (what is left of each source is redistributed; as for one dataset,
    a remainder that does not divide by the new ranks is cut by ``drop_last`` or padded).
    The state carries each source as its epoch was planned: a resumed epoch keeps the weights
    and the generation of the checkpoint, new weights or appended samples apply from the next
    epoch. A state of another mixture (other datasets, in another order) is refused.

    Importance sampling (``sampling="importance"``, with ``cache_dir``) and the importance tier
    work per source: each source draws its epoch count by the score table next to its own tier,
    which ``report(ids, losses, sources=batch["source"])`` feeds.

    Samples with named fields come with ``"fields"`` as from ``IterableDataset``, each by its
    own source's layout (a source without fields gives none). Every other argument is
    ``IterableDataset``'s, except ``locality`` below 1, which a mixture does not support yet.
    """

    _mixture = True

    def __init__(self, sources, weights=None, *, shares=None, epoch_size=None, **kwargs):
        if isinstance(sources, (str, bytes, os.PathLike)):
            raise ValueError("sources is a list of datasets (one dataset: use IterableDataset)")
        sources = [os.fspath(s) for s in sources]
        if not sources:
            raise ValueError("a mixture needs at least one source")
        if weights is not None and shares is not None:
            raise ValueError("give weights or shares, not both")
        if weights is not None:
            shares = [f"weight={float(w)!r}" for w in weights]
        elif shares is not None:
            shares = [str(s) for s in shares]
        else:
            shares = ["repeat=1"] * len(sources)
        locality = kwargs.get("locality")
        if locality is not None and float(locality) < 1.0:
            raise ValueError("locality below 1 is not supported for mixtures yet")
        super().__init__(sources[0], **kwargs)
        self.sources = sources
        self.shares = shares
        self.epoch_size = None if epoch_size is None else int(epoch_size)
        self._marks = None
        self._resume_sources = None
        self._tables = None
        self._natives = None
        # Fail early, here: the shares, the datasets, the same dataset twice.
        self.counts = self._info()[0]

    def _info(self):
        return mixture_info(self.sources, self.shares, self.epoch_size,
                            **self._stream_options())

    def _layouts(self):
        """None when no source has named fields; else (ids, sources) -> each sample's field
        layout from its own source (no fields: an empty layout)."""
        from ._iterable import _asked_layouts
        from ._native import Dataset as _NativeDataset

        if self._natives is None:
            self._natives = [_NativeDataset(p) for p in self.sources]
        has = [n.has_fields for n in self._natives]
        if not any(has):
            if self.fields is not None:
                raise ValueError("no source of the mixture has named fields to choose from")
            return None
        per = []
        for n, h in zip(self._natives, has):
            lay = n.field_layouts if h else (lambda ids: [[] for _ in ids])
            if self.raw or self.images != "bytes":
                lay = _asked_layouts(lay, self.raw, self.images)
            per.append(lay)

        def layouts(ids, sources):
            out = [None] * len(ids)
            by = {}
            for k, (i, s) in enumerate(zip(ids, sources)):
                by.setdefault(int(s), ([], []))
                by[int(s)][0].append(k)
                by[int(s)][1].append(int(i))
            for s, (ks, si) in by.items():
                for k, lay in zip(ks, per[s](si)):
                    out[k] = lay
            return out

        return layouts

    def _stream(self):
        rank, world = self._rank_world()
        worker, workers = self._worker()
        self._shard = (rank, world, worker, workers)
        resume = None
        st = self._resumed_state()
        if st is not None:
            resume = {"epoch": st["epoch"], "world_size": st["world_size"],
                      "num_workers": st["num_workers"], "consumed": st["consumed"],
                      "sources": self._resume_sources, "column": st.get("worker"),
                      "then": st.get("then")}
        stream = Stream.mixture(self.sources, self.shares, self.epoch_size, self.epoch, rank,
                                world, worker, workers, resume=resume, **self._stream_options())
        self._marks = stream.mix_marks()
        return stream

    def state_dict(self):
        """``IterableDataset.state_dict()`` plus each source as the epoch was planned
        (``"sources"``: dataset id, chunks, samples, the samples the epoch takes, window)."""
        state = super().state_dict()
        if "sources" not in state:
            marks = self._marks if self._marks is not None else self._info()[1]
            state["sources"] = [dict(m) for m in marks]
        return state

    def _identity(self):
        """A mixture is its sources, in order (their weights may change between a checkpoint
        and its resume: the resumed epoch keeps the checkpointed ones)."""
        if getattr(self, "_ident", None) is None:
            from ._native import Dataset as _NativeDataset

            self._ident = {"kind": "mixture",
                           "sources": [dict(_NativeDataset(s).identity) for s in self.sources]}
        return self._ident

    def load_state_dict(self, state):
        """Resumes from ``state_dict()`` of the same mixture (see the class documentation)."""
        if "sources" not in state:
            raise ValueError("state has no 'sources': it is a single dataset's, not a mixture's")
        sources = [dict(m) for m in state["sources"]]
        if len(sources) != len(self.sources):
            raise ValueError(f"state of a mixture of {len(sources)} sources, this one has "
                             f"{len(self.sources)}")
        super().load_state_dict(state)
        self._resume_sources = sources

    def report(self, ids, losses, sources=None):
        """Per-sample losses of a batch, keyed by each sample's source and id (``batch["source"]``
        and ``batch["id"]``): each source's losses go to the score table next to its own tier
        (``cache_dir``), which ``policy="importance"`` and ``sampling="importance"`` use for that
        source. Non-blocking, as ``IterableDataset.report``."""
        from ._iterable import _as_list
        from ._native import Scores

        if self.cache_dir is None:
            raise ValueError("report() needs cache_dir: the score tables live next to the tiers")
        if sources is None:
            raise ValueError("a mixture's losses need each sample's source: report(ids, losses, "
                             "sources=batch['source'])")
        ids, losses, sources = _as_list(ids, int), _as_list(losses, float), _as_list(sources, int)
        if not len(ids) == len(losses) == len(sources):
            raise ValueError(f"{len(ids)} ids, {len(losses)} losses, {len(sources)} sources")
        if self._tables is None:
            self._tables = {}
        by = {}
        for i, l, s in zip(ids, losses, sources):
            if not 0 <= s < len(self.sources):
                raise ValueError(f"source {s} is not in 0..{len(self.sources)}")
            by.setdefault(s, ([], []))
            by[s][0].append(i)
            by[s][1].append(l)
        for s, (si, sl) in by.items():
            if s not in self._tables:
                self._tables[s] = Scores(self.sources[s], self.cache_dir)
            self._tables[s].report(si, sl)
        self._reported = True

    def flush_scores(self):
        """Merges reported losses into every source's table now (also done every 2 s)."""
        for t in (self._tables or {}).values():
            t.flush()
        self._reported = False

    def __getstate__(self):
        state = super().__getstate__()
        state["_marks"] = None
        state["_tables"] = None
        state["_natives"] = None
        return state

    def __repr__(self):
        return (f"granary.Mixture({self.sources!r}, shares={self.shares!r}, "
                f"seed={self.seed}, epoch={self.epoch})")
