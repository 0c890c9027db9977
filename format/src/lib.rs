//! The granary on-disk format, version 2.0.
//!
//! `SPEC.md` beside this crate is normative; this crate is its executable twin. Every constant
//! and layout here is described there byte for byte, and a change to one changes the other.
//!
//! A dataset is a directory holding one snapshot file ([`SNAPSHOT_FILE`]) and chunk files
//! ([`chunk_file_name`]). All integers are little-endian. Every structure carries a CRC-32
//! (IEEE, as computed by `crc32fast`).
#![forbid(unsafe_code)]

mod chunk;
mod error;
mod hash;
mod id;
mod le;
mod legacy;
pub mod local;
pub mod names;
pub mod view;

mod record;
mod rng;
mod snapshot;
mod strtab;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;

pub use chunk::{
    decode_fields_block, decode_footer, ChunkFooter, ChunkHeader, ChunkSummary, ChunkWriter,
    DirAttrs, RunRecord, Trailer, CHUNK_HEADER_LEN, CHUNK_TRAILER_LEN,
};
use error::{bail, invalid};
pub use error::{FormatError, Result};
pub use hash::path_hash;
pub use id::{hex16, DatasetId};
pub use legacy::{is_legacy_snapshot, read_legacy_snapshot, LegacySnapshot};
pub use record::{
    check_chunk, check_fields, chunk_digest, decode_record, ChunkCheck, MAX_ZSTD_RATIO,
};
pub use rng::SplitMix64;
pub use snapshot::{
    features, prefix_successor, snapshot_key, Blocks, ChunkEntry, ContentDigest, Entry, EntryView,
    FieldType, FileAttrs, FileStat, Lineage, NsEntry, PageIndex, Pager, RecordEntry, SampleField,
    SectionKind, Snapshot, SnapshotBuilder, SnapshotHeader, ATTRS_LEN, BLOCK_SHIFT, BLOCK_SHIFTS,
    CHUNK_ENTRY_LEN, DIGEST_PREFIX, DTYPES, FIELDS_HEADER_LEN, LINEAGE_LEN, MAX_RECORD_OFFSET,
    NS_HEADER_LEN, PAGE_TARGET, RECORD_LEN, RESTART_INTERVAL, SECTION_ENTRY_LEN,
    SECTION_TABLE_HEAD, SNAPSHOT_HEADER_LEN, SNAP_FIELD_LEN,
};
pub use strtab::{encode_string_table, StringTable};
pub use view::ViewFile;

/// Major version of the snapshot format this crate reads and writes. Features are added by
/// feature bits in the header, never by a new minor version.
pub const SNAPSHOT_MAJOR: u16 = 2;
/// Version of the chunk file layout (bytes 8..10 of a chunk header). Bytes 10..12 hold the
/// chunk's feature bits ([`CHUNK_FIELDS`]).
pub const CHUNK_VERSION: u16 = 1;
/// Chunk feature bit: the footer ends with a fields block (every record is a field group).
pub const CHUNK_FIELDS: u16 = 1;
/// Chunk feature bit (with [`CHUNK_FIELDS`]): the fields block carries each name's type.
pub const CHUNK_TYPES: u16 = 4;
/// Chunk feature bit: the footer has an attributes block (each record's mode and mtime, and
/// directories of the packed tree), so that a snapshot rebuilt from chunks keeps them.
pub const CHUNK_ATTRS: u16 = 2;
/// The chunk feature bits this crate knows.
pub const CHUNK_KNOWN_FEATURES: u16 = CHUNK_FIELDS | CHUNK_ATTRS | CHUNK_TYPES;

/// Magic bytes at offset 0 of a snapshot file.
pub const SNAPSHOT_MAGIC: [u8; 8] = *b"GRNYSNAP";
/// Magic bytes at offset 0 of a chunk file.
pub const CHUNK_MAGIC: [u8; 8] = *b"GRNYCHNK";
/// Magic bytes at the very end of a chunk file.
pub const CHUNK_END_MAGIC: [u8; 8] = *b"GRNYCEND";

