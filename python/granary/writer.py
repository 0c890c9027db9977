"""Writing datasets from Python: ``Writer`` and ``merge``.

``Writer(out)`` makes a granary dataset from samples a program holds (bytes, memoryviews,
numpy arrays), as ``granary pack`` makes one from files::

    with granary.Writer("train.granary") as w:
        for key, jpeg, label in source:        # in any order, e.g. sorted by class
            w.write(key, jpeg, label=label)    # label: None, an int or a class name

Samples are checksummed, compressed and spilled to local disk on the writer's threads (the GIL
is released); closing gathers them into chunks in a seeded order, so that chunks mix samples
from the whole stream even when the source is sorted by class, and publishes the dataset
atomically (to an object store: the snapshot last). If the program dies, ``Writer(out,
resume=True)`` continues: samples written before are skipped (``write`` returns False) and the
dataset is the same as an uninterrupted run would have made. ``Writer(out, shard=(i, n))``
writes one of n parts; ``merge(out)`` joins them.
"""

import json
import os
import sys

from . import _native, _types

# The library's defaults (one place: the Rust options' `new`), shown in the signatures below.
_W = _native.WRITER_DEFAULTS
_O = _W["output"]

__all__ = ["Writer", "from_webdataset", "merge"]


def _key(key):
    if isinstance(key, str):
        return key.encode("utf-8", "surrogateescape")
    if isinstance(key, (bytes, bytearray)):
        return bytes(key)
    raise TypeError(f"key must be str or bytes, not {type(key).__name__}")


def _data(data, key):
    if isinstance(data, bytes):
        return data
    if isinstance(data, (str, int, float, list, tuple)) or data is None:
        raise TypeError(
            f"sample {key!r}: data must be bytes-like (bytes, bytearray, memoryview, a numpy "
            f"array), not {type(data).__name__}"
        )
    try:
        view = memoryview(data)
    except TypeError:
        raise TypeError(
            f"sample {key!r}: data must be bytes-like (bytes, bytearray, memoryview, a numpy "
            f"array), not {type(data).__name__}"
        ) from None
    return view.tobytes()  # C order, whatever the item format or strides


def _label(label):
    if label is None:
        return None
    if isinstance(label, bool):
        raise TypeError("label must be None, an int or a class name, not bool")
    if isinstance(label, int):
        if not 0 <= label < 0xFFFFFFFF:
            raise ValueError(f"label {label} out of range")
        return label
    if hasattr(label, "__index__") and not isinstance(label, (str, bytes)):
        return _label(int(label.__index__()))  # numpy integers
    if isinstance(label, str):
        return label.encode("utf-8")
    if isinstance(label, bytes):
        return label
    raise TypeError(f"label must be None, an int or a class name, not {type(label).__name__}")


def _given(**options):
    """The options given (not None; paths as their text): the others keep the library's
    defaults."""
    return {k: os.fspath(v) if hasattr(v, "__fspath__") else v
            for k, v in options.items() if v is not None}


