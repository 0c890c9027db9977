"""Partial local shuffling (PLS) on real data: test accuracy against a global shuffle.

Simulated data-parallel training: R ranks, each reading its own share of every epoch through
granary.IterableDataset(rank=r, world_size=R, shuffle="chunkwise", locality=Q); every step
takes one batch from each rank and makes one optimizer step on the average of the ranks'
gradients (what an all-reduce of the ranks' gradients gives), with a global batch of 128. The
reference is a global shuffle (shuffle="global": every epoch a new random permutation split
across the ranks, as DistributedSampler does).

Data: scikit-learn's digits (1,797 8x8 images, 10 classes; 1,437 for training, 360 held out),
one file per image, packed into small chunks (about ten images each, so that every rank holds
several chunks even at R = 16) in two layouts: granary's default (`--order random`, classes
mixed across chunks) and the sorted path order (`--order walk`, a chunk holds one class: what
an ImageFolder tree packed in order gives). Model: the MLP of examples/train_digits.py.

Locality Q is the fraction of chunks that change rank between epochs: at Q = 0 a rank reads
its home chunks every epoch (its node's tier keeps serving it), at Q = 1 chunks are dealt
afresh. The claim checked: small Q trains about as well as a global shuffle; Q = 0 gets worse
as R grows.

  python bench/python/pls.py [--ranks 8,16] [--locality 0,0.1,0.3,1] [--seeds 0,1,2,3,4]
                             [--epochs 20] [--orders random,walk] [--json FILE]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits

import granary

GLOBAL_BATCH = 128


def granary_cli():
    cli = os.environ.get("GRANARY_BIN") or shutil.which("granary")
    if not cli:
        sys.exit("the granary CLI is needed: cargo install --path . (or set GRANARY_BIN)")
    return cli


def write_and_pack(work, order):
    d = load_digits()
    x, y = d.images.astype(np.uint8), d.target
    perm = np.random.default_rng(12345).permutation(len(x))
    test, train = perm[:360], perm[360:]
    src = work / "digits"
    if not src.exists():
        for i in train:
            p = src / str(y[i]) / f"{i:04}.raw"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(x[i].tobytes())
    out = work / f"digits-{order}.granary"
    subprocess.run([granary_cli(), "pack", str(src), "-o", str(out), "--chunk-size", "1KiB",
                    "--order", order, "--force"], check=True, capture_output=True)
    test_x = torch.from_numpy(x[test].reshape(len(test), 64).astype(np.float32) / 16.0)
    return out, test_x, y[test]


def train(path, ranks, mode, locality, seed, epochs, test_x, test_y):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    shards = [granary.IterableDataset(path, shuffle=mode, seed=seed, rank=r, world_size=ranks,
                                      batch_size=GLOBAL_BATCH // ranks, window=2,
                                      locality=locality) for r in range(ranks)]
    for epoch in range(epochs):
        for s in shards:
            s.set_epoch(epoch)
        for step in zip(*shards):  # equal shares: every rank has the same number of batches
            opt.zero_grad()
            for b in step:  # each rank's gradient, averaged over the ranks
                x = torch.stack(b["data"]).float() / 16.0
                (loss_fn(model(x), b["label"]) / ranks).backward()
            opt.step()
    with torch.no_grad():
        pred = model(test_x).argmax(1).numpy()
    return float((pred == test_y).mean() * 100.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="8,16")
    ap.add_argument("--locality", default="0,0.1,0.3,1")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--orders", default="random,walk")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    ranks = [int(r) for r in a.ranks.split(",")]
    qs = [float(q) for q in a.locality.split(",")]
    seeds = [int(s) for s in a.seeds.split(",")]
    torch.set_num_threads(1)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for order in a.orders.split(","):
            path, test_x, test_y = write_and_pack(Path(tmp), order)
            chunks = granary.Dataset(path)._native().chunk_count
            print(f"layout {order}: {len(granary.Dataset(path))} training images in {chunks} chunks; "
                  f"{len(test_y)} test images; {a.epochs} epochs; global batch {GLOBAL_BATCH}; "
                  f"seeds {seeds}", flush=True)
            for r in ranks:
                runs = [("global", 1.0)] + [("chunkwise", q) for q in qs]
                ref = None
                for mode, q in runs:
                    accs = [train(path, r, mode, q, s, a.epochs, test_x, test_y) for s in seeds]
                    mean, sd = float(np.mean(accs)), float(np.std(accs))
                    ref = mean if mode == "global" else ref
                    label = "global" if mode == "global" else f"Q = {q:g}"
                    gap = "" if mode == "global" else f"  {mean - ref:+.2f} vs global"
                    print(f"  R = {r:2}  {label:<9} {mean:6.2f} % ± {sd:4.2f}{gap}", flush=True)
                    results.append({"order": order, "ranks": r, "shuffle": mode, "locality": q,
                                    "accuracies": accs, "mean": mean, "sd": sd})
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
