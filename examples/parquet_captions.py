"""A Parquet file with an image column and captions, converted to granary and trained from.

The example writes the Parquet file itself (as a Hugging Face dataset stores images: a struct
column ``image`` of ``{"bytes", "path"}``, plus ``caption`` and ``label``), converts it with
``granary.from_parquet`` into samples with the named fields ``png`` and ``txt``, then trains a
nearest-centroid classifier on the images streamed from granary (chunk-wise shuffled batches,
fields per batch) and tests it on held-out rows read by key. It checks that every converted
sample equals its row, and fails below 90 % test accuracy (chance: 25 %).

  python examples/parquet_captions.py [--rows 2000] [--work DIR]
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).parent))
import granary  # noqa: E402
from _shapes import NAMES, Centroids, features, image  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--work", help="directory for the files (default: a temporary one)")
    a = ap.parse_args()
    if a.work:
        run(a, Path(a.work))
    else:
        with tempfile.TemporaryDirectory(prefix="granary-parquet-") as tmp:
            run(a, Path(tmp))


def run(a, work):
    work.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    imgs, caps, labels = [], [], []
    for i in range(a.rows):
        k = int(rng.integers(0, len(NAMES)))
        png, cap = image(k, rng)
        imgs.append({"bytes": png, "path": f"{i:06d}.png"})
        caps.append(cap)
        labels.append(k)
    table = pa.table({
        "key": [f"row{i:06d}" for i in range(a.rows)],
        "image": pa.array(imgs, pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
        "caption": caps,
        "label": labels,
    })
    pq.write_table(table, work / "shapes.parquet", row_group_size=256)

    t = time.perf_counter()
    out = work / "shapes.granary"
    s = granary.from_parquet(work / "shapes.parquet", out, key="key",
                             fields={"png": "image", "txt": "caption"}, label="label",
                             chunk_size=1 << 20, force=True, progress=False)
    print(f"converted {s['files']} rows into {s['chunks']} chunks in {time.perf_counter() - t:.2f} s")

    ds = granary.Dataset(out)
    for i in range(len(ds)):  # every sample equals its row
        fields, label = ds[i]
        row = int(ds.path(i)[3:])
        assert fields == {"png": imgs[row]["bytes"], "txt": caps[row].encode()}, row
        assert ds.classes[label] == str(labels[row])

    test_keys = {f"row{i:06d}" for i in range(0, a.rows, 5)}  # every fifth row held out
    model = Centroids(len(NAMES))
    stream = granary.IterableDataset(out, batch_size=64, seed=1, fields=["png"])
    t, n = time.perf_counter(), 0
    for batch in stream:
        for i, png, y in zip(batch["id"], batch["fields"]["png"], batch["label"]):
            if ds.path(int(i)) not in test_keys:
                model.train(features(png), int(y))
                n += 1
    print(f"trained on {n} images streamed from granary in {time.perf_counter() - t:.2f} s")
    test = granary.Dataset(out, fields=["png"])
    right = 0
    for key in sorted(test_keys):
        fields, y = test[test.lookup(key)]
        right += model.predict(features(fields["png"])) == y
    acc = right / len(test_keys)
    print(f"test accuracy {acc:.1%} on {len(test_keys)} held-out images (chance {1 / len(NAMES):.0%})")
    if acc < 0.9:
        sys.exit("accuracy below 90 %")


if __name__ == "__main__":
    main()
