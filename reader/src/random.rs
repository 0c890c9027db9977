//! Random access to samples for map-style loaders and the mount, through a reader's
//! [`StoreStack`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use granary_format::{decode_record, Compression};

use crate::dataset::{read_exact, SampleInfo};
use crate::error::{ReadError, Result};
use crate::Dataset;
use granary_store::StoreStack;
use granary_store::{Access, BytesFrom, Source};

/// Random access to samples: chunk files stay open (one open and header check per chunk, at
/// most `MAX_OPEN` at a time), and raw records are read straight into the caller's buffer.
/// With a tier in the stack, a chunk open at origin is looked up in the tier again on each
/// read (a copy may have arrived since).
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
        let src = match (cached, self.stack.tier()) {
            (Some(f), None) => return Ok(f),
            (Some(f), Some(_)) if f.bytes_from() == BytesFrom::Tier => return Ok(f),
            (Some(f), Some(tier)) => match tier.open_copy(chunk)? {
                // The tier checked the copy's size and header when it opened it.
                Some(copy) => copy,
                None => return Ok(f),
            },
            (None, _) => self.ds.open_for_reads(&**self.stack.store(), chunk)?,
        };
        let mut files = self.files.lock().expect("open chunk files");
        if files.len() >= Self::MAX_OPEN {
            files.clear();
        }
        files.insert(chunk, src.clone());
        Ok(src)
    }

    /// Chunk `chunk` opened at origin, past every layer (not kept open).
    pub fn origin_source(&self, chunk: u32) -> Result<Source> {
        self.ds.open_for_reads(&**self.stack.origin(), chunk)
    }

    /// Closes the open sources `drop_it` picks (chunk, source); later reads open them again.
    pub fn forget(&self, drop_it: impl Fn(u32, &Source) -> bool) {
        self.files
            .lock()
            .expect("open chunk files")
            .retain(|c, s| !drop_it(*c, s));
    }

    /// Reads sample `info` into `out`, which must be exactly its original length; checks
    /// length and CRC-32 as [`Dataset::read`] does. A tier copy that fails (cut short,
    /// removed, damaged) is dropped, logged with its path, and the sample read from the store
    /// below the tier.
    pub fn read_into(&self, info: &SampleInfo, out: &mut [u8]) -> Result<()> {
        let chunk = info.entry.chunk;
        let f = self.source(chunk)?;
        match self.read_from(&f, info, out) {
            Err(e) if f.bytes_from() == BytesFrom::Tier && !e.is_invalid() => {
                self.drop_copy(chunk, &e);
                let f = self.source(chunk)?;
                self.read_from(&f, info, out)
            }
            r => r,
        }
    }

    /// Chunk `chunk`'s tier copy failed (`why`): closed here, removed from the tier and
    /// logged with its path; the next [`SampleReader::source`] of the chunk opens it below.
    pub fn drop_copy(&self, chunk: u32, why: &dyn std::fmt::Display) {
        self.forget(|c, s| c == chunk && s.bytes_from() == BytesFrom::Tier);
        if let Some(t) = self.stack.tier() {
            t.drop_copy(chunk, why);
        }
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
