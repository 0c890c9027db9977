//! `granary._native.Writer` and `merge`: datasets written from Python (the packer's writer API).
//! Arguments are converted here; the Python class in `granary/writer.py` adds the context
//! manager, bytes-like conversion and the progress bar.

use std::path::PathBuf;
use std::sync::Mutex;

use granary_packer::{Label, PackError, Writer as RsWriter, WriterOptions, Written};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::GranaryError;

/// The Python exception for a packer error: ValueError for requests that cannot be carried
/// out as given, GranaryError (OSError, with errno) for failing system calls and stores.
pub(crate) fn pack_err(e: PackError) -> PyErr {
    let msg = e.to_string();
    match e {
        PackError::Usage(m) => PyValueError::new_err(m),
        PackError::Io { source, .. } => crate::os_error(source.raw_os_error(), msg),
        _ => GranaryError::new_err(msg),
    }
}

/// A label as Python gives it: None, an int (class index) or bytes (class name).
#[derive(FromPyObject)]
pub(crate) enum PyLabel {
    Index(u32),
    Name(Vec<u8>),
}

/// The writer's options from the dict the Python side builds of its keyword arguments (only
/// those given: the defaults are the library's), pointed at `out`, which may be an object
/// store URL (then built in its staging directory).
fn writer_options(func: &str, out: &str, kw: &Bound<'_, PyDict>) -> PyResult<WriterOptions> {
    let mut o: WriterOptions = crate::from_keywords(func, kw)?;
    o.output.out = out.into();
    o.store = crate::store_config()?;
    o.output.resolve_destination(&o.store).map_err(pack_err)?;
    Ok(o)
}

/// The writer's documented defaults, as the dict `granary.Writer`'s signature shows (the
/// memory and thread counts depend on the machine: there they are `None`).
pub(crate) fn writer_defaults(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    let d = crate::to_python(py, "writer defaults", &WriterOptions::default())?;
    for k in ["memory", "threads"] {
        d.set_item(k, py.None())?;
    }
    Ok(d)
}

/// The writer's label from what Python gave.
fn to_label(l: &Option<PyLabel>) -> Label<'_> {
    match l {
        None => Label::None,
        Some(PyLabel::Index(i)) => Label::Index(*i),
        Some(PyLabel::Name(n)) => Label::Name(n),
    }
}

/// The writer behind `granary.Writer`. Its methods may be called from several threads at once:
/// each call holds the writer for its duration (taken with the GIL released, so that a call
/// waiting for another never blocks the thread it waits for), and every sample any thread
/// wrote is in the dataset `finish` publishes.
#[pyclass(module = "granary._native")]
pub(crate) struct Writer {
    inner: Mutex<Option<RsWriter>>,
}

fn closed() -> PyErr {
    PyValueError::new_err("the writer is closed")
}

impl Writer {
    /// Runs `f` on the open writer, with the GIL released while it waits for and holds it.
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut RsWriter) -> Result<T, PackError> + Send,
    ) -> PyResult<T> {
        py.detach(|| f(self.lock()?.as_mut().ok_or_else(closed)?).map_err(pack_err))
    }

    /// The writer, or an error naming what happened when a call into it panicked (the
    /// samples after that are not known to be whole: nothing more is taken).
    fn lock(&self) -> PyResult<std::sync::MutexGuard<'_, Option<RsWriter>>> {
        self.inner.lock().map_err(|_| {
            PyValueError::new_err(
                "the writer failed in another call (a panic, reported there); it takes no more \
                 samples: abort() it and write again with resume=True",
            )
        })
    }
}

#[pymethods]
impl Writer {
    /// `Writer(out, options)`: `options` is the dict `granary.Writer` builds from its keyword
    /// arguments (the public signature, with Python's own argument errors, lives there).
    #[new]
    fn new(py: Python<'_>, out: String, options: &Bound<'_, PyDict>) -> PyResult<Self> {
        let o = writer_options("Writer", &out, options)?;
        let w = py.detach(|| RsWriter::create(o)).map_err(pack_err)?;
        Ok(Writer {
            inner: Mutex::new(Some(w)),
        })
    }

    /// Adds one sample; True if it was written, False if an interrupted writer had it.
    #[pyo3(signature = (key, data, label=None))]
    fn write(
        &self,
        py: Python<'_>,
        key: Vec<u8>,
        data: &Bound<'_, PyBytes>,
        label: Option<PyLabel>,
    ) -> PyResult<bool> {
        let data = data.as_bytes().to_vec();
        let written = self.with(py, |w| w.write(&key, data, to_label(&label)))?;
        Ok(written == Written::New)
    }