/// File name of the snapshot inside a dataset directory.
pub const SNAPSHOT_FILE: &str = "snapshot.gsnap";
/// Suffix of chunk file names.
pub const CHUNK_SUFFIX: &str = ".gchunk";

/// Label value meaning "this sample has no label".
pub const NO_LABEL: u32 = u32::MAX;

/// Largest number of samples a snapshot may hold (positions in the namespace are u32).
pub const MAX_SAMPLES: u64 = u32::MAX as u64 - 1;

/// Length in bytes of one sample entry (snapshot sample table and chunk footer record table).
pub const SAMPLE_ENTRY_LEN: usize = 40;

/// File name of chunk `id`: `chunk-` + id in decimal, zero-padded to at least 8 digits, + suffix.
pub fn chunk_file_name(id: u32) -> String {
    format!("chunk-{id:08}{CHUNK_SUFFIX}")
}

/// Parses a chunk file name produced by [`chunk_file_name`]; `None` for anything else.
pub fn parse_chunk_file_name(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("chunk-")?.strip_suffix(CHUNK_SUFFIX)?;
    if digits.len() < 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let id: u32 = digits.parse().ok()?;
    (chunk_file_name(id) == name).then_some(id)
}

/// File name of chunk `id` at revision `revision`: [`chunk_file_name`] at revision 0, else
/// `chunk-` + id as there + `.r` + revision in decimal + suffix (a chunk compacted `revision`
/// times).
pub fn chunk_file_name_at(id: u32, revision: u32) -> String {
    match revision {
        0 => chunk_file_name(id),
        r => format!("chunk-{id:08}.r{r}{CHUNK_SUFFIX}"),
    }
}

/// Parses a name [`chunk_file_name_at`] produces: (chunk id, revision); `None` for anything
/// else.
pub fn parse_chunk_file_name_at(name: &str) -> Option<(u32, u32)> {
    if let Some(id) = parse_chunk_file_name(name) {
        return Some((id, 0));
    }
    let stem = name.strip_suffix(CHUNK_SUFFIX)?;
    let (head, rev) = stem.rsplit_once(".r")?;
    let id = parse_chunk_file_name(&format!("{head}{CHUNK_SUFFIX}"))?;
    let r: u32 = rev.parse().ok().filter(|&r| r > 0)?;
    (chunk_file_name_at(id, r) == name).then_some((id, r))
}

/// How a record's stored bytes are encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Compression {
    /// Stored bytes are the original bytes.
    None = 0,
    /// Stored bytes are one zstd frame whose content is the original bytes.
    Zstd = 1,
}

impl Compression {
    /// The 4-bit code stored in the low bits of a sample entry's flags.
    pub fn code(self) -> u32 {
        self as u32
    }

    /// Decodes a compression code; `None` for codes this version does not know.
    pub fn from_code(code: u32) -> Option<Self> {
        [Compression::None, Compression::Zstd]
            .get(code as usize)
            .copied()
    }

    /// Short name used in listings.
    pub fn name(self) -> &'static str {
        ["none", "zstd"][self as usize]
    }
}

/// One sample: where its stored bytes are and how to check them: what a reader gets from the
/// snapshot ([`Snapshot::sample`]) and what a chunk footer holds (40 bytes each).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleEntry {
    /// Chunk id holding the record.
    pub chunk: u32,
    /// Class index into the class names table, or [`NO_LABEL`].
    pub label: u32,
    /// Byte offset of the stored record inside the chunk file.
    pub offset: u64,
    /// Length of the stored (possibly compressed) record.
    pub stored_len: u64,
    /// Length of the original file.
    pub orig_len: u64,
    /// CRC-32 of the original bytes.
    pub crc32: u32,
    /// Flags: bits 0..4 compression code, bit 4 field group, all other bits zero.
    pub flags: u32,
}

