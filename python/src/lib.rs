//! `granary._native`: the reader library for Python. The `granary` package wraps these types
//! into `torch.utils.data` datasets; everything here works without torch.
//!
//! The GIL is released during every read (`Python::detach`). Map-style reads land straight in
//! a new `bytes` object (raw records are read into it, no intermediate buffer); streamed batches
//! are gathered once out of the large aligned read buffers into one buffer (a numpy array, or
//! one the caller provides, such as a segment of a DataLoader worker's shared-memory ring),
//! which the Python package hands out as per-sample views. The stable ABI this one wheel is
//! built for (CPython >= 3.9) has no buffer protocol for extension types before 3.11, hence
//! numpy arrays rather than views of the read buffers themselves. A DataLoader worker's batch
//! of samples that lie in mapped chunk files crosses to the training process as places in those
//! files, which it maps itself (`handover`): the one `unsafe` block of this crate, which lends
//! such a map to numpy.
#![deny(unsafe_code)]

mod handover;
mod stream;
mod writer;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use granary::{
    Dataset as RsDataset, LocalTier, ReadError, SampleReader, Shard, SharedScores, TierPolicy,
};
use pyo3::create_exception;
use pyo3::exceptions::{PyIndexError, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

create_exception!(
    granary._native,
    GranaryError,
    PyOSError,
    "A dataset, chunk, tier or score file is missing, damaged or unreadable."
);

create_exception!(
    granary._native,
    DamagedError,
    GranaryError,
    "A file's bytes are damaged or do not match the dataset's snapshot (another dataset's \
     chunk, another size, a failed checksum): they are never returned."
);

create_exception!(
    granary._native,
    IncompleteError,
    GranaryError,
    "A reader thread failed or stopped: the epoch is incomplete (never silently short)."
);

/// The Python exception for each cause: ValueError for arguments, DamagedError for bad or
/// mismatching data, IncompleteError for a reader that stopped, GranaryError (an OSError,
/// with errno when the system gave one) for system calls that failed.
pub(crate) fn err(e: ReadError) -> PyErr {
    let msg = e.to_string();
    use granary::StoreError as S;
    match e {
        ReadError::Store(S::Invalid(m)) => PyValueError::new_err(m),
        ReadError::Store(S::Format { .. } | S::Damaged { .. }) | ReadError::Record(_) => {
            DamagedError::new_err(msg)
        }
        ReadError::Incomplete(m) | ReadError::Store(S::Stopped(m)) => IncompleteError::new_err(m),
        ReadError::Store(S::Io { source, .. }) => os_error(source.raw_os_error(), msg),
        ReadError::Store(S::Remote { kind, .. }) => os_error(
            matches!(kind, granary::RemoteKind::NotFound).then_some(ENOENT),
            msg,
        ),
    }
}

/// A GranaryError (an OSError), with `errno` when there is one.
pub(crate) fn os_error(errno: Option<i32>, msg: String) -> PyErr {
    match errno {
        Some(errno) => GranaryError::new_err((errno, msg)),
        None => GranaryError::new_err(msg),
    }
}

/// A 128-bit digest of a list of sample ids (the first 16 bytes of SHA-256 over the count and
/// the ids, each a little-endian u64): what names a view's selection in a resume state.
fn ids_digest(ids: &[u64]) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update((ids.len() as u64).to_le_bytes());
    for &id in ids {
        h.update(id.to_le_bytes());
    }
    h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// ENOENT (Linux), so that a missing object is a `FileNotFoundError` like a missing file.
const ENOENT: i32 = 2;

fn hex(id: &[u8; 16]) -> String {
    granary::DatasetId(*id).to_string()
}

/// A name (a field's) as Python's `str`.
pub(crate) fn lossy(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

/// A field of a sample as Python lays it out: name, offset in the sample's bytes, length,
/// type descriptor.
type FieldLayout = (String, u64, u64, String);

/// A sample's fields as Python gets them: (name, bytes) in stored order.
type NamedFields<'py> = Vec<(String, Bound<'py, PyBytes>)>;

/// A packed dataset for random access: `len`, `read(i) -> (bytes, label)`, lookups.
#[pyclass(frozen, module = "granary._native")]
struct Dataset {
    reader: SampleReader,
}

impl Dataset {
    /// The dataset, after checking that it has a sample `id` (else an IndexError).
    fn sample_ds(&self, id: u64) -> PyResult<&Arc<RsDataset>> {
        let ds = self.reader.dataset();
        if id >= ds.len() {
            return Err(PyIndexError::new_err(format!(
                "sample {id} out of range ({} samples)",
                ds.len()
            )));
        }
        Ok(ds)
    }

    /// The type descriptor of each field name (in the order of `field_names`).
    fn descriptors(&self) -> PyResult<Vec<String>> {
        let types = self.reader.dataset().snapshot().field_types();
        let types = types.map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(types.iter().map(|t| t.descriptor()).collect())
    }
}

#[pymethods]
impl Dataset {
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let cfg = store_config()?;
        let ds = py
            .detach(|| RsDataset::open_with(&path, &cfg))
            .map_err(err)?;
        Ok(Dataset {
            reader: SampleReader::new(Arc::new(ds)),
        })
    }

    fn __len__(&self) -> usize {
        self.reader.dataset().len() as usize
    }

    /// Samples selected: a view's (opened through a view file), else every sample.
    fn selected(&self) -> usize {
        self.reader.dataset().selected_len() as usize
    }

    /// The sample id at position `i` of the selection (`i` itself without a view).
    fn id_at(&self, i: u64) -> PyResult<u64> {
        let ds = self.reader.dataset();
        let id = match ds.selection() {
            None => (i < ds.len()).then_some(i),
            Some(ids) => ids.get(i as usize).copied(),
        };
        id.ok_or_else(|| {
            PyIndexError::new_err(format!(
                "sample {i} out of range ({} samples)",
                self.selected()
            ))
        })
    }

    /// The position of sample `id` in the selection (`id` itself without a view), or None if
    /// the view does not hold it.
    fn position_of(&self, id: u64) -> Option<u64> {
        match self.reader.dataset().selection() {
            None => Some(id),
            Some(ids) => ids.binary_search(&id).ok().map(|k| k as u64),
        }
    }

    /// Sample `id`'s original bytes (CRC-checked) and label.
    fn read<'py>(&self, py: Python<'py>, id: u64) -> PyResult<(Bound<'py, PyBytes>, u32)> {
        let ds = self.sample_ds(id)?;
        let info = ds.sample(id).map_err(err)?;
        let len = usize::try_from(info.entry.orig_len)
            .map_err(|_| PyValueError::new_err("sample too large"))?;
        let data = PyBytes::new_with(py, len, |buf| {
            py.detach(|| self.reader.read_into(&info, buf)).map_err(err)
        })?;
        Ok((data, info.entry.label))
    }

    /// True if the samples have named fields.
    #[getter]
    fn has_fields(&self) -> bool {
        self.reader.dataset().has_fields()
    }

    /// The field names the samples use (str, sorted; empty without fields).
    fn field_names(&self) -> PyResult<Vec<String>> {
        let names = self.reader.dataset().field_names().map_err(err)?;
        Ok(names.iter().map(|n| lossy(n)).collect())
    }

    /// Each field name's type descriptor (`{name: descriptor}`; empty without fields).
    fn field_types(&self) -> PyResult<std::collections::BTreeMap<String, String>> {
        let names = self.field_names()?;
        Ok(names.into_iter().zip(self.descriptors()?).collect())
    }

    /// Per sample of `ids`: its fields as (name, offset in the sample's bytes, length, type
    /// descriptor).
    fn field_layouts(&self, ids: Vec<u64>) -> PyResult<Vec<Vec<FieldLayout>>> {
        let ds = self.reader.dataset();
        let names = ds.field_names().map_err(err)?;
        let types = self.descriptors()?;
        let type_of = |n: &[u8]| {
            names
                .iter()
                .position(|m| *m == n)
                .and_then(|k| types.get(k).cloned())
                .unwrap_or_else(|| "bytes".into())
        };
        let layouts = |id: u64| -> PyResult<Vec<FieldLayout>> {
            let fields = ds.fields(id).map_err(err)?;
            let layout = fields
                .iter()
                .map(|f| (lossy(f.name), f.offset, f.len, type_of(f.name)));
            Ok(layout.collect())
        };
        ids.into_iter().map(layouts).collect()
    }

    /// The fields `names` (all with None) of sample `id`, each read alone and checked against
    /// its own CRC-32, and its label.
    #[pyo3(signature = (id, names=None))]
    fn read_fields<'py>(
        &self,
        py: Python<'py>,
        id: u64,
        names: Option<Vec<String>>,
    ) -> PyResult<(NamedFields<'py>, u32)> {
        let ds = self.sample_ds(id)?;
        let label = ds.sample(id).map_err(err)?.entry.label;
        let wanted: Option<Vec<&[u8]>> = names
            .as_ref()
            .map(|v| v.iter().map(|n| n.as_bytes()).collect());
        let got = py
            .detach(|| ds.read_fields(id, wanted.as_deref()))
            .map_err(err)?;
        let fields = got
            .into_iter()
            .map(|(n, d)| (lossy(&n), PyBytes::new(py, &d)));
        Ok((fields.collect(), label))
    }

    /// The samples of chunk `c`: (first sample id, count).
    fn chunk_samples(&self, c: u32) -> PyResult<(u64, u64)> {
        let ce = self.reader.dataset().chunk(c).map_err(err)?;
        Ok((ce.first_sample, ce.sample_count))
    }

    /// Every sample of chunk `c` as (id, label, bytes), from one read of the chunk (each
    /// checked against its CRC-32).
    fn read_chunk<'py>(
        &self,
        py: Python<'py>,
        c: u32,
    ) -> PyResult<Vec<(u64, u32, Bound<'py, PyBytes>)>> {
        let ds = self.reader.dataset();
        let ce = ds.chunk(c).map_err(err)?;
        let bytes = py.detach(|| ds.load_chunk(c)).map_err(err)?;
        let mut out = Vec::with_capacity(ce.sample_count as usize);
        for id in ce.samples() {
            let label = ds.sample(id).map_err(err)?.entry.label;
            let data = ds.decode_from(&bytes, id).map_err(err)?;
            out.push((id, label, PyBytes::new(py, &data)));
        }
        Ok(out)
    }

    /// Label of sample `id`.
    fn label(&self, id: u64) -> PyResult<u32> {
        Ok(self.reader.dataset().sample(id).map_err(err)?.entry.label)
    }

    /// Id of the sample stored under `path` (bytes), or None.
    fn lookup(&self, path: &[u8]) -> PyResult<Option<u64>> {
        self.reader.dataset().lookup(path).map_err(err)
    }

    /// Stored path of sample `id` (bytes, as on the source file system).
    fn path<'py>(&self, py: Python<'py>, id: u64) -> PyResult<Bound<'py, PyBytes>> {
        let p = self.reader.dataset().path(id).map_err(err)?;
        Ok(PyBytes::new(py, &p))
    }

    /// Class names (bytes), indexed by label.
    fn classes<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let c = self.reader.dataset().classes().map_err(err)?;
        Ok(c.into_iter().map(|n| PyBytes::new(py, n)).collect())
    }

    /// The dataset id (hex), which ties caches and score tables to this dataset.
    #[getter]
    fn dataset_id(&self) -> String {
        hex(&self.reader.dataset().snapshot().dataset_id())
    }

    /// What a resume state pins: `{"kind": "dataset" | "view", "dataset": id, "snapshot": the
    /// snapshot's 128-bit content digest, "parent": the digest of the snapshot it extends (or
    /// None), "generation": appends so far, "samples": count, "chunks": count}`, and of a view
    /// `"selected"` (its size) and `"selection"`, a 128-bit digest of its sample ids.
    #[getter]
    fn identity<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let ds = self.reader.dataset();
        let snap = ds.snapshot();
        let d = PyDict::new(py);
        d.set_item("kind", ds.view().map_or("dataset", |_| "view"))?;
        d.set_item("dataset", hex(&snap.dataset_id()))?;
        d.set_item("snapshot", hex(&snap.content_digest()))?;
        let lineage = snap.lineage();
        d.set_item("parent", lineage.has_parent().then(|| hex(&lineage.parent)))?;
        d.set_item("generation", lineage.generation)?;
        d.set_item("samples", snap.sample_count())?;
        d.set_item("chunks", snap.chunk_count())?;
        if let Some(v) = ds.view() {
            d.set_item("selected", v.ids.len())?;
            d.set_item("selection", ids_digest(&v.ids))?;
        }
        Ok(d)
    }

    #[getter]
    fn chunk_count(&self) -> u64 {
        self.reader.dataset().chunk_count()
    }

    /// Sample ids of `rank`'s share of epoch `epoch` in the order a one-worker `Stream`
    /// delivers them (chunk-wise by default): what a sampler over a mounted tree follows so
    /// that each chunk is read once, in large reads, per epoch. Keywords: `seed` (0),
    /// `window`, `memory`, `rank` (0), `world_size` (1), `drop_last` (True), `shuffle`
    /// ("chunkwise"), `locality` (1.0); any other reader option is refused (a plan does not
    /// read, so it would be ignored).
    #[pyo3(signature = (epoch, **options))]
    fn plan(
        &self,
        py: Python<'_>,
        epoch: u64,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Vec<u64>> {
        const TAKES: &str = "seed, window, memory, rank, world_size, drop_last, shuffle, locality";
        let empty = PyDict::new(py);
        let options = options.unwrap_or(&empty);
        for k in options.keys() {
            let k: String = k.extract()?;
            if !TAKES.split(", ").any(|t| t == k) {
                return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                    "plan() does not use '{k}': a plan reads nothing (it takes {TAKES})"
                )));
            }
        }
        let o: granary::ReaderOptions = from_keywords("plan", options)?;
        let shard = Shard {
            rank: o.rank,
            world_size: o.world_size,
            worker: 0,
            num_workers: 1,
        };
        let ds = self.reader.dataset();
        let plan = py
            .detach(|| o.open(ds)?.setup()?.plan(ds, epoch, shard, None))
            .map_err(err)?;
        Ok(plan.samples)
    }
}

