//! Writing chunk files: [`ChunkWriter`] streams the header, the records and the footer, and
//! tracks offsets, the whole-file CRC-32 and the whole-file digest as it goes.

use std::io::Write;

use super::*;

fn invalid_input(m: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, m.into())
}

/// One record of [`ChunkWriter::append_run`]: what [`ChunkWriter::append`] takes, but its
/// bytes (which are in the run), and its attributes where the chunk has them.
#[derive(Clone, Copy, Debug)]
pub struct RunRecord<'a> {
    pub path: &'a [u8],
    pub stored_len: u64,
    pub compression: Compression,
    pub orig_len: u64,
    pub crc32: u32,
    pub label: u32,
    pub attrs: Option<FileAttrs>,
}

/// Streams a chunk file: header, then records, then footer and trailer. Tracks offsets and the
/// whole-file CRC as bytes are written.
pub struct ChunkWriter<W: Write> {
    out: W,
    chunk_id: u32,
    pos: u64,
    crc: crc32fast::Hasher,
    digest: crate::ContentDigest,
    entries: Vec<SampleEntry>,
    paths: Vec<Vec<u8>>,
    /// With fields: each record's fields, named in `names` until the footer sorts them.
    fields: Option<Vec<Vec<FieldEntry>>>,
    names: crate::FieldNames,
    /// Field types declared ([`ChunkWriter::field_types`]); other names are `bytes`.
    types: std::collections::BTreeMap<Vec<u8>, String>,
    /// With an attributes block: the records' attributes so far, and the directories.
    attrs: Option<(Vec<FileAttrs>, Vec<DirAttrs>)>,
}

impl<W: Write> ChunkWriter<W> {
    /// Starts a chunk by writing its header.
    pub fn new(out: W, dataset_id: [u8; 16], chunk_id: u32) -> std::io::Result<Self> {
        Self::start(out, dataset_id, chunk_id, false, false)
    }

    /// Starts a chunk whose records are field groups (a fields block with each name's type in
    /// the footer); append them with [`ChunkWriter::append_group`].
    pub fn with_fields(out: W, dataset_id: [u8; 16], chunk_id: u32) -> std::io::Result<Self> {
        Self::start(out, dataset_id, chunk_id, true, false)
    }

    /// Starts a chunk of files that records each record's mode and mtime
    /// ([`ChunkWriter::attrs`] after each [`ChunkWriter::append`]) and directories
    /// ([`ChunkWriter::dirs`]) in an attributes block.
    pub fn with_attrs(out: W, dataset_id: [u8; 16], chunk_id: u32) -> std::io::Result<Self> {
        Self::start(out, dataset_id, chunk_id, false, true)
    }

    fn start(
        out: W,
        dataset_id: [u8; 16],
        chunk_id: u32,
        fields: bool,
        attrs: bool,
    ) -> std::io::Result<Self> {
        let mut w = ChunkWriter {
            out,
            chunk_id,
            pos: 0,
            crc: crc32fast::Hasher::new(),
            digest: crate::ContentDigest::new(),
            entries: Vec::new(),
            paths: Vec::new(),
            fields: fields.then(Vec::new),
            names: Default::default(),
            types: Default::default(),
            attrs: attrs.then(Default::default),
        };
        let header = ChunkHeader {
            dataset_id,
            chunk_id,
            fields,
            types: fields,
            attrs,
        };
        w.write(&header.encode(), None)?;
        Ok(w)
    }

    /// Gives the record appended last its attributes (a mode beyond `0o7777` is refused).
    /// Only in a chunk started with [`ChunkWriter::with_attrs`]; every record needs them.
    pub fn attrs(&mut self, a: FileAttrs) -> std::io::Result<()> {
        let n = self.entries.len();
        match &mut self.attrs {
            Some((list, _)) if list.len() + 1 == n && a.mode <= 0o7777 => {
                list.push(a);
                Ok(())
            }
            _ => Err(invalid_input(format!(
                "attributes {a:?} for record {n}: only once per record, in a chunk with \
                 attributes, mode at most 7777"
            ))),
        }
    }

    /// Records directories (valid relative paths, any order, each once) with their
    /// attributes. Only in a chunk started with [`ChunkWriter::with_attrs`].
    pub fn dirs(&mut self, mut dirs: Vec<DirAttrs>) -> std::io::Result<()> {
        dirs.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        if let Some(w) = dirs.windows(2).find(|w| w[0].0 == w[1].0) {
            let p = String::from_utf8_lossy(&w[0].0);
            return Err(invalid_input(format!("directory {p} given twice")));
        }
        for (p, a) in &dirs {
            crate::check_relative_path(p).map_err(invalid_input)?;
            if a.mode > 0o7777 {
                return Err(invalid_input(format!("directory mode {:o}", a.mode)));
            }
        }
        match &mut self.attrs {
            Some((_, d)) => *d = dirs,
            None => return Err(invalid_input("a chunk without attributes")),
        }
        Ok(())
    }