/// Mask of the compression code inside [`SampleEntry::flags`].
pub const FLAG_COMPRESSION_MASK: u32 = 0xF;
/// Flag bit: the record is a *field group*: the sample's named fields stored raw
/// back to back; `crc32` and `orig_len` describe their concatenation, and the fields table
/// (the snapshot's fields section, or the chunk footer's fields block) says where each field is.
pub const FLAG_FIELDS: u32 = 0x10;
/// Flag bit of a snapshot record entry (never of a chunk footer's): the record of a deleted
/// sample was removed from its chunk by compaction; its stored length is 0.
pub const FLAG_REMOVED: u32 = 0x20;

/// Length of one field entry in chunk footers' fields blocks.
pub const FIELD_ENTRY_LEN: usize = 24;

/// One named field of a sample: the index of its name in a field-name table, its
/// length and the CRC-32 of its bytes. Fields are stored raw; a sample's fields lie back to
/// back in its record, in order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FieldEntry {
    pub name: u32,
    pub len: u64,
    pub crc32: u32,
}

// The 24-byte form: name u32, flags u32 (zero: stored raw), length u64, CRC-32 u32, reserved
// u32; in a snapshot's fields section, 16 bytes: name u32, CRC-32 u32, length u64.
le::layout!(FieldEntry, FIELD_ENTRY_LEN, pub(crate) encode, decode_raw, {
    name @ 0, len @ 8, crc32 @ 16,
});
le::layout!(FieldEntry, SNAP_FIELD_LEN, pub(crate) encode_snap, pub(crate) decode_snap, {
    name @ 0, crc32 @ 4, len @ 8,
});

impl FieldEntry {
    /// Decodes (and checks the zero fields of) one 24-byte entry.
    pub fn decode(b: &[u8]) -> Result<Self> {
        if le::u32_at(b, 4) != 0 || le::u32_at(b, 20) != 0 {
            bail!(
                "field entry",
                "flags or reserved field are not zero (fields are stored raw)"
            );
        }
        Ok(Self::decode_raw(b))
    }
}

/// The fields of a chunk's records: the chunk's field names and each record's
/// fields.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChunkFields {
    /// The names the chunk's fields use, sorted by bytes, distinct.
    pub names: Vec<Vec<u8>>,
    /// Each name's type descriptor (SPEC.md §6.5), name by name; empty for a chunk whose
    /// fields block carries no types (chunk feature bit [`CHUNK_TYPES`] clear: a 1.x chunk).
    pub types: Vec<String>,
    /// Per record, in record order: its fields (name indexes into `names`).
    pub records: Vec<Vec<FieldEntry>>,
}

/// Field names numbered as they first come (a writer learns them sample by sample).
#[derive(Clone, Debug, Default)]
pub(crate) struct FieldNames {
    ids: std::collections::HashMap<Vec<u8>, u32>,
    pub(crate) names: Vec<Vec<u8>>,
}

impl FieldNames {
    /// The number of `name`, given it if it is new.
    pub(crate) fn id(&mut self, name: &[u8]) -> u32 {
        let next = self.names.len() as u32;
        *self.ids.entry(name.to_vec()).or_insert_with(|| {
            self.names.push(name.to_vec());
            next
        })
    }

    /// The names sorted, each with its type (`type_of`, `bytes` where it has none), and
    /// `entries` renumbered to match.
    pub(crate) fn sorted<'e>(
        &self,
        entries: impl IntoIterator<Item = &'e mut FieldEntry>,
        type_of: impl Fn(&[u8]) -> Option<String>,
    ) -> (Vec<Vec<u8>>, Vec<String>) {
        let mut order: Vec<usize> = (0..self.names.len()).collect();
        order.sort_unstable_by_key(|&i| &self.names[i]);
        let mut rename = vec![0u32; order.len()];
        for (new, &old) in order.iter().enumerate() {
            rename[old] = new as u32;
        }
        for e in entries {
            e.name = rename[e.name as usize];
        }
        let typed = |i: usize| {
            let t = type_of(&self.names[i]).unwrap_or_else(|| "bytes".into());
            (self.names[i].clone(), t)
        };
        order.into_iter().map(typed).unzip()
    }
}

