"""Writing a Spark DataFrame as a granary dataset: one writer shard per partition, merged on the
driver (install pyspark: ``pip install granary[spark]``).

    import granary.spark
    granary.spark.write(df, "/shared/train.granary", key="id", fields=["jpg", "txt"], label="cls")

Each partition ``i`` of ``n`` is written by its task (``mapInArrow``: rows arrive as Arrow
batches) as shard ``(i, n)`` straight into ``out``
(which every executor must see: a shared file system, or a local path with ``local[*]``), then
the driver merges the parts (``granary.merge``) — the same parts and merge as ``granary pack
--shard``. A task Spark retries (a lost executor, a failure) writes its shard again from the
start (``force``): what an earlier attempt left of it is replaced, never mixed in. If the job
fails, nothing is published; running it again rewrites every shard.
"""

import json
import os

from ._rows import Columns, label_classes
from .writer import Writer, merge

__all__ = ["write"]


def _classes(df, label, classes):
    """The class table every shard must share: given, or from the label column's values (one
    small aggregate job)."""
    if classes is not None or label is None:
        return classes
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    t = df.schema[label].dataType
    if isinstance(t, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
        top = df.agg(F.max(F.col(label))).collect()[0][0]
        lo = df.agg(F.min(F.col(label))).collect()[0][0]
        if lo is not None and lo < 0:
            raise ValueError(f"label column {label!r} holds {lo}; int labels are >= 0")
        return None if top is None else [str(i) for i in range(top + 1)]
    if isinstance(t, T.StringType):
        return label_classes([r[0] for r in df.select(label).distinct().collect()])
    raise ValueError(f"label column {label!r} is {t.simpleString()}; labels are ints or strings")


def write(df, out, *, key=None, data=None, fields=None, label=None, classes=None, **writer_options):
    """Writes DataFrame ``df`` as a dataset at ``out``; returns the merge summary (a dict, with
    ``"shards"``: each partition's writer summary). Columns as in
    :func:`granary.from_parquet`; ``classes`` as in :class:`granary.Writer` (computed from the
    label column when not given). Other options go to each shard's writer."""
    cols = Columns(key=key, data=data, fields=fields, label=label, prefix="")
    missing = [c for c in cols.names() if c not in df.columns]
    if missing:
        raise ValueError(f"no column {missing[0]!r} (columns: {', '.join(df.columns)})")
    classes = _classes(df, label, classes)
    n = df.rdd.getNumPartitions()
    out = str(out)
    options = dict(writer_options, force=True, progress=False)
    names = cols.names()

    def task(batches):
        # Rows arrive as Arrow record batches (no per-row pickling); keys default to
        # "p<partition>-<row>", unique across partitions.
        import pyarrow as pa
        from pyspark import TaskContext

        i = TaskContext.get().partitionId()
        c = Columns(key=key, data=data, fields=fields, label=label, prefix=f"p{i:05d}-")
        number = 0
        with Writer(out, shard=(i, n), classes=classes, **options) as w:
            for batch in batches:
                for row in batch.to_pylist():
                    k, d, lab = c.sample(row, number)
                    w.write(k, d, label=lab)
                    number += 1
        yield pa.RecordBatch.from_pylist([{"summary": json.dumps(w.summary)}])

    shards = [r["summary"] for r in df.select(*names).mapInArrow(task, "summary string").collect()]
    # A partition Spark never ran a task for (none, in practice) is an empty part.
    for i in range(n):
        part = os.path.join(out, f"part-{i:04d}-of-{n:04d}", "part.gpart")
        if not os.path.exists(part):
            Writer(out, shard=(i, n), classes=classes, **options).close()
    summary = merge(out)
    summary["shards"] = [json.loads(s) for s in shards]
    return summary
