"""Tests of granary_format.py: the golden datasets against the Rust CLI (a black box), the
test vectors of format/testdata and their damaged variants."""

import hashlib
import json
import os
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

import granary_format as gf

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = sorted((ROOT / "tests" / "golden").glob("v2*/dataset"))
LEGACY = sorted((ROOT / "tests" / "golden").glob("v1*/dataset"))
TESTDATA = ROOT / "format" / "testdata"
VECTORS = sorted(p.parent.name for p in TESTDATA.glob("*/expected.json"))
DAMAGED = json.loads((TESTDATA / "damaged.json").read_text()) \
    if (TESTDATA / "damaged.json").exists() else []
ERRORS = {"damaged": gf.Damaged, "missing": gf.Missing, "unsupported": gf.Unsupported}
BIN = os.environ.get("GRANARY_BIN")
needs_bin = pytest.mark.skipif(not BIN, reason="GRANARY_BIN is unset: it names the granary "
                                                "binary the golden datasets are compared with")


def _ids(paths):
    return [p.parent.name for p in paths]


# ---------------------------------------------------------------------------------------------
# Golden datasets, compared with what `granary extract` restores


def _tree(root):
    """({relative path: (bytes, mode, mtime_ns)}, {relative dir: (mode, mtime_ns)}) of a tree."""
    files, dirs = {}, {}
    base = os.fsencode(root)
    for top, subdirs, names in os.walk(base):
        for name in subdirs + names:
            full = os.path.join(top, name)
            st = os.lstat(full)
            rel = os.path.relpath(full, base)
            if name in subdirs:
                dirs[rel] = (st.st_mode & 0o7777, st.st_mtime_ns)
            else:
                with open(full, "rb") as f:
                    files[rel] = (f.read(), st.st_mode & 0o7777, st.st_mtime_ns)
    return files, dirs


def _expected_tree(ds):
    """The same, from the reader: fields become KEY.NAME files (as the CLI shows them)."""
    files, dirs = {}, {}
    for entry in ds.entries():
        if entry.sample is None:
            dirs[entry.path] = (entry.mode, entry.mtime_ns)
        elif ds.incompat & gf.FIELDS:
            for name, _, data in ds.fields(entry.sample):   # with the key's attributes (§3)
                files[entry.path + b"." + name] = (data, entry.mode, entry.mtime_ns)
        else:
            files[entry.path] = (ds.read(entry.sample), entry.mode, entry.mtime_ns)
    return files, dirs


def _same_attrs(got, want, what):
    mode, mtime = want
    if mode is not None:    # extract does not restore set-user-id and set-group-id bits
        assert got[0] == mode & ~0o6000, f"{what}: mode"
    if mtime is not None:
        assert got[1] == mtime, f"{what}: mtime"


@needs_bin
@pytest.mark.parametrize("dataset", GOLDEN, ids=_ids(GOLDEN))
def test_golden_matches_extract(dataset, tmp_path):
    out = tmp_path / "out"
    subprocess.run([BIN, "extract", str(dataset), "-o", str(out)], check=True,
                   capture_output=True)
    got_files, got_dirs = _tree(out)
    want_files, want_dirs = _expected_tree(gf.open_dataset(dataset))
    assert sorted(got_files) == sorted(want_files)
    assert sorted(got_dirs) == sorted(want_dirs)
    for path, (data, mode, mtime) in want_files.items():
        assert got_files[path][0] == data, path
        _same_attrs(got_files[path][1:], (mode, mtime), path)
    for path, attrs in want_dirs.items():
        _same_attrs(got_dirs[path], attrs, path)


@needs_bin
@pytest.mark.parametrize("dataset", GOLDEN, ids=_ids(GOLDEN))
def test_golden_cli_agrees(dataset, capsysbinary):
    info = json.loads(subprocess.run([BIN, "info", "--json", str(dataset)], check=True,
                                     capture_output=True).stdout)
    ds = gf.open_dataset(dataset)
    assert (ds.dataset_id, ds.content_digest, ds.generation, ds.parent) == \
        (info["dataset_id"], info["content_digest"], info["generation"], info["parent"])
    assert (ds.sample_count, ds.chunk_count) == (info["samples"], info["chunks"])
    assert [c.decode() for c in ds.classes] == info["classes"]
    assert {k.decode(): v for k, v in ds.field_types.items()} == info["field_types"]
    listing = subprocess.run([BIN, "ls", str(dataset)], check=True, capture_output=True).stdout
    assert gf.main(["ls", str(dataset)]) == 0
    assert capsysbinary.readouterr().out == listing
    last = os.fsdecode(listing.splitlines()[-1])    # the CLI's cat agrees too
    assert gf.main(["cat", str(dataset), last]) == 0
    assert capsysbinary.readouterr().out == \
        subprocess.run([BIN, "cat", str(dataset), last], check=True, capture_output=True).stdout


