"""Datasets written from Parquet, Spark and Ray, and read back as Ray Datasets. Each part skips
without its package (pyarrow, pyspark with Java, ray) unless GRANARY_REQUIRE_ENGINES=1, which
scripts/python-tests.sh sets for the venv it installs them into."""

import os
import random

import pytest

import granary

from conftest import run

REQUIRED = os.environ.get("GRANARY_REQUIRE_ENGINES") == "1"


def need(module):
    try:
        return __import__(module)
    except ImportError:
        if REQUIRED:
            pytest.fail(f"GRANARY_REQUIRE_ENGINES=1 but {module} cannot be imported")
        pytest.skip(f"{module} is not installed")


def rows(n, seed=0):
    """n rows: id, an image (bytes), a caption (str), a class (str), a score (float)."""
    rng = random.Random(seed)
    return [
        {
            "id": f"img{i:05d}",
            "image": rng.randbytes(rng.randint(100, 3000)),
            "caption": f"a picture of thing {i}",
            "cls": ["cat", "dog", "emu"][i % 3],
            "score": i / 7,
        }
        for i in range(n)
    ]


def read_all(path):
    ds = granary.Dataset(path)
    out = {}
    for i in range(len(ds)):
        data, label = ds[i]
        out[ds.path(i)] = (data, ds.classes[label] if label < len(ds.classes) else None)
    return out


def test_parquet_round_trips_columns_as_fields_or_blobs(tmp_path):
    pa = need("pyarrow")
    import pyarrow.parquet as pq

    src = rows(500)
    table = pa.table({k: [r[k] for r in src] for k in src[0]})
    pq.write_table(table, tmp_path / "part-0.parquet", row_group_size=100)
    # Fields: the image column as "jpg", the caption as "txt"; labels by class name.
    out = tmp_path / "f.granary"
    s = granary.from_parquet(tmp_path / "part-0.parquet", out, key="id",
                             fields={"jpg": "image", "txt": "caption"}, label="cls",
                             chunk_size=64 << 10, progress=False)
    assert s["files"] == 500 and s["classes"] == 3
    got = read_all(out)
    assert got == {r["id"]: ({"jpg": r["image"], "txt": r["caption"].encode()}, r["cls"]) for r in src}
    # One blob per sample, keys from row numbers; a directory of Parquet files.
    out2 = tmp_path / "b.granary"
    granary.from_parquet(tmp_path, out2, data="image", progress=False)
    got = read_all(out2)
    assert [got[f"{i:09d}"][0] for i in range(500)] == [r["image"] for r in src]
    # Columns of the wrong type, or missing, are refused before anything is written.
    for kwargs, msg in [(dict(data="score"), "is double"), (dict(data="nope"), "no column"),
                        (dict(data="image", label="score"), "label column"),
                        (dict(data="image", fields=["caption"]), "exactly one")]:
        with pytest.raises(ValueError, match=msg):
            granary.from_parquet(tmp_path / "part-0.parquet", tmp_path / "x.granary", progress=False,
                                 **kwargs)
    assert not (tmp_path / "x.granary").exists()