/// The store's configuration: the defaults, changed by the `GRANARY_*` variables that are set
/// (read here, at the front end, on every open: `granary.job_secret()` and users set them
/// from Python).
pub(crate) fn store_config() -> PyResult<granary::StoreConfig> {
    granary::StoreConfig::from_env().map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The I/O backends this process can read with: ``{"io_uring": bool, "io_uring_unavailable":
/// str or None (why not: what switched it off, what to change), "pread": True}``.
#[pyfunction]
fn io_backends(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    let uring = granary::io::uring_available();
    d.set_item("io_uring", uring.is_ok())?;
    d.set_item("io_uring_unavailable", uring.err())?;
    d.set_item("pread", true)?;
    Ok(d)
}

/// `T` (a library options struct) built from keyword arguments by its serde field names and
/// defaults, with the errors a Python function gives: a keyword `T` has no field for, or a
/// value of the wrong type, is a TypeError naming it; a value that cannot work (an unknown
/// mode, a short secret) is a ValueError saying why. Path-like values are taken as their paths.
pub(crate) fn from_keywords<T: serde::de::DeserializeOwned>(
    func: &str,
    kw: &Bound<'_, PyDict>,
) -> PyResult<T> {
    use pyo3::exceptions::PyTypeError;
    let fspath = kw.py().import("os")?.getattr("fspath")?;
    let plain = PyDict::new(kw.py());
    for (k, v) in kw.iter() {
        let v = if v.hasattr("__fspath__")? {
            fspath.call1((v,))?
        } else {
            v
        };
        plain.set_item(k, v)?;
    }
    let mut unknown = Vec::new();
    let mut py_de = pythonize::Depythonizer::from_object(plain.as_any());
    let got: Result<T, _> = {
        let mut note = |path: serde_ignored::Path<'_>| unknown.push(path.to_string());
        serde_path_to_error::deserialize(serde_ignored::Deserializer::new(&mut py_de, &mut note))
    };
    if let Some(k) = unknown.first() {
        return Err(PyTypeError::new_err(format!(
            "{func}() got an unexpected keyword argument '{k}'"
        )));
    }
    got.map_err(|e| {
        // A nested option (the writer's `output.seed`) is the keyword argument `seed`.
        let path = e.path().to_string();
        let path = path.rsplit('.').next().unwrap_or_default().to_owned();
        let e: PyErr = e.into_inner().into();
        let py = kw.py();
        let text = e.value(py).to_string();
        // Serde's messages (an option's own check, `invalid type: ...`) come as plain Exceptions.
        let serde_says = e
            .get_type(py)
            .is(py.get_type::<pyo3::exceptions::PyException>());
        // A value of the wrong type (Python's own conversion refused it, or serde found
        // another type than the option's) is a TypeError naming the argument; one of the
        // right type that cannot work says why, as a ValueError.
        if e.is_instance_of::<PyTypeError>(py) || (serde_says && text.starts_with("invalid type")) {
            PyTypeError::new_err(format!("{func}(): argument {path}: {text}"))
        } else if serde_says {
            PyValueError::new_err(text)
        } else {
            PyValueError::new_err(format!("{func}(): argument {path}: {text}"))
        }
    })
}

/// `v` as Python objects (dicts, lists, numbers); a ValueError naming `what` if it cannot be.
pub(crate) fn to_python<'py>(
    py: Python<'py>,
    what: &str,
    v: &impl serde::Serialize,
) -> PyResult<Bound<'py, PyAny>> {
    pythonize::pythonize(py, v).map_err(|e| PyValueError::new_err(format!("{what}: {e}")))
}