@pytest.mark.parametrize("dataset", GOLDEN, ids=_ids(GOLDEN))
def test_golden_reads_and_verifies(dataset):
    ds = gf.open_dataset(dataset)
    for s in range(ds.sample_count):
        path = ds.path(s)
        assert ds.lookup(path) == s
        assert ds.stat(s)[0] == len(ds.read(s))
    assert ds.lookup(b"no/such/path") is None
    # Walking listdir from the root meets every directory and file (a key's as KEY.NAME) once.
    seen, todo = [], [b""]
    while todo:
        for entry in ds.listdir(todo.pop()):
            seen.append(entry)
            if entry.sample is None:
                todo.append(entry.path)
    files, dirs = _expected_tree(ds)
    assert sorted(e.path for e in seen) == sorted(list(files) + list(dirs))
    assert all(e.size == len(files[e.path][0]) for e in seen if e.sample is not None)
    with pytest.raises(NotADirectoryError):
        ds.listdir(ds.path(0))
    with pytest.raises(FileNotFoundError):
        ds.listdir(b"no/such/dir")
    assert ds.verify() == []


def test_golden_typed_values():
    ds = gf.open_dataset(ROOT / "tests" / "golden" / "v2-typed" / "dataset")
    for s in range(ds.sample_count):
        for name, descriptor, data in ds.fields(s):
            value = ds.value(s, name)
            if descriptor == "int":
                assert value == struct.unpack("<q", data)[0]
            elif descriptor == "str":
                assert value == data.decode()
            elif descriptor == "json":
                assert value == json.loads(data)
            elif descriptor.startswith("ndarray:"):
                assert len(value[2]) == len(data) and value[0] == descriptor.split(":")[1]


@pytest.mark.parametrize("dataset", LEGACY, ids=_ids(LEGACY))
def test_format_1_is_unsupported_and_names_upgrade(dataset):
    with pytest.raises(gf.Unsupported, match="granary upgrade"):
        gf.open_dataset(dataset)


def test_verify_notes_other_files(tmp_path):
    root = tmp_path / "dataset"
    shutil.copytree(ROOT / "tests" / "golden" / "v2-typed" / "dataset", root)
    (root / "chunk-0000000001.gchunk").write_bytes(b"")    # not chunk 1's name (§2)
    assert gf.open_dataset(root).verify() == ["chunk-0000000001.gchunk"]


def test_chunk_names():
    assert gf.chunk_name(5) == "chunk-00000005.gchunk"
    assert gf.chunk_name(5, 2) == "chunk-00000005.r2.gchunk"
    assert gf.chunk_name(10 ** 8, 1) == "chunk-100000000.r1.gchunk"


COMPACTED = [n for n in VECTORS if "revisions" in json.loads((TESTDATA / n / "expected.json")
                                                             .read_text())]


@pytest.mark.parametrize("name", COMPACTED or [None])
def test_compacted_reads_only_its_revisions(name, tmp_path):
    """A compacted vector: removed records (deleted, length 0, in no footer), and other
    revisions' files are no part of the dataset (§2): verify notes them, reads never use them."""
    if name is None:
        pytest.skip("no test vector has REVISIONS")
    root = tmp_path / "dataset"
    shutil.copytree(TESTDATA / name / "dataset", root)
    ds = gf.open_dataset(root)
    removed = [s for s in ds.deleted if ds._span(s)[2] & gf.REMOVED]
    assert removed and all(ds._span(s)[0] == ds._span(s)[1] for s in removed)
    assert not any(ds._span(s)[2] & gf.REMOVED for s in range(ds.sample_count)
                   if s not in ds.deleted)
    c = max(range(ds.chunk_count), key=lambda c: ds.revisions[c])
    r = ds.revisions[c]
    assert r >= 1
    live = next(s for s in range(ds.chunks[c].first_sample,
                                 ds.chunks[c].first_sample + ds.chunks[c].samples)
                if s not in ds.deleted)
    want = ds.read(live)
    # An older revision's name holding other bytes (a chunk with one record cut) is ignored.
    stale = gf.chunk_name(c, r - 1)
    (root / stale).write_bytes((root / gf.chunk_name(c, r)).read_bytes()[:-1])
    assert ds.read(live) == want
    assert ds.verify() == [stale]


