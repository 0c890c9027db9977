"""granary and Ray Data (install ray: ``pip install granary[ray]``).

Writing: ``ds.write_datasink(granary.ray.Datasink(out, shards=n, ...))`` writes each write task
``i`` (of ``n``: make the dataset ``n`` blocks with ``ds.repartition(n)``) as shard ``(i, n)``
and merges the parts on the driver when all tasks are done; ``granary.ray.write(ds, out, ...)``
does the repartition, computes the class table from the label column, and writes. A task Ray
retries writes its shard again from the start (``force``). ``out`` must be a path every worker
sees (a shared file system, or a local path on one machine).

Reading: ``granary.ray.read_granary(path)`` is a Ray Dataset whose blocks are the dataset's
chunks (each read with one large read and every sample checked against its CRC-32), with the
columns ``key`` (str), ``label`` (int64, -1 without a label) and either ``data`` (bytes) or one
bytes column per field (null where a sample lacks the field).
"""

import json
import os

import ray
import ray.data

from ._rows import Columns, label_classes
from .writer import Writer, merge

__all__ = ["Datasink", "read_granary", "write"]


def _rows(block):
    if hasattr(block, "to_pylist"):  # pyarrow.Table
        return block.to_pylist()
    return block.to_dict("records")  # pandas.DataFrame


class Datasink(ray.data.Datasink):
    """Writes a Ray Dataset of ``shards`` blocks as a granary dataset at ``out`` (see the
    module). Columns as in :func:`granary.from_parquet`; ``classes`` is required with a
    ``label`` column (every shard must share the class table; :func:`write` computes it)."""

    def __init__(self, out, *, shards, key=None, data=None, fields=None, label=None,
                 classes=None, **writer_options):
        if int(shards) < 1:
            raise ValueError("shards must be at least 1")
        if label is not None and classes is None:
            raise ValueError("a label column needs classes= (the class table every shard shares); "
                             "granary.ray.write computes it from the data")
        Columns(key=key, data=data, fields=fields, label=label)  # checks the arguments
        self.out = os.fspath(out)
        self.shards = int(shards)
        self.columns = dict(key=key, data=data, fields=fields, label=label)
        self.classes = classes
        self.options = dict(writer_options, force=True, progress=False)
        self.summary = None

    def write(self, blocks, ctx):
        i = ctx.task_idx
        if i >= self.shards:
            raise ValueError(
                f"write task {i} but the sink was made for {self.shards} shards: repartition the "
                f"dataset to {self.shards} blocks (or use granary.ray.write)")
        cols = Columns(prefix=f"t{i:05d}-", **self.columns)
        number = 0
        with Writer(self.out, shard=(i, self.shards), classes=self.classes, **self.options) as w:
            for block in blocks:
                for row in _rows(block):
                    k, d, lab = cols.sample(row, number)
                    w.write(k, d, label=lab)
                    number += 1
        return json.dumps(w.summary)

    def on_write_complete(self, write_result):
        # Shards no task wrote (fewer blocks than shards) are empty parts, then one merge.
        for i in range(self.shards):
            part = os.path.join(self.out, f"part-{i:04d}-of-{self.shards:04d}", "part.gpart")
            if not os.path.exists(part):
                Writer(self.out, shard=(i, self.shards), classes=self.classes, **self.options).close()
        self.summary = merge(self.out)
        returns = getattr(write_result, "write_returns", None) or []
        self.summary["shards"] = [json.loads(r) for r in returns if isinstance(r, str)]


def write(ds, out, *, shards=None, key=None, data=None, fields=None, label=None, classes=None,
          **writer_options):
    """Writes Ray Dataset ``ds`` as a granary dataset at ``out`` with ``shards`` write tasks
    (default: the cluster's CPUs); returns the merge summary."""
    if shards is None:
        shards = max(1, int(ray.cluster_resources().get("CPU", 1)))
    if label is not None and classes is None:
        classes = label_classes(ds.unique(label))
    sink = Datasink(out, shards=shards, key=key, data=data, fields=fields, label=label,
                    classes=classes, **writer_options)
    ds.repartition(shards).write_datasink(sink)
    return sink.summary


class _Source(ray.data.Datasource):
    """The chunks of a granary dataset as read tasks: one block per chunk."""

    def __init__(self, path):
        from . import _native

        self.path = os.fspath(path)
        ds = _native.Dataset(self.path)
        self.chunks = [ds.chunk_samples(c) for c in range(ds.chunk_count)]
        self.has_fields = ds.has_fields
        self.field_names = ds.field_names()

    def estimate_inmemory_data_size(self):
        return None

    def get_read_tasks(self, parallelism, per_task_row_limit=None, data_context=None):
        from ray.data.block import BlockMetadata
        from ray.data.datasource import ReadTask

        ids = [c for c, (_, n) in enumerate(self.chunks) if n > 0]
        groups = [ids[g::max(1, parallelism)] for g in range(max(1, min(parallelism, len(ids))))]
        tasks = []
        for group in groups:
            if not group:
                continue
            rows = sum(self.chunks[c][1] for c in group)
            meta = BlockMetadata(num_rows=rows, size_bytes=None, exec_stats=None, input_files=None)
            path, has_fields, names = self.path, self.has_fields, self.field_names
            tasks.append(ReadTask(lambda g=group: _read_chunks(path, g, has_fields, names), meta))
        return tasks


def _read_chunks(path, chunks, has_fields, names):
    """One pyarrow table per chunk."""
    import pyarrow as pa

    from . import _native

    ds = _native.Dataset(path)
    classes = ds.classes()
    for c in chunks:
        samples = ds.read_chunk(c)
        keys = [os.fsdecode(ds.path(i)) for i, _, _ in samples]
        labels = [lab if lab < len(classes) else -1 for _, lab, _ in samples]
        cols = {"key": pa.array(keys, pa.string()), "label": pa.array(labels, pa.int64())}
        if has_fields:
            layouts = ds.field_layouts([i for i, _, _ in samples])
            per = {n: [None] * len(samples) for n in names}
            for j, ((_, _, data), lay) in enumerate(zip(samples, layouts)):
                for n, o, k, _ in lay:
                    per[n][j] = data[o:o + k]
            for n in names:
                cols[n] = pa.array(per[n], pa.binary())
        else:
            cols["data"] = pa.array([d for _, _, d in samples], pa.binary())
        yield pa.table(cols)


def read_granary(path, **read_options):
    """A Ray Dataset of the granary dataset at ``path`` (see the module); ``read_options`` go to
    ``ray.data.read_datasource`` (``override_num_blocks``, ...)."""
    return ray.data.read_datasource(_Source(path), **read_options)