/// Checks a field name: 1 to 64 bytes of ASCII letters, digits, `_`, `-`, `+` and `.`, not
/// starting or ending with `.` and without `..` (what a file-name extension may be: a field
/// is shown as the file `KEY.NAME`, as WebDataset names them).
pub fn check_field_name(name: &[u8]) -> std::result::Result<(), &'static str> {
    if name.is_empty() || name.len() > 64 {
        return Err("a field name has 1 to 64 bytes");
    }
    if !name
        .iter()
        .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'+' | b'.'))
    {
        return Err("a field name is made of ASCII letters, digits, '_', '-', '+' and '.'");
    }
    if name[0] == b'.' || name[name.len() - 1] == b'.' || name.windows(2).any(|w| w == b"..") {
        return Err("a field name does not start or end with '.' or hold '..'");
    }
    Ok(())
}

/// Checks names that must each pass `check` and be sorted and distinct; `what` names the
/// table in errors.
pub(crate) fn check_sorted<S: AsRef<[u8]>>(
    what: &str,
    names: &[S],
    check: fn(&[u8]) -> std::result::Result<(), &'static str>,
) -> Result<()> {
    for (i, n) in names.iter().enumerate() {
        let n = n.as_ref();
        check(n).map_err(|why| invalid!(what, "{}: {why}", String::from_utf8_lossy(n)))?;
        if i > 0 && names[i - 1].as_ref() >= n {
            bail!(what, "not sorted and distinct");
        }
    }
    Ok(())
}

/// Checks the key of a sample with fields: a valid path whose last component holds no `.`
/// (the file `KEY.NAME` splits back into key and field name at its first dot).
pub fn check_field_key(key: &[u8]) -> std::result::Result<(), &'static str> {
    check_relative_path(key)?;
    let last = key.rsplit(|&b| b == b'/').next().unwrap_or(key);
    if last.contains(&b'.') {
        return Err("the last component of a key with fields holds no '.' (KEY.FIELD names split at the first dot)");
    }
    Ok(())
}

/// Splits the name `KEY.FIELD` of a field file into key and field name at the first dot of its
/// last component.
pub fn split_field_path(path: &[u8]) -> Option<(&[u8], &[u8])> {
    let start = path.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    let dot = start + path[start..].iter().position(|&b| b == b'.')?;
    Some((&path[..dot], &path[dot + 1..]))
}

le::layout!(SampleEntry, SAMPLE_ENTRY_LEN, pub encode, pub decode, {
    chunk @ 0, label @ 4, offset @ 8, stored_len @ 16, orig_len @ 24, crc32 @ 32, flags @ 36,
});

impl SampleEntry {
    /// True if the record is a field group.
    pub fn has_fields(&self) -> bool {
        self.flags & FLAG_FIELDS != 0
    }

    /// The record's compression, or an error naming the unknown code or flag bits. A field
    /// group is stored raw (its fields are).
    pub fn compression(&self) -> Result<Compression> {
        const WHAT: &str = "sample entry";
        let unknown = self.flags & !(FLAG_COMPRESSION_MASK | FLAG_FIELDS);
        let code = self.flags & FLAG_COMPRESSION_MASK;
        if unknown != 0 {
            bail!(WHAT, "unknown flag bits {unknown:#x}");
        }
        if self.has_fields() && code != 0 {
            bail!(WHAT, "a field group is stored raw (compression code 0)");
        }
        Compression::from_code(code)
            .ok_or_else(|| invalid!(WHAT, "unknown compression code {code}"))
    }

    /// Checks that `stored_len` is plausible for the compression and lengths.
    pub fn check_lengths(&self) -> Result<()> {
        if self.compression()? == Compression::None && self.stored_len != self.orig_len {
            bail!(
                "sample entry",
                "uncompressed record has stored length {} but original length {}",
                self.stored_len,
                self.orig_len
            );
        }
        Ok(())
    }
}