    /// Appends one sample with named fields as a field group: the fields' bytes back to back.
    /// `fields` are (name, bytes, CRC-32 of the bytes); names must be valid field names, each
    /// once in the sample. Only in a chunk started with [`ChunkWriter::with_fields`].
    pub fn append_group(
        &mut self,
        path: &[u8],
        fields: &[(&[u8], &[u8], u32)],
        label: u32,
    ) -> std::io::Result<SampleEntry> {
        if self.fields.is_none() {
            return Err(invalid_input(
                "a chunk without fields takes no field groups",
            ));
        }
        crate::check_field_key(path).map_err(invalid_input)?;
        if fields.is_empty() {
            return Err(invalid_input("a field group has at least one field"));
        }
        let mut names: Vec<&[u8]> = Vec::with_capacity(fields.len());
        for (name, _, _) in fields {
            crate::check_field_name(name).map_err(invalid_input)?;
            if names.contains(name) {
                return Err(invalid_input(format!(
                    "field {:?} twice",
                    String::from_utf8_lossy(name)
                )));
            }
            names.push(name);
        }
        let offset = self.pos;
        let mut group = crc32fast::Hasher::new();
        let mut total = 0u64;
        let mut list = Vec::with_capacity(fields.len());
        for (name, data, crc) in fields {
            self.write(data, Some(*crc))?;
            group.combine(&crc32fast::Hasher::new_with_initial_len(
                *crc,
                data.len() as u64,
            ));
            total += data.len() as u64;
            list.push(FieldEntry {
                name: self.names.id(name),
                len: data.len() as u64,
                crc32: *crc,
            });
        }
        let entry = SampleEntry {
            chunk: self.chunk_id,
            label,
            offset,
            stored_len: total,
            orig_len: total,
            crc32: group.finalize(),
            flags: FLAG_FIELDS,
        };
        self.entries.push(entry);
        self.paths.push(path.to_vec());
        self.fields.as_mut().expect("checked above").push(list);
        Ok(entry)
    }

    /// Writes `b` and counts it ([`ChunkWriter::count`]).
    fn write(&mut self, b: &[u8], crc: Option<u32>) -> std::io::Result<()> {
        self.out.write_all(b)?;
        self.count(b, crc);
        Ok(())
    }

    /// Counts `b`, just written, into the position, the whole-file digest (SHA-256 over every
    /// byte: the chunk's identity) and the whole-file CRC-32: combined from `crc`, the CRC-32
    /// the caller computed over these very bytes (a few dozen multiplications), instead of
    /// computed over the bytes a second time. A wrong `crc` makes the file's CRC-32 wrong as
    /// well as the record's, so verification finds it either way.
    fn count(&mut self, b: &[u8], crc: Option<u32>) {
        self.digest.update(b);
        match crc {
            Some(crc) => self.crc.combine(&crc32fast::Hasher::new_with_initial_len(
                crc,
                b.len() as u64,
            )),
            None => self.crc.update(b),
        }
        self.pos += b.len() as u64;
    }

    /// Records the record whose stored bytes `stored` were just written (see
    /// [`ChunkWriter::append`]): its entry and path, and its bytes counted.
    fn record(
        &mut self,
        path: &[u8],
        stored: &[u8],
        compression: Compression,
        orig_len: u64,
        crc32: u32,
        label: u32,
    ) -> SampleEntry {
        let entry = SampleEntry {
            chunk: self.chunk_id,
            label,
            offset: self.pos,
            stored_len: stored.len() as u64,
            orig_len,
            crc32,
            flags: compression.code(),
        };
        // A record stored as it is: its CRC-32 is that of its stored bytes.
        let own = matches!(compression, Compression::None) && orig_len == stored.len() as u64;
        self.count(stored, own.then_some(crc32));
        self.entries.push(entry);
        self.paths.push(path.to_vec());
        entry
    }

    /// Appends one record. `stored` is what goes on disk (compressed per `compression`),
    /// `orig_len` and `crc32` describe the original bytes (for a record stored as it is,
    /// `crc32` is also the CRC-32 of `stored`, and the whole-file CRC-32 is combined from it).
    pub fn append(
        &mut self,
        path: &[u8],
        stored: &[u8],
        compression: Compression,
        orig_len: u64,
        crc32: u32,
        label: u32,
    ) -> std::io::Result<SampleEntry> {
        if self.fields.is_some() {
            return Err(invalid_input("a chunk with fields takes field groups only"));
        }
        self.out.write_all(stored)?;
        Ok(self.record(path, stored, compression, orig_len, crc32, label))
    }

