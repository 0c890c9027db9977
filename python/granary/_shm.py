"""Batches that cross from DataLoader workers to the training process in reused shared memory.

A worker gathers each batch's bytes into a segment of its ring: shared memory (``memfd``) that
it keeps and reuses, so once the ring is warm a batch costs no allocation, no page faults and
no file descriptor. What crosses the DataLoader's queue is a small record (ring, segment,
offsets, ids, labels); the training process maps each segment once and hands out per-sample
views of it.

Ownership is one byte per segment in a shared control page: the worker sets it when it sends
a batch; the training process clears it when the last view of that batch is gone (a weak
reference on the array every view is made from); only then does the worker write there again.
A segment's descriptor travels with its batches (``multiprocessing``'s ``DupFd``, as torch
sends tensors) until the training process acknowledges it in the control page, so a batch
that never arrives costs nothing but a retry. Rings are per process: a forked child makes its
own. When every segment is taken (the training loop keeps more batches than the ring has
slots), the batch is pickled instead, a copy but never wrong.

When every sample of a batch lies in a chunk file the reader keeps mapped (a resident local
dataset, warm), even the ring is skipped: the record says which file, where and how long, and
the training process maps those files itself (privately, guarded against truncation, checked
to be the same files by device and inode) and hands out views of them (``attach_files``). The
worker checked the samples' CRC-32 over those very page-cache pages; the bytes are copied by
nobody. Each batch has maps of its own (a loop that writes into a sample changes its private
copy of the page, which no later batch sees), gone with its last view; past ``_MAX_LIVE`` maps
alive the samples are copied out of a map made for that batch alone. A file cut short under
them is an error at the next batch.
"""

import mmap
import os
import struct
import weakref
from multiprocessing import reduction

import numpy as np

SLOTS = 64  # segments per ring
_ACK_CTL = SLOTS  # byte: the training process has mapped the control page
_ACK_SEG = SLOTS + 8  # u64 per slot: serial of the segment the training process has mapped
_CTL_BYTES = _ACK_SEG + 8 * SLOTS
_MIN_SEGMENT = 4 << 20
_GRAIN = 1 << 20