class Writer:
    """Writes a granary dataset from samples; see the module documentation.

    Arguments (keyword-only past ``out``): ``shard=(i, n)`` writes part i of n for
    :func:`merge`; ``classes`` is the class table (names; an int label indexes it, a name must
    be in it), required for a shard with labels; without it, int labels get the class names
    ``"0" .. str(max)`` and name labels the sorted names seen. ``compress`` ("auto", "none",
    "zstd", "zstd:LEVEL"), ``chunk_size`` (bytes), ``seed`` (of the mixing), ``resume``,
    ``force`` (replace an existing dataset or interrupted writer), ``progress`` (None: a tqdm
    bar when tqdm is installed and stderr is a terminal), ``staging`` (local directory for a
    URL destination), ``threads``, ``buckets`` (spill logs), ``memory`` (bytes of samples held
    in memory before the rest go to the spill logs; default a sixteenth of the machine's
    memory, at most 512 MiB), ``gather_memory`` (bytes of one spill log read at once when closing).

    ``expected`` (about how many samples will be written, e.g. ``len(dataset)``) lets samples go
    straight into chunks, each picked by a seeded hash of the key among as many as the expected
    bytes need (the first samples tell their mean size): still a uniform mix of a class-sorted
    stream, but written to disk once and while they come instead of through the spill logs, so
    closing is quick. A count far too low makes chunks larger (a warning says so); such a
    writer cannot be resumed (an interrupted one starts over).

    Fields are typed: each field's values keep their type through the dataset (see
    ``granary._types``): a numpy array is stored as ``ndarray:DTYPE:SHAPE`` and read back as an
    array of that type and shape, a ``str`` as text, a dict or list as JSON, an ``int`` as a
    64-bit integer, bytes as bytes. The first value of a field sets its type; ``schema``
    (``{name: descriptor}``) declares types instead, e.g. ``{"img": "npy"}`` for arrays of
    several shapes, ``{"jpg": "image:jpeg"}`` for encoded images.
    """

    def __init__(self, out, *, shard=None, classes=None, compress=_O["compress"],
                 chunk_size=_O["chunk_size"], seed=_O["seed"], resume=False, force=False,
                 progress=None, staging=None, threads=None, buckets=_W["buckets"],
                 gather_memory=_W["gather_memory"], chunk_files=_O["chunk_files"], memory=None,
                 schema=None, expected=None):
        out = str(out)
        if schema is not None:
            schema = {str(k): str(v) for k, v in dict(schema).items()}
        if shard is not None:
            i, n = shard
            shard = (int(i), int(n))
        if classes is not None:
            classes = [c.encode("utf-8") if isinstance(c, str) else bytes(c) for c in classes]
        if progress is None:
            progress = sys.stderr.isatty()
        self._bar = None
        if progress:
            try:
                from tqdm import tqdm

                self._bar = tqdm(desc=f"writing {out}", unit=" samples")
            except ImportError:
                self._bar = None
        self.out = out
        self.summary = None
        options = dict(
            output=_given(shard=shard, compress=compress, chunk_size=int(chunk_size),
                          chunk_files=int(chunk_files), seed=int(seed), resume=bool(resume),
                          force=bool(force), progress=bool(progress), staging=staging),
            **_given(classes=classes, buckets=int(buckets), gather_memory=int(gather_memory),
                     memory=None if memory is None else int(memory),
                     threads=None if threads is None else max(1, int(threads)), schema=schema,
                     expected=None if expected is None else int(expected)))
        self._w = _native.Writer(out, options)
        # Each field's type: declared, or set by its first value (a resumed writer's kept).
        self._types = dict(self._w.field_types)
        for w in self._w.warnings:
            print(f"granary: {w}", file=sys.stderr)

    def write(self, key, data, label=None):
        """Adds one sample under ``key`` (a relative path: ``/`` separates directories).
        ``data`` is bytes-like, or a dict of named fields (``{"jpg": ..., "txt": ...}``: names
        are file-name extensions; the key's last component then holds no ``.``; a dataset's
        samples all have fields or none do), whose values may be bytes-like, ``str``, ``int``,
        JSON-able (dict, list, float, bool, None) or numpy arrays (see the class
        documentation). Returns True if it was written, False if an interrupted writer had it
        already (resume).
        """
        k = _key(key)
        if isinstance(data, dict):
            if not data:
                raise ValueError(f"sample {key!r} has no fields")
            fields = []
            for name, value in data.items():
                if not isinstance(name, str):
                    raise TypeError(f"sample {key!r}: field names are str, not {type(name).__name__}")
                fields.append((name.encode("ascii", "replace"),
                               self._typed(name, value, f"sample {key!r}, field {name!r}")))
            new = self._w.write_fields(k, fields, _label(label))
        else:
            new = self._w.write(k, _data(data, key), _label(label))
        if self._bar is not None:
            self._bar.update(1)
        return new

    def _typed(self, name, value, what):
        """The bytes of field ``name``'s ``value``, its type declared on first sight."""
        t = self._types.get(name)
        if t is None:
            t = _types.infer(value, what)
            self._w.declare_field_type(name.encode("ascii", "replace"), t)
            self._types[name] = t
        elif t == "bytes":
            return _data(value, what)
        return _types.encode(value, t, what)

    def has_resumed(self, key):
        """True if an interrupted writer had ``key``: its bytes need not be produced again."""
        return self._w.has_resumed(_key(key))

    def __len__(self):
        return len(self._w)

    @property
    def resumed(self):
        """Samples skipped because an interrupted writer had them."""
        return self._w.resumed

    @property
    def closed(self):
        return self._w.closed

    def close(self):
        """Gathers the samples into chunks and publishes the dataset; returns the summary
        (a dict). A second call raises ValueError."""
        try:
            self.summary = json.loads(self._w.finish())
        finally:
            if self._bar is not None:
                self._bar.close()
                self._bar = None
        return self.summary

    def abort(self):
        """Stops without publishing; what was written stays for ``resume``."""
        self._w.abort()
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._w.closed:
            return False
        if exc_type is None:
            self.close()
        else:
            self.abort()  # an error in the caller's loop: keep the work for resume
        return False


def merge(out):
    """Joins the parts written by ``Writer(out, shard=(i, n))`` (or ``granary pack --shard``)
    into one dataset; returns the summary (a dict)."""
    return json.loads(_native.merge(str(out)))


def from_webdataset(shards, out, *, compress=_O["compress"], chunk_size=_O["chunk_size"],
                    seed=_O["seed"], resume=False, force=False, progress=None, staging=None):
    """Imports WebDataset tar shards (``shards``: a path, URL or brace pattern such as
    ``"shards/{000000..000123}.tar"``, or a list of them) into a dataset at ``out``, as
    ``granary pack --from webdataset`` does: each key's members become one sample with named
    fields, labelled by its ``.cls`` member. Returns the summary (a dict)."""
    if isinstance(shards, (str, bytes)) or hasattr(shards, "__fspath__"):
        shards = [shards]
    shards = [str(s) for s in shards]
    if progress is None:
        progress = sys.stderr.isatty()
    output = _given(compress=compress, chunk_size=int(chunk_size), seed=int(seed),
                    resume=bool(resume),
                    force=bool(force), progress=bool(progress), staging=staging)
    return json.loads(_native.import_webdataset(shards, str(out), dict(output=output)))
