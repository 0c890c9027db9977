"""Views from columns: ``make_view`` writes a view file (as ``granary view`` does) selecting a
dataset's samples by ids, by paths, by a boolean mask or by a score column with a threshold -
given as arrays, or read from a NumPy ``.npy`` file or a Parquet column, keyed by sample id or
by path. The view opens wherever the dataset does (``granary.Dataset(view)``,
``granary.IterableDataset(view)``, ``granary read VIEW``)."""

import os

from ._native import Dataset as _NativeDataset
from ._native import compact as _compact
from ._native import delete_samples as _delete_samples
from ._native import purge_cache as _purge_cache
from ._native import write_view as _write_view


def _column(values, parquet, column, what):
    """A list of ``values``, or of a Parquet file's ``column``, or of a ``.npy`` file's array."""
    if parquet is not None:
        if column is None:
            raise ValueError("parquet= needs column= (which column holds the values)")
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise ImportError("pyarrow is needed to read Parquet (pip install pyarrow)") from e
        table = pq.read_table(os.fspath(parquet), columns=[column])
        return table.column(column).to_pylist()
    if isinstance(values, (str, os.PathLike)) and os.fspath(values).endswith(".npy"):
        import numpy as np
        return np.load(os.fspath(values), allow_pickle=False).tolist()
    if values is None:
        raise ValueError(f"no {what} given")
    return list(values.tolist() if hasattr(values, "tolist") else values)


def make_view(dataset, output, *, ids=None, paths=None, mask=None, scores=None,
              min_score=None, keys=None, parquet=None, column=None, key_column=None,
              description=None):
    """Writes a view of ``dataset`` to ``output`` and returns how many samples it holds.

    Choose the samples with exactly one of:

    - ``ids``: sample ids;
    - ``paths``: stored paths (str or bytes; every one must be in the dataset);
    - ``mask``: booleans, one per key, True keeps the sample;
    - ``scores`` with ``min_score``: numbers, one per key, kept when ``>= min_score``.

    ``mask`` and ``scores`` are keyed by sample id (the i-th value is sample i's: as many values
    as samples) unless ``keys`` gives each value's path. Any of them may be an array, a list, a
    ``.npy`` file, or a Parquet file: ``parquet=FILE, column=NAME`` (and ``key_column=NAME`` for
    the paths the rows belong to; without it the rows are sample ids in order).
    """
    ds = _NativeDataset(os.fspath(dataset))
    n = len(ds)
    given = [x for x in (ids, paths, mask, scores) if x is not None] + (
        [parquet] if parquet is not None and mask is None and scores is None else [])
    if len(given) != 1:
        raise ValueError("give exactly one of ids=, paths=, mask=, scores= (or parquet=)")
    what = description
    if ids is not None:
        chosen = [int(i) for i in _column(ids, None, None, "ids")]
        what = what or f"{len(chosen)} ids"
    elif paths is not None:
        chosen = [_id_of(ds, p) for p in _column(paths, None, None, "paths")]
        what = what or f"{len(chosen)} paths"
    else:
        if scores is not None or (parquet is not None and min_score is not None):
            if min_score is None:
                raise ValueError("scores= needs min_score=")
            values = _column(scores, parquet, column, "scores")
            keep = [v is not None and v >= min_score for v in values]
            what = what or f"score {column or 'column'} >= {min_score}"
        else:
            values = _column(mask, parquet, column, "mask")
            keep = [bool(v) for v in values]
            what = what or f"mask {column or ''}".strip()
        if parquet is not None and key_column is not None:
            keys = _column(None, parquet, key_column, "keys")
        if keys is not None:
            keys = list(keys)
            if len(keys) != len(keep):
                raise ValueError(f"{len(keys)} keys for {len(keep)} values")
            chosen = [_id_of(ds, k) for k, k_keep in zip(keys, keep) if k_keep]
        else:
            if len(keep) != n:
                raise ValueError(
                    f"{len(keep)} values for a dataset of {n} samples: values keyed by sample "
                    f"id need one per sample (or give keys= / key_column= with their paths)")
            chosen = [i for i, k in enumerate(keep) if k]
    return _write_view(os.fspath(dataset), os.fspath(output), chosen, what)


