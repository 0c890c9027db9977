"""A real training loop on real data through granary.

scikit-learn's bundled handwritten digits (1,797 images of 8x8 pixels, 10 classes) are written
as one small file per image in an ImageFolder-style tree (class directories), packed with the
granary CLI into small chunks (so that a chunk holds a few dozen images and chunk-wise shuffling
is a real approximation), and a small MLP is trained with granary.IterableDataset under three
epoch orders:

  global      a full random order every epoch (the reference);
  chunkwise   granary's default: chunk order shuffled, samples shuffled within windows of chunks;
  importance  chunk-wise, plus importance sampling from per-sample losses reported back by id
              (report(ids, losses) into the local tier's score table), with the losses of
              drawn samples multiplied by their weight 1/(N p) to stay unbiased; the tier
              (policy importance) keeps hot chunks of the most important samples.

Each is run with several seeds; the script prints the test accuracy of every run, the mean per
order and the gap to global, and exits 1 if chunkwise or importance trail global by more than
1 point on average.

  python examples/train_digits.py [--seeds 0,1,2] [--epochs 30] [--work DIR]

Needs torch, scikit-learn and numpy (Debian: python3-torch python3-sklearn python3-numpy), the
granary Python package (pip install ./python) and the granary CLI (cargo install --path ., or
GRANARY_BIN=path/to/granary).
"""

import argparse
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


def granary_cli():
    cli = os.environ.get("GRANARY_BIN") or shutil.which("granary")
    if not cli:
        sys.exit("the granary CLI is needed: cargo install --path . (or set GRANARY_BIN)")
    return cli


def write_and_pack(work):
    """Writes the training images as files, packs them; returns (dataset path, test X, test y)."""
    d = load_digits()
    x = d.images.astype(np.uint8)  # pixel values 0..16
    y = d.target
    rng = np.random.default_rng(12345)
    order = rng.permutation(len(x))
    test, train = order[:360], order[360:]
    src = work / "digits"
    for i in train:
        p = src / str(y[i]) / f"{i:04}.raw"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(x[i].tobytes())
    out = work / "digits.granary"
    subprocess.run(
        [granary_cli(), "pack", str(src), "-o", str(out), "--chunk-size", "4KiB", "--force"],
        check=True,
        capture_output=True,
    )
    return out, x[test], y[test]


def to_tensor(data):
    # A batch's samples are uint8 views of one buffer, 64 pixels each.
    return torch.stack(data).float() / 16.0


def train(path, mode, seed, epochs, test_x, test_y, work):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss(reduction="none")
    common = dict(seed=seed, batch_size=32, window=2)
    if mode == "importance":
        tier = work / f"tier-{seed}"
        shutil.rmtree(tier, ignore_errors=True)
        # One object: epoch 0 draws uniformly (no losses yet); set_epoch() merges the losses
        # reported since into the tier's score table, and the next epoch samples by them.
        ds = granary.IterableDataset(
            path, shuffle="chunkwise", sampling="importance", alpha=0.5,
            cache_dir=tier, cache_size=16 << 10, policy="importance", **common
        )
    else:
        ds = granary.IterableDataset(path, shuffle=mode, **common)
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        model.train()
        for batch in ds:
            x = to_tensor(batch["data"])
            y = torch.as_tensor(batch["label"], dtype=torch.long)
            losses = loss_fn(model(x), y)
            if "weight" in batch:
                loss = (losses * torch.as_tensor(batch["weight"])).mean()
            else:
                loss = losses.mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if mode == "importance":
                ds.report(batch["id"], losses)
    model.eval()
    with torch.no_grad():
        x = torch.from_numpy(test_x.reshape(len(test_x), 64).astype(np.float32) / 16.0)
        pred = model(x).argmax(1).numpy()
    return float((pred == test_y).mean() * 100.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--work", help="working directory (default: a temporary one)")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(a.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        path, test_x, test_y = write_and_pack(work)
        ds = granary.Dataset(path)
        print(f"digits: {len(ds)} training images packed into {ds._native().chunk_count} chunks, "
              f"{len(test_y)} test images; {a.epochs} epochs, seeds {seeds}")
        results = {}
        for mode in ("global", "chunkwise", "importance"):
            accs = [train(path, mode, s, a.epochs, test_x, test_y, work) for s in seeds]
            results[mode] = accs
            print(f"  {mode:<11} " + "  ".join(f"{v:5.1f}" for v in accs) + f"   mean {np.mean(accs):5.2f} %")
        ref = np.mean(results["global"])
        ok = True
        for mode in ("chunkwise", "importance"):
            gap = np.mean(results[mode]) - ref
            within = gap >= -1.0
            ok &= within
            print(f"  {mode} vs global: {gap:+.2f} points ({'within' if within else 'NOT within'} 1 point)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