    /// Appends records whose stored bytes lie back to back in `run` (each record's
    /// `stored_len` of it, in order), written with one write: a caller that laid a chunk's
    /// records out in memory hands them over whole, so that the file below can take them from
    /// where they are (see `granary_store::write::AtomicFile::direct`). The chunk is the one
    /// [`ChunkWriter::append`] of each record in turn (then [`ChunkWriter::attrs`] with its
    /// `attrs`) makes. Lengths that do not add up to `run`'s are refused before anything is
    /// written.
    pub fn append_run<'r>(
        &mut self,
        run: &[u8],
        records: impl IntoIterator<Item = RunRecord<'r>>,
    ) -> std::io::Result<()> {
        if self.fields.is_some() {
            return Err(invalid_input("a chunk with fields takes field groups only"));
        }
        let records: Vec<RunRecord<'r>> = records.into_iter().collect();
        let total = records
            .iter()
            .try_fold(0u64, |t, r| t.checked_add(r.stored_len));
        if total != Some(run.len() as u64) {
            return Err(invalid_input(format!(
                "{} records of {total:?} stored bytes in a run of {}",
                records.len(),
                run.len()
            )));
        }
        let attrs_ok = |r: &RunRecord<'_>| match (r.attrs, &self.attrs) {
            (Some(a), Some(_)) => a.mode <= 0o7777,
            (None, None) => true,
            _ => false,
        };
        if let Some(r) = records.iter().find(|r| !attrs_ok(r)) {
            return Err(invalid_input(format!(
                "attributes {:?} of record {:?}: every record of a chunk with attributes has \
                 them (mode at most 7777), and only there",
                r.attrs,
                String::from_utf8_lossy(r.path)
            )));
        }
        self.out.write_all(run)?;
        let mut at = 0usize;
        for r in records {
            let stored = &run[at..at + r.stored_len as usize];
            at += stored.len();
            self.record(r.path, stored, r.compression, r.orig_len, r.crc32, r.label);
            if let (Some(a), Some((list, _))) = (r.attrs, &mut self.attrs) {
                list.push(a);
            }
        }
        Ok(())
    }

    /// Declares field types (descriptors of SPEC.md §6.5, checked); a name not declared is
    /// `bytes`. Any time before [`ChunkWriter::finish`].
    pub fn field_types(
        &mut self,
        types: &std::collections::BTreeMap<Vec<u8>, String>,
    ) -> std::io::Result<()> {
        for d in types.values() {
            FieldType::parse(d).map_err(invalid_input)?;
        }
        self.types = types.clone();
        Ok(())
    }

    /// Number of bytes written so far.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// The chunk's id.
    pub fn chunk_id(&self) -> u32 {
        self.chunk_id
    }

    /// Replaces every record's label `l` so far by `f(l)`: a writer that learns its class
    /// table only at the end gives provisional labels, then the table's. Any time before
    /// [`ChunkWriter::finish`] (the labels are in the footer only).
    pub fn map_labels(&mut self, f: impl Fn(u32) -> u32) {
        for e in &mut self.entries {
            e.label = f(e.label);
        }
    }

    /// Writes the footer (with `classes`) and trailer; returns the writer and the summary.
    pub fn finish<C: AsRef<[u8]>>(mut self, classes: &[C]) -> std::io::Result<(W, ChunkSummary)> {
        let paths = encode_string_table(self.paths.iter());
        let classes = encode_string_table(classes.iter());
        let fields = self.fields.take().map(|mut records| {
            let (names, types) =
                (self.names).sorted(records.iter_mut().flatten(), |n| self.types.get(n).cloned());
            ChunkFields {
                names,
                types,
                records,
            }
        });
        let (attrs, dirs) = match self.attrs.take() {
            Some((a, d)) => (Some(a), d),
            None => (None, Vec::new()),
        };
        if let Some(a) = attrs.as_ref().filter(|a| a.len() != self.entries.len()) {
            let n = self.entries.len();
            return Err(invalid_input(format!(
                "attributes for {} of {n} records",
                a.len()
            )));
        }
        let mut body = Vec::new();
        let lens = [self.entries.len(), paths.len(), classes.len()];
        le::put_words(&mut body, &lens.map(|n| n as u64));
        for e in &self.entries {
            body.extend_from_slice(&e.encode());
        }
        body.extend_from_slice(&paths);
        body.extend_from_slice(&classes);
        if let Some(a) = &attrs {
            body.extend_from_slice(&encode_attrs_block(a, &dirs));
        }
        if let Some(f) = &fields {
            body.extend_from_slice(&encode_fields_block(f));
        }
        let trailer = Trailer {
            footer_offset: self.pos,
            footer_len: body.len() as u64,
            footer_crc: crc32fast::hash(&body),
        };
        self.write(&body, None)?;
        self.write(&trailer.encode(), None)?;
        let summary = ChunkSummary {
            chunk_id: self.chunk_id,
            file_size: self.pos,
            file_crc: self.crc.clone().finalize(),
            digest: std::mem::take(&mut self.digest).finish(),
            entries: std::mem::take(&mut self.entries),
            paths: std::mem::take(&mut self.paths),
            fields,
            attrs,
            dirs,
        };
        Ok((self.out, summary))
    }
}
