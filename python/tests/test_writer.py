"""granary.Writer: datasets written from Python, read back through the reader and the CLI."""

import os
import random
import signal
import subprocess
import sys
import textwrap

import pytest

import granary

from conftest import run

try:
    import numpy
except ImportError:  # the plain venv has no numpy
    numpy = None


def samples(n, classes=5, seed=0):
    """n (key, bytes, class name) in class order, as a class-sorted source gives them."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        c = f"class{i * classes // n}"
        data = rng.randbytes(rng.randint(100, 4000)) if i % 3 else b"caption %d " % i * 30
        out.append((f"{c}/{i:05}.bin", data, c))
    return out


def read_back(path):
    ds = granary.Dataset(path)
    got = {}
    for i in range(len(ds)):
        data, label = ds[i]
        got[ds.path(i)] = (data, ds.classes[label] if label < len(ds.classes) else None)
    return ds, got


def assert_chunks_mix_classes(out):
    """Chunks mix a class-sorted stream: every chunk of 20+ samples holds 3 of the 5 classes."""
    by_chunk = {}
    for line in run("ls", out, "--long").stdout.decode().splitlines():
        _id, _orig, _stored, _comp, chunk, cls, _path = line.split()
        by_chunk.setdefault(chunk, []).append(cls)
    assert len(by_chunk) > 5
    mixed = [len(set(v)) for v in by_chunk.values() if len(v) >= 20]
    assert mixed and min(mixed) >= 3, by_chunk


def test_written_samples_read_back_byte_exact_with_labels(tmp_path):
    src = samples(600)
    out = tmp_path / "w.granary"
    with granary.Writer(out, chunk_size=32 << 10, progress=False) as w:
        for key, data, c in src:
            assert w.write(key, data, label=c) is True
        assert len(w) == 600
    assert w.summary["files"] == 600 and w.summary["classes"] == 5
    ds, got = read_back(out)
    assert got == {k: (d, c) for k, d, c in src}
    # The CLI reads it like a packed tree.
    k, d, _ = src[17]
    assert run("cat", out, k).stdout == d
    assert run("verify", out).returncode == 0
    assert_chunks_mix_classes(out)


def test_an_expected_count_writes_straight_into_mixed_chunks(tmp_path):
    """expected=N: samples go straight into chunks, still a mix of a class-sorted stream,
    byte-exact; resume with it is refused, saying why."""
    src = samples(600)
    out = tmp_path / "e.granary"
    with granary.Writer(out, chunk_size=32 << 10, progress=False, expected=len(src)) as w:
        for key, data, c in src:
            assert w.write(key, data, label=c) is True
    assert w.summary["files"] == 600 and not w.summary["warnings"]
    assert not (tmp_path / ".e.granary.spill").exists()
    _, got = read_back(out)
    assert got == {k: (d, c) for k, d, c in src}
    assert run("verify", out).returncode == 0
    assert_chunks_mix_classes(out)
    with pytest.raises(ValueError, match="nothing to resume"):
        granary.Writer(tmp_path / "r.granary", expected=10, resume=True, progress=False)


def test_bytes_like_inputs_and_int_labels(tmp_path):
    out = tmp_path / "b.granary"
    want = {}
    with granary.Writer(out, progress=False) as w:
        w.write("bytes", b"abc", label=0)
        want["bytes"] = b"abc"
        w.write("bytearray", bytearray(b"xyz"), label=2)
        want["bytearray"] = b"xyz"
        w.write(b"memoryview", memoryview(b"0123456789")[2:6], label=1)
        want["memoryview"] = b"2345"
        if numpy is not None:
            a = numpy.arange(12, dtype=numpy.float32).reshape(3, 4)
            w.write("numpy", a, label=numpy.int64(1))
            want["numpy"] = a.tobytes()
            w.write("strided", a[:, ::2])
            want["strided"] = numpy.ascontiguousarray(a[:, ::2]).tobytes()
    ds, got = read_back(out)
    assert {k: v[0] for k, v in got.items()} == want
    assert ds.classes == ["0", "1", "2"]


def test_bad_input_is_a_clear_error_and_loses_nothing(tmp_path):
    out = tmp_path / "bad.granary"
    w = granary.Writer(out, progress=False)
    w.write("a/ok", b"1")
    for key in ["/abs", "a//b", "a/../b", "..", "", "a/./b"]:
        with pytest.raises(ValueError, match="not a valid path"):
            w.write(key, b"x")
    with pytest.raises(ValueError, match="written twice"):
        w.write("a/ok", b"again")
    for data in ["text", 3, None, [1, 2], 1.5]:
        with pytest.raises(TypeError, match="bytes-like"):
            w.write("k", data)
    with pytest.raises(TypeError, match="key must be"):
        w.write(3, b"x")
    with pytest.raises(ValueError, match="all have named fields or none"):
        w.write("multi", {"jpg": b"x", "txt": b"y"})
    with pytest.raises(TypeError, match="label"):
        w.write("k", b"x", label=1.5)
    w.write("a/two", b"2", label=1)
    with pytest.raises(ValueError, match="mixed"):
        w.write("a/three", b"3", label="cat")
    summary = w.close()
    assert summary["files"] == 2
    with pytest.raises(ValueError, match="closed already"):
        w.close()
    with pytest.raises(ValueError, match="closed"):
        w.write("late", b"x")
    _, got = read_back(out)
    assert set(got) == {"a/ok", "a/two"}
    with pytest.raises(ValueError, match="already exists"):
        granary.Writer(out, progress=False)
    with granary.Writer(out, force=True, progress=False) as w:
        w.write("new", b"n")
    assert set(read_back(out)[1]) == {"new"}
    with pytest.raises(ValueError, match="compression"):
        granary.Writer(tmp_path / "z", compress="lzma", progress=False)


def test_an_exception_in_the_loop_publishes_nothing_and_resume_continues(tmp_path):
    out = tmp_path / "r.granary"
    src = samples(300)
    with pytest.raises(RuntimeError):
        with granary.Writer(out, progress=False) as w:
            for i, (k, d, c) in enumerate(src):
                if i == 200:
                    raise RuntimeError("the source failed")
                w.write(k, d, label=c)
    assert not out.exists()
    with pytest.raises(ValueError, match="resume"):
        granary.Writer(out, progress=False)
    with granary.Writer(out, resume=True, progress=False) as w:
        assert w.has_resumed(src[0][0])
        flags = [w.write(k, d, label=c) for k, d, c in src]
    assert flags.count(False) == 200 and flags.count(True) == 100
    assert read_back(out)[1] == {k: (d, c) for k, d, c in src}


KILLED_WRITER = textwrap.dedent(
    """
    import os, signal, sys, random
    import granary
    out, n, kill_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(1)
    w = granary.Writer(out, resume=True, progress=False, buckets=4)
    for i in range(n):
        data = rng.randbytes(2000 + i % 500)
        w.write(f"s/{i:05}", data, label=i % 3)
        if i == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    w.close()
    """
)


def test_kill_9_mid_write_then_resume_gives_the_whole_dataset(tmp_path):
    out = tmp_path / "k.granary"
    script = tmp_path / "writer.py"
    script.write_text(KILLED_WRITER)
    p = subprocess.run([sys.executable, str(script), str(out), "3000", "2500"])
    assert p.returncode == -signal.SIGKILL
    assert not out.exists()
    p = subprocess.run([sys.executable, str(script), str(out), "3000", "-1"], capture_output=True)
    assert p.returncode == 0, p.stderr.decode()
    rng = random.Random(1)
    want = {f"s/{i:05}": rng.randbytes(2000 + i % 500) for i in range(3000)}
    ds, got = read_back(out)
    assert {k: v[0] for k, v in got.items()} == want
    assert run("verify", out).returncode == 0


def test_shards_then_merge(tmp_path):
    out = tmp_path / "s.granary"
    src = samples(400)
    names = sorted({c for _, _, c in src})
    for i in range(3):
        with granary.Writer(out, shard=(i, 3), classes=names, progress=False) as w:
            for j, (k, d, c) in enumerate(src):
                if j % 3 == i:
                    w.write(k, d, label=c)
        assert w.summary["action"] == "shard"
    with pytest.raises(ValueError, match="class table"):
        with granary.Writer(tmp_path / "t", shard=(0, 2), progress=False) as w:
            w.write("k", b"x", label=0)
    m = granary.merge(out)
    assert m["files"] == 400
    assert read_back(out)[1] == {k: (d, c) for k, d, c in src}


def field_samples(n):
    """n samples with fields jpg, txt and (every other one) json, keys without dots."""
    rng = random.Random(5)
    out = []
    for i in range(n):
        f = {"jpg": rng.randbytes(rng.randint(50, 3000)), "txt": f"caption {i}".encode()}
        if i % 2 == 0:
            f["json"] = b'{"i": %d}' % i
        out.append((f"part{i % 4}/s{i:05}", f, i % 3))
    return out


def test_samples_with_fields_read_back_as_dicts_field_by_field(tmp_path):
    out = tmp_path / "f.granary"
    src = field_samples(300)
    with granary.Writer(out, chunk_size=64 << 10, progress=False) as w:
        for k, f, c in src:
            if numpy is not None and c == 1:
                f = dict(f, jpg=numpy.frombuffer(f["jpg"], numpy.uint8))  # arrays are fields too
            w.write(k, f, label=c)
        with pytest.raises(ValueError, match="no '.'"):
            w.write("dotted.key", {"jpg": b"x"})
        with pytest.raises(ValueError, match="not a valid field name"):
            w.write("k", {"a/b": b"x"})
        with pytest.raises(ValueError, match="all have named fields or none"):
            w.write("blob", b"x")
        with pytest.raises(TypeError, match="bytes-like"):
            w.write("k2", {"jpg": "text"})
    want = {k: (f, c) for k, f, c in src}
    ds = granary.Dataset(out)
    assert ds.field_names == ["jpg", "json", "txt"]
    for i in range(len(ds)):
        fields, label = ds[i]
        f, c = want[ds.path(i)]
        assert fields == f and label == c
    # A subset: only those fields are read (one ranged read each).
    sub = granary.Dataset(out, fields=["txt"])
    assert all(set(sub[i][0]) == {"txt"} for i in range(0, len(sub), 7))
    with pytest.raises(ValueError, match="no named fields"):
        granary.Dataset(_plain(tmp_path), fields=["x"])
    # The CLI shows and restores KEY.FIELD files, as WebDataset names them.
    names = run("ls", out).stdout.decode().split()
    assert len(names) == sum(len(f) for _, f, _ in src)
    k, f, _ = src[10]
    assert run("cat", out, f"{k}.txt").stdout == f["txt"]
    run("extract", out, "-o", tmp_path / "x")
    for k, f, _ in src:
        for name, data in f.items():
            assert (tmp_path / "x" / f"{k}.{name}").read_bytes() == data
    assert run("verify", out).returncode == 0


def _plain(tmp_path):
    p = tmp_path / "plain.granary"
    with granary.Writer(p, progress=False) as w:
        w.write("a", b"1")
    return p


@pytest.mark.parametrize("batch", [None, 16])
def test_streams_of_field_samples_give_fields_per_sample_and_per_batch(tmp_path, batch):
    out = tmp_path / "s.granary"
    src = field_samples(200)
    with granary.Writer(out, chunk_size=32 << 10, progress=False) as w:
        for k, f, c in src:
            w.write(k, f, label=c)
    want = {k: f for k, f, _ in src}
    ds = granary.Dataset(out)
    by_id = {i: want[ds.path(i)] for i in range(len(ds))}
    it = granary.IterableDataset(out, batch_size=batch, seed=3)
    seen = 0
    for item in it:
        if batch is None:
            got = {n: bytes(v) for n, v in item["fields"].items()}
            assert got == by_id[item["id"]]
            seen += 1
        else:
            ids = [int(i) for i in item["id"]]
            for name, col in item["fields"].items():
                assert len(col) == len(ids)
                for i, v in zip(ids, col):
                    exp = by_id[i].get(name)
                    assert (v is None and exp is None) or bytes(v) == exp
            seen += len(ids)
    assert seen == len(src)
    only = granary.IterableDataset(out, batch_size=batch, fields=["txt"])
    item = next(iter(only))
    assert set(item["fields"]) == {"txt"}


def test_from_webdataset_imports_tar_shards_as_field_samples(tmp_path):
    import io
    import tarfile

    want = {}
    for s in range(2):
        with tarfile.open(tmp_path / f"shard-{s:06d}.tar", "w") as t:
            for i in range(40):
                key = f"{s}{i:04d}"
                for ext, data in [("jpg", bytes([i]) * (100 + i)), ("cls", str(i % 2).encode())]:
                    ti = tarfile.TarInfo(f"{key}.{ext}")
                    ti.size = len(data)
                    t.addfile(ti, io.BytesIO(data))
                    want.setdefault(key, {})[ext] = data
    out = tmp_path / "wds.granary"
    s = granary.from_webdataset(str(tmp_path / "shard-{000000..000001}.tar"), out, progress=False)
    assert s["files"] == 80 and s["classes"] == 2
    ds = granary.Dataset(out)
    for i in range(len(ds)):
        fields, label = ds[i]
        assert fields == want[ds.path(i)]
        assert label == int(fields["cls"])
    with pytest.raises(granary.GranaryError, match="shard-000009.tar"):
        granary.from_webdataset(tmp_path / "shard-000009.tar", tmp_path / "none.granary")


@pytest.mark.parametrize("expected", [None, 3000])
def test_one_writer_used_from_several_threads_keeps_every_sample(tmp_path, expected):
    import threading

    data = samples(3000)
    out = tmp_path / "ds.granary"
    kw = {} if expected is None else {"expected": expected}
    w = granary.Writer(out, **kw)
    errors = []

    def feed(part):
        try:
            for key, d, c in part:
                w.write(key, d, c)
        except BaseException as e:  # noqa: BLE001 - the test reports any
            errors.append(e)

    threads = [threading.Thread(target=feed, args=(data[i::2],)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert w.close()["files"] == 3000
    _, got = read_back(out)
    assert got == {k: (d, c) for k, d, c in data}


def test_a_key_that_is_both_a_file_and_a_directory_is_refused_when_written(tmp_path):
    out = tmp_path / "ds.granary"
    w = granary.Writer(out)
    w.write("a/k3", b"file")
    with pytest.raises(ValueError, match=r'"a/k3/sub" lies under "a/k3"' ):
        w.write("a/k3/sub", b"under a file")
    w.write("b/k4/sub", b"in a directory")
    with pytest.raises(ValueError, match=r'"b/k4" is a directory of keys written before' ):
        w.write("b/k4", b"a directory")
    w.abort()
    # Resumed: the refused samples were never spilled, so nothing stops the rerun.
    w = granary.Writer(out, resume=True)
    assert w.write("a/k3", b"file") is False and w.write("b/k4/sub", b"in a directory") is False
    w.write("c", b"new")
    assert w.close()["files"] == 3
    _, got = read_back(out)
    assert sorted(got) == ["a/k3", "b/k4/sub", "c"]
