"""Loading a dataset from an S3 server through PyTorch's DataLoader, measured side by side.

Cases (each run in a process of its own so that its peak memory is its own):

  raw      one GET per sample: a map-style dataset of the raw objects (what an S3 map-style
           dataset does), DataLoader(shuffle=True)
  granary  granary.IterableDataset over the s3:// URL (chunk-wise shuffle, ranged GETs)
  tier     the same with a local tier (cache_dir) big enough for the dataset: epoch 1 fills it,
           epochs 2+ read it from the local disk
  ceiling  the server's own ceiling: parallel whole-object GETs of the chunk files (boto3, 16
           threads), no decoding, no DataLoader
  local    granary.IterableDataset over the same packed dataset on the local disk (the
           local-disk rate (d) is compared with)

Every epoch drops the page cache first (`--drop` each epoch, or only before epoch 1), so the
server reads from its disk. Samples are delivered as bytes (no image decoding). Writes one
JSON line per epoch to stdout, with where the epoch's time went (`open_s`: making the dataset,
which fetches the snapshot in epoch 1; `first_s`: from then to the first batch, which starts
the DataLoader workers) and the CPU seconds it cost: this process and its workers
(`client_cpu_s`) and, with --server-pid, the S3 server (`server_cpu_s`). On a machine whose
cores the server shares, the rate follows their sum per byte.

  python s3_loaders.py --case raw --url s3://granary/bench/raw --keys keys.txt --epochs 2
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def s3_client(workers=16):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=os.environ["AWS_ENDPOINT_URL"],
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
        config=Config(max_pool_connections=workers, retries={"max_attempts": 5}),
    )


def split_url(url):
    rest = url.split("://", 1)[1]
    bucket, _, prefix = rest.partition("/")
    return bucket, prefix


class RawObjects:
    """Map-style dataset: one GET per sample (the client is made in each worker)."""

    def __init__(self, url, keys):
        self.bucket, self.prefix = split_url(url)
        self.keys = keys
        self.client = None

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, i):
        if self.client is None:
            self.client = s3_client(4)
        key = f"{self.prefix}/{self.keys[i]}"
        body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        return body, 0


def collate_list(batch):
    return batch


def proc_cpu(pid):
    """CPU seconds used so far by process `pid` (all its threads), or None."""
    if not pid:
        return None
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu():
    """CPU seconds of this process and its reaped children (DataLoader workers)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def epoch_loader(args, epoch, marks):
    import torch
    from torch.utils.data import DataLoader

    import granary

    if args.case == "raw":
        keys = open(args.keys).read().split("\n")
        keys = [k for k in keys if k]
        ds = RawObjects(args.url, keys)
        g = torch.Generator()
        g.manual_seed(epoch)
        loader = DataLoader(ds, batch_size=32, shuffle=True, generator=g,
                            num_workers=args.workers, collate_fn=collate_list,
                            persistent_workers=False)
        for batch in loader:
            yield len(batch), sum(len(b) for b, _ in batch)
        return
    kw = {}
    if args.case == "tier":
        kw = dict(cache_dir=args.tier, cache_size=args.tier_size, policy="lru")
    url = args.local if args.case == "local" else args.url
    ds = granary.IterableDataset(url, seed=1, batch_size=32, batch_format="list", **kw)
    ds.set_epoch(epoch)
    marks["open"] = time.perf_counter()
    loader = DataLoader(ds, batch_size=None, num_workers=args.workers)
    for batch in loader:
        yield len(batch["data"]), sum(len(d) for d in batch["data"])


def ceiling(args):
    from concurrent.futures import ThreadPoolExecutor

    bucket, prefix = split_url(args.url)
    client = s3_client(args.threads)
    names = [o["Key"] for p in client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=prefix + "/") for o in p.get("Contents", [])
        if o["Key"].endswith(".gchunk")]

    def get(key):
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        n = 0
        while True:
            b = body.read(8 << 20)
            if not b:
                return n
            n += len(b)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.threads) as ex:
        total = sum(ex.map(get, names))
    return total, time.perf_counter() - t0, len(names)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", required=True, choices=["raw", "granary", "tier", "ceiling", "local"])
    ap.add_argument("--url", help="s3:// prefix of the raw objects (raw) or the dataset")
    ap.add_argument("--local", help="local packed dataset (case local)")
    ap.add_argument("--keys", help="file listing the raw objects' keys (case raw)")
    ap.add_argument("--samples", type=int, help="samples in the dataset (for the ceiling's rate)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--tier")
    ap.add_argument("--tier-size", type=int, default=0)
    ap.add_argument("--drop", choices=["first", "every"], default="first")
    ap.add_argument("--server-pid", type=int, help="the S3 server's pid: its CPU per epoch is reported")
    args = ap.parse_args()

    # Libraries are loaded before the page cache is dropped: a cold epoch measures the data,
    # not a cold `import torch`.
    import boto3  # noqa: F401
    import torch  # noqa: F401
    import granary  # noqa: F401

    if args.case == "ceiling":
        drop_caches()
        cpu0, server0 = own_cpu(), proc_cpu(args.server_pid)
        total, secs, objects = ceiling(args)
        row = {"case": "ceiling", "epoch": 1, "bytes": total, "objects": objects,
               "seconds": secs, "mb_s": total / 1e6 / secs,
               "samples_s": (args.samples or 0) / secs, "client_cpu_s": own_cpu() - cpu0}
        if server0 is not None:
            row["server_cpu_s"] = proc_cpu(args.server_pid) - server0
        print(json.dumps(row), flush=True)
        return
    for epoch in range(1, args.epochs + 1):
        if epoch == 1 or args.drop == "every":
            drop_caches()
        cpu0, server0 = own_cpu(), proc_cpu(args.server_pid)
        t0 = time.perf_counter()
        n = nbytes = 0
        marks = {}
        for k, b in epoch_loader(args, epoch, marks):
            if n == 0:
                marks["first"] = time.perf_counter()
            n += k
            nbytes += b
        secs = time.perf_counter() - t0
        me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        row = {"case": args.case, "epoch": epoch, "samples": n, "bytes": nbytes,
               "seconds": secs, "samples_s": n / secs, "mb_s": nbytes / 1e6 / secs,
               "peak_rss_mb": max(me, kids) / 1024, "client_cpu_s": own_cpu() - cpu0}
        if "open" in marks:
            row["open_s"] = marks["open"] - t0
            row["first_s"] = marks.get("first", marks["open"]) - marks["open"]
        if server0 is not None:
            row["server_cpu_s"] = proc_cpu(args.server_pid) - server0
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    sys.exit(main())