/// Checks that `path` is a valid relative dataset path: non-empty, no leading `/`, components
/// separated by single `/`, none empty, `.` or `..`, and no NUL byte.
pub fn check_relative_path(path: &[u8]) -> std::result::Result<(), &'static str> {
    if path.is_empty() {
        return Err("empty path");
    }
    if path.contains(&0) {
        return Err("path contains a NUL byte");
    }
    if path[0] == b'/' {
        return Err("absolute path");
    }
    for comp in path.split(|&b| b == b'/') {
        match comp {
            b"" => return Err("empty path component"),
            b"." => return Err("'.' path component"),
            b".." => return Err("'..' path component"),
            _ => {}
        }
    }
    Ok(())
}

/// CRC-32 (IEEE) of `data`, the checksum used everywhere in the format.
pub fn crc32(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_names_round_trip() {
        for id in [0u32, 1, 42, 99_999_999, 100_000_000, u32::MAX] {
            assert_eq!(parse_chunk_file_name(&chunk_file_name(id)), Some(id));
        }
        assert_eq!(chunk_file_name(7), "chunk-00000007.gchunk");
        for bad in [
            "chunk-7.gchunk",
            "chunk-0000000x.gchunk",
            "chunk-000000007.gchunk",
            "x",
        ] {
            assert_eq!(parse_chunk_file_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn relative_paths() {
        assert!(check_relative_path(b"a/b.jpg").is_ok());
        assert!(check_relative_path(b"\xff\xfe/x").is_ok());
        for bad in [
            &b""[..],
            b"/a",
            b"a//b",
            b"a/",
            b"./a",
            b"a/../b",
            b"..",
            b"a\0b",
        ] {
            assert!(check_relative_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn field_names_and_keys() {
        for ok in [&b"jpg"[..], b"seg.png", b"json", b"__x__", b"a-b+c", b"0"] {
            assert!(check_field_name(ok).is_ok(), "{ok:?}");
        }
        for bad in [
            &b""[..],
            b".jpg",
            b"jpg.",
            b"a..b",
            b"a/b",
            b"a b",
            b"\xff",
            &[b'x'; 65],
        ] {
            assert!(check_field_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_field_key(b"dir/sample_01").is_ok());
        assert!(check_field_key(b"dir.v2/sample").is_ok());
        assert!(check_field_key(b"dir/sample.1").is_err());
        assert!(check_field_key(b"../x").is_err());
        assert_eq!(
            split_field_path(b"a.b/c.seg.png"),
            Some((&b"a.b/c"[..], &b"seg.png"[..]))
        );
        assert_eq!(split_field_path(b"a.b/c"), None);
        let e = FieldEntry {
            name: 3,
            len: 1 << 40,
            crc32: 0xabcd_ef01,
        };
        assert_eq!(FieldEntry::decode(&e.encode()).unwrap(), e);
        let mut b = e.encode();
        b[4] = 1;
        assert!(FieldEntry::decode(&b).is_err(), "flags must be zero");
    }

    #[test]
    fn sample_entry_round_trip_and_layout() {
        let e = SampleEntry {
            chunk: 0x01020304,
            label: 5,
            offset: 0x1122334455667788,
            stored_len: 9,
            orig_len: 10,
            crc32: 0xdeadbeef,
            flags: 1,
        };
        let b = e.encode();
        assert_eq!(&b[0..4], &[4, 3, 2, 1]);
        assert_eq!(&b[8..16], &[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]);
        assert_eq!(SampleEntry::decode(&b), e);
        assert_eq!(e.compression().unwrap(), Compression::Zstd);
        let bad = SampleEntry { flags: 0x20, ..e };
        assert!(bad.compression().is_err());
        // A field group (format 1.3) is stored raw: zstd with it is refused, and its stored
        // and original lengths are equal.
        let bad = SampleEntry { flags: 0x11, ..e };
        assert!(bad.compression().is_err());
        let group = SampleEntry { flags: 0x10, ..e };
        assert_eq!(group.compression().unwrap(), Compression::None);
        assert!(group.check_lengths().is_err());
        let bad = SampleEntry { flags: 7, ..e };
        assert!(bad.compression().is_err());
    }
}
