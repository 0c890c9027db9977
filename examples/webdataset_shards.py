"""WebDataset shards made by ``webdataset.ShardWriter``, imported with ``granary pack --from
webdataset``, and trained from.

The example writes a shard set of labelled PNG images with captions (``KEY.png``, ``KEY.txt``,
``KEY.cls``), imports it into granary (the CLI), checks that ``granary extract`` gives back
exactly the members of the tars, then trains a nearest-centroid classifier on the images
streamed from granary and tests it on held-out keys. Fails below 90 % test accuracy (chance:
25 %).

  python examples/webdataset_shards.py [--samples 2000] [--work DIR]
"""

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import webdataset as wds

sys.path.insert(0, str(Path(__file__).parent))
import granary  # noqa: E402
from _shapes import NAMES, Centroids, features, image  # noqa: E402


def granary_cli():
    cli = os.environ.get("GRANARY_BIN") or shutil.which("granary")
    if not cli:
        sys.exit("the granary CLI is needed: cargo install --path . (or set GRANARY_BIN)")
    return cli


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--work", help="directory for the files (default: a temporary one)")
    a = ap.parse_args()
    if a.work:
        run(a, Path(a.work))
    else:
        with tempfile.TemporaryDirectory(prefix="granary-wds-") as tmp:
            run(a, Path(tmp))


def run(a, work):
    shutil.rmtree(work / "shards", ignore_errors=True)
    (work / "shards").mkdir(parents=True)
    rng = np.random.default_rng(0)
    with wds.ShardWriter(str(work / "shards" / "shard-%06d.tar"), maxcount=500, verbose=0) as w:
        for i in range(a.samples):
            k = int(rng.integers(0, len(NAMES)))
            png, cap = image(k, rng)
            w.write({"__key__": f"s{i:06d}", "png": png, "txt": cap, "cls": k})
    shards = sorted((work / "shards").glob("shard-*.tar"))
    pattern = str(work / "shards" / f"shard-{{000000..{len(shards) - 1:06d}}}.tar")

    t = time.perf_counter()
    out = work / "shapes.granary"
    subprocess.run([granary_cli(), "pack", "--from", "webdataset", pattern, "-o", str(out), "--force",
                    "--quiet"], check=True)
    print(f"imported {len(shards)} shards in {time.perf_counter() - t:.2f} s")

    # Extract gives back exactly the tars' members.
    members = {}
    for s in shards:
        with tarfile.open(s) as tf:
            for m in tf.getmembers():
                members[m.name] = tf.extractfile(m).read()
    shutil.rmtree(work / "extracted", ignore_errors=True)
    subprocess.run([granary_cli(), "extract", str(out), "-o", str(work / "extracted")], check=True,
                   capture_output=True)
    got = {str(p.relative_to(work / "extracted")): p.read_bytes()
           for p in (work / "extracted").rglob("*") if p.is_file()}
    assert got == members, "extract differs from the shards"
    print(f"extract: the {len(members)} tar members, byte for byte")

    ds = granary.Dataset(out)
    test_keys = {f"s{i:06d}" for i in range(0, a.samples, 5)}
    model = Centroids(len(NAMES))
    t, n = time.perf_counter(), 0
    for item in granary.IterableDataset(out, seed=2):  # per sample: item["fields"]
        if ds.path(item["id"]) not in test_keys:
            model.train(features(item["fields"]["png"]), item["label"])
            n += 1
    print(f"trained on {n} images streamed from granary in {time.perf_counter() - t:.2f} s")
    right = 0
    for key in sorted(test_keys):
        fields, y = ds[ds.lookup(key)]
        assert int(fields["cls"]) == y
        right += model.predict(features(fields["png"])) == y
    acc = right / len(test_keys)
    print(f"test accuracy {acc:.1%} on {len(test_keys)} held-out images (chance {1 / len(NAMES):.0%})")
    if acc < 0.9:
        sys.exit("accuracy below 90 %")


if __name__ == "__main__":
    main()
