"""A small, pure-Python reader of the granary dataset format 2.0, written from format/SPEC.md.

    ds = open_dataset("train.granary")
    ds.read(ds.lookup(b"cat/0001.jpg"))     # the sample's original bytes, CRC-checked

Only the standard library, plus `zstandard` when a zstd record is met. Opening makes the checks
SPEC §9 lists under *Opening*; the rest is checked before its first use; `verify()` checks all.
"""

import bisect
import hashlib
import itertools
import json
import math
import mmap
import os
import re
import struct
import sys
import zlib
from collections import namedtuple

SNAPSHOT = "snapshot.gsnap"
ATTRS, FIELDS, DELETIONS, REVISIONS = 0x1, 0x2, 0x4, 0x8     # incompatible bits (§5.2)
NO_LABEL = 0xFFFFFFFF
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
REQUIRED_KINDS = {1, 2, 3, 4, 6, 7}
KNOWN_KINDS = REQUIRED_KINDS | {5, 8, 9}
REMOVED = 0x20      # record flag bit 5 (§6.6): a deleted sample's record compaction removed
_HEADER = struct.Struct("<8sHBBI16sQQII16s16sII")     # §5.1, 96 bytes
_CHUNK_HEADER = struct.Struct("<8sHHI16sI24sI")        # §4, 64 bytes
_TRAILER = struct.Struct("<QQII8s")                    # §4, 32 bytes
_FOOTER_ENTRY = struct.Struct("<IIQQQII")              # §4, 40 bytes


class FormatError(Exception):
    """Base of every error about a dataset's files."""


class Damaged(FormatError):
    """An integrity or structure problem: CRC, digest, truncation, layout, inconsistent tables."""


class Missing(FormatError):
    """A file of the dataset is absent."""


class Unsupported(FormatError):
    """Another major version, or incompatible feature bits this reader does not know."""


class Deleted(LookupError):
    """A read by id of a sample that was deleted (§6.8): its id stays, but it is no sample of
    the dataset's any more (not damage: the dataset is intact)."""


# A chunk table entry (§6.2), with its id and number of samples.
Chunk = namedtuple("Chunk", "id first_sample samples file_size records_end orig_bytes compressed "
                            "file_crc digest")
# A namespace entry (§6.7): sample and size are None for a directory; mode, mtime_ns without ATTRS.
Entry = namedtuple("Entry", "path sample size mode mtime_ns")

# ---------------------------------------------------------------------------------------------
# Primitives (§1, §3, §6.5)


def chunk_name(chunk_id, revision=0):
    """The file name of chunk `chunk_id` at `revision` (§2): `chunk-00000005.r2.gchunk`."""
    return "chunk-%08d%s.gchunk" % (chunk_id, f".r{revision}" if revision else "")


def _align8(n):
    return (n + 7) & ~7


def _varint(buf, pos, end, where):
    """(value, next position) of the LEB128 varint at buf[pos], which must end before `end`."""
    value = 0
    for i in range(10):
        if pos >= end:
            raise Damaged(f"{where}: a varint runs past its end")
        byte, pos = buf[pos], pos + 1
        value |= (byte & 0x7F) << (7 * i)
        if byte < 0x80:
            if value >> 64 or (byte == 0 and i):
                raise Damaged(f"{where}: a varint exceeds 2^64 or is overlong")
            return value, pos
    raise Damaged(f"{where}: a varint is longer than 10 bytes")


def _strtab(buf, off, length, where, count=None):
    """The items of the string table that fills buf[off:off+length] exactly (§1)."""
    if length < 16 or off + length > len(buf):
        raise Damaged(f"{where}: a string table of {length} bytes is too short")
    (n,) = struct.unpack_from("<Q", buf, off)
    if (count is not None and n != count) or 16 + 8 * n > length:
        raise Damaged(f"{where}: a string table of {n} items, expected {count} in {length} bytes")
    offs = struct.unpack_from(f"<{n + 1}Q", buf, off + 8)
    if offs[0] or any(a > b for a, b in zip(offs, offs[1:])) or 16 + 8 * n + offs[-1] != length:
        raise Damaged(f"{where}: string table offsets are inconsistent")
    base = off + 16 + 8 * n
    return [bytes(buf[base + a:base + b]) for a, b in zip(offs, offs[1:])]


def _check_rising(items, where, what):
    for i in range(1, len(items)):
        if items[i] <= items[i - 1]:
            raise Damaged(f"{where}: {what} {i} is not greater than the one before")


def valid_path(path):
    """Whether `path` (bytes) is a valid dataset path (§1)."""
    return (bool(path) and b"\0" not in path
            and all(c not in (b"", b".", b"..") for c in path.split(b"/")))


_NAME_RE = re.compile(rb"(?!\.)(?!.*\.\.)[A-Za-z0-9_+\-.]{1,64}(?<!\.)")
_DTYPES = {"bool": "?", "int8": "b", "int16": "h", "int32": "i", "int64": "q", "uint8": "B",
           "uint16": "H", "uint32": "I", "uint64": "Q", "float16": "e", "float32": "f",
           "float64": "d"}
_DIM = r"(?:0|[1-9][0-9]*)"
_TYPE_RE = re.compile(r"bytes|str|json|int|npy|image:[a-z0-9]{1,16}"
                      rf"|ndarray:(?:{'|'.join(_DTYPES)}):(?:{_DIM}(?:,{_DIM}){{0,31}})?")


def valid_field_name(name):
    """Whether `name` (bytes) is a valid field name (§3)."""
    return _NAME_RE.fullmatch(name) is not None


def _ndarray(descriptor):
    """(dtype, shape, element count, struct code) of an ndarray descriptor."""
    _, dtype, dims = descriptor.split(":")
    shape = tuple(int(d) for d in dims.split(",")) if dims else ()
    return dtype, shape, math.prod(shape), _DTYPES[dtype]


def valid_type(descriptor):
    """Whether `descriptor` (str) is a type descriptor of §6.5 (an ndarray below 2^64 bytes)."""
    ok = _TYPE_RE.fullmatch(descriptor) is not None
    if ok and descriptor.startswith("ndarray:"):
        _, _, count, code = _ndarray(descriptor)
        ok = count * struct.calcsize(code) < 1 << 64
    return ok


