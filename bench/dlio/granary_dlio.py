"""granary's own reader inside DLIO (MLPerf Storage's benchmark), through DLIO's data-loader
plugin interface (``++workload.reader.data_loader_classname=granary_dlio.GranaryDataLoader``).

Each simulated accelerator (an MPI rank) reads its share of the packed dataset named by
``GRANARY_DLIO_DATASET`` with ``granary.IterableDataset`` (chunk-wise shuffle, every sample
CRC-checked) through a torch ``DataLoader`` with DLIO's ``read_threads`` workers. Per sample it
does what DLIO's own JPEG reader does after the bytes arrive: decode the JPEG with PIL into an
array, then hand on DLIO's fixed resized image; a batch is those images stacked, as DLIO's
torch loader collates them. Only where the bytes come from differs.

``GRANARY_DLIO_MEMORY`` (bytes) sets each worker's read budget (default: the library's).
"""

import io
import math
import os

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader

import granary
from dlio_benchmark.common.enumerations import DataLoaderType
from dlio_benchmark.data_loader.base_data_loader import BaseDataLoader
from dlio_benchmark.utils.config import ConfigArguments


class _Decode:
    """What DLIO's ImageReader does per sample: decode, keep the array, return the resized image."""

    def __init__(self):
        self.resized = None

    def __call__(self, data):
        np.asarray(Image.open(io.BytesIO(memoryview(data.numpy()))))
        if self.resized is None:
            self.resized = torch.from_numpy(ConfigArguments.get_instance().resized_image)
        return self.resized


def _stack(images):
    return torch.stack(images)


class GranaryDataLoader(BaseDataLoader):
    def __init__(self, format_type, dataset_type, epoch_number):
        super().__init__(format_type, dataset_type, epoch_number, DataLoaderType.CUSTOM)
        path = os.environ.get("GRANARY_DLIO_DATASET")
        if not path:
            raise RuntimeError("GRANARY_DLIO_DATASET must name the packed dataset "
                               "(granary pack DATA_FOLDER -o DATASET)")
        memory = os.environ.get("GRANARY_DLIO_MEMORY")
        self.dataset = granary.IterableDataset(
            path, seed=self._args.seed, rank=self._args.my_rank,
            world_size=self._args.comm_size, batch_size=self.batch_size,
            memory=None if not memory else int(memory),
            transform=_Decode(), collate=_stack,
        )
        self.loader = None

    def read(self):
        workers = self._args.read_threads
        kwargs = {}
        if workers > 0:
            kwargs = {"persistent_workers": True,
                      "prefetch_factor": max(1, math.ceil(self._args.prefetch_size / workers))
                      if self._args.prefetch_size > 0 else 2}
        self.dataset.set_epoch(self.epoch_number)
        self.loader = DataLoader(self.dataset, batch_size=None, num_workers=workers,
                                 pin_memory=True, **kwargs)

    def next(self):
        super().next()
        for batch in self.loader:
            yield batch["data"]
        self.epoch_number += 1
        self.dataset.set_epoch(self.epoch_number)

    def finalize(self):
        pass
