//! Chunk files: a 64-byte header, records back to back, a footer listing every record, and a
//! 32-byte trailer that locates the footer.

use crate::error::{bail, check_crc, invalid, need, FormatError, Result};
use crate::strtab::{encode_string_table, StringTable};
use crate::SAMPLE_ENTRY_LEN;
use crate::{le, SampleEntry, CHUNK_END_MAGIC, CHUNK_MAGIC, CHUNK_VERSION};
use crate::{
    ChunkFields, Compression, FieldEntry, FieldType, FileAttrs, ATTRS_LEN, CHUNK_ATTRS,
    CHUNK_FIELDS, CHUNK_TYPES, FIELD_ENTRY_LEN, FLAG_FIELDS,
};

mod writer;
pub use writer::{ChunkWriter, RunRecord};

/// A directory as a chunk footer carries it: its path and attributes.
pub type DirAttrs = (Vec<u8>, FileAttrs);

/// Length of the chunk header; records start at this offset.
pub const CHUNK_HEADER_LEN: usize = 64;
/// Length of the trailer at the end of every chunk file.
pub const CHUNK_TRAILER_LEN: usize = 32;
/// Length of the fixed part of the footer body (record count and the two table lengths).
const FOOTER_FIXED_LEN: usize = 24;

/// The header of a chunk file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    /// Random id shared by the snapshot and every chunk of one dataset.
    pub dataset_id: [u8; 16],
    /// This chunk's id; the file is named [`crate::chunk_file_name`]`(chunk_id)`.
    pub chunk_id: u32,
    /// The footer ends with a fields block (feature bit [`CHUNK_FIELDS`]).
    pub fields: bool,
    /// The fields block carries each name's type (feature bit [`CHUNK_TYPES`]).
    pub types: bool,
    /// The footer has an attributes block (feature bit [`CHUNK_ATTRS`]).
    pub attrs: bool,
}

