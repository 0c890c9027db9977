"""``Dataset``: a packed dataset by index, for ``DataLoader`` with any sampler."""

import os

from . import _types
from ._iterable import _field_list, _index
from ._native import Dataset as _NativeDataset
from ._torch import _MapBase


class Dataset(_MapBase):
    """Map-style access to a packed dataset: ``len(ds)``, ``ds[i] -> (data, label)``.

    ``data`` is ``bytes`` (read-only, buffer protocol), CRC-checked; raw records are read
    straight into it. ``transform``, if given, is applied to it (``ds[i] -> (transform(data),
    label)``), in the DataLoader worker that reads it, as torchvision's datasets do.
    ``ds.lookup(path)``, ``ds.path(i)`` and ``ds.classes`` use the snapshot only (no I/O).

    A sample with named fields is ``{name: value}``, each value decoded by its field's type
    (an array, a str, a JSON value, an int, bytes: see ``granary._types``); ``raw=True`` gives
    every field's stored bytes instead. ``fields`` reads only the fields named. Image fields
    are their encoded bytes, or with ``images="pil"`` decoded PIL images (PIL needed then).

    ``path`` may be a view file (``granary view``): ``ds[i]`` is then the view's i-th sample,
    ``len(ds)`` the view's size, and ``lookup`` finds only the view's samples.
    """

    def __init__(self, path, transform=None, fields=None, raw=False, images="bytes"):
        if transform is not None and not callable(transform):
            raise ValueError("transform must be callable")
        self.root = os.fspath(path)
        self.transform = transform
        self.fields = _field_list(fields)
        self.raw = bool(raw)
        self.images = _types.check_images(images)
        self._ds = None
        self._types = None
        self._pinned = None
        native = self._native()  # fail early on a bad path
        # Indexes are positions in this generation's samples: a copy (a DataLoader worker)
        # must read the same generation, or every index could name another sample.
        self._pinned = native.identity["snapshot"]
        if self.fields is not None and not native.has_fields:
            raise ValueError(f"{self.root}: the samples have no named fields to choose from")

    def _native(self):
        if self._ds is None:
            ds = _NativeDataset(self.root)
            pinned = getattr(self, "_pinned", None)
            now = ds.identity
            if pinned is not None and now["snapshot"] != pinned:
                raise RuntimeError(
                    f"{self.root} changed since this Dataset was made (now generation "
                    f"{now['generation']}, content {now['snapshot']}, not {pinned}): its indexes "
                    "would name other samples; make the Dataset again")
            self._ds = ds
        return self._ds

    def __len__(self):
        return self._native().selected()

    def __getitem__(self, i):
        n = len(self)
        i = _index(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample {i} out of range ({n} samples)")
        native = self._native()
        i = native.id_at(i)
        if native.has_fields:
            fields, label = native.read_fields(i, self.fields)
            data = dict(fields)
            if not self.raw:
                if self._types is None:
                    self._types = {n: _types.asked(t, images=self.images)
                                   for n, t in native.field_types().items()}
                data = _types.decode_fields(data, self._types)
        else:
            data, label = native.read(i)
        if self.transform is not None:
            data = self.transform(data)
        return data, label

    @property
    def field_names(self):
        """The names of the samples' fields, sorted; empty without fields."""
        return self._native().field_names()

    def lookup(self, path):
        """Index of the sample stored under ``path`` (str or bytes), or None."""
        native = self._native()
        id = native.lookup(os.fsencode(path))
        return None if id is None else native.position_of(id)

    def path(self, i):
        """The stored path of sample ``i`` (undecodable bytes kept as surrogate escapes)."""
        native = self._native()
        return os.fsdecode(native.path(native.id_at(_index(i))))

    @property
    def classes(self):
        """Class names, indexed by label."""
        return [os.fsdecode(c) for c in self._native().classes()]

    @property
    def dataset_id(self):
        return self._native().dataset_id

    @property
    def field_types(self):
        """Each field's type descriptor (``{name: descriptor}``); empty without fields."""
        return self._native().field_types()

    def __getstate__(self):
        return {"root": self.root, "transform": self.transform, "fields": self.fields,
                "raw": self.raw, "images": self.images, "pinned": self._pinned}

    def __setstate__(self, state):
        self.root = state["root"]
        self.transform = state.get("transform")
        self.fields = state.get("fields")
        self.raw = state.get("raw", False)
        self.images = state.get("images", "bytes")
        self._pinned = state.get("pinned")
        self._ds = None
        self._types = None

    def __repr__(self):
        return f"granary.Dataset({self.root!r})"
