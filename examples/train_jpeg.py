"""End to end on real JPEG bytes: pack JPEG files, decode them in DataLoader workers, train a CNN.

Real JPEGs are generated with PIL from scikit-learn's digits: every 8x8 digit is scaled to
32x32, drawn in a random colour on a random background at a random offset, and saved as a
JPEG (quality 90) in an ImageFolder-style tree, several variants per digit. The tree is packed
with the granary CLI; a small CNN trains through

  DataLoader(granary.IterableDataset(ds, batch_size=64, transform=decode, collate=torch.stack),
             batch_size=None, num_workers=2)

where ``decode`` turns each sample's bytes into a float tensor in the worker
(``torchvision.io.decode_jpeg`` on the sample's uint8 view when torchvision is installed, PIL
otherwise) and ``torch.stack`` makes the batch one tensor there, so that one tensor per batch
crosses to the training process. Held-out digits, drawn the same way, measure test accuracy.

It prints images/s per epoch and where the time goes: in the training loop, waiting for the
next batch versus the training step; and, measured apart in one process, what reading alone
(granary, no decoding) and decoding alone (the same bytes, no I/O) cost per image.

  python examples/train_jpeg.py [--variants 4] [--epochs 5] [--workers 2] [--work DIR]
"""

import argparse
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader

import granary

try:
    from torchvision.io import decode_jpeg
except ImportError:
    decode_jpeg = None
if os.environ.get("DECODER") == "pil":  # set by --decoder pil, read again in workers (spawn)
    decode_jpeg = None


def granary_cli():
    cli = os.environ.get("GRANARY_BIN") or shutil.which("granary")
    if not cli:
        sys.exit("the granary CLI is needed: cargo install --path . (or set GRANARY_BIN)")
    return cli


def jpeg(img8, rng):
    """One 32x32 RGB JPEG of an 8x8 digit (pixel values 0..16)."""
    fg, bg = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    while np.abs(fg - bg).sum() < 200:  # keep the digit visible
        fg = rng.integers(0, 256, 3)
    alpha = np.asarray(Image.fromarray((img8 * 15.9).astype(np.uint8)).resize((24, 24), Image.BILINEAR),
                       dtype=np.float32)[..., None] / 255.0
    canvas = np.empty((32, 32, 3), np.float32)
    canvas[:] = bg
    dy, dx = rng.integers(0, 9, 2)
    canvas[dy:dy + 24, dx:dx + 24] = alpha * fg + (1 - alpha) * bg
    out = io.BytesIO()
    Image.fromarray(canvas.astype(np.uint8)).save(out, format="JPEG", quality=90)
    return out.getvalue()


def make_data(work, variants):
    d = load_digits()
    perm = np.random.default_rng(7).permutation(len(d.images))
    test, train = perm[:360], perm[360:]
    rng = np.random.default_rng(11)
    src = work / "jpegs"
    for i in train:
        for v in range(variants):
            p = src / str(d.target[i]) / f"{i:04}-{v}.jpg"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(jpeg(d.images[i], rng))
    test_x = torch.stack([decode(jpeg(d.images[i], rng)) for i in test])
    out = work / "jpegs.granary"
    subprocess.run([granary_cli(), "pack", str(src), "-o", str(out), "--force"], check=True,
                   capture_output=True)
    return out, test_x, torch.as_tensor(d.target[test])


def decode(data):
    """A sample's JPEG bytes (uint8 tensor view, or bytes) -> 1x32x32 float: grey, standardised
    per image (colours are random; the digit is the contrast)."""
    if decode_jpeg is not None:
        if isinstance(data, bytes):
            data = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        img = decode_jpeg(data)
    else:
        raw = data if isinstance(data, bytes) else data.numpy()
        img = torch.from_numpy(np.array(Image.open(io.BytesIO(raw)).convert("RGB"))).permute(2, 0, 1)
    grey = img.float().mean(0, keepdim=True)
    return (grey - grey.mean()) / (grey.std() + 1e-3)


def model():
    c = torch.nn
    return c.Sequential(
        c.Conv2d(1, 16, 3, padding=1), c.ReLU(), c.MaxPool2d(2),
        c.Conv2d(16, 32, 3, padding=1), c.ReLU(), c.MaxPool2d(2),
        c.Flatten(), c.Linear(32 * 8 * 8, 64), c.ReLU(), c.Linear(64, 10),
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", type=int, default=4, help="JPEGs drawn per training digit")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--decoder", choices=["auto", "pil"], default="auto",
                    help="auto: torchvision.io.decode_jpeg when installed, else PIL")
    ap.add_argument("--min-accuracy", type=float, default=0.0,
                    help="exit 1 if the last epoch's test accuracy is below this (percent)")
    ap.add_argument("--work", help="working directory (default: a temporary one)")
    a = ap.parse_args()
    global decode_jpeg
    if a.decoder == "pil":
        os.environ["DECODER"] = "pil"
        decode_jpeg = None
    torch.manual_seed(0)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(a.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        path, test_x, test_y = make_data(work, a.variants)
        n = len(granary.Dataset(path))
        size = sum(p.stat().st_size for p in (work / "jpegs").rglob("*.jpg")) / n
        print(f"{n} JPEGs of 32x32 (mean {size:.0f} bytes), packed; decoder: "
              f"{'torchvision.io.decode_jpeg' if decode_jpeg else 'PIL'}; {a.workers} workers")

        # Reading alone and decoding alone, in this process.
        ds = granary.IterableDataset(path, batch_size=64, seed=1)
        t = time.perf_counter()
        raw = [x for b in ds for x in b["data"]]
        read_s = time.perf_counter() - t
        t = time.perf_counter()
        for x in raw:
            decode(x)
        decode_s = time.perf_counter() - t
        del raw
        print(f"  apart, one process: reading {n / read_s:8.0f} images/s, "
              f"decoding {n / decode_s:6.0f} images/s")

        net = model()
        opt = torch.optim.Adam(net.parameters(), lr=2e-3)
        loss_fn = torch.nn.CrossEntropyLoss()
        # Decoded and stacked in the workers: one tensor per batch crosses to this process.
        train = granary.IterableDataset(path, batch_size=64, seed=1, transform=decode,
                                        collate=torch.stack)
        for epoch in range(a.epochs):
            train.set_epoch(epoch)
            net.train()
            wait = step = 0.0
            seen = 0
            t0 = last = time.perf_counter()
            for batch in DataLoader(train, batch_size=None, num_workers=a.workers):
                got = time.perf_counter()
                x = batch["data"]
                loss = loss_fn(net(x), batch["label"])
                opt.zero_grad()
                loss.backward()
                opt.step()
                done = time.perf_counter()
                wait += got - last
                step += done - got
                last = done
                seen += len(x)
            wall = time.perf_counter() - t0
            net.eval()
            with torch.no_grad():
                acc = float((net(test_x).argmax(1) == test_y).float().mean()) * 100
            print(f"  epoch {epoch}: {seen / wall:6.0f} images/s; of {wall:5.2f} s, waiting for "
                  f"data {wait:5.2f} s, training step {step:5.2f} s; test accuracy {acc:5.1f} %")
    if acc < a.min_accuracy:
        sys.exit(f"test accuracy {acc:.1f} % is below {a.min_accuracy} %")


if __name__ == "__main__":
    main()