/// Removes keyword `key` from `kw` and converts it, if given (a TypeError naming it if its
/// type is wrong).
pub(crate) fn pop_keyword<'py, T>(
    func: &str,
    kw: &Bound<'py, PyDict>,
    key: &str,
) -> PyResult<Option<T>>
where
    T: for<'b> FromPyObject<'b, 'py>,
    for<'b> <T as FromPyObject<'b, 'py>>::Error: Into<PyErr>,
{
    let Some(v) = kw.get_item(key)? else {
        return Ok(None);
    };
    kw.del_item(key)?;
    v.extract::<T>().map(Some).map_err(|e| {
        let e: PyErr = e.into();
        pyo3::exceptions::PyTypeError::new_err(format!("{func}(): argument {key}: {e}"))
    })
}

/// The node's shared importance score table of a dataset, next to its tier under `cache_dir`:
/// `report(ids, losses)` ranks and queues (no I/O); a background thread merges every
/// `interval` seconds.
#[pyclass(frozen, module = "granary._native")]
struct Scores {
    inner: SharedScores,
}

#[pymethods]
impl Scores {
    #[new]
    #[pyo3(signature = (dataset, cache_dir, interval = 2.0))]
    fn new(py: Python<'_>, dataset: PathBuf, cache_dir: PathBuf, interval: f64) -> PyResult<Self> {
        if !(interval > 0.0 && interval.is_finite()) {
            return Err(PyValueError::new_err(
                "interval must be a positive number of seconds",
            ));
        }
        let cfg = store_config()?;
        py.detach(|| {
            let ds = RsDataset::open_with(&dataset, &cfg)?;
            let t = LocalTier::open(
                &cache_dir,
                ds.snapshot().dataset_id(),
                0,
                TierPolicy::Static,
            )?;
            SharedScores::open(
                &t.scores_path(),
                ds.len(),
                0.8,
                Duration::from_secs_f64(interval),
            )
        })
        .map(|inner| Scores { inner })
        .map_err(err)
    }

