//! The one way a chunk file is built: header, records, footer (class table, field types),
//! then sealed and renamed into place ([`crate::write`]), on an [`AtomicFile`] (a pack's
//! chunks), an [`Appender`](crate::append::Appender) (the writer's) or [`InMemory`] (a tier's
//! hot chunks); a chunk dropped before it is published leaves nothing.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use granary_format::{ChunkSummary, ChunkWriter, DirAttrs};

use crate::write::{AtomicFile, Durability, Pending, Seal};

/// What a chunk's records are besides their bytes.
pub enum Records {
    /// Files or samples with nothing more.
    Plain,
    /// Files with their attributes, and these directories (so that a snapshot's namespace can
    /// be rebuilt from the chunks).
    Attrs(Vec<DirAttrs>),
    /// Samples with named fields (their types are given when the chunk is finished).
    Fields,
}

/// A chunk file being built (see the module).
pub struct ChunkFile<W: Seal> {
    w: ChunkWriter<W>,
    fields: bool,
    tmp: PathBuf,
}

impl<W: Seal> ChunkFile<W> {
    /// Starts chunk `id` of dataset `dataset_id` on `out`: writes its header.
    pub fn create(out: W, dataset_id: [u8; 16], id: u32, records: Records) -> io::Result<Self> {
        let fields = matches!(records, Records::Fields);
        let tmp = out.tmp_path().to_path_buf();
        let w = match records {
            Records::Plain => ChunkWriter::new(out, dataset_id, id)?,
            Records::Fields => ChunkWriter::with_fields(out, dataset_id, id)?,
            Records::Attrs(dirs) => {
                let mut w = ChunkWriter::with_attrs(out, dataset_id, id)?;
                w.dirs(dirs)?;
                w
            }
        };
        Ok(ChunkFile { w, fields, tmp })
    }

    /// Where records are appended.
    pub fn records(&mut self) -> &mut ChunkWriter<W> {
        &mut self.w
    }

    /// The temporary name the chunk is written under, for errors.
    pub fn tmp_path(&self) -> &Path {
        &self.tmp
    }

    /// Writes the footer with the class table `classes` (and the fields' `types`); hands back
    /// the output, not sealed yet (a tier makes room for a hot chunk first).
    pub fn finish<C: AsRef<[u8]>>(
        mut self,
        classes: &[C],
        types: &BTreeMap<Vec<u8>, String>,
    ) -> io::Result<(W, ChunkSummary)> {
        if self.fields {
            self.w.field_types(types)?;
        }
        self.w.finish(classes)
    }

    /// [`ChunkFile::finish`], then sealed and renamed into place.
    pub fn publish<C: AsRef<[u8]>>(
        self,
        classes: &[C],
        types: &BTreeMap<Vec<u8>, String>,
    ) -> io::Result<ChunkSummary> {
        let (out, summary) = self.finish(classes, types)?;
        out.seal()?.publish()?;
        Ok(summary)
    }
}

/// A file gathered in memory and written (as an [`AtomicFile`]) only when sealed.
pub struct InMemory {
    path: PathBuf,
    durability: Durability,
    bytes: Vec<u8>,
}

impl InMemory {
    pub fn new(path: &Path, durability: Durability) -> InMemory {
        InMemory {
            path: path.to_path_buf(),
            durability,
            bytes: Vec::new(),
        }
    }
}

impl io::Write for InMemory {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.bytes.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Seal for InMemory {
    fn seal(self) -> io::Result<Pending> {
        let mut f = AtomicFile::create(&self.path, self.durability)?;
        f.write_all(&self.bytes)?;
        f.finish()
    }

    /// The final name (nothing is on disk before the file is sealed).
    fn tmp_path(&self) -> &Path {
        &self.path
    }
}