def test_overlong_varint_is_refused():
    assert gf._varint(b"\x80\x01", 0, 2, "here") == (128, 2)
    with pytest.raises(gf.Damaged, match="overlong"):
        gf._varint(b"\x80\x00", 0, 2, "here")


def test_missing_snapshot(tmp_path):
    with pytest.raises(gf.Missing):
        gf.open_dataset(tmp_path)


def test_value_decoding():
    assert gf.decode_value("int", struct.pack("<q", -5)) == -5
    assert gf.decode_value("ndarray:float16:2", struct.pack("<2e", 1.5, -2.0)) == \
        ("float16", (2,), [1.5, -2.0])
    assert gf.decode_value("ndarray:int32:", struct.pack("<i", 7)) == ("int32", (), [7])
    assert gf.decode_value("image:png", b"\x89PNG") == b"\x89PNG"
    for descriptor, data in [("int", b"1234"), ("str", b"\xff"), ("json", b"{"),
                             ("json", b"NaN"), ("ndarray:uint16:3", b"\0" * 4)]:
        with pytest.raises(gf.Damaged):
            gf.decode_value(descriptor, data)
    assert all(map(gf.valid_type, ["bytes", "ndarray:bool:0", "ndarray:uint8:4,4,3", "npy"]))
    assert not any(map(gf.valid_type, ["ndarray:uint8:04", "ndarray:int:1", "image:", "float"]))


# ---------------------------------------------------------------------------------------------
# Test vectors (format/testdata)


def _skip_without_vectors():
    if not VECTORS:
        pytest.skip(f"{TESTDATA} holds no test vectors yet")


def _hexes(values):
    return [v.hex() for v in values]


@pytest.mark.parametrize("name", VECTORS or [None])
def test_vector(name):
    _skip_without_vectors()
    expected = json.loads((TESTDATA / name / "expected.json").read_text())
    ds = gf.open_dataset(TESTDATA / name / "dataset")
    for key in ("dataset_id", "content_digest", "generation", "parent", "incompat", "compat"):
        assert getattr(ds, key) == expected[key], key
    assert _hexes(ds.classes) == expected["classes_hex"]
    assert ds.entry_count == expected["entries"]
    assert [{"id": c.id, "samples": c.samples, "file_size": c.file_size, "digest": c.digest.hex()}
            for c in ds.chunks] == expected["chunks"]
    assert [{"path_hex": e.path.hex(), "mode": e.mode, "mtime_ns": e.mtime_ns}
            for e in ds.entries() if e.sample is None] == expected["dirs"]
    # Each chunk's revision (§6.9), listed with REVISIONS: its file is named by it (§2).
    assert ds.revisions == expected.get("revisions", [0] * ds.chunk_count)
    assert ("revisions" in expected) == bool(ds.incompat & gf.REVISIONS)
    for c, r in enumerate(ds.revisions):
        assert (TESTDATA / name / "dataset" / gf.chunk_name(c, r)).is_file()
    # Deleted samples (§6.8): listed with their generation, in no listing, unreadable by id.
    deleted = expected.get("deleted", [])
    assert [{"id": s, "generation": g} for s, g in sorted(ds.deleted.items())] == deleted
    assert ds.sample_count == len(expected["samples"]) + len(deleted)
    assert ds.live_count == len(expected["samples"])
    assert sorted([w["id"] for w in expected["samples"]] + [d["id"] for d in deleted]) == \
        list(range(ds.sample_count))
    files = [e for e in ds.entries() if e.sample is not None]
    assert sorted(e.sample for e in files) == [w["id"] for w in expected["samples"]]
    for d in deleted:
        for read in (ds.read, ds.path, ds.stat, ds.label, ds.compression, ds.fields):
            with pytest.raises(gf.Deleted, match="deleted"):
                read(d["id"])
    for want in expected["samples"]:
        s = want["id"]
        data = ds.read(s)
        size, mode, mtime = ds.stat(s)
        got = {"id": s, "path_hex": ds.path(s).hex(), "size": len(data), "crc32": zlib.crc32(data),
               "sha256": hashlib.sha256(data).hexdigest(), "label": ds.label(s),
               "compression": ds.compression(s), "mode": mode, "mtime_ns": mtime,
               "fields": _vector_fields(ds, s)}
        assert size == len(data)
        assert ds.lookup(ds.path(s)) == s
        assert got == want, f"sample {s}"
    assert ds.verify() == []


