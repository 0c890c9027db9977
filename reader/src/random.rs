//! Random access to samples for map-style loaders and the mount, through a reader's
//! [`StoreStack`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use granary_format::{decode_record, Compression};

use crate::dataset::{read_exact, SampleInfo};
use crate::error::{ReadError, Result};
use crate::Dataset;
use granary_format::CHUNK_HEADER_LEN;
use granary_store::StoreStack;
use granary_store::{Access, BytesFrom, Source};

/// Random access to samples: chunk files stay open (one open and header check per chunk, at
/// most `MAX_OPEN` at a time), and raw records are read straight into the caller's buffer.
/// A chunk opened below a tier moves to the tier's copy once one arrives
/// ([`granary_store::ChunkSource::newer_copy`]); bytes that fail give their source up for the
/// one below it ([`granary_store::ChunkSource::fall_back`]).
pub struct SampleReader {
    ds: Arc<Dataset>,
    stack: StoreStack,
    files: Mutex<HashMap<u32, Source>>,
}

impl SampleReader {
    /// Open chunk files kept at most (all are closed when the limit is reached).
    pub const MAX_OPEN: usize = 256;

    /// Reads from the dataset's own store, through the page cache.
    pub fn new(ds: Arc<Dataset>) -> Self {
        let stack = StoreStack::plain(ds.store(), Access::positional());
        Self::with_stack(ds, stack)
    }

    /// Reads through `stack`.
    pub fn with_stack(ds: Arc<Dataset>, stack: StoreStack) -> Self {
        SampleReader {
            ds,
            stack,
            files: Default::default(),
        }
    }

    /// The dataset.
    pub fn dataset(&self) -> &Arc<Dataset> {
        &self.ds
    }

    /// The stack it reads through.
    pub fn stack(&self) -> &StoreStack {
        &self.stack
    }

    /// The open source of `chunk` (opened through the stack if not open yet, its size and
    /// header checked).
    pub fn source(&self, chunk: u32) -> Result<Source> {
        let cached = self
            .files
            .lock()
            .expect("open chunk files")
            .get(&chunk)
            .cloned();
        let src = match cached {
            Some(f) => match f.newer_copy()? {
                // The tier checked the copy's size and header when it opened it.
                Some(copy) => copy,
                None => return Ok(f),
            },
            None => self.ds.open_for_reads(&**self.stack.store(), chunk)?,
        };
        let mut files = self.files.lock().expect("open chunk files");
        if files.len() >= Self::MAX_OPEN {
            files.clear();
        }
        files.insert(chunk, src.clone());
        Ok(src)
    }

    /// Closes the open sources `drop_it` picks (chunk, source); later reads open them again.
    pub fn forget(&self, drop_it: impl Fn(u32, &Source) -> bool) {
        self.files
            .lock()
            .expect("open chunk files")
            .retain(|c, s| !drop_it(*c, s));
    }

    /// Reads sample `info` into `out`, which must be exactly its original length; checks
    /// length and CRC-32 as [`Dataset::read`] does. A copy that fails (cut short, removed,
    /// damaged) is given up, and the sample read from the store below it (the tier drops its
    /// copy, logged with its path).
    pub fn read_into(&self, info: &SampleInfo, out: &mut [u8]) -> Result<()> {
        self.read_served(info, out).map(|_| ())
    }

    /// [`SampleReader::read_into`], saying where the bytes came from in the end.
    pub fn read_served(&self, info: &SampleInfo, out: &mut [u8]) -> Result<BytesFrom> {
        let chunk = info.entry.chunk;
        let mut f = self.source(chunk)?;
        loop {
            match self.read_from(&f, info, out) {
                Ok(()) => return Ok(f.bytes_from()),
                Err(e) if !e.is_invalid() => match self.fall_back(chunk, &f, &e)? {
                    Some(below) => f = below,
                    None => return Err(e),
                },
                Err(e) => return Err(e),
            }
        }
    }

    /// Gives up `f`, chunk `chunk`'s source whose bytes failed (`why`), for the one the layer
    /// that served it names (the tier drops its copy, logged with its path, and opens the
    /// chunk below it), its size and header checked; later reads of the chunk use it. `None`
    /// when nothing lies below `f` (the failure is the dataset's own).
    pub fn fall_back(
        &self,
        chunk: u32,
        f: &Source,
        why: &dyn std::fmt::Display,
    ) -> Result<Option<Source>> {
        let Some(below) = self.ds.fall_back(f, chunk, why)? else {
            return Ok(None);
        };
        let mut head = [0u8; CHUNK_HEADER_LEN];
        read_exact(&*below, &mut head, 0)?;
        self.ds.check_chunk_header(&head, chunk, below.location())?;
        self.files
            .lock()
            .expect("open chunk files")
            .insert(chunk, below.clone());
        Ok(Some(below))
    }

    /// [`SampleReader::read_into`] from `f`, a source of the sample's chunk.
    pub fn read_from(&self, f: &Source, info: &SampleInfo, out: &mut [u8]) -> Result<()> {
        self.ds.check_placement(info)?;
        let e = &info.entry;
        if out.len() as u64 != e.orig_len {
            return Err(ReadError::invalid(format!(
                "sample {}: buffer of {} bytes for {} bytes",
                info.id,
                out.len(),
                e.orig_len
            )));
        }
        let read = |buf: &mut [u8]| read_exact(&**f, buf, e.offset);
        if info.compression == Compression::None {
            read(out)?;
            return decode_record(e, out)
                .map(|_| ())
                .map_err(|err| self.ds.record_error(info, err));
        }
        let mut stored = vec![0u8; e.stored_len as usize];
        read(&mut stored)?;
        let data = decode_record(e, &stored).map_err(|err| self.ds.record_error(info, err))?;
        out.copy_from_slice(&data);
        Ok(())
    }
}
