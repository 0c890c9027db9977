//! Writing a dataset from samples a program holds (the writer API), instead of from files.
//!
//! Samples come one by one, in whatever order the caller's source has them (often sorted by
//! class). To mix them across chunks as `pack` does without holding the dataset, the writer
//! works in two passes over local disk:
//!
//! 1. **Scatter.** Each sample is checksummed and compressed on the writer's threads and
//!    appended to one of B spill logs (`spill-NNNN.log`) chosen by a seeded hash of its key:
//!    every log receives a uniform random share of the whole stream.
//! 2. **Gather** (at `finish`). Each log in turn is read back (whole when it fits the memory
//!    budget, record by record otherwise), its records put in a seeded order of their keys and
//!    cut into chunks: a class-sorted source gives class-mixed chunks.
//!
//! Memory holds one log's records (or its index), the chunk being written, a bounded queue and
//! a 16-byte hash per key (to refuse keys written twice). With an expected sample count
//! ([`WriterOptions::expected`]) each sample goes straight to its chunk instead (`direct.rs`).
//!
//! The logs are the resume state: after a crash, `resume` reads them back, drops a torn last
//! record, and skips the keys they hold when the caller writes its samples again (their bytes
//! checked against the log's CRC). The dataset is built and published as a pack's is (with a
//! shard: a part for `merge`). The layout is a pure function of the set of samples and the
//! seed.

mod direct;
mod gather;
mod options;
mod spill;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use granary_format::local::{FIELD_TYPES, WRITER_STATE};
use granary_format::{path_hash, NO_LABEL};

use crate::{
    lock, new_dataset_id, output, shared_key_of, write_file_atomic, IoAt, PackError, Place,
    PART_FILE,
};

pub use options::{WriterOptions, DEFAULT_BUCKETS, DEFAULT_GATHER_MEMORY};
pub(crate) use spill::parse_log;
use spill::*;

const STATE_FILE: &str = "writer.state";
/// The field types declared so far, beside the writer state (a resumed writer keeps them).
const TYPES_FILE: &str = "field.types";
/// Samples (of any size) queued between the caller and the writer's threads.
const QUEUE: usize = 64;
/// Bytes a spill log buffers before writing.
const LOG_BUFFER: usize = 256 << 10;
/// Fixed part of a spill record's body (see [`SpillRecord::write_to`]).
const RECORD_FIXED: usize = 32;
/// Largest spill record body (a sample of up to 4 GiB less the key).
const MAX_RECORD: u64 = u32::MAX as u64;

/// Class indexes given without a class table are below this (SPEC.md §8): the class table is
/// then every number up to the largest index, which must stay a table, not an exhaustion.
pub const MAX_INDEX_LABEL: u32 = 1 << 24;

/// A sample's label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Label<'a> {
    None,
    /// An index into the class table (`classes`, or the names `0`, `1`, ... when none was given).
    Index(u32),
    /// A class name.
    Name(&'a [u8]),
}

/// What [`Writer::write`] did with a sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// Queued for the dataset.
    New,
    /// An interrupted writer had it already (same bytes): skipped.
    Resumed,
}

/// What the writer's threads share.
struct Shared {
    logs: Vec<Mutex<BufWriter<File>>>,
    dir: PathBuf,
    error: Mutex<Option<PackError>>,
    /// Samples held in memory per bucket (up to `budget` bytes in all), not in the logs.
    held: Vec<Mutex<Vec<SpillRecord>>>,
    held_bytes: AtomicU64,
    budget: u64,
    /// With an expected sample count: the chunks samples go straight to (set once the first
    /// samples told their mean size; see [`direct`]).
    direct: std::sync::OnceLock<direct::Direct>,
}

impl Shared {
    fn fail(&self, e: PackError) {
        lock(&self.error).get_or_insert(e);
    }

    fn take_error(&self) -> Option<PackError> {
        lock(&self.error).take()
    }
}

/// A sample on its way to a spill log.
struct Job {
    key: Vec<u8>,
    data: Vec<u8>,
    /// Named fields (their bytes back to back in `data`): name and length of each.
    fields: Vec<(Vec<u8>, usize)>,
    label: u32,
    label_name: Vec<u8>,
    bucket: u32,
}

