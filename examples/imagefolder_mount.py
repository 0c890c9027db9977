"""Unmodified torchvision training code over `granary mount`: the JPEG digits of
train_jpeg.py are packed, the dataset is mounted, and a CNN trains from
`torchvision.datasets.ImageFolder(MOUNT)` with PIL decoding in DataLoader workers, exactly as
it would from the original tree (optionally ordered by `granary.ChunkwiseSampler`). Needs
torchvision and a machine where FUSE mounts work (root, or fusermount3).

  python examples/imagefolder_mount.py [--variants 2] [--epochs 4] [--sampler chunkwise]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torchvision
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import granary  # noqa: E402
from train_jpeg import granary_cli, make_data, model  # noqa: E402


def to_input(img):
    """PIL image -> 1x32x32 float: grey, standardised per image (as train_jpeg.decode)."""
    grey = torch.from_numpy(np.asarray(img.convert("L"), dtype=np.float32))[None]
    return (grey - grey.mean()) / (grey.std() + 1e-3)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--sampler", choices=["shuffle", "chunkwise"], default="shuffle")
    ap.add_argument("--min-accuracy", type=float, default=0.0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        packed, test_x, test_y = make_data(work, a.variants)
        mnt = work / "mnt"
        mnt.mkdir()
        subprocess.run([granary_cli(), "mount", str(packed), str(mnt), "--log",
                        str(work / "mount.log")], check=True)
        try:
            # The training code proper: nothing in it knows about granary but the sampler.
            ds = torchvision.datasets.ImageFolder(str(mnt), transform=to_input)
            sampler = granary.ChunkwiseSampler(ds) if a.sampler == "chunkwise" else None
            net = model()
            opt = torch.optim.Adam(net.parameters(), lr=2e-3)
            loss_fn = torch.nn.CrossEntropyLoss()
            for epoch in range(a.epochs):
                t = time.perf_counter()
                loader = DataLoader(ds, batch_size=64, shuffle=sampler is None, sampler=sampler,
                                    num_workers=a.workers)
                n = 0
                net.train()
                for x, y in loader:
                    loss = loss_fn(net(x), y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    n += len(x)
                net.eval()
                with torch.no_grad():
                    acc = (net(test_x).argmax(1) == test_y).float().mean().item() * 100
                print(f"epoch {epoch}: {n} images at {n / (time.perf_counter() - t):.0f}/s, "
                      f"test accuracy {acc:.1f} %", flush=True)
            stats = os.getxattr(mnt, "user.granary.stats").decode()
            print(f"mount statistics: {stats}")
        finally:
            subprocess.run([granary_cli(), "umount", str(mnt)], check=True)
    if acc < a.min_accuracy:
        raise SystemExit(f"accuracy {acc:.1f} % below {a.min_accuracy} %")


if __name__ == "__main__":
    main()
