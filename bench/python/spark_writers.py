"""Spark conversion side by side: the same DataFrame (a Parquet file of an ImageFolder-style
tree's files: key, bytes, class) written by ``granary.spark.write`` and by MosaicML Streaming's
``dataframe_to_mds``, on a local Spark (``local[2]`` by default), each in a fresh session, the
output synced to disk inside the clock. Prints samples/s and the ratio.

  python bench/python/spark_writers.py --src TREE --work DIR [--master local[2]] [--partitions 4]
"""

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path


def sync_tree(out):
    for p in Path(out).rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--json")
    a = ap.parse_args()
    import pyarrow as pa
    import pyarrow.parquet as pq

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    files = sorted(p for p in Path(a.src).rglob("*") if p.is_file())
    pq.write_table(pa.table({
        "key": [p.relative_to(a.src).as_posix().rsplit(".", 1)[0] for p in files],
        "data": pa.array([p.read_bytes() for p in files], pa.binary()),
        "label": [p.parent.name for p in files],
    }), work / "samples.parquet", row_group_size=512)
    nbytes = sum(p.stat().st_size for p in files)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    rows = {}
    for name in ("granary", "mds"):
        spark = (SparkSession.builder.master(a.master).appName(f"bench-{name}")
                 .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
                 .config("spark.driver.bindAddress", "127.0.0.1")
                 .config("spark.driver.memory", "4g").getOrCreate())
        df = spark.read.parquet(str(work / "samples.parquet")).repartition(a.partitions).cache()
        n = df.count()  # materialised before the clock
        out = work / f"out-{name}"
        shutil.rmtree(out, ignore_errors=True)
        t = time.perf_counter()
        if name == "granary":
            import granary.spark

            granary.spark.write(df, str(out), key="key", data="data", label="label")
        else:
            from streaming.base.converters import dataframe_to_mds

            dataframe_to_mds(df.select("data", "label"), merge_index=True,
                             mds_kwargs={"out": str(out), "columns": {"data": "bytes", "label": "str"}})
        sync_tree(out)
        dt = time.perf_counter() - t
        rows[name] = {"samples": n, "seconds": dt, "samples_per_s": n / dt, "mb_per_s": nbytes / 1e6 / dt}
        spark.stop()
        shutil.rmtree(out, ignore_errors=True)
    for name, r in rows.items():
        print(f"{name:10} {r['samples_per_s']:10.0f} samples/s {r['mb_per_s']:8.0f} MB/s ({r['seconds']:.1f} s)")
    print(f"granary.spark.write / dataframe_to_mds: {rows['granary']['samples_per_s'] / rows['mds']['samples_per_s']:.2f}x")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
