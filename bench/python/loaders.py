"""Python-side loader throughput: granary vs raw files, WebDataset, MosaicML Streaming, LitData.

Same data (an ImageFolder-style tree, e.g. from `granary bench gen`), same torch DataLoader
worker count, same batch size, every loader shuffling, every batch delivered to the training
loop as a list of per-sample payloads (what a loop that decodes samples one by one consumes);
no decoding: the loaders are measured, not JPEG decoding. Each loader as its documentation
recommends:

  raw          what torchvision's ImageFolder does without decoding: a map-style dataset of
               the files, DataLoader(shuffle=True, batch_size=B, num_workers=W), each file
               opened and read whole
  granary      granary.IterableDataset(ds, batch_size=B) in DataLoader(batch_size=None,
               num_workers=W): chunk-wise shuffle, each sample a uint8 tensor view: of the
               training process's own map of the chunk file when the worker read it from a
               map (warm, resident), else of the batch's buffer (the worker's shared-memory
               ring)
  granary-ring the same with zero_copy=False: every batch through the ring (a copy)
  granary-tensor  the same with batch_format="tensor" (one tensor and offsets per batch)
  granary-inproc  the per-sample batches iterated in the training process: the reader's own
               I/O and checksum threads instead of DataLoader worker processes
  webdataset   tar shards from wds.ShardWriter; wds.WebDataset(urls, shardshuffle=True)
               .shuffle(1000).to_tuple(...).batched(B) in wds.WebLoader(batch_size=None,
               num_workers=W)
  mds          streaming.MDSWriter shards; streaming.StreamingDataset(local=dir, shuffle=True,
               batch_size=B) in DataLoader(batch_size=B, num_workers=W)
  litdata      litdata.optimize(...) chunks; litdata.StreamingDataset(dir, shuffle=True) in
               litdata.StreamingDataLoader(batch_size=B, num_workers=W)
  floor        not a loader: DataLoader workers yielding per-sample views of one shared tensor
               (the tree's sizes, nothing read or copied): what DataLoader's hand-over of
               per-sample payloads costs alone, a ceiling for the per-sample rows

Every loader runs in a process of its own (its modules imported before the clock starts, its
peak memory measured: the training process's and its workers' largest resident set). The page
cache is dropped before its first epoch only (as root; otherwise the report says it was not):
epoch 1 is cold, the next ones warm. Conversions are timed too. Two ceilings for the same
bytes: the disk's (fio reading granary's chunk files sequentially with O_DIRECT, before and
after the loaders) and memory's (W threads reading the same files warm, sequentially, into one
buffer each: a copy out of the page cache and nothing else). Prints a table, granary's ratios
to the fastest other loader cold and warm, and the ceilings; --json writes the numbers.

  python bench/python/loaders.py --src TREE --work DIR [--workers 2] [--batch 64] [--epochs 3]
                                [--touch]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def list_tree(src):
    files = sorted(p for p in Path(src).rglob("*") if p.is_file())
    classes = sorted({p.parent.relative_to(src).as_posix() for p in files})
    index = {c: i for i, c in enumerate(classes)}
    return [(p, index[p.parent.relative_to(src).as_posix()]) for p in files]


def granary_cli():
    cli = os.environ.get("GRANARY_BIN") or shutil.which("granary")
    if not cli:
        sys.exit("the granary CLI is needed: cargo install --path . (or set GRANARY_BIN)")
    return cli


# -- conversions ------------------------------------------------------------------------

def convert_granary(src, files, out):
    subprocess.run([granary_cli(), "pack", str(src), "-o", str(out), "--force"], check=True,
                   capture_output=True)


def convert_webdataset(src, files, out):
    import webdataset as wds

    out.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(out / "shard-%06d.tar"), maxsize=256 << 20, verbose=0) as w:
        for i, (p, label) in enumerate(files):
            w.write({"__key__": f"{i:08d}", "bin": p.read_bytes(), "cls": str(label).encode()})


def convert_mds(src, files, out):
    from streaming import MDSWriter

    with MDSWriter(out=str(out), columns={"data": "bytes", "label": "int"}, size_limit=64 << 20) as w:
        for p, label in files:
            w.write({"data": p.read_bytes(), "label": label})


def _lit_item(item):
    path, label = item
    with open(path, "rb") as f:
        return {"data": f.read(), "label": label}


def convert_litdata(src, files, out):
    import litdata

    # Inputs carry the paths: newer LitData runs the function in spawned processes.
    litdata.optimize(fn=_lit_item, inputs=[(str(p), label) for p, label in files],
                     output_dir=str(out), chunk_bytes="64MB", num_workers=1)


# -- loaders --------------------------------------------------------------------------------

def collate_bytes(batch):
    # LitData hands out memoryviews of its chunks, which cannot cross from a DataLoader worker
    # (pickle refuses them): bytes, as a user would have to.
    return [b["data"] if isinstance(b["data"], bytes) else bytes(b["data"]) for b in batch]


class RawFiles:
    """ImageFolder without decoding: (bytes, label) of file i."""

    def __init__(self, files):
        self.files = [(str(p), label) for p, label in files]

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        path, label = self.files[i]
        with open(path, "rb") as f:
            return f.read(), label


def collate_raw(batch):
    return [b for b, _ in batch]


def load_raw(src, workers, batch, epoch):
    import torch
    from torch.utils.data import DataLoader

    g = torch.Generator()
    g.manual_seed(epoch)
    ds = RawFiles(list_tree(src))
    yield from sizes(DataLoader(ds, batch_size=batch, shuffle=True, generator=g,
                                num_workers=workers, collate_fn=collate_raw))


def _granary(out, batch, epoch, fmt, zero_copy=True):
    import granary

    ds = granary.IterableDataset(out, batch_size=batch, seed=1, batch_format=fmt,
                                 zero_copy=zero_copy)
    ds.set_epoch(epoch)
    return ds


def load_granary(out, workers, batch, epoch):
    from torch.utils.data import DataLoader

    ds = _granary(out, batch, epoch, "list")
    yield from sizes(b["data"] for b in DataLoader(ds, batch_size=None, num_workers=workers))


def load_granary_ring(out, workers, batch, epoch):
    from torch.utils.data import DataLoader

    ds = _granary(out, batch, epoch, "list", zero_copy=False)
    yield from sizes(b["data"] for b in DataLoader(ds, batch_size=None, num_workers=workers))


def load_granary_tensor(out, workers, batch, epoch):
    from torch.utils.data import DataLoader

    ds = _granary(out, batch, epoch, "tensor")
    for b in DataLoader(ds, batch_size=None, num_workers=workers):
        if TOUCH:
            touch(b["data"])
        yield len(b["offsets"]) - 1, int(b["offsets"][-1])


def load_granary_inproc(out, workers, batch, epoch):
    yield from sizes(b["data"] for b in _granary(out, batch, epoch, "list"))


_tree_sizes = {}


def load_floor(src, workers, batch, epoch):
    """No loader: each DataLoader worker yields batches of per-sample uint8 views (the tree's
    file sizes, in its share) of one shared-memory tensor allocated once, so nothing is read
    or copied per batch. What handing per-sample payloads from workers to the training process
    costs by itself (pickling, the queue, rebuilding each view): a ceiling for every loader
    measured here through DataLoader workers."""
    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    if src not in _tree_sizes:  # stat'ed once (the first epoch's time)
        _tree_sizes[src] = [p.stat().st_size for p, _ in list_tree(src)]
    all_sizes = _tree_sizes[src]

    class Floor(IterableDataset):
        def __iter__(self):
            info = get_worker_info()
            w, k = (info.id, info.num_workers) if info else (0, 1)
            mine = all_sizes[w::k]
            batches = [mine[i:i + batch] for i in range(0, len(mine), batch)]
            slab = torch.zeros(max(sum(b) for b in batches), dtype=torch.uint8).share_memory_()
            for b in batches:
                views, at = [], 0
                for n in b:
                    views.append(slab[at:at + n])
                    at += n
                yield {"data": views}

    yield from sizes(b["data"] for b in DataLoader(Floor(), batch_size=None, num_workers=workers))


TOUCH = False  # --touch: the loop reads one byte of every 4 KiB page of every sample


def touch(x):
    """Reads one byte per 4 KiB page of ``x`` (a tensor, array or bytes): what a decoder's
    first pass over the sample costs in page faults and cache misses, without the decode."""
    return sum(memoryview(x.numpy() if hasattr(x, "numpy") else x).cast("B")[::4096])


def sizes(batches):
    for b in batches:
        if TOUCH:
            for x in b:
                touch(x)
        yield len(b), sum(len(x) for x in b)


def load_webdataset(out, workers, batch, epoch):
    import webdataset as wds

    urls = sorted(str(p) for p in Path(out).glob("shard-*.tar"))
    ds = (wds.WebDataset(urls, shardshuffle=True, seed=epoch, empty_check=False)
          .shuffle(1000).to_tuple("bin", "cls").batched(batch, collation_fn=lambda s: [x[0] for x in s]))
    yield from sizes(wds.WebLoader(ds, batch_size=None, num_workers=workers))


def load_mds(out, workers, batch, epoch):
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader

    ds = StreamingDataset(local=str(out), shuffle=True, shuffle_seed=epoch + 1, batch_size=batch)
    yield from sizes(DataLoader(ds, batch_size=batch, num_workers=workers, collate_fn=collate_bytes))


def load_litdata(out, workers, batch, epoch):
    import litdata

    ds = litdata.StreamingDataset(str(out), shuffle=True, seed=epoch + 1)
    yield from sizes(litdata.StreamingDataLoader(ds, batch_size=batch, num_workers=workers,
                                                 collate_fn=collate_bytes))


# name: (converted directory under --work or None for the source tree, conversion, loader,
# modules to import before the clock starts; importing torch alone takes seconds of CPU)
LOADERS = {
    "raw": (None, None, load_raw, ["torch.utils.data"]),
    "granary": ("granary", convert_granary, load_granary, ["torch.utils.data", "granary"]),
    "granary-ring": ("granary", convert_granary, load_granary_ring, ["torch.utils.data", "granary"]),
    "granary-tensor": ("granary", convert_granary, load_granary_tensor, ["torch.utils.data", "granary"]),
    "granary-inproc": ("granary", convert_granary, load_granary_inproc, ["torch", "granary"]),
    "webdataset": ("webdataset", convert_webdataset, load_webdataset, ["torch.utils.data", "webdataset"]),
    "mds": ("mds", convert_mds, load_mds, ["torch.utils.data", "streaming"]),
    "litdata": ("litdata", convert_litdata, load_litdata, ["torch.utils.data", "litdata"]),
    "floor": (None, None, load_floor, ["torch.utils.data"]),
}


def disk_ceiling(packed):
    """What this disk delivers to one reader of the same bytes, cold: fio reading granary's
    chunk files sequentially with O_DIRECT, 4 MiB requests, io_uring, 8 in flight. Bytes/s, or
    None without fio."""
    if not shutil.which("fio") or not Path(packed).is_dir():
        return None
    drop_caches()
    r = subprocess.run(
        ["fio", "--name=ceiling", f"--opendir={packed}", "--rw=read", "--bs=4M", "--direct=1",
         "--ioengine=io_uring", "--iodepth=8", "--readonly", "--output-format=json"],
        check=True, capture_output=True, text=True)
    out = r.stdout[r.stdout.index("{"):]  # after fio's "opendir added N files"
    return json.loads(out)["jobs"][0]["read"]["bw_bytes"]


def memory_ceiling(packed, threads):
    """Bytes/s of `threads` threads copying granary's chunk files out of the page cache, each
    file read sequentially into a buffer of the reader's own (read once first to make it warm;
    best of 3)."""
    import concurrent.futures

    files = sorted(p for p in Path(packed).iterdir() if p.is_file())
    total = sum(p.stat().st_size for p in files)

    def read(part):
        buf = bytearray(8 << 20)
        for p in part:
            with open(p, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass

    best = 0.0
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for attempt in range(4):
            t = time.perf_counter()
            list(pool.map(read, [files[k::threads] for k in range(threads)]))
            dt = time.perf_counter() - t
            if attempt:
                best = max(best, total / dt)
    return best


def run_child(a):
    """One loader's epochs, in this process: prints one JSON line."""
    import importlib
    import resource

    global TOUCH
    TOUCH = a.touch
    dirname, _, load, modules = LOADERS[a.child]
    for m in modules:
        importlib.import_module(m)
    data = Path(a.src) if dirname is None else Path(a.work) / dirname
    runs = []
    for epoch in range(a.epochs):
        cold = drop_caches() if epoch == 0 else False
        t = time.perf_counter()
        n = nbytes = 0
        for k, m in load(data, a.workers, a.batch, epoch):
            n += k
            nbytes += m
        dt = time.perf_counter() - t
        runs.append({"samples": n, "bytes": nbytes, "seconds": dt, "samples_per_s": n / dt,
                     "cold": cold})
    # This process's high-water mark (VmHWM: ru_maxrss would include the parent's from before
    # exec), and the largest of its DataLoader workers (shared memory they touched included).
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps({"runs": runs, "peak_rss_mb": hwm / 1024, "worker_peak_rss_mb": workers / 1024}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", required=True, help="ImageFolder-style tree")
    ap.add_argument("--work", required=True, help="where the converted datasets go")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--only", default=",".join(LOADERS))
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--touch", action="store_true",
                    help="the training loop reads one byte of every 4 KiB page of every sample "
                         "(page faults and cache misses a decoder would meet), not only lengths")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return run_child(a)
    src, work = Path(a.src), Path(a.work)
    names = a.only.split(",")
    unknown = [n for n in names if n not in LOADERS]
    if unknown:
        sys.exit(f"unknown loader(s) {', '.join(unknown)}; choose from {', '.join(LOADERS)}")
    files = list_tree(src)
    total = sum(p.stat().st_size for p, _ in files)
    print(f"{len(files)} files, {total / 1e9:.2f} GB, {a.workers} workers, batches of {a.batch}, "
          f"{a.epochs} epochs (the first cold)", flush=True)
    conv_s = {}
    for name in names:
        dirname, convert, _, modules = LOADERS[name]
        if convert is None or (work / dirname).exists():
            continue
        import importlib

        for m in modules:
            importlib.import_module(m)
        drop_caches()
        t = time.perf_counter()
        convert(src, files, work / dirname)
        conv_s[dirname] = time.perf_counter() - t
    packed = work / "granary"
    ceilings = [disk_ceiling(packed)]
    results = []
    for name in names:
        args = [sys.executable, __file__, "--child", name, "--src", str(src), "--work", str(work),
                "--workers", str(a.workers), "--batch", str(a.batch), "--epochs", str(a.epochs)]
        if a.touch:
            args.append("--touch")
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"  {name}: failed\n{r.stderr[-2000:]}", file=sys.stderr)
            continue
        res = json.loads(r.stdout.strip().splitlines()[-1])
        runs = res["runs"]
        for run in runs:
            short = len(files) - run["samples"]
            if short and not (name.startswith("granary") and 0 < short < a.batch * a.workers):
                print(f"  warning: {name} delivered {run['samples']} of {len(files)} samples",
                      file=sys.stderr)
        dirname = LOADERS[name][0]
        res.update(loader=name, convert_s=conv_s.get(dirname),
                   cold_samples_per_s=runs[0]["samples_per_s"] if runs[0]["cold"] else None,
                   warm_samples_per_s=max((x["samples_per_s"] for x in runs[1:]), default=None))
        results.append(res)
        conv = (f"{len(files) / conv_s[dirname]:6.0f} files/s" if dirname in conv_s
                else "   (existing)  " if dirname else "        -       ")
        print(f"  {name:<15} convert {conv}  peak RSS {res['peak_rss_mb']:4.0f} + "
              f"{res['worker_peak_rss_mb']:4.0f} MB per worker  epochs " +
              "  ".join(f"{x['samples_per_s']:6.0f}/s{' cold' if x['cold'] else ' warm'}" for x in runs),
              flush=True)
    ceilings.append(disk_ceiling(packed))
    disk = [c for c in ceilings if c]
    mem = memory_ceiling(packed, a.workers) if packed.is_dir() else None
    mean_size = total / len(files)
    if disk:
        print("disk ceiling (fio, O_DIRECT 4 MiB reads, io_uring QD 8, cold; before and after): "
              + ", ".join(f"{c / 1e6:.0f} MB/s = {c / mean_size:.0f} samples/s" for c in disk))
    if mem:
        print(f"memory ceiling ({a.workers} threads copying the chunk files out of the page cache): "
              f"{mem / 1e6:.0f} MB/s = {mem / mean_size:.0f} samples/s")
    others = [r for r in results if not r["loader"].startswith("granary") and r["loader"] != "floor"]
    floor = next((r for r in results if r["loader"] == "floor" and r.get("warm_samples_per_s")), None)
    if floor:
        print(f"DataLoader floor (per-sample views of one shared tensor, nothing read or copied): "
              f"{floor['warm_samples_per_s']:.0f} samples/s")
        for g in (r for r in results if r["loader"].startswith("granary") and r.get("warm_samples_per_s")):
            print(f"warm: {g['loader']} / DataLoader floor: {g['warm_samples_per_s'] / floor['warm_samples_per_s']:.2f}x")
    for state in ("cold", "warm"):
        key = f"{state}_samples_per_s"
        rated = [r for r in others if r.get(key)]
        if not rated:
            continue
        fastest = max(rated, key=lambda r: r[key])
        for g in (r for r in results if r["loader"].startswith("granary") and r.get(key)):
            print(f"{state}: {g['loader']} / fastest other ({fastest['loader']}): "
                  f"{g[key] / fastest[key]:.2f}x")
    if a.json:
        Path(a.json).write_text(json.dumps({"results": results, "disk_ceiling_bytes_per_s": disk,
                                            "memory_ceiling_bytes_per_s": mem,
                                            "files": len(files), "bytes": total}, indent=2))


if __name__ == "__main__":
    main()