def _id_of(ds, path):
    p = os.fsencode(path) if isinstance(path, str) else bytes(path)
    i = ds.lookup(p)
    if i is None:
        raise KeyError(f"no sample {os.fsdecode(p)!r} in the dataset")
    return i


def delete(dataset, *, ids=None, paths=None, strict=False):
    """Deletes samples from the local dataset ``dataset`` (``granary delete``): publishes its next
    generation without them, rewriting no chunk, and returns the summary as a dict (``deleted``,
    ``already_deleted``, ``generation``, ``samples`` left, ``chunks_affected``, ``dead_bytes``,
    ``missing``). The samples of ``ids`` and those of ``paths`` are deleted (both, when both are
    given): ``ids`` are sample ids (an ``IterableDataset`` item's ``"id"``; a map-style
    ``Dataset``'s index is a position among the samples left, which is no id once samples were
    deleted), ``paths`` stored paths (str or bytes); each may be an array, a list or a ``.npy``
    file. A path the dataset does not hold
    is listed in ``missing`` and left out, or with ``strict=True`` a KeyError (nothing deleted);
    an id past the dataset's end is a ValueError. Readers of this generation never deliver, list
    or find a deleted sample; sample ids do not move. The deleted records' bytes stay in their
    chunk files until ``granary compact`` rewrites them."""
    if ids is None and paths is None:
        raise ValueError("give ids= or paths= (or both)")
    chosen, missing = [], []
    if ids is not None:
        for i in _column(ids, None, None, "ids"):
            # An id is an integer: 1.5, "3" or True are mistakes, not ids.
            if isinstance(i, (bool, str, bytes, float)) or not hasattr(i, "__index__"):
                raise ValueError(f"ids: {i!r} is not a sample id (an integer)")
            i = int(i.__index__())
            if i < 0:
                raise ValueError(f"ids: {i} is not a sample id (ids start at 0)")
            chosen.append(i)
    if paths is not None:
        if isinstance(paths, (str, bytes, os.PathLike)) and not str(paths).endswith(".npy"):
            paths = [paths]
        ds = _NativeDataset(os.fspath(dataset))
        for p in _column(paths, None, None, "paths"):
            b = os.fsencode(p) if isinstance(p, str) else bytes(p)
            i = ds.lookup(b)
            if i is None:
                if strict:
                    raise KeyError(f"no sample {os.fsdecode(b)!r} in the dataset")
                missing.append(os.fsdecode(b))
            else:
                chosen.append(i)
        del ds
    if not chosen:
        what = f"none of the paths is in the dataset ({missing[:3]})" if missing else "no sample given"
        raise ValueError(f"nothing to delete: {what}")
    import json
    s = json.loads(_delete_samples(os.fspath(dataset), chosen))
    s["missing"] = missing
    return s


def compact(dataset, *, all=False, min_dead=0.2, grace=24 * 3600):
    """Rewrites the chunks of ``dataset`` (a directory or a writable object-store URL) that keep
    deleted samples' records without them (``granary compact``): those whose deleted records
    take at least ``min_dead`` of their record bytes, or every one with ``all=True``; publishes
    the next generation and removes replaced chunk files written more than ``grace`` seconds
    ago (``grace=0``: at once; a reader still on an older generation then fails naming the
    missing file). Returns the summary as a dict (``generation``: None when nothing needed
    rewriting; ``chunks_rewritten``, ``records_removed``, ``bytes_removed``, ``files_removed``,
    ``files_waiting``...)."""
    import json
    return json.loads(_compact(os.fspath(dataset), float(min_dead), bool(all), float(grace)))


def purge_cache(dataset, cache_dir):
    """Removes from the node's tier under ``cache_dir`` (the ``cache_dir`` readers are given)
    every chunk copy and hot chunk of ``dataset`` that holds deleted samples' records, or chunks
    its current snapshot does not list (``granary cache purge``): what a reader of it removes as
    it starts, done at once. Returns a dict (``entries_removed``, ``bytes_freed``,
    ``entries_left``...); a ``cache_dir`` that is not a directory raises."""
    import json
    return json.loads(_purge_cache(os.fspath(dataset), os.fspath(cache_dir)))