impl ChunkHeader {
    /// Encodes the 64-byte header.
    pub fn encode(&self) -> [u8; CHUNK_HEADER_LEN] {
        let mut b = [0u8; CHUNK_HEADER_LEN];
        b[0..8].copy_from_slice(&CHUNK_MAGIC);
        b[8..10].copy_from_slice(&CHUNK_VERSION.to_le_bytes());
        let features = (self.fields as u16 * CHUNK_FIELDS)
            | (self.types as u16 * CHUNK_TYPES)
            | (self.attrs as u16 * CHUNK_ATTRS);
        b[10..12].copy_from_slice(&features.to_le_bytes());
        b[12..16].copy_from_slice(&(CHUNK_HEADER_LEN as u32).to_le_bytes());
        b[16..32].copy_from_slice(&self.dataset_id);
        b[32..36].copy_from_slice(&self.chunk_id.to_le_bytes());
        let crc = crc32fast::hash(&b[0..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and checks a header from the first bytes of a chunk file.
    pub fn decode(b: &[u8]) -> Result<Self> {
        const WHAT: &str = "chunk header";
        need(WHAT, b, CHUNK_HEADER_LEN)?;
        if b[0..8] != CHUNK_MAGIC {
            return Err(FormatError::bad_magic(WHAT, &CHUNK_MAGIC, &b[0..8]));
        }
        let version = le::u16_at(b, 8);
        if version != CHUNK_VERSION {
            bail!(
                WHAT,
                "chunk layout version {version} is not supported by this reader (it reads \
                 version {CHUNK_VERSION})"
            );
        }
        check_crc(WHAT, le::u32_at(b, 60), &b[0..60])?;
        let features = le::u16_at(b, 10);
        if features & !crate::CHUNK_KNOWN_FEATURES != 0 {
            bail!(
                WHAT,
                "feature bits {:#x} are unknown: a chunk of a dataset whose snapshot this \
                 reader knows holds only known ones (damaged, or another format's chunk)",
                features & !crate::CHUNK_KNOWN_FEATURES
            );
        }
        if b[36..60].iter().any(|&x| x != 0) {
            bail!(WHAT, "reserved bytes 36..60 are not zero");
        }
        if features & CHUNK_TYPES != 0 && features & CHUNK_FIELDS == 0 {
            bail!(WHAT, "field types without fields");
        }
        let header_len = le::u32_at(b, 12);
        if header_len as usize != CHUNK_HEADER_LEN {
            bail!(
                WHAT,
                "header length {header_len}, expected {CHUNK_HEADER_LEN}"
            );
        }
        Ok(ChunkHeader {
            dataset_id: le::id_at(b, 16),
            chunk_id: le::u32_at(b, 32),
            fields: features & CHUNK_FIELDS != 0,
            types: features & CHUNK_TYPES != 0,
            attrs: features & CHUNK_ATTRS != 0,
        })
    }
}

/// The trailer: where the footer is and its CRC.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Trailer {
    /// Offset of the footer body in the file.
    pub footer_offset: u64,
    /// Length of the footer body.
    pub footer_len: u64,
    /// CRC-32 of the footer body.
    pub footer_crc: u32,
}

le::layout!(Trailer, CHUNK_TRAILER_LEN, encode_fields, decode_fields, {
    footer_offset @ 0, footer_len @ 8, footer_crc @ 16,
});

impl Trailer {
    /// Encodes the 32-byte trailer.
    pub fn encode(&self) -> [u8; CHUNK_TRAILER_LEN] {
        let mut b = self.encode_fields();
        b[24..32].copy_from_slice(&CHUNK_END_MAGIC);
        b
    }

    /// Decodes the last 32 bytes of a chunk file of `file_len` bytes and checks that the footer
    /// sits between the header and the trailer, immediately before the trailer.
    pub fn decode(b: &[u8], file_len: u64) -> Result<Self> {
        const WHAT: &str = "chunk trailer";
        if b.len() != CHUNK_TRAILER_LEN {
            return Err(FormatError::truncated(
                WHAT,
                CHUNK_TRAILER_LEN as u64,
                b.len() as u64,
            ));
        }
        if b[24..32] != CHUNK_END_MAGIC {
            return Err(FormatError::bad_magic(WHAT, &CHUNK_END_MAGIC, &b[24..32]));
        }
        let t = Trailer::decode_fields(b);
        let end = t
            .footer_offset
            .checked_add(t.footer_len)
            .and_then(|e| e.checked_add(CHUNK_TRAILER_LEN as u64));
        if le::u32_at(b, 20) != 0
            || t.footer_offset < CHUNK_HEADER_LEN as u64
            || end != Some(file_len)
        {
            bail!(
                WHAT,
                "footer at {}+{} does not end at the trailer of a {file_len}-byte file",
                t.footer_offset,
                t.footer_len
            );
        }
        Ok(t)
    }
}

/// The decoded footer: every record of the chunk, its path, and the dataset's class names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkFooter {
    /// Record entries in file order (`chunk` field equals the chunk id).
    pub entries: Vec<SampleEntry>,
    /// Path of each record, relative to the packed source directory.
    pub paths: Vec<Vec<u8>>,
    /// The dataset's class names (identical in every chunk of a dataset).
    pub classes: Vec<Vec<u8>>,
    /// The records' fields (format 1.3; every record is a field group), if the footer has a
    /// fields block.
    pub fields: Option<ChunkFields>,
    /// With an attributes block: each record's mode and mtime, in record order.
    pub attrs: Option<Vec<FileAttrs>>,
    /// With an attributes block: the directories this chunk records (sorted, distinct).
    pub dirs: Vec<DirAttrs>,
}

/// Encodes a fields block: the names (a string table, preceded by its length as u64), with
/// types (`f.types` not empty) the types likewise, the number of field entries m (u64), one
/// u32 field count per record, then the m entries.
pub fn encode_fields_block(f: &ChunkFields) -> Vec<u8> {
    let m: usize = f.records.iter().map(Vec::len).sum();
    let mut b = Vec::new();
    put_sized_table(&mut b, &f.names);
    if !f.types.is_empty() {
        put_sized_table(&mut b, &f.types);
    }
    b.extend_from_slice(&(m as u64).to_le_bytes());
    for r in &f.records {
        b.extend_from_slice(&(r.len() as u32).to_le_bytes());
    }
    for e in f.records.iter().flatten() {
        b.extend_from_slice(&e.encode());
    }
    b
}

/// Appends `items` as a string table preceded by its length (u64).
fn put_sized_table<S: AsRef<[u8]>>(b: &mut Vec<u8>, items: &[S]) {
    let table = encode_string_table(items.iter());
    b.extend_from_slice(&(table.len() as u64).to_le_bytes());
    b.extend_from_slice(&table);
}

/// The next string table preceded by its length (u64), checked.
fn sized_table(t: &mut le::Take<'_>, what: &'static str) -> Result<Vec<Vec<u8>>> {
    let table = StringTable::parse(t.sized()?, what)?;
    table.validate()?;
    table.to_vecs()
}

/// Encodes an attributes block: one [`FileAttrs`] per record, then the directories' paths (a
/// string table preceded by its length as u64) and one [`FileAttrs`] per directory.
fn encode_attrs_block(attrs: &[FileAttrs], dirs: &[DirAttrs]) -> Vec<u8> {
    let mut b: Vec<u8> = attrs.iter().flat_map(|a| a.encode()).collect();
    let paths: Vec<&[u8]> = dirs.iter().map(|d| &d.0[..]).collect();
    put_sized_table(&mut b, &paths);
    for (_, a) in dirs {
        b.extend_from_slice(&a.encode());
    }
    b
}

/// Decodes the attributes block for `n` records at the front of `t`: the records'
/// attributes and the directories (each a valid relative path, sorted and distinct).
fn decode_attrs_block(t: &mut le::Take<'_>, n: u64) -> Result<(Vec<FileAttrs>, Vec<DirAttrs>)> {
    let attrs_of = |b: &[u8]| -> Result<Vec<FileAttrs>> {
        b.chunks_exact(ATTRS_LEN).map(FileAttrs::decode).collect()
    };
    let attrs = attrs_of(t.bytes(n.saturating_mul(ATTRS_LEN as u64))?)?;
    let paths = sized_table(t, "chunk footer directories")?;
    let dirs = attrs_of(t.bytes((paths.len() * ATTRS_LEN) as u64)?)?;
    crate::check_sorted(
        "chunk footer directories",
        &paths,
        crate::check_relative_path,
    )?;
    Ok((attrs, paths.into_iter().zip(dirs).collect()))
}

/// Decodes the fields block of a footer of `n` records (with each name's type when `typed`),
/// checking its layout, names (each a valid field name, sorted, distinct) and types (one per
/// name, each a known descriptor), that every record has at least one field and every entry
/// names one of the names.
pub fn decode_fields_block(b: &[u8], n: u64, typed: bool) -> Result<ChunkFields> {
    const WHAT: &str = "chunk footer fields";
    let mut t = le::Take::new(b, WHAT);
    let names = sized_table(&mut t, "chunk footer field names")?;
    let mut types = Vec::new();
    if typed {
        let t = sized_table(&mut t, "chunk footer field types")?;
        if t.len() != names.len() {
            bail!(WHAT, "not one type per field name");
        }
        for d in t {
            let d = String::from_utf8(d)
                .map_err(|_| invalid!(WHAT, "a type descriptor is not UTF-8"))?;
            FieldType::parse(&d).map_err(|e| FormatError::invalid(WHAT, e))?;
            types.push(d);
        }
    }
    crate::check_sorted("chunk footer field names", &names, crate::check_field_name)?;
    let m = t.u64()?;
    let b = t.rest;
    // In u128, where no sum of these can overflow.
    if 4 * n as u128 + m as u128 * FIELD_ENTRY_LEN as u128 != b.len() as u128 {
        bail!(
            WHAT,
            "{n} records and {m} fields do not fill the {}-byte rest of the block",
            b.len()
        );
    }
    let entries_at = 4 * n as usize;
    let mut records = Vec::with_capacity(n as usize);
    let mut next = 0u64;
    for r in 0..n as usize {
        let count = le::u32_at(b, 4 * r) as u64;
        if count == 0 || next + count > m {
            bail!(
                WHAT,
                "record {r} has {count} fields (at least 1, and {m} in all)"
            );
        }
        let mut fields = Vec::with_capacity(count as usize);
        for k in next..next + count {
            let e = FieldEntry::decode(
                &b[entries_at + k as usize * FIELD_ENTRY_LEN..][..FIELD_ENTRY_LEN],
            )?;
            if e.name as usize >= names.len() {
                bail!(WHAT, "record {r} names field {} of {}", e.name, names.len());
            }
            fields.push(e);
        }
        next += count;
        records.push(fields);
    }
    if next != m {
        bail!(WHAT, "{m} fields but the records use {next}");
    }
    Ok(ChunkFields {
        names,
        types,
        records,
    })
}

/// Checks a field group's entry against its fields: the group flag set, and lengths that add
/// up to the record's.
pub fn check_group(entry: &SampleEntry, fields: &[FieldEntry]) -> Result<()> {
    let total = fields
        .iter()
        .try_fold(0u64, |a, f| a.checked_add(f.len))
        .unwrap_or(u64::MAX);
    if !entry.has_fields() || total != entry.orig_len || entry.stored_len != entry.orig_len {
        bail!(
            "field group",
            "record of {} bytes (flags {:#x}) does not hold its fields' {total} bytes",
            entry.orig_len,
            entry.flags
        );
    }
    Ok(())
}

/// Decodes a footer body and checks it against its trailer and the chunk header: CRC, entry
/// layout (records back to back from offset 64 up to the footer), chunk ids and paths.
pub fn decode_footer(body: &[u8], trailer: &Trailer, header: &ChunkHeader) -> Result<ChunkFooter> {
    let chunk_id = header.chunk_id;
    const WHAT: &str = "chunk footer";
    if body.len() as u64 != trailer.footer_len {
        return Err(FormatError::truncated(
            WHAT,
            trailer.footer_len,
            body.len() as u64,
        ));
    }
    check_crc(WHAT, trailer.footer_crc, body)?;
    need(WHAT, body, FOOTER_FIXED_LEN)?;
    let [count, paths_len, classes_len] = le::words(body);
    let total = count as u128 * SAMPLE_ENTRY_LEN as u128
        + FOOTER_FIXED_LEN as u128
        + paths_len as u128
        + classes_len as u128;
    if total > body.len() as u128 {
        bail!(
            WHAT,
            "{count} records, {paths_len} path bytes and {classes_len} class bytes do not \
             add up to the footer length {}",
            body.len()
        );
    }
    let mut rest = le::Take::new(&body[FOOTER_FIXED_LEN..], WHAT);
    let table = rest.bytes(count * SAMPLE_ENTRY_LEN as u64)?;
    let paths = StringTable::parse(rest.bytes(paths_len)?, "chunk footer paths")?;
    let classes = StringTable::parse(rest.bytes(classes_len)?, "chunk footer classes")?;
    // The blocks after the class table, each if the header announces it: attributes, fields.
    let mut rest = le::Take::new(rest.rest, "chunk footer attributes");
    let (attrs, dirs) = match header.attrs {
        true => decode_attrs_block(&mut rest, count).map(|(a, d)| (Some(a), d))?,
        false => (None, Vec::new()),
    };
    let fields = match (rest.rest, header.fields) {
        ([], false) => None,
        (block, true) => Some(decode_fields_block(block, count, header.types)?),
        (_, false) => {
            bail!(
                WHAT,
                "bytes after the class table and attributes, but the header announces no \
                 fields block"
            )
        }
    };
    if paths.len() != count {
        bail!(WHAT, "{count} records but {} paths", paths.len());
    }
    paths.validate()?;
    classes.validate()?;
    let mut entries = Vec::with_capacity(count as usize);
    let mut expect_offset = CHUNK_HEADER_LEN as u64;
    for (i, b) in table.chunks_exact(SAMPLE_ENTRY_LEN).enumerate() {
        let e = SampleEntry::decode(b);
        let what = || format!("chunk {chunk_id} footer record {i}");
        if e.chunk != chunk_id {
            bail!(what(), "names chunk {}", e.chunk);
        }
        e.compression()
            .and_then(|_| e.check_lengths())
            .map_err(|err| FormatError::invalid(what(), err.to_string()))?;
        if e.offset != expect_offset {
            bail!(what(), "at offset {}, expected {expect_offset}", e.offset);
        }
        expect_offset = e
            .offset
            .checked_add(e.stored_len)
            .filter(|&end| end <= trailer.footer_offset)
            .ok_or_else(|| invalid!(what(), "extends past the start of the footer"))?;
        match &fields {
            Some(f) => check_group(&e, &f.records[i]),
            None if e.has_fields() => {
                Err(invalid!("field group", "the footer has no fields block"))
            }
            None => Ok(()),
        }
        .map_err(|err| FormatError::invalid(what(), err.to_string()))?;
        if e.label != crate::NO_LABEL && e.label as u64 >= classes.len() {
            bail!(
                what(),
                "label {} but only {} classes",
                e.label,
                classes.len()
            );
        }
        entries.push(e);
    }
    if expect_offset != trailer.footer_offset {
        bail!(
            WHAT,
            "records end at {expect_offset} but the footer starts at {}",
            trailer.footer_offset
        );
    }
    let paths = paths.to_vecs()?;
    for (i, p) in paths.iter().enumerate() {
        let check = match fields {
            Some(_) => crate::check_field_key(p),
            None => crate::check_relative_path(p),
        };
        check.map_err(|why| {
            FormatError::invalid(format!("chunk {chunk_id} footer record {i}"), why)
        })?;
    }
    let classes = classes.to_vecs()?;
    Ok(ChunkFooter {
        entries,
        paths,
        classes,
        fields,
        attrs,
        dirs,
    })
}

/// What a finished chunk file holds, for the snapshot's chunk table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkSummary {
    /// Chunk id.
    pub chunk_id: u32,
    /// Total file length in bytes.
    pub file_size: u64,
    /// CRC-32 of the whole file.
    pub file_crc: u32,
    /// The chunk's identity: the first 16 bytes of SHA-256 over the whole file.
    pub digest: [u8; 16],
    /// Record entries in file order.
    pub entries: Vec<SampleEntry>,
    /// Path of each record.
    pub paths: Vec<Vec<u8>>,
    /// The records' fields (format 1.3), if the chunk's records are field groups.
    pub fields: Option<ChunkFields>,
    /// Each record's mode and mtime, if the chunk records them (feature bit [`CHUNK_ATTRS`]).
    pub attrs: Option<Vec<FileAttrs>>,
    /// The directories the chunk records, with their attributes.
    pub dirs: Vec<DirAttrs>,
}