class _Segment:
    __slots__ = ("fd", "mm", "size", "serial")

    def __init__(self, size, serial):
        self.fd = os.memfd_create(f"granary-batch-{serial}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            self.mm = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise
        self.size = size
        self.serial = serial

    def close(self):
        try:
            self.mm.close()
        except BufferError:  # a view is still alive in this process: it goes with the view
            pass
        os.close(self.fd)


class Ring:
    """The worker side: segments to gather batches into, and the records that carry them."""

    def __init__(self):
        self.pid = os.getpid()
        self.token = os.urandom(8).hex()
        self.ctl_fd = os.memfd_create("granary-ring", os.MFD_CLOEXEC)
        os.ftruncate(self.ctl_fd, _CTL_BYTES)
        self.ctl = mmap.mmap(self.ctl_fd, _CTL_BYTES)
        self.segs = []
        self.serial = 0

    def acquire(self, nbytes):
        """A free segment of at least ``nbytes``, marked taken: its slot, or None when every
        slot is taken."""
        free = [i for i, s in enumerate(self.segs) if not self.ctl[i]]
        fits = [i for i in free if self.segs[i].size >= nbytes]
        if fits:
            slot = fits[0]
        elif free or len(self.segs) < SLOTS:
            if free:
                slot = free[0]
                self.segs[slot].close()
            else:
                slot = len(self.segs)
                self.segs.append(None)
            self.serial += 1
            # Room for batches a little larger than this one, so sizes that wander reuse it.
            size = max(_MIN_SEGMENT, -(-(nbytes + nbytes // 4) // _GRAIN) * _GRAIN)
            self.segs[slot] = _Segment(size, self.serial)
        else:
            return None
        self.ctl[slot] = 1
        return slot

    def release(self, slot):
        """Gives back a slot whose batch will not be sent."""
        self.ctl[slot] = 0

    def array(self, slot, nbytes):
        return np.frombuffer(self.segs[slot].mm, np.uint8, count=nbytes)

    def record(self, slot, nbytes, offsets, ids, labels, weights, packed, layouts=None,
               sources=None):
        seg = self.segs[slot]
        ctl_fd = None if self.ctl[_ACK_CTL] else reduction.DupFd(self.ctl_fd)
        (acked,) = struct.unpack_from("<Q", self.ctl, _ACK_SEG + 8 * slot)
        seg_fd = None if acked == seg.serial else reduction.DupFd(seg.fd)
        args = (self.token, self.pid, ctl_fd, slot, seg.serial, seg_fd, seg.size, nbytes,
                offsets, ids, labels, weights, packed, layouts, sources)
        return Batch(_attach, args, lambda: assemble(self.array(slot, nbytes), offsets, ids,
                                                     labels, weights, packed, layouts, sources))


_ring = None


def ring():
    """This process's ring (a new one in a forked child)."""
    global _ring
    if _ring is None or _ring.pid != os.getpid():
        _ring = Ring()
    return _ring


class Batch:
    """A batch as a DataLoader worker sends it: it pickles as ``fn`` and its arguments (a
    small record of a ring segment for ``_attach``, or the bytes themselves for ``assemble``)
    and unpickles, in the training process, as the batch's dict. Not a mapping, so that
    DataLoader's ``default_convert`` passes it through untouched; a dataset that wraps
    granary's inside the worker can still read it like the dict (``b["id"]``, ``b.keys()``),
    but not change it: build a new dict for that."""

    __slots__ = ("fn", "args", "local", "_dict")

    def __init__(self, fn, args, local):
        self.fn = fn
        self.args = args
        self.local = local  # () -> the batch's dict in this process
        self._dict = None

    def __reduce__(self):
        return (self.fn, self.args)

    def _d(self):
        if self._dict is None:
            self._dict = self.local()
        return self._dict

    def __getitem__(self, key):
        return self._d()[key]

    def __contains__(self, key):
        return key in self._d()

    def __iter__(self):
        return iter(self._d())

    def __len__(self):
        return len(self._d())

    def keys(self):
        return self._d().keys()

    def values(self):
        return self._d().values()

    def items(self):
        return self._d().items()

    def get(self, key, default=None):
        return self._d().get(key, default)

    def __repr__(self):
        return f"<granary batch for the training process ({self.fn.__name__})>"


def _extended(fn, args, extra):
    d = fn(*args)
    d.update(extra)
    return d


def with_extra(item, extra):
    """``item`` (a batch dict or a ``Batch`` record) with the keys of ``extra`` added, as it
    crosses to the training process."""
    if isinstance(item, Batch):
        local = item.local
        return Batch(_extended, (item.fn, item.args, extra), lambda: {**local(), **extra})
    item.update(extra)
    return item


# -- the training process's side --------------------------------------------------------------


class _Attached:
    __slots__ = ("pid", "ctl", "segs")

    def __init__(self, pid, ctl):
        self.pid = pid
        self.ctl = ctl
        self.segs = {}  # slot -> (serial, mmap)


_attached = {}  # ring token -> _Attached
_MAX_RINGS = 64


def _map(dupfd, size):
    fd = dupfd.detach()
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _release(ctl, slot):
    try:
        ctl[slot] = 0
    except ValueError:  # the control page is gone (interpreter shutdown)
        pass


def _attach(token, pid, ctl_fd, slot, serial, seg_fd, size, nbytes, offsets, ids, labels,
            weights, packed, layouts=None, sources=None):
    r = _attached.get(token)
    if r is None:
        if ctl_fd is None:
            raise RuntimeError(
                f"granary: a batch from DataLoader worker pid {pid} refers to shared memory "
                "this process never received")
        # New workers: forget the rings of workers that have exited, and bound the rest.
        for t in [t for t, a in _attached.items() if not _alive(a.pid)]:
            del _attached[t]
        while len(_attached) >= _MAX_RINGS:
            del _attached[next(iter(_attached))]
        r = _attached[token] = _Attached(pid, _map(ctl_fd, _CTL_BYTES))
        r.ctl[_ACK_CTL] = 1
    elif ctl_fd is not None:
        os.close(ctl_fd.detach())  # sent again before our acknowledgement arrived
    have = r.segs.get(slot)
    if seg_fd is not None:
        if have is None or have[0] != serial:
            have = r.segs[slot] = (serial, _map(seg_fd, size))
            struct.pack_into("<Q", r.ctl, _ACK_SEG + 8 * slot, serial)
        else:
            os.close(seg_fd.detach())
    if have is None or have[0] != serial:
        raise RuntimeError(
            f"granary: a batch from DataLoader worker pid {pid} refers to segment {slot} "
            f"generation {serial}, which this process never received")
    arr = np.frombuffer(have[1], np.uint8, count=nbytes)
    # Every view below is made from `arr`: the slot is free again once the last one is gone.
    weakref.finalize(arr, _release, r.ctl, slot).atexit = False
    return assemble(arr, offsets, ids, labels, weights, packed, layouts, sources)


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def assemble(arr, offsets, ids, labels, weights, packed, layouts=None, sources=None):
    """The batch dict from a uint8 array of the samples back to back: per-sample views (uint8
    tensors with torch, numpy arrays without) or, ``packed``, the array and the offsets; ids
    and labels as int64 tensors (numpy arrays without torch); of a mixture, ``"source"``."""
    torch = _torch()
    if torch is not None:
        data = torch.from_numpy(arr)
        if not packed:
            data = list(torch.split(data, np.diff(offsets).tolist()))
    elif not packed:
        data = np.split(arr, offsets[1:-1])
    else:
        data = arr
    return _item(torch, data, offsets, ids, labels, weights, packed, layouts, sources)


def _item(torch, data, offsets, ids, labels, weights, packed, layouts, sources):
    """The batch dict around ``data`` (per-sample views, or the packed array)."""
    if torch is not None:
        offsets = torch.from_numpy(offsets)
        ids, labels = torch.from_numpy(ids), torch.from_numpy(labels)
        if weights is not None:
            weights = torch.from_numpy(weights)
        if sources is not None:
            sources = torch.from_numpy(sources)
    item = {"id": ids, "label": labels, "data": data}
    if layouts is not None:
        # {field name: [each sample's value (bytes fields: a view of its bytes), or None]};
        # a fixed-shape array field stacked.
        from . import _types

        views = data if not packed else [data[int(offsets[j]):int(offsets[j + 1])]
                                         for j in range(len(layouts))]
        item["fields"] = _types.batch_fields(views, layouts)
    if packed:
        item["offsets"] = offsets
    if weights is not None:
        item["weight"] = weights
    if sources is not None:
        item["source"] = sources
    return item


# -- batches as places in mapped chunk files ----------------------------------------------------

# Maps are made per batch, never kept for the next one: a training loop that writes into a
# sample's tensor changes its own private copy of that page, which a later batch must not see.
_live = [0]  # maps alive in this process (their views are): bounded by _MAX_LIVE
_MAX_LIVE = 2048  # past it (the loop keeps that many batches), batches are copied
_in_use = []  # the FileMaps of the last batch handed out: checked again at the next one


def _unmapped():
    _live[0] -= 1


def _map_file(path, dev, ino, torch):
    """(FileMap, the whole file as a tensor or array, whether it stays mapped): past
    ``_MAX_LIVE`` maps alive the map is only for copying the batch's samples out of."""
    from ._native import map_file

    arr, fm = map_file(path, dev, ino)
    if _live[0] >= _MAX_LIVE:
        return fm, arr, False
    _live[0] += 1
    weakref.finalize(arr, _unmapped).atexit = False
    return fm, torch.from_numpy(arr) if torch is not None else arr, True


def _slices(base, starts, lens, torch):
    """Views of ``base`` at ``starts`` / ``lens`` (sorted by start): one split of the range
    they span, gaps included, unless two overlap (a sample drawn twice)."""
    ends = starts + lens
    gaps = starts[1:] - ends[:-1]
    if len(starts) > 1 and (gaps < 0).any():
        return [base[int(a):int(b)] for a, b in zip(starts, ends)]
    sizes = np.empty(2 * len(starts) - 1, np.int64)
    sizes[0::2] = lens
    sizes[1::2] = gaps
    span = base[int(starts[0]):int(ends[-1])]
    if torch is not None:
        pieces = torch.split(span, sizes.tolist())
    else:
        pieces = np.split(span, np.cumsum(sizes)[:-1])
    return pieces[0::2]


def attach_files(files, which, starts, offsets, ids, labels, weights, packed, layouts=None,
                 sources=None):
    """The batch dict of a record of places in chunk files (``worker_batches``), as views of
    this process's own maps of those files."""
    global _in_use
    for fm in _in_use:  # a file cut short while the previous batch was read
        fm.check()
    torch = _torch()
    lens = np.diff(offsets)
    data = [None] * len(ids)
    maps = []
    for k, (path, dev, ino) in enumerate(files):
        js = np.flatnonzero(which == k) if len(files) > 1 else np.arange(len(ids))
        js = js[np.argsort(starts[js], kind="stable")]
        fm, base, kept = _map_file(path, dev, ino, torch)
        end = int((starts[js] + lens[js]).max()) if len(js) else 0
        if end > len(base):
            from ._native import DamagedError

            raise DamagedError(
                f"{path}: cut short to {len(base)} bytes since a DataLoader worker read "
                f"samples up to byte {end} of it (ids {ids[js].tolist()[:8]})"
            )
        views = _slices(base, starts[js], lens[js], torch if kept else None)
        if kept:
            maps.append(fm)
        else:  # copied out, then checked: the map goes with this function
            views = [np.array(v) for v in views]
            if torch is not None:
                views = [torch.from_numpy(v) for v in views]
            fm.check()
        for j, view in zip(js.tolist(), views):
            data[j] = view
    _in_use = maps
    for fm in maps:
        fm.check()
    return _item(torch, data, offsets, ids, labels, weights, packed, layouts, sources)


def worker_batches(stream, n, packed, weighted, layouts=None, wanted=None, mixture=False,
                   zero_copy=False):
    """(samples, record) per batch of ``stream``, gathered into this worker's ring, or, with
    ``zero_copy`` and every sample in a mapped chunk file, as places in those files."""
    r = ring()
    taken = []

    def alloc(nbytes):
        slot = r.acquire(nbytes)
        taken.append(slot)
        return np.empty(nbytes, np.uint8) if slot is None else r.array(slot, nbytes)

    while True:
        taken.clear()
        refs = None
        try:
            if zero_copy:
                batch = stream.next_batch_refs(n, alloc)
                if batch is not None:
                    *batch, refs = batch
            else:
                batch = stream.next_batch_into(n, alloc)
        except BaseException:
            for slot in taken:
                if slot is not None:
                    r.release(slot)
            raise
        if batch is None:
            return
        ids, labels, arr, offsets, weights, sources = batch
        lay = None
        if layouts is not None:
            lay = layouts([int(i) for i in ids], sources)
        ids = np.asarray(ids, np.int64)
        labels = np.asarray(labels, np.int64)
        weights = np.asarray(weights, np.float32) if weighted else None
        sources = np.asarray(sources, np.int64) if mixture else None
        if layouts is not None:
            if wanted is not None:
                lay = [[f for f in s if f[0] in wanted] for s in lay]
        if refs is not None:  # nothing copied: the training process maps the files
            files, which, starts = refs
            args = (files, np.asarray(which, np.int32), np.asarray(starts, np.int64), offsets,
                    ids, labels, weights, packed, lay, sources)
            yield len(ids), Batch(attach_files, args, lambda a=args: attach_files(*a))
            continue
        slot = taken[0]
        if slot is None:  # every slot is taken: the bytes are pickled, a copy
            args = (arr, offsets, ids, labels, weights, packed, lay, sources)
            yield len(ids), Batch(assemble, args, lambda a=args: assemble(*a))
        else:
            del arr  # the segment may be replaced later: nothing here keeps a view of it
            yield len(ids), r.record(slot, int(offsets[-1]), offsets, ids, labels, weights, packed,
                                     lay, sources)