    /// Queues per-sample losses of one batch, keyed by sample id.
    fn report(&self, ids: Vec<u64>, losses: Vec<f32>) -> PyResult<()> {
        self.inner.report(&ids, &losses).map_err(err)
    }

    /// Merges what is queued into the shared file now.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.flush()).map_err(err)
    }

    /// Current score of sample `id` (as of the last merge).
    fn score(&self, id: u64) -> f64 {
        self.inner.snapshot().score(id)
    }
}

/// Writes a view of the dataset at `dataset` holding sample `ids` to `output` (see
/// `granary.make_view`); returns how many samples it holds.
#[pyfunction]
fn write_view(
    py: Python<'_>,
    dataset: PathBuf,
    output: PathBuf,
    ids: Vec<u64>,
    description: String,
) -> PyResult<usize> {
    let cfg = store_config()?;
    py.detach(|| {
        let ds = RsDataset::open_checked_with(&dataset, &cfg)?;
        granary::write_view(&dataset, &ds, &output, ids, description).map(|v| v.ids.len())
    })
    .map_err(err)
}

/// Removes from the tier under `cache_dir` every copy and hot chunk of `dataset` that holds
/// deleted samples' records or chunks of other generations (`granary cache purge`); returns
/// the summary as JSON text.
#[pyfunction]
fn purge_cache(py: Python<'_>, dataset: PathBuf, cache_dir: PathBuf) -> PyResult<String> {
    let cfg = store_config()?;
    let p = py
        .detach(|| {
            let ds = RsDataset::open_with(&dataset, &cfg)?;
            granary::purge_tier(&ds, &cache_dir)
        })
        .map_err(err)?;
    serde_json::to_string(&p).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Writes a report (`WaitMeter.prometheus(path)`) as every file granary writes, refusing what
/// is not a report's place (see `granary_store::write::publish_report`): a ValueError naming it.
#[pyfunction]
fn publish_file(py: Python<'_>, path: PathBuf, data: Vec<u8>) -> PyResult<()> {
    py.detach(|| granary_store::write::publish_report(&path, &data))
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidInput => PyValueError::new_err(e.to_string()),
            _ => GranaryError::new_err((
                e.raw_os_error().unwrap_or(0),
                format!("{}: {e}", path.display()),
            )),
        })
}