/// A dataset being written from samples. See the module documentation.
pub struct Writer {
    opts: WriterOptions,
    t0: Instant,
    /// Where the chunks go (and a whole dataset is built).
    layout: Place,
    /// The spill logs and the state (locked for the writer's life).
    spill: PathBuf,
    _lock: output::DirLock,
    dataset_id: [u8; 16],
    shared: Arc<Shared>,
    tx: Option<SyncSender<Job>>,
    threads: Vec<JoinHandle<()>>,
    seen: HashSet<u128>,
    /// Hashes of the directories the keys so far lie in (`a` and `a/b` for `a/b/c`), so that
    /// a key that is both a file and a directory is refused when it is written.
    dirs: HashSet<u128>,
    /// Keys an interrupted writer spilled and this one was not given again yet: key hash ->
    /// CRC-32 of the original bytes.
    resumed: HashMap<u128, u32>,
    /// Whether the samples have named fields, once the first is written.
    with_fields: Option<bool>,
    /// Without a class table, labels are all class names or all indexes: the names seen, or
    /// the highest index seen.
    names: BTreeSet<Vec<u8>>,
    max_index: Option<u32>,
    samples: u64,
    resumed_samples: u64,
    warnings: Vec<String>,
    /// What the object-store destination held when the writer began (for the publish).
    remote_found: Vec<(String, u64)>,
    /// Each field name's type descriptor, declared or from the schema.
    types: std::collections::BTreeMap<Vec<u8>, String>,
    /// With an expected sample count, until its chunks are sized: the first samples, held.
    probe: Option<Vec<Job>>,
    probe_bytes: u64,
    finished: bool,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("out", &self.opts.output.out)
            .field("samples", &self.samples)
            .finish()
    }
}