def _check_names(names, where):
    for name in names:
        if not valid_field_name(name):
            raise Damaged(f"{where}: invalid field name {name!r}")
    _check_rising(names, where, "field name")


def _types(raw, where):
    """Type descriptors (str) from their stored bytes, each one of §6.5."""
    types = [t.decode("ascii", "replace") for t in raw]
    for t in types:
        if not valid_type(t):
            raise Damaged(f"{where}: unknown type descriptor {t!r}")
    return types


def _reject_constant(name):
    raise ValueError(f"{name} is not JSON")


def decode_value(descriptor, data, where="field"):
    """A field's bytes decoded per its type descriptor (§6.5): int, str, a JSON value,
    (dtype, shape, flat list) for ndarray, the bytes themselves for other types."""
    try:
        if descriptor == "int":
            if len(data) != 8:
                raise Damaged(f"{where}: an int field holds {len(data)} bytes, not 8")
            return int.from_bytes(data, "little", signed=True)
        if descriptor == "str":
            return bytes(data).decode("utf-8")
        if descriptor == "json":
            return json.loads(bytes(data).decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:    # UnicodeDecodeError is a ValueError
        raise Damaged(f"{where}: not a valid {descriptor} value: {e}") from None
    if descriptor.startswith("ndarray:"):
        dtype, shape, count, code = _ndarray(descriptor)
        if len(data) != count * struct.calcsize(code):
            raise Damaged(f"{where}: {len(data)} bytes do not hold a {descriptor}")
        return dtype, shape, list(struct.unpack(f"<{count}{code}", data))
    return bytes(data)


def _unzstd(stored, where):
    """The content of the one zstd frame `stored`, its declared size bounded first (§3)."""
    import zstandard   # only datasets with zstd records need it
    if bytes(stored[:4]) != ZSTD_MAGIC:
        raise Damaged(f"{where}: a zstd record that does not start with a zstd frame")
    try:
        size = zstandard.frame_content_size(stored)
        if size < 0 or size > len(stored) * 65536 + 4096:    # refused before decoding
            raise Damaged(f"{where}: zstd frame declares no content size or too large a one")
        decoder = zstandard.ZstdDecompressor().decompressobj()
        data = decoder.decompress(stored)
    except zstandard.ZstdError as e:
        raise Damaged(f"{where}: zstd frame does not decode: {e}") from None
    if not decoder.eof or decoder.unused_data or len(data) != size:
        raise Damaged(f"{where}: zstd record is not exactly one frame of {size} bytes")
    return data


# ---------------------------------------------------------------------------------------------
# The dataset


class Dataset:
    """A granary 2.0 dataset: its snapshot read whole (the opening checks of §9 made), its
    chunk files read on demand. ``open_dataset(path)`` is this class."""

    def __init__(self, directory):
        self.directory = os.fspath(directory)
        self._snap = os.path.join(self.directory, SNAPSHOT)
        try:
            with open(self._snap, "rb") as f:
                self._buf = f.read()
        except FileNotFoundError:
            raise Missing(f"{self._snap}: missing, so this is not a dataset") from None
        self._read_header()
        self._read_section_table()
        self._read_sections()
        self._page_index, self._pages = None, {}    # on first use; page -> (entries, paths)

    def _read_header(self):
        b, where = self._buf, self._snap
        if b[:8] != b"GRNYSNAP":
            raise Damaged(f"{where}: not a granary snapshot (bad magic)")
        if len(b) >= 10:    # the version before the CRC: a 1.x header has another layout
            (version,) = struct.unpack_from("<H", b, 8)
            if version == 1:
                raise Unsupported(f"{where}: format 1.x snapshot; run `granary upgrade "
                                  f"{self.directory}` to rewrite it as format 2.0")
            if version != 2:
                raise Unsupported(f"{where}: format major version {version}, not 2")
        if len(b) < 96:
            raise Damaged(f"{where}: truncated to {len(b)} bytes, shorter than its header")
        (_, _, shift, zero, incompat, dataset_id, n, body_end, compat, chunk_count, digest,
         zeros, table_crc, header_crc) = _HEADER.unpack_from(b)
        if zlib.crc32(b[:92]) != header_crc:
            raise Damaged(f"{where}: header CRC mismatch (bytes 0..92)")
        if zero or any(zeros):
            raise Damaged(f"{where}: reserved header bytes (11, 72..88) are not zero")
        if not 12 <= shift <= 24 or n > (1 << 32) - 2 or body_end < 104 or incompat & 3 == 3:
            raise Damaged(f"{where}: block_shift, sample count, body_end or feature bits out of "
                          "range (ATTRS and FIELDS are never set together)")
        if incompat & ~(ATTRS | FIELDS | DELETIONS | REVISIONS):
            raise Unsupported(f"{where}: unknown incompatible feature bits {incompat:#x}")
        nblocks = -(-(body_end - 96) >> shift)
        if len(b) != body_end + 4 * nblocks:
            raise Damaged(f"{where}: {len(b)} bytes, the header implies {body_end + 4 * nblocks}")
        if zlib.crc32(b[body_end:]) != table_crc:
            raise Damaged(f"{where}: block CRC table (bytes {body_end}..{len(b)}) fails its CRC")
        self._block_crcs = struct.unpack_from(f"<{nblocks}I", b, body_end)
        self._checked = bytearray(nblocks)      # blocks whose CRC has been checked
        self._mv, self._shift, self._body_end = memoryview(b), shift, body_end
        self._id, self.incompat, self.compat = dataset_id, incompat, compat
        self.dataset_id, self.content_digest = dataset_id.hex(), digest.hex()
        self.sample_count, self.chunk_count = n, chunk_count

    def _need(self, off, n):
        """Check the CRC of every body block that bytes off..off+n touch, before their use."""
        if off < 96 or off + n > self._body_end:
            raise Damaged(f"{self._snap}: bytes {off}..{off + n} lie outside the body")
        size = 1 << self._shift
        for blk in range((off - 96) >> self._shift, ((off + n - 97) >> self._shift) + 1):
            if not self._checked[blk]:
                start, end = 96 + blk * size, min(96 + (blk + 1) * size, self._body_end)
                if zlib.crc32(self._mv[start:end]) != self._block_crcs[blk]:
                    raise Damaged(f"{self._snap}: block {blk} (bytes {start}..{end}) fails its CRC")
                self._checked[blk] = 1

    def _unpack(self, fmt, off):
        self._need(off, struct.calcsize(fmt))
        return struct.unpack_from(fmt, self._buf, off)

    def _read_section_table(self):
        where = f"{self._snap}: section table"
        count, zero = self._unpack("<II", 96)
        if count > 64 or zero:
            raise Damaged(f"{where}: count {count} or its zero field is wrong")
        pos, end, self._sections = _align8(104 + 24 * count), None, {}
        for i in range(count):
            kind, zero, off, length = self._unpack("<IIQQ", 104 + 24 * i)
            if zero or off != pos or off + length > self._body_end:
                raise Damaged(f"{where}: section {i} is misplaced or has a non-zero zero field")
            if kind in self._sections:     # in any order, but once
                raise Damaged(f"{where}: section {i} repeats kind {kind}")
            # 2.0 defines no compatible bit: any bit set is unknown, and lets unknown kinds pass.
            if kind not in KNOWN_KINDS and not self.compat:
                raise Damaged(f"{where}: section {i} has unknown kind {kind}")
            self._sections[kind] = (off, length)
            end, pos = off + length, _align8(off + length)
        if end != self._body_end:
            raise Damaged(f"{where}: the last section ends at {end}, not {self._body_end}")
        wanted = REQUIRED_KINDS | ({5} if self.incompat & FIELDS else set()) | \
            ({8} if self.incompat & DELETIONS else set()) | \
            ({9} if self.incompat & REVISIONS else set())
        if set(self._sections) & KNOWN_KINDS != wanted:
            raise Damaged(f"{where}: has kinds {sorted(self._sections)}, expected {sorted(wanted)}")

    def _section(self, kind, length=None):
        off, actual = self._sections[kind]
        if length is not None and actual != length:
            raise Damaged(f"{self._snap}: section kind {kind} is {actual} bytes, not {length}")
        return off, actual

    def _read_sections(self):
        n, c, snap = self.sample_count, self.chunk_count, self._snap
        off, _ = self._section(1, 24)
        self.generation, parent = self._unpack("<Q16s", off)
        if self.generation == 0 and any(parent):
            raise Damaged(f"{snap}: lineage at {off}: generation 0 with a non-zero parent")
        self.parent = parent.hex() if any(parent) else None
        off, _ = self._section(2, 56 * c)
        self._need(off, 56 * c)
        rows = list(struct.iter_unpack("<QQQQII16s", self._buf[off:off + 56 * c]))
        if c == 0 and n:
            raise Damaged(f"{snap}: {n} samples but no chunks")
        self.chunks = []
        for i, (size, first, records_end, orig, compressed, crc, digest) in enumerate(rows):
            nxt = rows[i + 1][1] if i + 1 < c else n
            if (first != 0 if i == 0 else first < rows[i - 1][1]) or nxt < first:
                raise Damaged(f"{snap}: chunk table entry {i}: first_sample {first} out of order")
            if records_end < 64 or records_end + 32 > size or \
                    (nxt == first and (records_end, orig, compressed) != (64, 0, 0)):
                raise Damaged(f"{snap}: chunk table entry {i}: records_end {records_end} does "
                              f"not fit in file_size {size}, or an empty chunk's fields are wrong")
            self.chunks.append(Chunk(i, first, nxt - first, size, records_end, orig, compressed,
                                     crc, digest))
        self._firsts = [ch.first_sample for ch in self.chunks]
        off, length = self._section(3)
        self._need(off, length)
        self.classes = _strtab(self._buf, off, length, f"{snap}: classes section")
        off, length = self._section(4)
        offs = self._cc_offsets = self._unpack(f"<{c + 1}Q", off)
        self._cc_pairs = off + 8 * (c + 1)
        if offs[0] or any(a > b for a, b in zip(offs, offs[1:])) or offs[-1] != length - 8 * c - 8:
            raise Damaged(f"{snap}: class counts offsets are inconsistent")
        self._records, _ = self._section(6, 16 * n)
        self.deleted = self._read_deletions() if self.incompat & DELETIONS else {}
        self.live_count = n - len(self.deleted)
        # Each chunk's revision (§6.9): its file's name; 0 (as written first) without REVISIONS.
        self.revisions = [0] * c
        if self.incompat & REVISIONS:
            off, _ = self._section(9, 4 * c)
            self.revisions = list(self._unpack(f"<{c}I", off))
        self._read_namespace_header()
        self.field_names, self.field_types = [], {}
        if self.incompat & FIELDS:
            self._read_fields_header()

    def _read_deletions(self):
        """{sample: generation that deleted it} from the deletions section (§6.8), checked."""
        off, length = self._section(8)
        where = f"{self._snap}: deletions section at {off}"
        (d,) = self._unpack("<Q", off)
        if not 1 <= d <= self.sample_count or length != 8 + 8 * d:
            raise Damaged(f"{where}: {d} deletions of {self.sample_count} samples in {length} "
                          "bytes")
        rows = self._unpack(f"<{2 * d}I", off + 8)
        deleted, prev = {}, -1
        for s, g in zip(rows[::2], rows[1::2]):
            if not prev < s < self.sample_count:
                raise Damaged(f"{where}: sample {s} does not rise below {self.sample_count}")
            if not 1 <= g <= self.generation:
                raise Damaged(f"{where}: sample {s} deleted by generation {g}, not from 1 to "
                              f"the lineage's {self.generation}")
            deleted[s], prev = g, s
        return deleted

    def _read_namespace_header(self):
        off, length = self._section(7)
        where = f"{self._snap}: namespace header at {off}"
        e, p, first_paths_len, pages_len, zero = self._unpack("<5Q", off)
        if zero or e >= 1 << 32 or e < self.live_count or p > e or (p == 0) != (e == 0):
            raise Damaged(f"{where}: entry count {e}, page count {p} or zero field out of range")
        first_paths = off + 40 + 16 * (p + 1)
        ids = off + _align8(first_paths - off + first_paths_len)
        pages = off + _align8(ids - off + 4 * self.sample_count)
        if pages + pages_len != off + length:
            raise Damaged(f"{where}: its sizes add up to {pages + pages_len - off}, not {length}")
        self.entry_count, self._page_count, self._pages_len, self._ns_off = e, p, pages_len, off
        self._first_paths, self._ids, self._pages_at = (first_paths, first_paths_len), ids, pages
        self._pads = [(first_paths + first_paths_len, ids), (ids + 4 * self.sample_count, pages)]

    def _read_fields_header(self):
        off, length = self._section(5)
        n, where = self.sample_count, f"{self._snap}: fields section at {off}"
        k, m, names_len, types_len = self._unpack("<4Q", off)
        index = _align8(32 + names_len + types_len)
        if k >= 1 << 32 or m < n or index + 8 * (n + 1) + 16 * m != length:
            raise Damaged(f"{where}: counts {k}, {m} or sizes disagree with its {length} bytes")
        self._need(off + 32, names_len + types_len)
        names = _strtab(self._buf, off + 32, names_len, f"{where}: names", k)
        types = _strtab(self._buf, off + 32 + names_len, types_len, f"{where}: types", k)
        _check_names(names, where)
        (first,), (last,) = self._unpack("<Q", off + index), self._unpack("<Q", off + index + 8 * n)
        if first != 0 or last != m:
            raise Damaged(f"{where}: field index runs {first}..{last}, expected 0..{m}")
        self.field_names, self.field_types = names, dict(zip(names, _types(types, where)))
        self._field_index, self._field_m = off + index, m
        self._field_entries = off + index + 8 * (n + 1)
        self._pads.append((off + 32 + names_len + types_len, off + index))

    def _index(self):
        """Page offsets, positions and first paths, checked once before the namespace's use."""
        if self._page_index is None:
            p, where = self._page_count, f"{self._snap}: page index"
            both = self._unpack(f"<{2 * p + 2}Q", self._ns_off + 40)
            offs, firsts, (at, length) = both[:p + 1], both[p + 1:], self._first_paths
            if (offs[0], offs[-1], firsts[0], firsts[-1]) != \
                    (0, self._pages_len, 0, self.entry_count):
                raise Damaged(f"{where}: page offsets or positions do not run from 0 to the end")
            _check_rising(offs, where, "page offset")
            _check_rising(firsts, where, "page position")
            self._need(at, length)
            paths = _strtab(self._buf, at, length, f"{where}: first paths", p)
            _check_rising(paths, where, "first path")
            self._page_index = (offs, firsts, paths)
        return self._page_index

    def _page(self, p):
        """(entries, paths) of page p, decoded to its end and checked (§6.7)."""
        if p in self._pages:
            return self._pages[p]
        offs, firsts, first_paths = self._index()
        start, end = self._pages_at + offs[p], self._pages_at + offs[p + 1]
        where = f"{self._snap}: namespace page {p} at {start}"
        self._need(start, end - start)
        page = self._buf[start:end]
        count = firsts[p + 1] - firsts[p]
        r = -(-count // 16)
        table = len(page) - 4 - 4 * r
        if table < 0 or struct.unpack_from("<I", page, len(page) - 4)[0] != r:
            raise Damaged(f"{where}: restart count is not ceil({count} / 16)")
        restarts = struct.unpack_from(f"<{r}I", page, table)
        if restarts[0] != 0 or restarts[-1] >= table:
            raise Damaged(f"{where}: restart table offsets lie outside the entries")
        attrs, n = self.incompat & ATTRS, self.sample_count
        entries, prev, mtime, pos = [], b"", 0, 0
        for i in range(count):
            here, restart = f"{where}, entry {i}", i % 16 == 0
            if pos >= table or (restart and pos != restarts[i // 16]):
                raise Damaged(f"{here}: at page byte {pos}, not where the restart table says")
            shared, pos = _varint(page, pos, table, here)
            suffix, pos = _varint(page, pos, table, here)
            if (restart and shared) or shared > len(prev) or pos + suffix > table:
                raise Damaged(f"{here}: shared {shared} or suffix length {suffix} out of range")
            path = prev[:shared] + page[pos:pos + suffix]
            pos += suffix
            if path <= prev if i else path != first_paths[p]:
                raise Damaged(f"{here}: path {path!r} out of order or not the page's first path")
            tag, pos = _varint(page, pos, table, here)
            if tag > n or tag - 1 in self.deleted:
                raise Damaged(f"{here}: tag {tag} names no sample (count {n}) or a deleted one")
            size = mode = None
            if tag:
                size, pos = _varint(page, pos, table, here)
            if attrs:
                mode, pos = _varint(page, pos, table, here)
                if mode > 0o7777:
                    raise Damaged(f"{here}: mode {mode:#o} above 0o7777")
                z, pos = _varint(page, pos, table, here)
                mtime = (0 if restart else mtime) + ((z >> 1) ^ -(z & 1))    # + unzigzagged delta
                mtime = (mtime + (1 << 63)) % (1 << 64) - (1 << 63)         # modulo 2^64, an i64
            entries.append(Entry(path, tag - 1 if tag else None, size, mode,
                                 mtime if attrs else None))
            prev = path
        if pos != table:
            raise Damaged(f"{where}: entries end at page byte {pos}, the restart table at {table}")
        if len(self._pages) >= 256:     # a bounded cache: pages decode quickly
            self._pages.clear()
        self._pages[p] = (entries, [e.path for e in entries])
        return self._pages[p]

    def _entry_at(self, pos):
        _, firsts, _ = self._index()
        p = bisect.bisect_right(firsts, pos) - 1
        return self._page(p)[0][pos - firsts[p]]

    def _lower_bound(self, key):
        """The first position whose path is not less than `key` (§7)."""
        if self.entry_count == 0:
            return 0
        _, firsts, first_paths = self._index()
        p = max(bisect.bisect_right(first_paths, key) - 1, 0)
        return firsts[p] + bisect.bisect_left(self._page(p)[1], key)

    def _run_end(self, prefix):
        """The position after the last entry whose path starts with `prefix` (§7)."""
        succ = prefix.rstrip(b"\xff")
        return self._lower_bound(succ[:-1] + bytes([succ[-1] + 1])) if succ else self.entry_count

    def _find(self, path):
        """(position, entry) of `path`, or (position, None)."""
        pos = self._lower_bound(path)
        entry = self._entry_at(pos) if pos < self.entry_count else None
        return pos, (entry if entry and entry.path == path else None)

    def _entry_of(self, s, pos=None):
        """Sample s's entry, found (or at `pos`, confirmed) through the id table."""
        (at,) = self._unpack("<I", self._ids + 4 * self._live(s))
        entry = self._entry_at(at) if at < self.entry_count and pos in (None, at) else None
        if entry is None or entry.sample != s:
            raise Damaged(f"{self._snap}: id table sends sample {s} to another entry ({at})")
        return entry

    def _sample(self, s):
        if not 0 <= s < self.sample_count:
            raise IndexError(f"sample {s} out of range (the dataset has {self.sample_count})")
        return s

    def _live(self, s):
        """`s`, a sample not deleted (§6.8): else Deleted."""
        if self._sample(s) in self.deleted:
            raise Deleted(f"sample {s} was deleted (by generation {self.deleted[s]})")
        return s

    def lookup(self, path):
        """The id of the sample whose namespace entry is `path` (bytes), or None (§7): for a field
        group its key (users see its fields as KEY.NAME files instead; see listdir)."""
        pos, entry = self._find(bytes(path))
        if entry is None or entry.sample is None:
            return None
        # The id table must agree, or this path and path(id) would disagree.
        return self._entry_of(entry.sample, pos).sample

    def path(self, s):
        """Sample `s`'s path (its key for a field group)."""
        return self._entry_of(s).path

    def stat(self, s):
        """(size, mode or None, mtime_ns or None) of sample `s`."""
        return self._entry_of(s)[2:]

    def entries(self):
        """Every namespace entry (Entry), files and directories, in path order."""
        for p in range(self._page_count):
            yield from self._page(p)[0]

    def _shown(self, entry):
        """What users see of `entry`, its path checked first (§1, §3): a key shows as the files
        KEY.NAME (sample: the key's, size: the field's), anything else as itself."""
        key = entry.sample is not None and self.incompat & FIELDS
        if not valid_path(entry.path) or (key and b"." in entry.path.rsplit(b"/", 1)[-1]):
            raise Damaged(f"{self._snap}: invalid {'key' if key else 'path'} {entry.path!r}")
        return [entry._replace(path=entry.path + b"." + self.field_names[n], size=length)
                for n, _, length in self._fields_of(entry.sample)] if key else [entry]

    def listdir(self, directory=b""):
        """The entries directly in `directory` (b"" for the root) as users see them (§7)."""
        directory = bytes(directory)
        entry = self._find(directory)[1] if directory else None
        if directory and entry is None:
            raise FileNotFoundError(f"{directory!r} is not in the dataset")
        if entry is not None and entry.sample is not None:
            raise NotADirectoryError(f"{directory!r} is not a directory of the dataset")
        prefix = directory + b"/" if directory else b""
        pos, end, children = self._lower_bound(prefix), self._run_end(prefix), []
        while pos < end:
            entry = self._entry_at(pos)
            cut = entry.path.find(b"/", len(prefix))
            if cut < 0:
                children += self._shown(entry)
                pos += 1
            else:   # inside a subdirectory's subtree: skip all of it (never going back)
                pos = max(pos + 1, self._run_end(entry.path[:cut + 1]))
        return children

    def _chunk_of(self, s):
        return self.chunks[bisect.bisect_right(self._firsts, self._sample(s)) - 1]

    def _span(self, s):
        """(offset, end, flags, crc32, label) of sample s's record, its entry checked."""
        ch, at = self._chunk_of(s), self._records + 16 * s
        low, high, flags, crc, label = self._unpack("<IHHII", at)
        offset, end = low | high << 32, ch.records_end
        if s + 1 < ch.first_sample + ch.samples:
            low, high = self._unpack("<IH", at + 16)
            end = low | high << 32
        where = f"{self._snap}: record entry of sample {s} at {at}"
        code, group = flags & 0xF, bool(flags & 0x10)
        if flags & ~0x3F or code > 1 or group != bool(self.incompat & FIELDS) or (group and code):
            raise Damaged(f"{where}: flags {flags:#x} invalid (compression code {code})")
        if flags & REMOVED and s not in self.deleted:
            raise Damaged(f"{where}: its record is marked removed, but sample {s} is not deleted")
        if label != NO_LABEL and label >= len(self.classes):
            raise Damaged(f"{where}: label {label} is not below the class count")
        if (s == ch.first_sample and offset != 64) or not 64 <= offset <= end <= ch.records_end:
            raise Damaged(f"{where}: record {offset}..{end} is not in 64..{ch.records_end}")
        if flags & REMOVED and end != offset:
            raise Damaged(f"{where}: removed, but its record has {end - offset} bytes")
        return offset, end, flags, crc, label

    def _open_chunk(self, ch):
        """Chunk `ch`'s file, open: callers check it with _check_chunk before use."""
        name = os.path.join(self.directory, chunk_name(ch.id, self.revisions[ch.id]))
        try:   # the revision the snapshot names, never another (§2, §6.9)
            return open(name, "rb")
        except FileNotFoundError:
            raise Missing(f"{name}: chunk {ch.id} (revision {self.revisions[ch.id]}) is missing") \
                from None

    def _check_chunk(self, f, ch):
        """Check the open chunk file's length and header (§4, §7); returns its feature bits."""
        size, name = os.fstat(f.fileno()).st_size, f.name
        if size != ch.file_size:
            raise Damaged(f"{name}: {size} bytes, the chunk table says {ch.file_size}")
        header = f.read(64)     # the file was just opened
        magic, version, features, length, dataset_id, cid, zeros, crc = _CHUNK_HEADER.unpack(header)
        if magic != b"GRNYCHNK":
            raise Damaged(f"{name}: not a granary chunk (bad magic)")
        # The CRC before the fields: a damaged byte then reads as damage, not as a new layout.
        if zlib.crc32(header[:60]) != crc:
            raise Damaged(f"{name}: header CRC mismatch (bytes 0..60)")
        # Bit 2 (field types) only with bit 0 (fields block).
        if version != 1 or length != 64 or any(zeros) or features & ~7 or features & 5 == 4:
            raise Damaged(f"{name}: header version, length, feature bits or zeros are wrong")
        if dataset_id != self._id or cid != ch.id:
            raise Damaged(f"{name}: header names chunk {cid} of dataset {dataset_id.hex()}")
        return features

    def _decode(self, stored, flags, crc, size, where):
        """The original bytes of a stored record, checked against its length and CRC-32."""
        data = _unzstd(stored, where) if flags & 0xF == 1 else stored
        if len(data) != size or zlib.crc32(data) != crc:
            what = "CRC-32" if len(data) == size else f"length ({len(data)}, shown: {size})"
            raise Damaged(f"{where}: {what} mismatch")
        return data

    def read(self, s):
        """Sample `s`'s original bytes (for a field group: its fields back to back)."""
        size, ch = self._entry_of(s).size, self._chunk_of(s)   # its path, then its record
        with self._open_chunk(ch) as f:
            self._check_chunk(f, ch)
            offset, end, flags, crc, _ = self._span(s)
            f.seek(offset)
            stored = f.read(end - offset)
        return self._decode(stored, flags, crc, size, f"{f.name} at {offset}: sample {s}")

    def label(self, s):
        """Sample `s`'s class index, or None."""
        label = self._span(self._live(s))[4]
        return None if label == NO_LABEL else label

    def compression(self, s):
        """How sample `s`'s record is stored: "none" or "zstd"."""
        return "zstd" if self._span(self._live(s))[2] & 0xF else "none"

    def _fields_of(self, s):
        """[(name index, crc32, len)] of sample s's field entries, checked (§6.5)."""
        start, end = self._unpack("<QQ", self._field_index + 8 * s)
        if not start < end <= self._field_m:
            raise Damaged(f"{self._snap}: field index of sample {s} runs {start}..{end}")
        at = self._field_entries + 16 * start
        self._need(at, 16 * (end - start))
        rows = list(struct.iter_unpack("<IIQ", self._buf[at:at + 16 * (end - start)]))
        if len({n for n, _, _ in rows if n < len(self.field_names)}) != len(rows):   # distinct
            raise Damaged(f"{self._snap}: a field entry of sample {s} names no field, or twice")
        return rows

    def _split(self, s, data, rows):
        """[(name, type, bytes)] of the fields in `data`, each field's length and CRC checked."""
        if sum(length for _, _, length in rows) != len(data):
            raise Damaged(f"sample {s}: field lengths do not add up to its {len(data)} bytes")
        out, pos = [], 0
        for name, crc, length in rows:
            piece, pos, name = data[pos:pos + length], pos + length, self.field_names[name]
            if zlib.crc32(piece) != crc:
                raise Damaged(f"sample {s}: field {name.decode()} fails its CRC-32")
            out.append((name, self.field_types[name], piece))
        return out

    def fields(self, s):
        """[(name, type descriptor, bytes)] of sample `s`'s fields, or None without FIELDS."""
        if not self.incompat & FIELDS:
            self._live(s)
            return None
        return self._split(s, self.read(s), self._fields_of(s))     # read() checks s first

    def value(self, s, name):
        """Sample `s`'s field `name` decoded per its type (see decode_value)."""
        name = name.encode() if isinstance(name, str) else name
        for field, descriptor, data in self.fields(s) or ():
            if field == name:
                return decode_value(descriptor, data, f"sample {s}, field {name.decode()}")
        raise KeyError(f"sample {s} has no field {name!r}")

    def verify(self):
        """Check everything §9 lists under *Verifying*, raising on the first problem; returns
        the names of the directory's other files, which are not part of the dataset (§2)."""
        self._need(96, self._body_end - 96)
        if hashlib.sha256(self._buf[:56] + self._buf[96:]).hexdigest()[:32] != self.content_digest:
            raise Damaged(f"{self._snap}: content digest mismatch")
        placed = [(96, 8 + 24 * len(self._sections))] + list(self._sections.values())
        for start, end in [(a + la, b) for (a, la), (b, _) in zip(placed, placed[1:])] + self._pads:
            if any(self._mv[start:end]):
                raise Damaged(f"{self._snap}: padding bytes {start}..{end} are not zero")
        by_sample, dirs = self._verify_namespace()
        files = [e for e in by_sample if e is not None]     # a deleted sample has no entry
        for entry in list(dirs.values()) + files:       # _shown checks every path and key
            if any(f.path in dirs for f in self._shown(entry) if f.sample is not None):
                raise Damaged(f"{self._snap}: a directory is also a field file of {entry.path!r}")
        listed, declared = {}, {}   # directory -> first listing's (mode, mtime); name -> type
        attributes = []             # whether each chunk with records has an attributes block
        gone = []                   # the deleted samples' paths, as their chunks' footers hold
        for ch in self.chunks:
            with self._open_chunk(ch) as f:
                features, records = self._verify_chunk(f, ch, by_sample, listed, declared, gone)
            attributes += [bool(features & 2)] if records else []
        # ATTRS: every chunk with records has attributes, or none has records but dirs are listed
        if bool(self.incompat & ATTRS) != (all(attributes) if attributes else bool(listed)):
            raise Damaged(f"{self._snap}: ATTRS disagrees with the chunks' attributes blocks")
        # A removed record's path is in no footer any more: its ancestors may stay directories.
        removed = any(self._span(s)[2] & REMOVED for s in self.deleted)
        self._verify_dirs([e.path for e in files] + gone, dirs, listed, removed)
        for name in self.field_names:
            if declared.get(name, "bytes") != self.field_types[name]:
                raise Damaged(f"{self._snap}: field {name!r} has type {self.field_types[name]}, "
                              f"its chunks declare {declared.get(name, 'none')}")
        ours = {SNAPSHOT} | {chunk_name(c, r) for c, r in enumerate(self.revisions)}
        return sorted(n for n in os.listdir(self.directory) if n not in ours)

    def _verify_namespace(self):
        """(each sample's entry, {directory: entry}); checks paths, ancestors, tags, id table."""
        by_sample, dirs, prev = [None] * self.sample_count, {}, None
        for pos, entry in enumerate(self.entries()):
            path, where = entry.path, f"{self._snap}: namespace entry {pos}"
            if prev is not None and path <= prev:
                raise Damaged(f"{where}: path {path!r} out of order")
            if b"/" in path and path[:path.rfind(b"/")] not in dirs:
                raise Damaged(f"{where}: {path!r} has no parent directory entry before it")
            if entry.sample is None:
                dirs[path] = entry
            elif by_sample[entry.sample] is not None:
                raise Damaged(f"{where}: sample {entry.sample} is tagged twice")
            else:
                by_sample[entry.sample] = (pos, entry)
            prev = path
        for s, pos in enumerate(self._unpack(f"<{self.sample_count}I", self._ids)):
            if s in self.deleted:   # no entry (page decoding refuses a tag naming it), no slot
                if pos != NO_LABEL:
                    raise Damaged(f"{self._snap}: id table sends deleted sample {s} to entry "
                                  f"{pos}, not 0xFFFFFFFF")
            elif by_sample[s] is None or by_sample[s][0] != pos:
                raise Damaged(f"{self._snap}: id table sends sample {s} to another entry ({pos})")
        return [None if x is None else x[1] for x in by_sample], dirs

    def _verify_chunk(self, f, ch, by_sample, listed, declared, gone):
        """Check chunk `ch` (open as `f`) against the snapshot; returns its feature bits and
        record count. The footer paths of its deleted samples' records are added to `gone`.
        Its footer lists the records it holds: its samples' whose record is not removed (§6.9)."""
        features, name = self._check_chunk(f, ch), f.name
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if zlib.crc32(buf) != ch.file_crc or hashlib.sha256(buf).digest()[:16] != ch.digest:
                raise Damaged(f"{name}: whole-file CRC-32 or digest differs from the chunk table's")
            foot = _parse_footer(buf, features, name)
            spans = {s: self._span(s) for s in range(ch.first_sample, ch.first_sample + ch.samples)}
            held = [s for s, span in spans.items() if not span[2] & REMOVED]
            if (foot["offset"], foot["n"]) != (ch.records_end, len(held)):
                raise Damaged(f"{name}: footer offset or record count ({foot['n']}) differs from "
                              f"the snapshot's ({len(held)} records not removed)")
            if foot["classes"] != self.classes:
                raise Damaged(f"{name}: footer's class table differs from the snapshot's")
            if held and (bool(features & 1) != bool(self.incompat & FIELDS)
                         or (self.incompat & ATTRS and not features & 2)):
                raise Damaged(f"{name}: feature bits {features:#x} disagree with the snapshot")
            fields = foot["fields"]
            for field, t in zip(fields["names"], fields["types"] or ()) if fields else ():
                if field not in self.field_types or declared.setdefault(field, t) != t:
                    raise Damaged(f"{name}: field {field!r} declared as {t}, unlike elsewhere")
            orig = compressed = 0
            labels = {}
            for i, s in enumerate(held):
                offset, end, flags, crc, label = spans[s]
                entry = by_sample[s]
                if entry is None:   # deleted: its record stays, counted in no sum (§6.8)
                    self._verify_deleted(buf, foot, i, s, name)
                    gone.append(foot["paths"][i])
                    continue
                data = self._decode(buf[offset:end], flags, crc, entry.size,
                                    f"{name} at {offset}: sample {s}")
                if entry.path != foot["paths"][i]:
                    raise Damaged(f"{name}: record {i}'s path differs from sample {s}'s")
                if foot["entries"][i] != (ch.id, label, offset, end - offset, len(data), crc,
                                          flags):
                    raise Damaged(f"{name}: footer entry {i} differs from sample {s}'s record")
                if self.incompat & ATTRS and foot["attrs"][i] != entry[3:]:
                    raise Damaged(f"{name}: attributes of record {i} differ from the snapshot's")
                if fields:
                    self._verify_fields(s, data, fields, i, name)
                orig, compressed = orig + len(data), compressed + (flags & 0xF != 0)
                if label != NO_LABEL:
                    labels[label] = labels.get(label, 0) + 1
        for path, attrs in foot["dirs"]:
            listed.setdefault(path, attrs)
        if (orig, compressed) != (ch.orig_bytes, ch.compressed):
            raise Damaged(f"{self._snap}: chunk {ch.id}: orig_bytes or compressed are wrong")
        if self._class_counts(ch.id) != labels:
            raise Damaged(f"{self._snap}: class counts of chunk {ch.id} differ from its samples'")
        return features, len(held)

    def _verify_deleted(self, buf, foot, i, s, name):
        """A deleted sample's record: still its footer entry's, its CRC-32 (and fields) right;
        its path, which the snapshot no longer holds, only valid."""
        offset, end, flags, crc, label = self._span(s)
        where = f"{name} at {offset}: deleted sample {s}"
        data = _unzstd(buf[offset:end], where) if flags & 0xF == 1 else buf[offset:end]
        if zlib.crc32(data) != crc:
            raise Damaged(f"{where}: CRC-32 mismatch")
        if foot["entries"][i] != (self._chunk_of(s).id, label, offset, end - offset, len(data),
                                  crc, flags):
            raise Damaged(f"{name}: footer entry {i} differs from deleted sample {s}'s record")
        if not valid_path(foot["paths"][i]):
            raise Damaged(f"{name}: record {i}'s path is invalid")
        if foot["fields"]:
            self._verify_fields(s, data, foot["fields"], i, name)

    def _verify_fields(self, s, data, fields, i, name):
        rows = self._fields_of(s)
        start = fields["starts"][i]
        theirs = fields["entries"][start:start + fields["counts"][i]]
        if [(self.field_names[n], crc, length) for n, crc, length in rows] != \
                [(fields["names"][n], crc, length) for n, crc, length in theirs]:
            raise Damaged(f"{name}: fields of record {i} differ from sample {s}'s in the snapshot")
        if len({n for n, _, _ in rows}) != len(rows):
            raise Damaged(f"{self._snap}: sample {s} has a field name twice")
        for field, descriptor, piece in self._split(s, data, rows):
            decode_value(descriptor, piece, f"sample {s}, field {field.decode()}")

    def _class_counts(self, c):
        """Chunk c's class counts decoded from the snapshot: {class: count}."""
        start, end = self._cc_pairs + self._cc_offsets[c], self._cc_pairs + self._cc_offsets[c + 1]
        self._need(start, end - start)
        where, counts, cls, pos = f"{self._snap}: class counts of chunk {c}", {}, -1, start
        while pos < end:
            gap, pos = _varint(self._buf, pos, end, where)
            count, pos = _varint(self._buf, pos, end, where)
            cls += 1 + gap
            if cls >= len(self.classes) or count < 1:
                raise Damaged(f"{where}: class {cls} or count {count} out of range")
            counts[cls] = count
        return counts

    def _verify_dirs(self, paths, dirs, listed, removed=False):
        """The directories are those the chunks list and every ancestor of a path (§8): of
        the samples' paths, the deleted ones' (which their chunks' footers still hold) too.
        With records removed by compaction, whose paths no footer holds any more, the
        directories that were their ancestors stay (§6.8): more directories may remain."""
        expected = set(listed)
        for path in paths + list(listed):
            expected.update(path[:i] for i in range(len(path)) if path[i] == 0x2F)
        if expected != set(dirs) and not (removed and expected < set(dirs)):
            raise Damaged(f"{self._snap}: directory entries differ from what the chunks list")
        for path, entry in dirs.items() if self.incompat & ATTRS else ():
            if entry[3:] != listed.get(path, (0o755, 0)):
                raise Damaged(f"{self._snap}: directory {path!r}: attributes differ")


class _Cursor:
    """Sequential, bounds-checked reads of a chunk footer."""

    def __init__(self, buf, where):
        self.buf, self.pos, self.where = buf, 0, where

    def take(self, n):
        if self.pos + n > len(self.buf):
            raise Damaged(f"{self.where}: the footer ends inside a field at footer byte {self.pos}")
        self.pos += n
        return self.buf[self.pos - n:self.pos]

    def u64s(self, count=1):
        values = struct.unpack(f"<{count}Q", self.take(8 * count))
        return values if count > 1 else values[0]

    def strtab(self, length, what, count=None):
        return _strtab(self.take(length), 0, length, f"{self.where}: {what}", count)

    def attributes(self, count):
        rows = list(struct.iter_unpack("<IIq", self.take(16 * count)))
        if any(mode > 0o7777 or zero for mode, zero, _ in rows):
            raise Damaged(f"{self.where}: an attribute entry's mode or zero field is wrong")
        return [(mode, mtime) for mode, _, mtime in rows]


def _parse_footer(buf, features, name):
    """A chunk's trailer and footer (§4), checked for layout: a dict of its parts."""
    size = len(buf)
    offset, length, crc, zero, magic = _TRAILER.unpack(buf[size - 32:])
    if magic != b"GRNYCEND" or zero:
        raise Damaged(f"{name}: trailer at {size - 32}: bad magic or non-zero zero field")
    if offset < 64 or offset + length + 32 != size:
        raise Damaged(f"{name}: trailer puts the footer at {offset}..{offset + length} of {size}")
    foot = buf[offset:offset + length]
    if zlib.crc32(foot) != crc:
        raise Damaged(f"{name}: footer (bytes {offset}..{offset + length}) fails its CRC-32")
    r = _Cursor(foot, f"{name}: footer at {offset}")
    n, paths_len, classes_len = r.u64s(3)
    out = {"offset": offset, "n": n, "attrs": None, "dirs": [], "fields": None,
           "entries": list(_FOOTER_ENTRY.iter_unpack(r.take(40 * n)))}
    out["paths"] = r.strtab(paths_len, "paths", n)
    out["classes"] = r.strtab(classes_len, "classes")
    if features & 2:
        out["attrs"] = r.attributes(n)
        dirs = r.strtab(r.u64s(), "directories")
        if not all(valid_path(d) for d in dirs):
            raise Damaged(f"{r.where}: an invalid directory path")
        _check_rising(dirs, r.where, "directory")
        out["dirs"] = list(zip(dirs, r.attributes(len(dirs))))
    if features & 1:
        names = r.strtab(r.u64s(), "field names")
        _check_names(names, r.where)
        types = _types(r.strtab(r.u64s(), "types", len(names)), r.where) if features & 4 else None
        m = r.u64s()
        counts = struct.unpack(f"<{n}I", r.take(4 * n))
        rows = list(struct.iter_unpack("<IIQII", r.take(24 * m)))
        if any(c < 1 for c in counts) or sum(counts) != m:
            raise Damaged(f"{r.where}: field counts are not all >= 1 adding up to {m}")
        if any(field >= len(names) or z1 or z2 for field, z1, _, _, z2 in rows):
            raise Damaged(f"{r.where}: a field entry names no field or has non-zero zero bytes")
        out["fields"] = {"names": names, "types": types, "counts": counts,
                         "starts": list(itertools.accumulate(counts, initial=0)),
                         "entries": [(field, crc, ln) for field, _, ln, crc, _ in rows]}
    if r.pos != length:
        raise Damaged(f"{r.where}: {length - r.pos} bytes left after its last block")
    return out


# ---------------------------------------------------------------------------------------------
# Command line


def main(argv=None):
    """python3 granary_format.py {info,ls,verify} DATASET | cat DATASET PATH"""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in ("info", "ls", "cat", "verify") or \
            len(args) != (3 if args[0] == "cat" else 2):
        print(f"usage: {main.__doc__}", file=sys.stderr)
        return 2
    try:
        ds = open_dataset(args[1])
        if args[0] == "info":
            info = {k: getattr(ds, k) for k in ("dataset_id content_digest generation parent "
                                                "incompat compat sample_count live_count "
                                                "chunk_count entry_count").split()}
            info["classes"] = [c.decode("utf-8", "backslashreplace") for c in ds.classes]
            info["field_types"] = {k.decode(): v for k, v in ds.field_types.items()}
            print(json.dumps(info, indent=2))
        elif args[0] == "ls":       # as `granary ls` shows them: files, a key's as KEY.NAME
            for entry in ds.entries():
                for shown in ds._shown(entry) if entry.sample is not None else ():
                    print(shown.path.decode("utf-8", "backslashreplace"))
        elif args[0] == "cat":      # KEY.NAME splits at its last component's first "." (§3)
            want = os.fsencode(args[2])
            cut = want.find(b".", want.rfind(b"/") + 1) if ds.incompat & FIELDS else len(want)
            s = ds.lookup(want[:cut]) if cut >= 0 else None
            data = None if s is None else ds.read(s) if cut == len(want) else \
                next((b for n, _, b in ds.fields(s) if n == want[cut + 1:]), None)
            if data is None:
                print(f"{args[2]}: no such file in the dataset", file=sys.stderr)
                return 1
            sys.stdout.buffer.write(data)
        else:
            for name in ds.verify():
                print(f"{name}: not part of the dataset")
            gone = f", {len(ds.deleted)} deleted" if ds.deleted else ""
            print(f"{args[1]}: ok ({ds.live_count} samples{gone}, {ds.chunk_count} chunks)")
    except FormatError as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


open_dataset = Dataset


if __name__ == "__main__":
    sys.exit(main())