    /// Adds one sample with named fields `[(name, bytes)]`; True if it was written, False if
    /// an interrupted writer had it.
    #[pyo3(signature = (key, fields, label=None))]
    fn write_fields(
        &self,
        py: Python<'_>,
        key: Vec<u8>,
        fields: Vec<(Vec<u8>, Bound<'_, PyBytes>)>,
        label: Option<PyLabel>,
    ) -> PyResult<bool> {
        let fields: Vec<(Vec<u8>, Vec<u8>)> = fields
            .into_iter()
            .map(|(n, d)| (n, d.as_bytes().to_vec()))
            .collect();
        let written = self.with(py, |w| w.write_fields(&key, fields, to_label(&label)))?;
        Ok(written == Written::New)
    }

    /// Declares field `name`'s type (a descriptor such as `str`, `json`, `int`,
    /// `ndarray:uint8:32,32,3`, `npy`); every value of the field then has it.
    fn declare_field_type(
        &self,
        py: Python<'_>,
        name: Vec<u8>,
        descriptor: String,
    ) -> PyResult<()> {
        self.with(py, |w| w.declare_field_type(&name, &descriptor))
    }

    /// The field types declared so far (`{name: descriptor}`), a resumed writer's included.
    #[getter]
    fn field_types(&self, py: Python<'_>) -> PyResult<std::collections::BTreeMap<String, String>> {
        self.with(py, |w| {
            Ok(w.field_types()
                .iter()
                .map(|(n, t)| (crate::lossy(n), t.clone()))
                .collect())
        })
    }

    /// True if an interrupted writer had `key` (not written again yet).
    fn has_resumed(&self, py: Python<'_>, key: Vec<u8>) -> PyResult<bool> {
        self.with(py, |w| Ok(w.has_resumed(&key)))
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |w| Ok(w.len() as usize))
    }

    /// Samples skipped because an interrupted writer had them.
    #[getter]
    fn resumed(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |w| Ok(w.resumed()))
    }

    #[getter]
    fn warnings(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        self.with(py, |w| Ok(w.warnings().to_vec()))
    }

    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        py.detach(|| self.inner.lock().map_or(true, |g| g.is_none()))
    }

    /// Builds the chunks and the snapshot and publishes the dataset; returns the summary as
    /// JSON text. Waits for calls of other threads under way; later ones find it closed.
    fn finish(&self, py: Python<'_>) -> PyResult<String> {
        let s = py.detach(|| {
            let closed = || PyValueError::new_err("the writer is closed already");
            let w = self.lock()?.take().ok_or_else(closed)?;
            w.finish().map_err(pack_err)
        })?;
        serde_json::to_string(&s).map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// Stops without publishing; the spill logs stay for `resume`.
    fn abort(&self, py: Python<'_>) {
        py.detach(|| {
            // A writer that panicked is dropped all the same (after the lock is let go).
            let w = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
            drop(w);
        });
    }
}

/// Merges the parts shards wrote (`Writer(out, shard=(i, n))` or `granary pack --shard`) into
/// one dataset; returns the summary as JSON text.
#[pyfunction]
pub(crate) fn merge(py: Python<'_>, out: PathBuf) -> PyResult<String> {
    let s = py
        .detach(|| granary_packer::merge(&out))
        .map_err(pack_err)?;
    serde_json::to_string(&s).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Deletes samples `ids` from the local dataset at `dataset` (`granary delete`): publishes its
/// next generation without them; returns the summary as JSON text.
#[pyfunction]
pub(crate) fn delete_samples(py: Python<'_>, dataset: PathBuf, ids: Vec<u64>) -> PyResult<String> {
    let cfg = crate::store_config()?;
    let s = py
        .detach(|| granary_packer::delete(&dataset, &ids, &cfg))
        .map_err(pack_err)?;
    serde_json::to_string(&s).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Compacts the dataset at `dataset` (`granary compact`): rewrites the chunks whose deleted
/// records take at least `min_dead` of their record bytes (every one with `all`) without them,
/// and removes replaced chunk files older than `grace_s` seconds; returns the summary as JSON.
#[pyfunction]
pub(crate) fn compact(
    py: Python<'_>,
    dataset: PathBuf,
    min_dead: f64,
    all: bool,
    grace_s: f64,
) -> PyResult<String> {
    if !(grace_s >= 0.0 && grace_s.is_finite()) {
        return Err(PyValueError::new_err(format!(
            "grace {grace_s} is not a number of seconds"
        )));
    }
    let cfg = crate::store_config()?;
    let o = granary_packer::CompactOptions {
        min_dead,
        all,
        grace: std::time::Duration::from_secs_f64(grace_s),
    };
    let s = py
        .detach(|| granary_packer::compact(&dataset, &o, &cfg))
        .map_err(pack_err)?;
    serde_json::to_string(&s).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Imports WebDataset tar shards (paths or URLs, brace patterns allowed) into a dataset at
/// `out`, as `granary pack --from webdataset` does; returns the summary as JSON text.
#[pyfunction]
pub(crate) fn import_webdataset(
    py: Python<'_>,
    sources: Vec<String>,
    out: String,
    options: &Bound<'_, PyDict>,
) -> PyResult<String> {
    let o = writer_options("from_webdataset", &out, options)?;
    let (s, _) = py
        .detach(|| granary_packer::import_webdataset(&sources, o, &|_, _, _| {}))
        .map_err(pack_err)?;
    serde_json::to_string(&s).map_err(|e| PyValueError::new_err(e.to_string()))
}