impl ChunkSummary {
    /// Chunk `chunk_id` of `file_size` bytes, CRC `file_crc` and digest `digest`, without its
    /// records: what a caller that reads the footer later keeps.
    pub fn bare(chunk_id: u32, file_size: u64, file_crc: u32, digest: [u8; 16]) -> Self {
        ChunkSummary {
            chunk_id,
            file_size,
            file_crc,
            digest,
            entries: Vec::new(),
            paths: Vec::new(),
            fields: None,
            attrs: None,
            dirs: Vec::new(),
        }
    }

    /// The summary of chunk `chunk_id` of `file_size` bytes, CRC `file_crc` and digest `digest`
    /// with the records of its decoded `footer`.
    pub fn from_footer(
        chunk_id: u32,
        file_size: u64,
        file_crc: u32,
        digest: [u8; 16],
        f: ChunkFooter,
    ) -> Self {
        ChunkSummary {
            entries: f.entries,
            paths: f.paths,
            fields: f.fields,
            attrs: f.attrs,
            dirs: f.dirs,
            ..Self::bare(chunk_id, file_size, file_crc, digest)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_chunk() -> (Vec<u8>, ChunkSummary) {
        chunk_with(false)
    }

    const DIR_ATTRS: FileAttrs = FileAttrs {
        mode: 0o750,
        mtime_ns: -3,
    };

    fn file_attrs(i: i64) -> FileAttrs {
        FileAttrs {
            mode: 0o644,
            mtime_ns: 1_700_000_000_000_000_000 + i,
        }
    }

    /// Two records; with `attrs`, their attributes and directories `b` and `e/f`.
    fn chunk_with(attrs: bool) -> (Vec<u8>, ChunkSummary) {
        let mut w = match attrs {
            true => ChunkWriter::with_attrs(Vec::new(), [7; 16], 3).unwrap(),
            false => ChunkWriter::new(Vec::new(), [7; 16], 3).unwrap(),
        };
        w.append(
            b"a/x",
            b"hello",
            Compression::None,
            5,
            crate::crc32(b"hello"),
            0,
        )
        .unwrap();
        if attrs {
            w.attrs(file_attrs(1)).unwrap();
        }
        w.append(b"b/y", b"", Compression::None, 0, crate::crc32(b""), 1)
            .unwrap();
        if attrs {
            w.attrs(file_attrs(2)).unwrap();
            w.dirs(vec![
                (b"e/f".to_vec(), DIR_ATTRS),
                (b"b".to_vec(), DIR_ATTRS),
            ])
            .unwrap();
        }
        let (bytes, s) = w.finish(&[b"a".as_slice(), b"b"]).unwrap();
        (bytes, s)
    }

    #[test]
    fn attributes_round_trip_and_every_flip_and_cut_is_detected() {
        let (bytes, s) = chunk_with(true);
        let (h, f) = decode_all(&bytes).unwrap();
        assert!(h.attrs && !h.fields);
        assert_eq!(f.attrs, Some(vec![file_attrs(1), file_attrs(2)]));
        assert_eq!(s.attrs, f.attrs);
        let dirs = vec![(b"b".to_vec(), DIR_ATTRS), (b"e/f".to_vec(), DIR_ATTRS)];
        assert_eq!((&f.dirs, &s.dirs), (&dirs, &dirs));
        for pos in (0..bytes.len()).filter(|p| !(64..69).contains(p)) {
            let mut d = bytes.clone();
            d[pos] ^= 0x20;
            assert!(decode_all(&d).is_err(), "flip at {pos} not detected");
        }
        for cut in 0..bytes.len() {
            assert!(decode_all(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        // Without the feature bit, the block is bytes the header does not announce.
        let mut d = bytes.clone();
        d[10] = 0;
        let crc = crc32fast::hash(&d[0..60]);
        d[60..64].copy_from_slice(&crc.to_le_bytes());
        let err = decode_all(&d).unwrap_err().to_string();
        assert!(err.contains("announces no fields block"), "{err}");
        // The writer refuses what the block cannot hold.
        let mut w = ChunkWriter::with_attrs(Vec::new(), [7; 16], 0).unwrap();
        assert!(w.dirs(vec![(b"../x".to_vec(), DIR_ATTRS)]).is_err());
        let twice = vec![(b"d".to_vec(), DIR_ATTRS), (b"d".to_vec(), DIR_ATTRS)];
        assert!(w.dirs(twice).is_err());
        assert!(ChunkWriter::new(Vec::new(), [7; 16], 0)
            .unwrap()
            .dirs(Vec::new())
            .is_err());
    }

    fn decode_all(bytes: &[u8]) -> Result<(ChunkHeader, ChunkFooter)> {
        let h = ChunkHeader::decode(bytes)?;
        if bytes.len() < CHUNK_TRAILER_LEN {
            return Err(FormatError::truncated("chunk", 32, bytes.len() as u64));
        }
        let t = Trailer::decode(
            &bytes[bytes.len() - CHUNK_TRAILER_LEN..],
            bytes.len() as u64,
        )?;
        let body = &bytes[t.footer_offset as usize..(t.footer_offset + t.footer_len) as usize];
        Ok((h, decode_footer(body, &t, &h)?))
    }

    /// The whole-file CRC-32 is combined from the records' own CRC-32s where they describe
    /// the stored bytes (raw records, fields), computed where they do not (compressed): both
    /// agree with the bytes; a record CRC-32 that lies shows in the file's too.
    #[test]
    fn the_file_crc_is_the_crc_of_the_bytes_however_it_is_reached() {
        let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut w = ChunkWriter::new(Vec::new(), [1; 16], 0).unwrap();
        w.append(
            b"raw",
            &big,
            Compression::None,
            big.len() as u64,
            crate::crc32(&big),
            0,
        )
        .unwrap();
        w.append(b"z", b"zstd bytes", Compression::Zstd, 400, 0x1234, 0)
            .unwrap();
        let (bytes, s) = w.finish::<&[u8]>(&[]).unwrap();
        assert_eq!(s.file_crc, crate::crc32(&bytes));
        let mut w = ChunkWriter::with_fields(Vec::new(), [1; 16], 0).unwrap();
        let fields = [
            (&b"a"[..], &big[..10], crate::crc32(&big[..10])),
            (b"b", &big, crate::crc32(&big)),
        ];
        w.append_group(b"k", &fields, 0).unwrap();
        let (bytes, s) = w.finish::<&[u8]>(&[]).unwrap();
        assert_eq!(s.file_crc, crate::crc32(&bytes));
        let mut w = ChunkWriter::new(Vec::new(), [1; 16], 0).unwrap();
        w.append(b"raw", &big, Compression::None, big.len() as u64, 7, 0)
            .unwrap();
        let (bytes, s) = w.finish::<&[u8]>(&[]).unwrap();
        assert_ne!(s.file_crc, crate::crc32(&bytes));
    }

    #[test]
    fn a_run_makes_the_chunk_its_records_appended_one_by_one_make() {
        let big: Vec<u8> = (0..70_000u32).map(|i| (i * 13 % 251) as u8).collect();
        // Path, stored bytes, compression, original length, CRC-32.
        type Rec<'a> = (&'static [u8], &'a [u8], Compression, u64, u32);
        let recs: [Rec<'_>; 4] = [
            (
                b"a/raw",
                &big,
                Compression::None,
                big.len() as u64,
                crate::crc32(&big),
            ),
            (b"a/empty", b"", Compression::None, 0, crate::crc32(b"")),
            (b"b/z", b"zstd bytes", Compression::Zstd, 400, 0x1234),
            (
                b"b/tail",
                &big[..9],
                Compression::None,
                9,
                crate::crc32(&big[..9]),
            ),
        ];
        let run: Vec<u8> = recs.iter().flat_map(|r| r.1.iter().copied()).collect();
        for with_attrs in [false, true] {
            let start = |w: Vec<u8>| match with_attrs {
                true => ChunkWriter::with_attrs(w, [2; 16], 5).unwrap(),
                false => ChunkWriter::new(w, [2; 16], 5).unwrap(),
            };
            let attrs = |i: usize| with_attrs.then(|| file_attrs(i as i64));
            let mut one = start(Vec::new());
            for (i, (path, stored, c, orig, crc)) in recs.iter().enumerate() {
                one.append(path, stored, *c, *orig, *crc, i as u32).unwrap();
                if let Some(a) = attrs(i) {
                    one.attrs(a).unwrap();
                }
            }
            let mut all = start(Vec::new());
            let run_of = |i: usize, r: &Rec<'_>| RunRecord {
                path: r.0,
                stored_len: r.1.len() as u64,
                compression: r.2,
                orig_len: r.3,
                crc32: r.4,
                label: i as u32,
                attrs: attrs(i),
            };
            all.append_run(&run, recs.iter().enumerate().map(|(i, r)| run_of(i, r)))
                .unwrap();
            let (a, sa) = one.finish::<&[u8]>(&[b"x"]).unwrap();
            let (b, sb) = all.finish::<&[u8]>(&[b"x"]).unwrap();
            assert_eq!(a, b, "attrs {with_attrs}");
            assert_eq!((sa.file_crc, &sa.entries), (sb.file_crc, &sb.entries));
            assert_eq!(sb.file_crc, crate::crc32(&b));
            // Lengths that do not add up, and attributes where the chunk has none (or the
            // other way round), are refused before a byte is written.
            let mut w = start(Vec::new());
            let short = recs.iter().enumerate().map(|(i, r)| run_of(i, r));
            assert!(w.append_run(&run[1..], short).is_err());
            let wrong = recs.iter().enumerate().map(|(i, r)| RunRecord {
                attrs: (!with_attrs).then(|| file_attrs(1)),
                ..run_of(i, r)
            });
            assert!(w.append_run(&run, wrong).is_err());
            assert_eq!(w.position(), CHUNK_HEADER_LEN as u64);
        }
    }

    #[test]
    fn round_trip() {
        let (bytes, s) = sample_chunk();
        assert_eq!(s.file_size, bytes.len() as u64);
        assert_eq!(s.file_crc, crate::crc32(&bytes));
        let (h, f) = decode_all(&bytes).unwrap();
        assert_eq!(h.chunk_id, 3);
        assert_eq!(h.dataset_id, [7; 16]);
        assert_eq!(f.entries, s.entries);
        assert_eq!(f.paths, vec![b"a/x".to_vec(), b"b/y".to_vec()]);
        assert_eq!(f.classes, vec![b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(&bytes[64..69], b"hello");
    }

    #[test]
    fn every_flip_and_cut_is_detected() {
        let (bytes, _) = sample_chunk();
        for pos in 0..bytes.len() {
            let mut d = bytes.clone();
            d[pos] ^= 0x20;
            // Record bytes are covered by the per-record CRC, not by the header/footer checks.
            if (64..69).contains(&pos) {
                continue;
            }
            assert!(decode_all(&d).is_err(), "flip at {pos} not detected");
        }
        for cut in 0..bytes.len() {
            assert!(decode_all(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn rejects_future_versions_and_unknown_features() {
        let (bytes, _) = sample_chunk();
        let with = |at: usize, v: u16| {
            let mut b = bytes.clone();
            b[at..at + 2].copy_from_slice(&v.to_le_bytes());
            let crc = crc32fast::hash(&b[0..60]);
            b[60..64].copy_from_slice(&crc.to_le_bytes());
            ChunkHeader::decode(&b).unwrap_err().to_string()
        };
        let err = with(8, 2);
        assert!(
            err.contains("version 2") && err.contains("version 1"),
            "{err}"
        );
        let err = with(10, 8);
        assert!(err.contains("feature bits 0x8"), "{err}");
        let err = with(10, 4);
        assert!(err.contains("field types without fields"), "{err}");
    }
}
