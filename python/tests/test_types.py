"""Typed fields: a value written as a numpy array, str, dict or int reads back as the same type
and value, through the map-style dataset, the streams and their batches."""

import json

import pytest

import granary

from conftest import run

np = pytest.importorskip("numpy")


def typed_samples(n):
    out = []
    for i in range(n):
        img = (np.arange(32 * 32 * 3, dtype=np.uint8).reshape(32, 32, 3) + i).astype(np.uint8)
        out.append((f"part{i % 3}/s{i:04}", {
            "img": img,
            "emb": np.linspace(0, 1, 8, dtype=np.float32) * i,
            "txt": f"caption number {i} \u2013 \u00e9t\u00e9",
            "meta": {"i": i, "tags": ["a", "b"][: i % 3], "score": i / 7, "ok": i % 2 == 0},
            "cls": i - 100,
            "raw": bytes([i % 256]) * (i % 5 + 1),
        }))
    return out


def same(a, b):
    if isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape \
            and (a == b).all()
    return type(a) is type(b) and a == b


def written(tmp_path, n):
    """A dataset of ``typed_samples(n)`` written with small chunks, and its samples."""
    out = tmp_path / "t.granary"
    src = typed_samples(n)
    with granary.Writer(out, chunk_size=16 << 10, progress=False) as w:
        for k, f in src:
            w.write(k, f)
    return out, src


def test_fields_read_back_as_the_types_and_values_written(tmp_path):
    out, src = written(tmp_path, 60)
    ds = granary.Dataset(out)
    assert ds.field_types == {
        "cls": "int", "emb": "ndarray:float32:8", "img": "ndarray:uint8:32,32,3",
        "meta": "json", "raw": "bytes", "txt": "str",
    }
    want = dict(src)
    for i in range(len(ds)):
        got, _ = ds[i]
        exp = want[ds.path(i)]
        for name, value in exp.items():
            assert same(got[name], value), (name, got[name], value)
        assert not got["img"].flags.writeable  # a view of the bytes read, not a copy
    # raw=True: the stored bytes.
    raw = granary.Dataset(out, raw=True)
    got, _ = raw[0]
    exp = want[raw.path(0)]
    assert got["txt"] == exp["txt"].encode()
    assert got["img"] == exp["img"].tobytes()
    assert json.loads(got["meta"]) == exp["meta"]
    # The command line shows the types and serves the stored bytes.
    info = run("info", out, "--json")
    assert json.loads(info.stdout)["field_types"]["img"] == "ndarray:uint8:32,32,3"
    assert run("verify", out).returncode == 0


@pytest.mark.parametrize("batch", [None, 8])
def test_streams_give_typed_fields_and_stack_fixed_shape_arrays(tmp_path, batch):
    out, src = written(tmp_path, 40)
    ds = granary.Dataset(out)
    want = {i: dict(src)[ds.path(i)] for i in range(len(ds))}
    seen = 0
    for item in granary.IterableDataset(out, batch_size=batch, seed=1):
        if batch is None:
            for name, value in want[item["id"]].items():
                assert same(item["fields"][name], value), name
            seen += 1
            continue
        ids = [int(i) for i in item["id"]]
        img = item["fields"]["img"]
        assert isinstance(img, np.ndarray) and img.shape == (len(ids), 32, 32, 3)
        for j, i in enumerate(ids):
            assert (img[j] == want[i]["img"]).all()
            assert item["fields"]["txt"][j] == want[i]["txt"]
            assert item["fields"]["cls"][j] == want[i]["cls"]
        seen += len(ids)
    assert seen == len(src)


def test_a_field_keeps_one_type_and_npy_takes_any_array(tmp_path):
    w = granary.Writer(tmp_path / "a.granary", progress=False)
    w.write("s0", {"x": np.zeros((2, 3), np.uint8)})
    with pytest.raises(ValueError, match="npy"):
        w.write("s1", {"x": np.zeros((4, 3), np.uint8)})
    with pytest.raises(ValueError, match="holds ndarray"):
        w._w.declare_field_type(b"x", "str")
    w.abort()
    out = tmp_path / "b.granary"
    with granary.Writer(out, progress=False, schema={"x": "npy"}) as w:
        for i in range(5):
            w.write(f"s{i}", {"x": np.ones((i + 1, 2), np.int16) * i})
    ds = granary.Dataset(out)
    assert ds.field_types == {"x": "npy"}
    for i in range(5):
        got, _ = ds[ds.lookup(f"s{i}")]
        assert got["x"].shape == (i + 1, 2) and got["x"].dtype == np.int16
    with pytest.raises(ValueError, match="unknown field type"):
        granary.Writer(tmp_path / "c.granary", progress=False, schema={"x": "blob"})


def test_images_are_bytes_unless_pil_images_are_asked_for(tmp_path):
    """An ``image:png`` field stores what it is given (encoded bytes, or a PIL image encoded as
    PNG); it reads back as those bytes, and as PIL images only with ``images="pil"``."""
    Image = pytest.importorskip("PIL.Image")  # in the torch2 suite (requirements-torch2.txt)
    import io
    out = tmp_path / "img.granary"
    pixels = [np.full((4, 5, 3), i * 40, np.uint8) for i in range(6)]
    encoded = []
    with granary.Writer(out, schema={"png": "image:png"}, progress=False) as w:
        for i, px in enumerate(pixels):
            img = Image.fromarray(px)
            if i % 2:
                buf = io.BytesIO()
                img.save(buf, format="PNG")
                value = buf.getvalue()
            else:
                value = img
            w.write(f"s{i}", {"png": value, "i": i})
    ds = granary.Dataset(out)
    assert ds.field_types["png"] == "image:png"
    pil = granary.Dataset(out, images="pil")
    for k in range(len(ds)):
        i = ds[k][0]["i"]
        stored = ds[k][0]["png"]
        assert isinstance(stored, bytes) and stored.startswith(b"\x89PNG")
        got = pil[k][0]["png"]
        assert isinstance(got, Image.Image) and got.size == (5, 4)
        assert (np.asarray(got) == pixels[i]).all()
    batches = list(granary.IterableDataset(out, batch_size=3, images="pil"))
    assert sum(len(b["id"]) for b in batches) == len(pixels)
    for b in batches:
        for j, i in enumerate(b["fields"]["i"]):
            assert (np.asarray(b["fields"]["png"][j]) == pixels[i]).all()
    with pytest.raises(ValueError, match="images must be"):
        granary.Dataset(out, images="cv2")
    with pytest.raises(TypeError, match="PIL image"):
        granary.Writer(tmp_path / "bad.granary", schema={"p": "image:png"},
                       progress=False).write("s", {"p": 3})
