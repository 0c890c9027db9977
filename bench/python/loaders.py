"""Python-side loader throughput: granary vs WebDataset, MosaicML Streaming (MDS) and LitData.

Same data (an ImageFolder-style tree, e.g. from `granary bench gen`), same torch DataLoader
worker count, same batch size, every loader shuffling, every batch delivered to the training
loop with the raw bytes of its samples (a list of bytes, or for granary one uint8 tensor with
offsets); no decoding: the loaders are measured, not JPEG decoding.
Each loader is used as its documentation recommends:

  granary      granary.IterableDataset(ds, batch_size=B, batch_format="tensor") in
               DataLoader(batch_size=None, num_workers=W) (chunk-wise shuffle)
  granary-inproc  the same dataset iterated in the training process: the reader's own I/O and
               checksum threads instead of DataLoader worker processes
  webdataset   tar shards from wds.ShardWriter; wds.WebDataset(urls, shardshuffle=True)
               .shuffle(1000).to_tuple(...).batched(B) in wds.WebLoader(batch_size=None,
               num_workers=W)
  mds          streaming.MDSWriter shards; streaming.StreamingDataset(local=dir, shuffle=True,
               batch_size=B) in DataLoader(batch_size=B, num_workers=W)
  litdata      litdata.optimize(...) chunks; litdata.StreamingDataset(dir, shuffle=True) in
               litdata.StreamingDataLoader(batch_size=B, num_workers=W)

Before every epoch the page cache is dropped (as root; otherwise the numbers are warm and the
report says so). Conversions are timed too; every loader's modules are imported before the
first epoch is timed. The disk's ceiling for the same bytes is measured with fio (when it is
installed) before and after the loaders. Prints a table, the ratio of granary to the fastest
other loader and to the disk ceiling; --json writes the numbers.

  python bench/python/loaders.py --src TREE --work DIR [--workers 2] [--batch 64] [--epochs 2]
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


_FILES = None


def _lit_item(i):
    p, label = _FILES[i]
    return {"data": p.read_bytes(), "label": label}


def convert_litdata(src, files, out):
    import litdata

    global _FILES
    _FILES = files
    litdata.optimize(fn=_lit_item, inputs=list(range(len(files))), output_dir=str(out),
                     chunk_bytes="64MB", num_workers=1)


# -- loaders --------------------------------------------------------------------------------

def collate_bytes(batch):
    return [b["data"] for b in batch]


def load_granary(out, workers, batch, epoch):
    import granary
    from torch.utils.data import DataLoader

    ds = granary.IterableDataset(out, batch_size=batch, seed=1, batch_format="tensor")
    ds.set_epoch(epoch)
    for b in DataLoader(ds, batch_size=None, num_workers=workers):
        yield len(b["offsets"]) - 1, int(b["offsets"][-1])


def load_granary_inproc(out, workers, batch, epoch):
    """granary's reader in the training process (its own I/O and checksum threads, no
    DataLoader worker processes)."""
    import granary

    ds = granary.IterableDataset(out, batch_size=batch, seed=1, batch_format="tensor")
    ds.set_epoch(epoch)
    for b in ds:
        yield len(b["offsets"]) - 1, int(b["offsets"][-1])


def sizes(batches):
    for b in batches:
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


LOADERS = {
    "granary": (convert_granary, load_granary),
    "granary-inproc": (None, load_granary_inproc),
    "webdataset": (convert_webdataset, load_webdataset),
    "mds": (convert_mds, load_mds),
    "litdata": (convert_litdata, load_litdata),
}
# What each loader imports: imported before any epoch is timed (importing torch alone takes
# seconds of CPU, which would otherwise land in the first loader's first epoch).
MODULES = {
    "granary": ["torch.utils.data", "granary"],
    "granary-inproc": ["granary"],
    "webdataset": ["torch.utils.data", "webdataset"],
    "mds": ["torch.utils.data", "streaming"],
    "litdata": ["litdata"],
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", required=True, help="ImageFolder-style tree")
    ap.add_argument("--work", required=True, help="where the converted datasets go")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--only", default=",".join(LOADERS))
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    src, work = Path(a.src), Path(a.work)
    names = a.only.split(",")
    unknown = [n for n in names if n not in LOADERS]
    if unknown:
        sys.exit(f"unknown loader(s) {', '.join(unknown)}; choose from {', '.join(LOADERS)}")
    files = list_tree(src)
    total = sum(p.stat().st_size for p, _ in files)
    print(f"{len(files)} files, {total / 1e9:.2f} GB, {a.workers} workers, batches of {a.batch}")
    import importlib

    for name in names:
        for m in MODULES[name]:
            importlib.import_module(m)
    conv_s = {}
    for name in names:
        convert, _ = LOADERS[name]
        out = work / name.split("-")[0]
        if convert is not None and not out.exists():
            drop_caches()
            t = time.perf_counter()
            convert(src, files, out)
            conv_s[name] = time.perf_counter() - t
    ceilings = [disk_ceiling(work / "granary")]
    results = []
    for name in names:
        _, load = LOADERS[name]
        out = work / name.split("-")[0]
        runs = []
        for epoch in range(a.epochs):
            cold = drop_caches()
            t = time.perf_counter()
            n = nbytes = 0
            for k, m in load(out, a.workers, a.batch, epoch):
                n += k
                nbytes += m
            dt = time.perf_counter() - t
            if n != len(files) and not (name.startswith("granary") and n >= len(files) - a.batch):
                print(f"  warning: {name} delivered {n} of {len(files)} samples", file=sys.stderr)
            runs.append({"samples": n, "bytes": nbytes, "seconds": dt, "samples_per_s": n / dt, "cold": cold})
        best = max(r["samples_per_s"] for r in runs)
        results.append({"loader": name, "convert_s": conv_s.get(name), "runs": runs, "best_samples_per_s": best})
        conv = f"{len(files) / conv_s[name]:7.0f} files/s" if name in conv_s else "  (existing)  "
        print(f"  {name:<11} convert {conv}  epochs " +
              "  ".join(f"{r['samples_per_s']:7.0f}/s ({r['bytes'] / r['seconds'] / 1e6:5.0f} MB/s{'' if r['cold'] else ', warm'})" for r in runs),
              flush=True)
    ceilings.append(disk_ceiling(work / "granary"))
    ceilings = [c for c in ceilings if c]
    mean_size = total / len(files)
    if ceilings:
        per_s = [c / mean_size for c in ceilings]
        print(f"disk ceiling (fio, O_DIRECT 4 MiB reads, io_uring QD 8, cold; before and after): "
              + ", ".join(f"{c / 1e6:.0f} MB/s = {p:.0f} samples/s" for c, p in zip(ceilings, per_s)))
    others = [r for r in results if not r["loader"].startswith("granary")]
    for g in (r for r in results if r["loader"].startswith("granary")):
        if others:
            fastest = max(others, key=lambda r: r["best_samples_per_s"])
            print(f"{g['loader']} / fastest other ({fastest['loader']}): "
                  f"{g['best_samples_per_s'] / fastest['best_samples_per_s']:.2f}x (best epoch of each)")
        if ceilings:
            print(f"{g['loader']} / disk ceiling: {g['best_samples_per_s'] / max(per_s):.2f} "
                  f"(best epoch, highest ceiling)")
    if others and ceilings:
        fastest = max(r["best_samples_per_s"] for r in others)
        print(f"3x the fastest other loader would need {3 * fastest:.0f} samples/s: "
              f"{3 * fastest / max(per_s):.2f} of the disk ceiling")
    if a.json:
        Path(a.json).write_text(json.dumps({"results": results, "disk_ceiling_bytes_per_s": ceilings},
                                           indent=2))


if __name__ == "__main__":
    main()