DELETING = [n for n in VECTORS if "deleted" in json.loads((TESTDATA / n / "expected.json")
                                                           .read_text())]


@pytest.mark.parametrize("name", DELETING or [None])
def test_deleted_samples_are_neither_listed_nor_found(name):
    """A deleted sample's path (its chunk's footer still holds it) finds nothing, and a walk of
    the directories meets every other sample, and no deleted one (§6.8)."""
    if name is None:
        pytest.skip("no test vector has deletions")
    ds = gf.open_dataset(TESTDATA / name / "dataset")
    assert ds.deleted and ds.live_count == ds.sample_count - len(ds.deleted)
    seen, todo = set(), [b""]
    while todo:
        for entry in ds.listdir(todo.pop()):
            if entry.sample is None:
                todo.append(entry.path)
            else:
                seen.add(entry.sample)
    assert seen == set(range(ds.sample_count)) - set(ds.deleted)
    for ch in ds.chunks:
        with ds._open_chunk(ch) as f:
            features = ds._check_chunk(f, ch)
            f.seek(0)
            foot = gf._parse_footer(f.read(), features, f.name)
        # The footer lists the samples whose records compaction did not remove (§6.9).
        held = [s for s in range(ch.first_sample, ch.first_sample + ch.samples)
                if not ds._span(s)[2] & gf.REMOVED]
        assert len(held) == len(foot["paths"])
        for s, path in zip(held, foot["paths"]):
            assert ds.lookup(path) == (None if s in ds.deleted else s), path


def _vector_fields(ds, s):
    fields = ds.fields(s)
    if fields is None:
        return None
    out = []
    for name, descriptor, data in fields:
        field = {"name": name.decode(), "type": descriptor, "len": len(data),
                 "crc32": zlib.crc32(data)}
        if descriptor in ("int", "str", "json") or descriptor.startswith("ndarray:"):
            value = ds.value(s, name)
            field["value"] = value if not descriptor.startswith("ndarray:") else \
                {"dtype": value[0], "shape": list(value[1]), "data": value[2]}
        out.append(field)
    return out


# ---------------------------------------------------------------------------------------------
# Damaged variants (format/testdata/damaged.json)


def _reseal(path):
    """Recompute every block CRC, the content digest, the table CRC and the header CRC (§5)."""
    data = bytearray(path.read_bytes())
    shift, body_end = data[10], struct.unpack_from("<Q", data, 40)[0]
    size = 1 << shift
    table = b"".join(struct.pack("<I", zlib.crc32(data[at:min(at + size, body_end)]))
                     for at in range(96, body_end, size))
    data = data[:body_end] + table
    data[56:72] = hashlib.sha256(bytes(data[:56]) + bytes(data[96:])).digest()[:16]
    struct.pack_into("<I", data, 88, zlib.crc32(table))
    struct.pack_into("<I", data, 92, zlib.crc32(data[:92]))
    path.write_bytes(bytes(data))


def _apply(edit, root):
    path = root / edit["file"]
    op = edit["op"]
    if op == "delete":
        path.unlink()
    elif op == "truncate":
        with open(path, "r+b") as f:
            f.truncate(edit["len"])
    elif op == "copy_from":
        shutil.copyfile(root / edit["from"], path)
    elif op == "reseal":
        _reseal(path)
    else:
        data = bytearray(path.read_bytes())
        if op == "flip":
            data[edit["at"]] ^= edit["mask"]
        elif op == "put":
            patch = bytes.fromhex(edit["hex"])
            data[edit["at"]:edit["at"] + len(patch)] = patch
        else:
            raise ValueError(f"unknown edit {op}")
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("case", DAMAGED or [None],
                         ids=[c["name"] for c in DAMAGED] or ["none"])
def test_damaged(case, tmp_path):
    _skip_without_vectors()
    if case is None:
        pytest.skip(f"{TESTDATA / 'damaged.json'} does not exist yet")
    root = tmp_path / "dataset"
    shutil.copytree(TESTDATA / case["base"] / "dataset", root)
    for edit in case["edits"]:
        _apply(edit, root)
    error, when = ERRORS[case["error"]], case["when"]
    if when == "open":
        with pytest.raises(error) as caught:
            gf.open_dataset(root)
    else:
        ds = gf.open_dataset(root)
        with pytest.raises(error) as caught:
            if when == "read":     # a sample's bytes and, with fields, each field
                ds.read(case["sample"])
                ds.fields(case["sample"])
            elif when == "lookup":
                s = ds.lookup(bytes.fromhex(case["path_hex"]))
                assert s is not None, "the lookup found nothing, it raised nothing"
                ds.read(s)
            else:
                assert when == "verify"
                ds.verify()
    assert type(caught.value) is error


