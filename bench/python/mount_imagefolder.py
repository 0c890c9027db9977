"""torchvision's real ImageFolder + DataLoader reading (a) a raw tree on a shared file system and
(b) `granary mount` of the packed dataset on the same file system with a local tier.

Run by `RUN=mount bash bench/juicefs.sh` (which sets up the JuiceFS stand-in for a parallel file
system); on a real cluster point it at the real mount:

  python bench/python/mount_imagefolder.py --shared /lustre/me --granary target/release/granary \\
      --work /local/ssd/bench --report bench-out/mount

`--shared DIR` holds `raw/` (the ImageFolder tree) and `raw.granary/` (it packed). Every
configuration runs epochs 1..E with a fresh tier; the page cache is dropped before epoch 1 (and
before every epoch for the rows marked so, which stand for a dataset larger than memory).
Per epoch: samples/s, what the shared file system saw (metadata operations, FUSE operations and
bytes read, from JuiceFS's `.stats` when it is JuiceFS), and the mount's tier hits (from its
`user.granary.stats`). ImageFolder's loader returns the file's bytes (the files are random
bytes behind a JPEG marker: decoding would measure the CPU, not the storage).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import torch
import torchvision


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def collate(batch):
    return [b for b, _ in batch], torch.tensor([y for _, y in batch])


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def jfs_stats(shared):
    """JuiceFS counters (metadata ops, FUSE ops, bytes read), or {} for other file systems."""
    path = os.path.join(shared, ".stats")
    if not os.path.exists(path):
        return {}
    out = {"meta_ops": 0, "fuse_meta_ops": 0, "fuse_reads": 0, "read_bytes": 0, "get_bytes": 0}
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            try:
                v = float(value)
            except ValueError:
                continue
            if name.startswith("juicefs_meta_ops_total_"):
                out["meta_ops"] += v
            elif name.startswith("juicefs_fuse_ops_total_"):
                op = name[len("juicefs_fuse_ops_total_"):]
                if op == "read":
                    out["fuse_reads"] += v
                else:
                    out["fuse_meta_ops"] += v
            elif name == "juicefs_fuse_read_size_bytes_sum":
                out["read_bytes"] += v
            # Older JuiceFS: ..._bytes{method="GET"}; 1.x: ..._bytes_GET.
            elif name.startswith("juicefs_object_request_data_bytes") and (
                    'method="GET"' in name or name.endswith("_GET")):
                out["get_bytes"] += v
    return out


def granary_stats(mnt):
    if mnt is None:
        return {}
    return json.loads(os.getxattr(mnt, "user.granary.stats"))


def delta(after, before):
    return {k: after[k] - before.get(k, 0) for k in after if isinstance(after[k], (int, float))}


def fetch_ceiling(shared, packed, threads=3):
    """The packed dataset's chunk files read whole from the shared file system, cold, `threads`
    files at a time (as the mount's fetchers do): the rate at which a first epoch through a
    tier can get its bytes. Returns a row like run_epochs' (one epoch)."""
    from concurrent.futures import ThreadPoolExecutor

    names = sorted(os.path.join(packed, f) for f in os.listdir(packed) if f.endswith(".gchunk"))

    def whole(path):
        n = 0
        with open(path, "rb", buffering=0) as f:
            while True:
                b = f.read(8 << 20)
                if not b:
                    return n
                n += len(b)

    drop_caches()
    j, t = jfs_stats(shared), time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        total = sum(ex.map(whole, names))
    secs = time.perf_counter() - t
    jd = delta(jfs_stats(shared), j) if j else {}
    print(json.dumps({"fetch_ceiling_mb_s": total / 1e6 / secs, "bytes": total, "seconds": secs}),
          flush=True)
    return {"bytes": total, "seconds": secs, "shared": jd}


def run_epochs(name, root, mnt, shared, epochs, workers, batch, sampler_kind, drop_every):
    drop_caches()
    j0, t0 = jfs_stats(shared), time.perf_counter()
    ds = torchvision.datasets.ImageFolder(root, loader=read_bytes)
    scan_s = time.perf_counter() - t0
    scan = delta(jfs_stats(shared), j0) if j0 else {}
    sampler = None
    if sampler_kind == "chunkwise":
        import granary

        sampler = granary.ChunkwiseSampler(ds, seed=0)
    rows = []
    for epoch in range(epochs):
        if epoch > 0 and drop_every:
            drop_caches()
        dl = torch.utils.data.DataLoader(
            ds, batch_size=batch, num_workers=workers, collate_fn=collate,
            shuffle=sampler is None, sampler=sampler,
            generator=torch.Generator().manual_seed(epoch) if sampler is None else None,
        )
        j, g = jfs_stats(shared), granary_stats(mnt)
        t = time.perf_counter()
        n = nbytes = 0
        for data, _ in dl:
            n += len(data)
            nbytes += sum(len(d) for d in data)
        secs = time.perf_counter() - t
        jd = delta(jfs_stats(shared), j) if j else {}
        gd = delta(granary_stats(mnt), g) if mnt else {}
        served = gd.get("samples_from_tier", 0) + gd.get("samples_from_origin", 0)
        row = {
            "config": name, "epoch": epoch + 1, "samples": n, "bytes": nbytes, "seconds": secs,
            "samples_per_s": n / secs, "shared": jd,
            "tier_hits": gd.get("samples_from_tier", 0), "origin_reads":
            gd.get("samples_from_origin", 0),
            "tier_hit_ratio": gd.get("samples_from_tier", 0) / served if served else None,
            "fetched_bytes": gd.get("bytes_fetched", 0),
            "page_cache_served": n - served if mnt else None,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    if len(ds) != rows[0]["samples"] and sampler is None:
        raise SystemExit(f"{name}: epoch delivered {rows[0]['samples']} of {len(ds)} samples")
    return {"config": name, "scan_seconds": scan_s, "scan_shared": scan, "epochs": rows}


def mount(granary, ds, mnt, tier, size, policy):
    os.makedirs(mnt, exist_ok=True)
    cmd = [granary, "mount", ds, mnt, "--log", mnt + ".log"]
    if tier:
        shutil.rmtree(tier, ignore_errors=True)
        cmd += ["--cache-dir", tier, "--cache-size", str(size), "--policy", policy]
    subprocess.run(cmd, check=True)


def umount(granary, mnt):
    subprocess.run([granary, "umount", mnt], check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", required=True, help="directory holding raw/ and raw.granary/")
    ap.add_argument("--granary", required=True, help="the granary executable")
    ap.add_argument("--work", required=True, help="local directory: mount point and tiers")
    ap.add_argument("--report", required=True, help="directory for the report")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--small-tier", type=float, default=0.2,
                    help="tier size of the policy rows, as a share of the dataset")
    ap.add_argument("--only", help="run only the configurations whose name contains this "
                    "(and the raw baselines)")
    args = ap.parse_args()

    raw = os.path.join(args.shared, "raw")
    packed = os.path.join(args.shared, "raw.granary")
    size = sum(os.path.getsize(os.path.join(packed, f)) for f in os.listdir(packed))
    mnt = os.path.join(args.work, "mnt")
    tier = os.path.join(args.work, "tier")
    os.makedirs(args.report, exist_ok=True)
    configs = [("raw files (ImageFolder, shuffle)", None, None, "shuffle", False)]
    # No tier: every file read is one positional read of its record in a chunk file on the
    # shared file system (what moves there per byte served is the row's point).
    configs.append(("granary mount, no tier, shuffle", 0, None, "shuffle", False))
    configs.append(("granary mount, tier 100 %, shuffle", size * 11 // 10, "static", "shuffle",
                    False))
    configs.append(("granary mount, tier 100 %, shuffle, cache dropped every epoch",
                    size * 11 // 10, "static", "shuffle", True))
    small = int(size * args.small_tier)
    pct = round(args.small_tier * 100)
    for sampler in ("shuffle", "chunkwise"):
        for policy in ("lru", "static", "importance"):
            configs.append((f"granary mount, tier {pct} % {policy}, {sampler}, dropped every epoch",
                            small, policy, sampler, True))
    configs.append(("raw files (ImageFolder, shuffle), dropped every epoch", None, None,
                    "shuffle", True))
    # What ImageFolder + DataLoader deliver at best here: the raw tree on local disk, read
    # warm (epochs 2+): no file system under the mount can be read faster through ImageFolder.
    local = os.path.join(args.work, "raw-local")
    configs.append(("ceiling: raw files on local disk (ImageFolder, shuffle)", None, local,
                    "shuffle", False))
    if args.only:
        configs = [c for c in configs if args.only in c[0] or c[0].startswith("raw files (")]
    results = []
    for name, quota, policy, sampler, drop_every in configs:
        print(f"== {name}", flush=True)
        if quota is None:
            root = raw
            if policy == local:
                shutil.rmtree(local, ignore_errors=True)
                shutil.copytree(raw, local)
                root = local
            results.append(run_epochs(name, root, None, args.shared, args.epochs, args.workers,
                                      args.batch, sampler, drop_every))
            continue
        mount(args.granary, packed, mnt, tier if quota else None, quota, policy)
        try:
            results.append(run_epochs(name, mnt, mnt, args.shared, args.epochs, args.workers,
                                      args.batch, sampler, drop_every))
        finally:
            umount(args.granary, mnt)
    print("== ceiling of a first epoch through a tier: the chunk files read whole, cold", flush=True)
    fetch = fetch_ceiling(args.shared, packed)
    with open(os.path.join(args.report, "mount.json"), "w") as f:
        json.dump({"dataset_bytes": size, "results": results, "fetch_ceiling": fetch}, f, indent=1)
    write_table(results, size, os.path.join(args.report, "mount.txt"), fetch)


def write_table(results, size, path, fetch=None):
    def rates(dropped):
        for r in results:
            if r["config"].startswith("raw files (") and ("dropped" in r["config"]) == dropped:
                return {e["epoch"]: e["samples_per_s"] for e in r["epochs"]}
        return {}

    # Each row against the raw tree on the shared file system in the same cache state.
    raw_rate = {False: rates(False), True: rates(True)}
    lines = [f"dataset: {size / 1e6:.0f} MB packed; samples/s per epoch (x raw: against the raw "
             "tree on the shared FS in the same cache state), shared-FS metadata ops, FUSE "
             "metadata ops, MB read through its FUSE interface and MB it fetched from its object "
             "store (JuiceFS), tier hit ratio (of the reads that reached the mount)", ""]
    head = (f"{'configuration':<66} {'ep':>2} {'samples/s':>10} {'x raw':>6} {'meta ops':>9} "
            f"{'fuse ops':>9} {'MB read':>8} {'MB GET':>8} {'tier hits':>9}")
    lines.append(head)
    for r in results:
        base = raw_rate["dropped" in r["config"]]
        for e in r["epochs"]:
            sh = e["shared"]
            hit = e["tier_hit_ratio"]
            ratio = e["samples_per_s"] / base[e["epoch"]] if base.get(e["epoch"]) else 0
            lines.append(
                f"{r['config']:<66} {e['epoch']:>2} {e['samples_per_s']:>10,.0f} "
                f"{ratio:>6.1f} "
                f"{sh.get('meta_ops', 0):>9,.0f} {sh.get('fuse_meta_ops', 0):>9,.0f} "
                f"{sh.get('read_bytes', 0) / 1e6:>8,.0f} {sh.get('get_bytes', 0) / 1e6:>8,.0f} "
                f"{'-' if hit is None else f'{hit:.0%}':>9}")
        sc = r["scan_shared"]
        lines.append(f"{'  (ImageFolder scan: %.2f s, %d meta ops)' % (r['scan_seconds'], sc.get('meta_ops', 0)):<66}")
    if fetch:
        # A first epoch through a tier moves every chunk file once from the shared file
        # system: at best it takes as long as reading them whole.
        samples = next((e["samples"] for r in results for e in r["epochs"]), 0)
        first = raw_rate[False].get(1)
        bound = samples / fetch["seconds"]
        lines.append("")
        lines.append(f"chunk files read whole from the shared FS, cold, 3 at a time: "
                     f"{fetch['bytes'] / 1e6:,.0f} MB in {fetch['seconds']:.2f} s "
                     f"({fetch['bytes'] / 1e6 / fetch['seconds']:,.0f} MB/s): a first epoch "
                     f"that fetches every chunk once runs at most {bound:,.0f} samples/s"
                     + (f" = {bound / first:.1f}x raw epoch 1" if first else ""))
    text = "\n".join(lines) + "\n"
    with open(path, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