/// Python's `logging` while the interpreter can be attached to; stderr (warnings and errors)
/// once it is shutting down or gone: a background thread (the tier's admission, a peer) may
/// log after the training script ended, which must neither panic nor lose the message.
struct PythonOrStderr(pyo3_log::Logger);

impl log::Log for PythonOrStderr {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        Python::try_attach(|_| self.0.enabled(m)).unwrap_or(m.level() <= log::Level::Warn)
    }

    fn log(&self, r: &log::Record<'_>) {
        if Python::try_attach(|_| self.0.log(r)).is_none() && r.level() <= log::Level::Warn {
            eprintln!("{}: {}: {}", r.level(), r.target(), r.args());
        }
    }

    fn flush(&self) {}
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The reader's diagnostics (a full tier, a peer marked down) go to Python's `logging`
    // (loggers named after the Rust modules, e.g. "granary_store.peers"), or to stderr once
    // the interpreter is shutting down.
    if let Ok(py_logger) = pyo3_log::Logger::new(m.py(), pyo3_log::Caching::LoggersAndLevels) {
        let _ = log::set_boxed_logger(Box::new(PythonOrStderr(py_logger)))
            .map(|()| log::set_max_level(log::LevelFilter::Debug));
    }
    m.add_class::<Dataset>()?;
    m.add_class::<stream::Stream>()?;
    m.add_class::<Scores>()?;
    m.add_class::<writer::Writer>()?;
    m.add_class::<handover::FileMap>()?;
    m.add_function(wrap_pyfunction!(handover::map_file, m)?)?;
    m.add_function(wrap_pyfunction!(stream::check_reader_options, m)?)?;
    m.add_function(wrap_pyfunction!(stream::mixture_info, m)?)?;
    m.add_function(wrap_pyfunction!(io_backends, m)?)?;
    m.add_function(wrap_pyfunction!(write_view, m)?)?;
    m.add_function(wrap_pyfunction!(writer::delete_samples, m)?)?;
    m.add_function(wrap_pyfunction!(writer::compact, m)?)?;
    m.add_function(wrap_pyfunction!(purge_cache, m)?)?;
    m.add_function(wrap_pyfunction!(publish_file, m)?)?;
    // Every reader option by name with the library's default (`None` for "decided later", as
    // `ReaderOptions` says; the job's secret shows as `None`): what Python's signatures show.
    let reader_defaults = granary::ReaderOptions::default();
    m.add(
        "READER_DEFAULTS",
        to_python(m.py(), "reader defaults", &reader_defaults)?,
    )?;
    m.add("WRITER_DEFAULTS", writer::writer_defaults(m.py())?)?;
    m.add_function(wrap_pyfunction!(writer::merge, m)?)?;
    m.add_function(wrap_pyfunction!(writer::import_webdataset, m)?)?;
    m.add("GranaryError", m.py().get_type::<GranaryError>())?;
    m.add("DamagedError", m.py().get_type::<DamagedError>())?;
    m.add("IncompleteError", m.py().get_type::<IncompleteError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
