"""Small labelled PNG images for the examples: class k is a disc of colour k on a noisy
background, at a random place; a caption says what it shows. Also a nearest-centroid classifier
(on mean colour), trained and tested from granary streams."""

import io

import numpy as np
from PIL import Image

COLOURS = {"red": (220, 40, 40), "green": (40, 200, 60), "blue": (40, 60, 220), "yellow": (230, 220, 40)}
NAMES = sorted(COLOURS)


def image(k, rng):
    """PNG bytes of a 32x32 image of class k, and its caption."""
    a = rng.integers(0, 90, (32, 32, 3)).astype(np.uint8)
    cy, cx, r = rng.integers(8, 24), rng.integers(8, 24), rng.integers(5, 9)
    yy, xx = np.mgrid[:32, :32]
    a[(yy - cy) ** 2 + (xx - cx) ** 2 <= r * r] = COLOURS[NAMES[k]]
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return buf.getvalue(), f"a {NAMES[k]} disc of radius {r} at ({cx}, {cy})"


def features(png):
    """Mean colour of the brightest quarter of the pixels (the disc)."""
    a = np.asarray(Image.open(io.BytesIO(bytes(png))).convert("RGB"), np.float32).reshape(-1, 3)
    top = a[np.argsort(a.sum(1))[-len(a) // 8:]]
    return top.mean(0)


class Centroids:
    """Nearest-centroid classifier over features()."""

    def __init__(self, classes):
        self.sums = np.zeros((classes, 3))
        self.counts = np.zeros(classes)

    def train(self, x, y):
        self.sums[y] += x
        self.counts[y] += 1

    def predict(self, x):
        c = self.sums / np.maximum(self.counts, 1)[:, None]
        return int(np.argmin(((c - x) ** 2).sum(1)))
