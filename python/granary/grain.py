"""A granary dataset (or view) as a Grain random-access data source, for JAX training.

``granary.grain.DataSource("train.granary")`` has what Grain's ``RandomAccessDataSource``
protocol asks: ``len(src)``, ``src[i]`` (the i-th sample: a dict of ``"id"``, ``"label"`` and
``"data"``, the CRC-checked bytes as a numpy uint8 array; a sample with named fields gives its
fields, decoded by their types, instead of ``"data"``), a ``repr`` that names the dataset, its
id and its size (what Grain's checkpoints record), and pickling as configuration only (each
Grain worker process opens the dataset itself). Grain's samplers, sharding, transformations
and checkpointing (``DataLoader`` iterators' ``get_state`` / ``set_state``) then work as with
any source: ``grain.DataLoader(data_source=src, sampler=grain.samplers.IndexSampler(len(src),
shuffle=True, seed=0), operations=[Decode(), grain.transforms.Batch(64)])``, where
``Decode`` is the ``grain.transforms.Map`` that turns each sample's bytes into an array of one
shape (Grain's ``Batch`` stacks arrays: samples of different lengths, such as encoded images,
cannot be batched as they are).

Grain reads record by record in its sampler's order: each sample is one local lookup and one
read (``Dataset``'s path). For chunk-wise epochs with large sequential reads, use
``IterableDataset`` (PyTorch) or ``granary read``.
"""

from ._dataset import Dataset

try:  # numpy comes with Grain and JAX
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None


class DataSource:
    """A granary dataset or view as a Grain ``RandomAccessDataSource`` (see the module)."""

    def __init__(self, path, fields=None, raw=False, images="bytes"):
        self._ds = Dataset(path, fields=fields, raw=raw, images=images)
        native = self._ds._native()
        self.path = self._ds.root
        self.dataset_id = native.dataset_id
        self._len = len(self._ds)

    def __len__(self):
        return self._len

    def __getitem__(self, record_key):
        i = int(record_key)
        if not 0 <= i < self._len:
            raise IndexError(f"record {i} out of range ({self._len} samples)")
        data, label = self._ds[i]
        item = {"id": self._ds._native().id_at(i), "label": label}
        if isinstance(data, dict):
            item.update(data)
        elif _np is not None:
            item["data"] = _np.frombuffer(data, dtype=_np.uint8)
        else:
            item["data"] = data
        return item

    def __repr__(self):
        return (f"granary.grain.DataSource(path={self.path!r}, dataset_id={self.dataset_id}, "
                f"samples={self._len})")