def test_parquet_image_structs_give_their_bytes(tmp_path):
    pa = need("pyarrow")
    import pyarrow.parquet as pq

    imgs = [bytes([i]) * (100 + i) for i in range(20)]
    struct = pa.array([{"bytes": b, "path": f"{i}.png"} for i, b in enumerate(imgs)],
                      pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    pq.write_table(pa.table({"image": struct, "label": list(range(20))}), tmp_path / "hf.parquet")
    out = tmp_path / "hf.granary"
    granary.from_parquet(tmp_path / "hf.parquet", out, fields={"png": "image"}, label="label",
                         progress=False)
    ds = granary.Dataset(out)
    assert sorted((ds[i][0]["png"], ds[i][1]) for i in range(len(ds))) == sorted(
        (b, i) for i, b in enumerate(imgs))


@pytest.fixture(scope="module")
def spark():
    need("pyspark")
    import sys

    from pyspark.sql import SparkSession

    # Spark's Python workers: this interpreter (and its granary), on loopback only.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"

    try:
        s = (SparkSession.builder.master("local[2,3]").appName("granary-tests")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.task.maxFailures", "3").getOrCreate())
    except Exception as e:  # no Java
        if REQUIRED:
            pytest.fail(f"GRANARY_REQUIRE_ENGINES=1 but Spark does not start: {e}")
        pytest.skip(f"Spark does not start: {e}")
    yield s
    s.stop()


def test_spark_writes_one_shard_per_partition_and_merges(spark, tmp_path):
    import granary.spark

    src = rows(400)
    df = spark.createDataFrame([(r["id"], bytearray(r["image"]), r["caption"], r["cls"]) for r in src],
                               ["id", "image", "caption", "cls"]).repartition(5)
    out = tmp_path / "spark.granary"
    s = granary.spark.write(df, str(out), key="id", fields={"jpg": "image", "txt": "caption"},
                            label="cls", chunk_size=32 << 10)
    assert s["files"] == 400 and len(s["shards"]) == 5
    assert read_all(out) == {r["id"]: ({"jpg": r["image"], "txt": r["caption"].encode()}, r["cls"])
                             for r in src}
    assert run("verify", out).returncode == 0


def test_a_spark_task_that_fails_once_rewrites_its_shard(spark, tmp_path):
    """The first attempt of partition 1's task dies after writing part of its shard; Spark
    retries it, and the dataset has every row exactly once."""
    import granary.spark

    marker = tmp_path / "failed-once"
    src = rows(300, seed=4)
    df = spark.createDataFrame([(r["id"], bytearray(r["image"])) for r in src], ["id", "image"])
    df = df.repartition(3)

    def flaky(it, marker=str(marker)):
        import os as _os

        from pyspark import TaskContext

        for n, row in enumerate(it):
            if TaskContext.get().partitionId() == 1 and n == 50 and not _os.path.exists(marker):
                open(marker, "w").close()
                raise RuntimeError("injected task failure")
            yield row

    df = spark.createDataFrame(df.rdd.mapPartitions(flaky), df.schema)
    out = tmp_path / "retry.granary"
    s = granary.spark.write(df, str(out), key="id", data="image")
    assert marker.exists(), "the failure was injected"
    assert s["files"] == 300
    assert {k: v[0] for k, v in read_all(out).items()} == {r["id"]: r["image"] for r in src}


@pytest.fixture(scope="module")
def ray_local():
    ray = need("ray")
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True,
             configure_logging=False, _node_ip_address="127.0.0.1")
    yield ray
    ray.shutdown()


def test_ray_writes_through_a_datasink_and_reads_chunks_as_blocks(ray_local, tmp_path):
    import granary.ray

    src = rows(300, seed=9)
    ds = ray_local.data.from_items([{"id": r["id"], "image": r["image"], "caption": r["caption"],
                                     "cls": r["cls"]} for r in src])
    out = tmp_path / "ray.granary"
    s = granary.ray.write(ds, str(out), shards=3, key="id", fields={"jpg": "image", "txt": "caption"},
                          label="cls", chunk_size=32 << 10)
    assert s["files"] == 300
    want = {r["id"]: ({"jpg": r["image"], "txt": r["caption"].encode()}, r["cls"]) for r in src}
    assert read_all(out) == want
    # The sink as users call it: write_datasink with a class table given.
    out2 = tmp_path / "sink.granary"
    sink = granary.ray.Datasink(str(out2), shards=2, key="id", data="image")
    ds.repartition(2).write_datasink(sink)
    assert sink.summary["files"] == 300
    # Read back: one block per chunk, columns key / label / one per field.
    back = granary.ray.read_granary(str(out))
    assert set(back.columns()) == {"key", "label", "jpg", "txt"}
    rows_back = back.take_all()
    assert len(rows_back) == 300
    classes = granary.Dataset(out).classes
    got = {r["key"]: ({"jpg": r["jpg"], "txt": r["txt"]}, classes[r["label"]]) for r in rows_back}
    assert got == want
    blobs = granary.ray.read_granary(str(out2)).take_all()
    assert sorted(r["data"] for r in blobs) == sorted(r["image"] for r in src)


def test_a_view_by_a_parquet_score_column_keyed_by_path(tmp_path):
    """A quality column in Parquet, keyed by path, chooses a view's samples (no rewrite)."""
    need("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq
    src = tmp_path / "src"
    paths = [f"c{i % 4}/s{i:03}.bin" for i in range(80)]
    for i, p in enumerate(paths):
        (src / p).parent.mkdir(parents=True, exist_ok=True)
        (src / p).write_bytes(bytes([i]) * 10)
    ds = tmp_path / "ds"
    assert run("pack", src, "-o", ds).returncode == 0
    quality = [((i * 37) % 100) / 100 for i in range(len(paths))]
    table = pa.table({"path": paths[::-1], "quality": quality[::-1]})
    pq.write_table(table, tmp_path / "q.parquet")
    out = tmp_path / "good.gview"
    m = granary.make_view(ds, out, parquet=tmp_path / "q.parquet", column="quality",
                          key_column="path", min_score=0.5)
    want = sorted(p for p, q in zip(paths, quality) if q >= 0.5)
    v = granary.Dataset(out)
    assert m == len(v) == len(want)
    assert sorted(v.path(i) for i in range(len(v))) == want
    assert run("read", out).returncode == 0


def test_damage_read_in_a_ray_task_reaches_the_driver_as_damaged_error(ray_local, tmp_path):
    """A flipped byte in a chunk read by a Ray task: the driver gets a ``DamagedError`` naming
    the chunk (granary's exceptions pickle as themselves, so Ray's task error keeps the type)."""
    import granary.ray

    src = tmp_path / "src"
    for i in range(120):
        (src / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (src / f"c{i % 2}" / f"f{i:03d}.bin").write_bytes(bytes([i % 251]) * (500 + i))
    out = tmp_path / "ds.granary"
    run("pack", src, "-o", out, "--chunk-size", "8KiB", "--compress", "none")
    chunk = sorted(out.glob("chunk-*.gchunk"))[1]
    b = bytearray(chunk.read_bytes())
    b[200] ^= 0xFF
    chunk.write_bytes(bytes(b))
    with pytest.raises(Exception) as e:
        granary.ray.read_granary(str(out)).take_all()
    assert isinstance(e.value, granary.DamagedError) or isinstance(
        getattr(e.value, "cause", None), granary.DamagedError), repr(e.value)
    assert chunk.name in str(e.value)


def test_a_writer_error_in_a_spark_task_names_itself_in_the_driver(spark, tmp_path):
    """Two rows with one key: the granary writer in the Spark task refuses the second, and the
    job fails in the driver with granary's message (never a dataset missing a row)."""
    import granary.spark

    df = spark.createDataFrame([("same", bytearray(b"one")), ("same", bytearray(b"two"))],
                               ["id", "image"]).coalesce(1)
    out = tmp_path / "dup.granary"
    with pytest.raises(Exception) as e:
        granary.spark.write(df, str(out), key="id", data="image")
    assert "same" in str(e.value) and ("twice" in str(e.value) or "already" in str(e.value)), \
        str(e.value)[-2000:]
    assert not (out / "snapshot.gsnap").exists()
