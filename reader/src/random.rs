//! Random access to samples for map-style loaders and the mount, through a reader's
//! [`StoreStack`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use granary_format::{decode_record, Compression};

use crate::dataset::Dataset;
use crate::dataset::SampleInfo;
use crate::error::{ReadError, Result};
use granary_store::verified::{read_into, Expect};
use granary_store::StoreStack;
use granary_store::{Access, BytesFrom, Source};

/// Random access to samples: chunk files stay open (one open and header check per chunk, at
/// most `MAX_OPEN` at a time), and raw records are read straight into the caller's buffer,
/// verified by the store (a copy that fails is read again below it).
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
        if let Some(f) = self.files.lock().expect("open chunk files").get(&chunk) {
            return Ok(f.clone());
        }
        let src = self.ds.open_for_reads(&**self.stack.store(), chunk)?;
        let mut files = self.files.lock().expect("open chunk files");
        if files.len() >= Self::MAX_OPEN {
            files.clear();
        }
        files.insert(chunk, src.clone());
        Ok(src)
    }

    /// Closes the open sources `drop_it` picks (chunk, source); later reads open them again.
    pub fn forget(&self, drop_it: impl Fn(u32, &Source) -> bool) {
        let mut files = self.files.lock().expect("open chunk files");
        files.retain(|c, s| !drop_it(*c, s));
    }

    /// Reads sample `info` into `out`, which must be exactly its original length; checks
    /// length and CRC-32 as [`Dataset::read`] does.
    pub fn read_into(&self, info: &SampleInfo, out: &mut [u8]) -> Result<()> {
        let f = self.source(info.entry.chunk)?;
        self.read_from(&f, info, out).map(|_| ())
    }

    /// [`SampleReader::read_into`] from `f`, a source of the sample's chunk; says where the
    /// bytes came from in the end.
    pub fn read_from(&self, f: &Source, info: &SampleInfo, out: &mut [u8]) -> Result<BytesFrom> {
        self.ds.check_placement(info)?;
        let e = &info.entry;
        if out.len() as u64 != e.orig_len {
            let (id, n, want) = (info.id, out.len(), e.orig_len);
            let m = format!("sample {id}: buffer of {n} bytes for {want} bytes");
            return Err(ReadError::invalid(m));
        }
        let expect = Expect {
            records: Arc::new([(0, *e)]),
            ..Expect::default()
        };
        let read = |buf: &mut [u8]| read_into(f, e.offset, buf, &expect);
        if info.compression == Compression::None {
            let from = read(out)?;
            decode_record(e, out).map_err(|err| self.ds.record_error(info, err))?;
            return Ok(from);
        }
        let mut stored = vec![0u8; e.stored_len as usize];
        let from = read(&mut stored)?;
        let data = decode_record(e, &stored).map_err(|err| self.ds.record_error(info, err))?;
        out.copy_from_slice(&data);
        Ok(from)
    }
}