impl Writer {
    /// Starts a dataset (or resumes an interrupted writer of it, with `resume`).
    pub fn create(opts: WriterOptions) -> Result<Writer, PackError> {
        opts.output.check()?;
        if opts.buckets == 0 || opts.buckets > 65_536 {
            return Err(usage!(
                "the number of spill logs must be between 1 and 65536"
            ));
        }
        if let Some(c) = &opts.classes {
            if c.iter().collect::<HashSet<_>>().len() != c.len() {
                return Err(usage!("classes must be distinct"));
            }
        }
        opts.check_expected()?;
        let direct = opts.expected.is_some();
        let layout = Place::of(&opts.output)?;
        let spill = match (opts.output.shard, &opts.output.destination) {
            (None, Some(_)) => layout.work.join("spill"),
            (None, None) => layout.work.with_extension("spill"),
            (Some(_), _) => layout.work.clone(),
        };
        let existed = spill.join(STATE_FILE).exists();
        let mut warnings = Vec::new();
        let remote_found = output::claim(&opts.output, &mut warnings)?;
        if let Some(s) = opts.output.shard {
            if opts.output.out.join(s.dir_name()).join(PART_FILE).exists() && !opts.output.force {
                return Err(usage!(
                    "shard {s} of {} finished already; run granary merge (or pass force, --force, to write it again)",
                    opts.output.out.display()
                ));
            }
        }
        std::fs::create_dir_all(&spill).at("creating", &spill)?;
        let lock = output::DirLock::build(&spill, &opts.output.out)?;
        let state_path = spill.join(STATE_FILE);
        let dataset_id = if existed && opts.output.resume {
            Self::resumed_id(&opts, &state_path)?
        } else {
            if existed && !opts.output.force {
                return Err(usage!(
                    "an interrupted writer of {} left its work in {}; pass resume (--resume) to continue it or force (--force) to start over",
                    opts.output.out.display(),
                    spill.display()
                ));
            }
            if opts.output.shard.is_some() {
                std::fs::remove_file(spill.join(PART_FILE)).ok();
            }
            clear_spill(&spill)?;
            let id = match opts.output.shard {
                // Every shard derives the same id from what they share.
                Some(s) => crate::shard::shared_dataset_id(
                    &shared_key_of(&opts.settings(&[0; 16])),
                    s.count,
                    0,
                    path_hash(b"granary writer"),
                ),
                None => new_dataset_id(opts.output.out.as_os_str().as_encoded_bytes()),
            };
            if !direct {
                // The resume state (a writer straight into chunks has none).
                let state = WRITER_STATE.frame(opts.settings(&id).as_bytes());
                write_file_atomic(&state_path, &state)?;
            }
            id
        };
        let spill_logs = if direct { 0 } else { opts.buckets };
        let mut logs = Vec::with_capacity(spill_logs as usize);
        for b in 0..spill_logs {
            let p = spill.join(log_name(b));
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&p)
                .at("opening", &p)?;
            logs.push(Mutex::new(BufWriter::with_capacity(LOG_BUFFER, f)));
        }
        let shared = Arc::new(Shared {
            logs,
            dir: spill.clone(),
            error: Mutex::new(None),
            held: (0..spill_logs).map(|_| Mutex::new(Vec::new())).collect(),
            held_bytes: AtomicU64::new(0),
            budget: opts.memory,
            direct: Default::default(),
        });
        let mut w = Writer {
            t0: Instant::now(),
            layout,
            spill,
            _lock: lock,
            dataset_id,
            shared,
            tx: None,
            threads: Vec::new(),
            seen: HashSet::new(),
            dirs: HashSet::new(),
            resumed: HashMap::new(),
            with_fields: None,
            names: BTreeSet::new(),
            max_index: None,
            samples: 0,
            resumed_samples: 0,
            warnings: Vec::new(),
            remote_found,
            types: Default::default(),
            probe: direct.then(Vec::new),
            probe_bytes: 0,
            finished: false,
            opts,
        };
        if direct {
            // The chunks are built from the first sample on: what an earlier build left goes.
            w.clear_outputs()?;
        }
        for (n, t) in w.opts.schema.clone() {
            w.declare_field_type(n.as_bytes(), &t)?;
        }
        if existed && w.opts.output.resume {
            w.read_back(&mut warnings)?;
            w.read_types()?;
        }
        w.warnings = warnings;
        w.start_threads();
        Ok(w)
    }

    /// The dataset id of the interrupted writer whose state is at `path`, if its settings
    /// are these.
    fn resumed_id(opts: &WriterOptions, path: &Path) -> Result<[u8; 16], PackError> {
        let bytes = std::fs::read(path).at("reading", path)?;
        let body = WRITER_STATE.unframe(&bytes).map_err(|e| {
            usage!(
                "{} is damaged ({e}); start over with force (--force)",
                path.display()
            )
        })?;
        let text = String::from_utf8_lossy(body);
        let id_hex = text
            .lines()
            .find_map(|l| l.strip_prefix("dataset_id="))
            .unwrap_or_default();
        let id: granary_format::DatasetId = id_hex.parse().map_err(|_| {
            usage!(
                "{} names no dataset id; start over with force (--force)",
                path.display()
            )
        })?;
        let now = opts.settings(&id.0);
        if now != text {
            return Err(usage!(
                "cannot resume: the interrupted writer used other settings.\nrecorded:\n{text}now:\n{now}\
                 resume with the recorded settings, or pass force (--force) to start over"
            ));
        }
        Ok(id.0)
    }

    /// Reads the spill logs of an interrupted writer: every intact record's key becomes one
    /// that is skipped when written again; a torn or damaged tail is cut off.
    fn read_back(&mut self, warnings: &mut Vec<String>) -> Result<(), PackError> {
        for b in 0..self.opts.buckets {
            let p = self.spill.join(log_name(b));
            let f = std::fs::OpenOptions::new().read(true).write(true).open(&p);
            let f = f.at("opening", &p)?;
            let mut good = 0u64;
            // Up to the first torn or damaged record, which is dropped with what follows.
            for r in records(BufReader::with_capacity(1 << 20, &f)) {
                let rec = match r {
                    Ok((at, n, rec)) => {
                        good = at + n;
                        rec
                    }
                    Err((at, why, torn)) => {
                        let cause = if torn {
                            " (cut short by the interruption)"
                        } else {
                            ""
                        };
                        let p = p.display();
                        warnings.push(format!(
                            "{p}: {why} at byte {at}{cause}; dropped from there"
                        ));
                        break;
                    }
                };
                if !rec.label_name.is_empty() {
                    self.names.insert(rec.label_name.clone());
                } else if rec.label != NO_LABEL {
                    self.max_index = self.max_index.max(Some(rec.label));
                }
                self.with_fields = Some(!rec.fields.is_empty());
                self.resumed.insert(key_hash(&rec.key), rec.enc.crc32);
            }
            let len = f.metadata().at("inspecting", &p)?;
            if len.len() != good {
                f.set_len(good).at("truncating", &p)?;
            }
        }
        self.samples = self.resumed.len() as u64;
        Ok(())
    }

    fn start_threads(&mut self) {
        let (tx, rx) = sync_channel::<Job>(QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..self.opts.threads.max(1) {
            let (rx, shared, mode) = (rx.clone(), self.shared.clone(), self.opts.output.compress);
            self.threads
                .push(std::thread::spawn(move || spill_loop(&rx, &shared, mode)));
        }
        self.tx = Some(tx);
    }

    /// The number of samples the dataset has so far (with those of an interrupted writer).
    pub fn len(&self) -> u64 {
        self.samples
    }

    /// True before the first sample.
    pub fn is_empty(&self) -> bool {
        self.samples == 0
    }

    /// Samples skipped because the interrupted writer had them.
    pub fn resumed(&self) -> u64 {
        self.resumed_samples
    }

    /// Warnings so far (from reading back an interrupted writer's logs).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// True if an interrupted writer spilled `key` already (and it was not written again yet):
    /// a caller can skip producing its bytes.
    pub fn has_resumed(&self, key: &[u8]) -> bool {
        self.resumed.contains_key(&key_hash(key))
    }

    /// Adds one sample. `key` is its path in the dataset (a relative path: `/` separates
    /// directories; no empty, `.` or `..` components). The sample is checksummed, compressed
    /// and spilled on the writer's threads; an error of theirs is returned by the next call.
    pub fn write(
        &mut self,
        key: &[u8],
        data: Vec<u8>,
        label: Label<'_>,
    ) -> Result<Written, PackError> {
        self.write_sample(key, data, Vec::new(), label)
    }

    /// Declares field `name`'s type (a descriptor of SPEC.md §6.5: `str`, `json`, `int`,
    /// `ndarray:DTYPE:SHAPE`, `npy`, `image:CODEC`, `bytes`), which every sample's field of that
    /// name then has; a name never declared is `bytes`. Declaring a name again with another
    /// type is an error (a field's values are all of one type). Kept across `resume`.
    pub fn declare_field_type(&mut self, name: &[u8], descriptor: &str) -> Result<(), PackError> {
        let shown = String::from_utf8_lossy(name).into_owned();
        granary_format::check_field_name(name)
            .map_err(|why| usage!("field {shown:?} is not a valid field name: {why}"))?;
        granary_format::FieldType::parse(descriptor).map_err(|e| usage!("field {shown:?}: {e}"))?;
        match self.types.get(name) {
            Some(t) if t == descriptor => return Ok(()),
            Some(t) => Err(usage!(
                "field {shown:?} holds {t} values; it cannot also hold {descriptor} (declare a \
                 type that fits every value, such as npy for arrays of several shapes)"
            ))?,
            None => {}
        }
        self.types.insert(name.to_vec(), descriptor.to_string());
        let body: String = self
            .types
            .iter()
            .map(|(n, t)| format!("{}={t}\n", String::from_utf8_lossy(n)))
            .collect();
        write_file_atomic(
            &self.spill.join(TYPES_FILE),
            &FIELD_TYPES.frame(body.as_bytes()),
        )
    }

    /// Reads back the field types an interrupted writer declared.
    fn read_types(&mut self) -> Result<(), PackError> {
        let path = self.spill.join(TYPES_FILE);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(PackError::io("reading", &path, e)),
        };
        let bad = |detail: String| PackError::Source {
            path: path.clone(),
            detail,
        };
        let body = FIELD_TYPES
            .unframe(&bytes)
            .map_err(|e| bad(e.to_string()))?;
        let text = String::from_utf8_lossy(body).into_owned();
        for line in text.lines() {
            let not_a_type = || bad(format!("not a field type: {line:?}"));
            let (n, t) = line.split_once('=').ok_or_else(not_a_type)?;
            self.declare_field_type(n.as_bytes(), t)?;
        }
        Ok(())
    }

    /// The field types declared so far.
    pub fn field_types(&self) -> &std::collections::BTreeMap<Vec<u8>, String> {
        &self.types
    }

    /// Adds one sample with named fields: `(name, bytes)` in the order they are
    /// to be stored. Names are file-name extensions (`jpg`, `txt`, `seg.png`), each once; the
    /// key's last component holds no `.` (the fields show as files `KEY.NAME`). Fields are
    /// stored raw. A dataset's samples all have fields or none do.
    pub fn write_fields(
        &mut self,
        key: &[u8],
        fields: Vec<(Vec<u8>, Vec<u8>)>,
        label: Label<'_>,
    ) -> Result<Written, PackError> {
        let shown = String::from_utf8_lossy(key).into_owned();
        if fields.is_empty() {
            return Err(usage!("sample {shown:?} has no fields"));
        }
        for (k, (name, d)) in fields.iter().enumerate() {
            let field = String::from_utf8_lossy(name);
            granary_format::check_field_name(name).map_err(|why| {
                usage!("sample {shown:?}: field {field:?} is not a valid field name: {why}")
            })?;
            if fields[..k].iter().any(|(n, _)| n == name) {
                return Err(usage!("sample {shown:?}: field {field:?} given twice"));
            }
            // A declared type's values: the fixed length of int and ndarray fields, UTF-8 text
            // for str and json ones (verify also parses the JSON).
            if let Some(t) = self.types.get(name) {
                let t = granary_format::FieldType::parse(t).map_err(PackError::Usage)?;
                t.check_value(d)
                    .map_err(|why| usage!("sample {shown:?}: field {field:?}: {why}"))?;
            }
        }
        let total: usize = fields.iter().map(|(_, d)| d.len()).sum();
        let mut data = Vec::with_capacity(total);
        let mut list = Vec::with_capacity(fields.len());
        for (name, d) in fields {
            data.extend_from_slice(&d);
            list.push((name, d.len()));
        }
        self.write_sample(key, data, list, label)
    }

    /// Refuses `key` (hash `h`) when it would be a file where an earlier key has a directory,
    /// or lie under an earlier key as if that were a directory (`a/k3` and `a/k3/sub`): the
    /// namespace of a dataset holds each path once, as a file or as a directory. Then records
    /// the directories `key` lies in.
    fn place_in_tree(
        &mut self,
        key: &[u8],
        h: u128,
        shown: &dyn Fn() -> String,
    ) -> Result<(), PackError> {
        if self.dirs.contains(&h) {
            return Err(usage!(
                "key {:?} is a directory of keys written before ({:?}): a path is a file or a \
                 directory, not both",
                shown(),
                format!("{}/...", shown())
            ));
        }
        let mut dirs = Vec::new();
        for i in (0..key.len()).filter(|&i| key[i] == b'/') {
            let d = key_hash(&key[..i]);
            if self.seen.contains(&d) || self.resumed.contains_key(&d) {
                return Err(usage!(
                    "key {:?} lies under {:?}, which was written before as a sample (a file): a \
                     path is a file or a directory, not both",
                    shown(),
                    String::from_utf8_lossy(&key[..i])
                ));
            }
            dirs.push(d);
        }
        self.dirs.extend(dirs);
        Ok(())
    }

    fn write_sample(
        &mut self,
        key: &[u8],
        data: Vec<u8>,
        fields: Vec<(Vec<u8>, usize)>,
        label: Label<'_>,
    ) -> Result<Written, PackError> {
        if self.finished {
            return Err(usage!("the writer is closed"));
        }
        if let Some(e) = self.shared.take_error() {
            return Err(e);
        }
        let shown = || String::from_utf8_lossy(key).into_owned();
        let grouped = !fields.is_empty();
        let check = match grouped {
            true => granary_format::check_field_key(key),
            false => granary_format::check_relative_path(key),
        };
        check.map_err(|why| usage!("key {:?} is not a valid path: {why}", shown()))?;
        if *self.with_fields.get_or_insert(grouped) != grouped {
            return Err(usage!(
                "sample {:?}: {}; a dataset's samples all have named fields or none do",
                shown(),
                if grouped {
                    "has fields, but the samples before it were single blobs"
                } else {
                    "is a single blob, but the samples before it had named fields"
                }
            ));
        }
        let fields_len: usize = fields.iter().map(|(n, _)| n.len() + 13).sum();
        let data_len = data.len() + fields_len;
        if data_len as u64 + key.len() as u64 + RECORD_FIXED as u64 + 256 > MAX_RECORD {
            return Err(usage!(
                "sample {:?} has {} bytes; a written sample holds less than 4 GiB",
                shown(),
                data.len()
            ));
        }
        let (label, label_name) = self.label(label, &shown)?;
        let h = key_hash(key);
        self.place_in_tree(key, h, &shown)?;
        if let Some(crc) = self.resumed.remove(&h) {
            self.seen.insert(h);
            if crc32fast::hash(&data) != crc {
                return Err(usage!(
                    "key {:?} was written with other bytes before the interruption; a resumed writer must \
                     be given the same samples (or start over with force, --force)",
                    shown()
                ));
            }
            self.resumed_samples += 1;
            return Ok(Written::Resumed);
        }
        if !self.seen.insert(h) {
            return Err(usage!("key {:?} was written twice", shown()));
        }
        self.samples += 1;
        if self.samples > granary_format::MAX_SAMPLES {
            return Err(usage!(
                "a dataset holds at most {} samples",
                granary_format::MAX_SAMPLES
            ));
        }
        let job = Job {
            key: key.to_vec(),
            data,
            fields,
            label,
            label_name,
            bucket: 0,
        };
        self.dispatch(job)?;
        Ok(Written::New)
    }

    /// Hands a sample to the writer's threads, for its spill log or (with an expected count)
    /// its chunk; while the chunks are not sized yet, holds it.
    fn dispatch(&mut self, mut job: Job) -> Result<(), PackError> {
        if let Some(probe) = &mut self.probe {
            self.probe_bytes += job.data.len() as u64;
            probe.push(job);
            let sized = self.probe_bytes >= direct::PROBE_BYTES
                || probe.len() >= direct::PROBE_SAMPLES
                || self.samples >= self.opts.expected.unwrap_or(0);
            return match sized {
                true => self.start_direct(),
                false => Ok(()),
            };
        }
        let slots = self
            .shared
            .direct
            .get()
            .map_or(self.opts.buckets, |d| d.slots());
        job.bucket = bucket_of(&job.key, self.opts.output.seed, slots);
        let sent = self.tx.as_ref().map(|tx| tx.send(job).is_ok());
        if sent != Some(true) {
            return Err(self
                .shared
                .take_error()
                .unwrap_or_else(|| usage!("the writer's threads stopped")));
        }
        Ok(())
    }

    /// Sizes the chunks from the samples held so far (their mean size and the expected
    /// count) and sends those samples to them.
    fn start_direct(&mut self) -> Result<(), PackError> {
        let Some(probe) = self.probe.take() else {
            return Ok(());
        };
        let mean = self.probe_bytes as f64 / probe.len().max(1) as f64;
        let expected = self.opts.expected.unwrap_or(0).max(self.samples);
        let out = &self.opts.output;
        let slots = direct::slots_for(expected, mean, out.chunk_size, out.chunk_files);
        let d = direct::Direct::new(
            &self.layout.chunks,
            self.dataset_id,
            self.layout.ids,
            self.with_fields == Some(true),
            slots,
        )?;
        if self.shared.direct.set(d).is_err() {
            return Err(usage!("the chunks were sized twice"));
        }
        for job in probe {
            self.dispatch(job)?;
        }
        Ok(())
    }

    /// Checks a label and turns it into what a spill record holds.
    fn label(
        &mut self,
        label: Label<'_>,
        shown: &dyn Fn() -> String,
    ) -> Result<(u32, Vec<u8>), PackError> {
        let mixed = match label {
            Label::Index(_) => !self.names.is_empty(),
            Label::Name(_) => self.max_index.is_some(),
            Label::None => false,
        };
        match (&self.opts.classes, label) {
            (_, Label::None) => Ok((NO_LABEL, Vec::new())),
            (Some(classes), Label::Index(i)) if (i as usize) < classes.len() => Ok((i, Vec::new())),
            (Some(classes), Label::Index(i)) => Err(usage!(
                "sample {:?}: label {i} but only {} classes were given",
                shown(),
                classes.len()
            )),
            (Some(classes), Label::Name(n)) => match classes.iter().position(|c| c[..] == *n) {
                Some(i) => Ok((i as u32, Vec::new())),
                None => Err(usage!(
                    "sample {:?}: class {:?} is not one of the classes given",
                    shown(),
                    String::from_utf8_lossy(n)
                )),
            },
            (None, _) if self.opts.output.shard.is_some() => Err(usage!(
                "a shard with labels needs the class table (classes=...): every chunk \
                 carries it, and shards cannot agree on one otherwise"
            )),
            (None, _) if mixed => Err(usage!(
                "sample {:?}: labels are class indexes and class names mixed; give one kind (or pass classes)",
                shown()
            )),
            (None, Label::Index(i)) if i >= MAX_INDEX_LABEL => Err(usage!(
                "sample {:?}: label {i} is too large: without a class table, class indexes are \
                 below {MAX_INDEX_LABEL} (the dataset gets a class named for every number up to \
                 the largest); pass classes",
                shown()
            )),
            (None, Label::Index(i)) => {
                self.max_index = self.max_index.max(Some(i));
                Ok((i, Vec::new()))
            }
            (None, Label::Name([])) => {
                Err(usage!("sample {:?}: a class name cannot be empty", shown()))
            }
            (None, Label::Name(n)) => {
                if !self.names.contains(n) {
                    self.names.insert(n.to_vec());
                }
                Ok((NO_LABEL, n.to_vec()))
            }
        }
    }

    /// Stops the threads and flushes the logs to disk.
    ///
    /// The logs are not fsynced: they are the resume state after a crash of the process (the
    /// page cache keeps what was written), and every record is checked by its CRC when read
    /// back, so a log cut or damaged by a crash of the machine loses only its tail. With
    /// `spill_held`, the samples held in memory go to the logs too (a writer stopped without
    /// `finish` keeps them for `resume`).
    fn drain(&mut self, spill_held: bool) -> Result<(), PackError> {
        drop(self.tx.take());
        let mut panicked = false;
        for t in self.threads.drain(..) {
            panicked |= t.join().is_err();
        }
        if let Some(e) = self.shared.take_error() {
            return Err(e);
        }
        if panicked {
            return Err(usage!("a writer thread panicked"));
        }
        for (b, log) in self.shared.logs.iter().enumerate() {
            let mut log = lock(log);
            let p = self.spill.join(log_name(b as u32));
            if spill_held {
                let held = std::mem::take(&mut *lock(&self.shared.held[b]));
                for rec in held {
                    rec.write_to(&mut *log).at("writing", &p)?;
                }
            }
            log.flush().at("writing", &p)?;
        }
        Ok(())
    }

    /// The class table the dataset gets.
    fn classes(&self) -> Vec<Vec<u8>> {
        match (&self.opts.classes, self.max_index) {
            (Some(c), _) => c.clone(),
            _ if !self.names.is_empty() => self.names.iter().cloned().collect(),
            (None, Some(m)) => (0..=m).map(|i| i.to_string().into_bytes()).collect(),
            (None, None) => Vec::new(),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let shared = self.shared.clone();
        if let Some(d) = shared.direct.get() {
            // Straight into chunks, nothing resumes: stop the threads; what a finish did not
            // name goes.
            let _ = self.drain(false);
            d.abandon();
            return;
        }
        let unfinished = !self.finished;
        // A finish that failed leaves what it had not gathered in memory.
        let held = shared
            .held
            .iter()
            .any(|h| !h.lock().map(|v| v.is_empty()).unwrap_or(true));
        if unfinished || held {
            // Kept for `resume`: stop the threads, the held samples to their logs, flushed.
            let _ = self.drain(true);
        }
    }
}

#[cfg(test)]
mod tests;
