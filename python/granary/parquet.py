"""``from_parquet``: a Parquet file (or several) to a granary dataset, read a batch of rows at a
time with pyarrow (install pyarrow: ``pip install granary[parquet]``)."""

import os

from ._rows import Columns
from .writer import Writer

__all__ = ["from_parquet"]


def _files(paths):
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = []
    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            out.extend(sorted(os.path.join(p, f) for f in os.listdir(p) if f.endswith(".parquet")))
        else:
            out.append(p)
    if not out:
        raise ValueError("no Parquet files given")
    return out


def from_parquet(paths, out, *, key=None, data=None, fields=None, label=None, batch_rows=1024,
                 **writer_options):
    """Writes the rows of Parquet ``paths`` (a file, a directory of ``*.parquet`` or a list) as
    the samples of a dataset at ``out`` (a directory or an object store URL).

    ``key``: the column of keys (str; None: the row number across the files, zero-padded).
    ``data``: a binary (or string) column, one blob per sample; or ``fields``: the columns that
    become named fields (a list: each named after its column; a dict: {field name: column}).
    Image structs (Hugging Face ``Image`` columns: ``{"bytes", "path"}``) give their bytes.
    ``label``: an int or string column. Other options go to :class:`granary.Writer`
    (``chunk_size``, ``compress``, ``resume``, ``force``, ...). Returns the writer's summary.
    Memory: one batch of ``batch_rows`` rows at a time, besides the writer's.
    """
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("from_parquet needs pyarrow: pip install pyarrow") from None
    cols = Columns(key=key, data=data, fields=fields, label=label)
    files = _files(paths)
    handles = []
    for f in files:
        pf = pq.ParquetFile(f)
        cols.check_arrow_schema(pf.schema_arrow, f)
        handles.append((f, pf))
    number = 0
    with Writer(out, **writer_options) as w:
        for f, pf in handles:
            for batch in pf.iter_batches(batch_size=batch_rows, columns=cols.names()):
                for row in batch.to_pylist():
                    k, d, lab = cols.sample(row, number)
                    w.write(k, d, label=lab)
                    number += 1
    return w.summary