# ---------------------------------------------------------------------------------------------
# Damage of our own, resealed like a hostile writer would, each where SPEC §9 says it is found


def _sections(data):
    count = struct.unpack_from("<I", data, 96)[0]
    return {kind: (off, length) for kind, _, off, length in
            (struct.unpack_from("<IIQQ", data, 104 + 24 * i) for i in range(count))}


def _first_page_end(data):
    """Where page 0's restart table ends (its last byte + 1)."""
    off, _ = _sections(data)[7]
    e, p, first_paths_len, _, _ = struct.unpack_from("<5Q", data, off)
    n = struct.unpack_from("<Q", data, 32)[0]
    align = lambda x: (x + 7) & ~7   # noqa: E731
    pages = off + align(align(40 + 16 * (p + 1) + first_paths_len) + 4 * n)
    return pages + struct.unpack_from("<Q", data, off + 48)[0]


def _put(at_of, value, fmt="<I"):
    return lambda data: struct.pack_into(fmt, data, at_of(data), value)


OWN_DAMAGE = {
    # name: (snapshot edit, when, error)
    "record flags reserved bit": (_put(lambda d: _sections(d)[6][0] + 16 * 5 + 6, 0x8000, "<H"),
                                  "read", gf.Damaged),
    "label above the class count": (_put(lambda d: _sections(d)[6][0] + 16 * 5 + 12, 4),
                                    "label", gf.Damaged),
    "parent at generation 0": (_put(lambda d: _sections(d)[1][0] + 8, 1), "open", gf.Damaged),
    "unknown section kind": (_put(lambda d: 104 + 24 * (len(_sections(d)) - 1), 9), "open",
                             gf.Damaged),
    "restart count": (_put(lambda d: _first_page_end(d) - 4, 99), "lookup", gf.Damaged),
    "chunk orig_bytes": (_put(lambda d: _sections(d)[2][0] + 24, 1, "<Q"), "verify", gf.Damaged),
    "class count": (_put(lambda d: _sections(d)[4][0] + 8 * 11 + 1, 0x7F, "<B"), "verify",
                    gf.Damaged),
    "padding": (_put(lambda d: _sections(d)[3][0] + _sections(d)[3][1], 1, "<B"), "verify",
                gf.Damaged),
}


@pytest.mark.parametrize("name", sorted(OWN_DAMAGE))
def test_own_damage(name, tmp_path):
    edit, when, error = OWN_DAMAGE[name]
    root = tmp_path / "dataset"
    shutil.copytree(ROOT / "tests" / "golden" / "v2" / "dataset", root)
    snapshot = root / "snapshot.gsnap"
    data = bytearray(snapshot.read_bytes())
    edit(data)
    snapshot.write_bytes(bytes(data))
    _reseal(snapshot)
    if when == "open":
        with pytest.raises(error):
            gf.open_dataset(root)
        return
    ds = gf.open_dataset(root)
    with pytest.raises(error):
        if when == "read":
            ds.read(5)
        elif when == "label":
            ds.label(5)
        elif when == "lookup":
            ds.lookup(b"apple/000.bin")
        else:
            ds.read(5)      # nothing a read uses is damaged ...
            ds.verify()     # ... but verify finds it


def test_chunk_damage(tmp_path):
    root = tmp_path / "dataset"
    shutil.copytree(ROOT / "tests" / "golden" / "v2" / "dataset", root)
    chunk = root / gf.chunk_name(0)
    data = bytearray(chunk.read_bytes())
    data[-40] ^= 1                          # a footer byte: readers do not use the footer
    chunk.write_bytes(bytes(data))
    ds = gf.open_dataset(root)
    first = ds.chunks[0].first_sample
    ds.read(first)
    with pytest.raises(gf.Damaged, match="CRC"):
        ds.verify()
    data[20] ^= 1                           # the dataset id, the header CRC made to match
    struct.pack_into("<I", data, 60, zlib.crc32(data[:60]))
    chunk.write_bytes(bytes(data))
    with pytest.raises(gf.Damaged, match="dataset"):
        ds.read(first)
