//! `granary._native.Writer` and `merge`: datasets written from Python (the packer's writer API).
//! Arguments are converted here; the Python class in `granary/writer.py` adds the context
//! manager, bytes-like conversion and the progress bar.

use std::path::PathBuf;

use granary_packer::{Label, PackError, ShardSpec, Writer as RsWriter, WriterOptions, Written};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::GranaryError;

/// The Python exception for a packer error: ValueError for requests that cannot be carried
/// out as given, GranaryError (OSError, with errno) for failing system calls and stores.
pub(crate) fn pack_err(e: PackError) -> PyErr {
    let msg = e.to_string();
    match e {
        PackError::Usage(m) => PyValueError::new_err(m),
        PackError::Io { source, .. } => match source.raw_os_error() {
            Some(errno) => GranaryError::new_err((errno, msg)),
            None => GranaryError::new_err(msg),
        },
        _ => GranaryError::new_err(msg),
    }
}

/// A label as Python gives it: None, an int (class index) or bytes (class name).
#[derive(FromPyObject)]
pub(crate) enum PyLabel {
    Index(u32),
    Name(Vec<u8>),
}

/// An object store `out` (and its staging directory) as the writer's destination.
fn set_destination(o: &mut WriterOptions, out: &str, staging: Option<PathBuf>) -> PyResult<()> {
    o.store = crate::store_config()?;
    if let Some((u, staging)) = granary::write_destination(out, staging.as_deref(), &o.store)
        .map_err(PyValueError::new_err)?
    {
        o.staging = Some(staging);
        o.destination = Some(u);
    }
    Ok(())
}

/// The writer's label from what Python gave.
fn to_label(l: &Option<PyLabel>) -> Label<'_> {
    match l {
        None => Label::None,
        Some(PyLabel::Index(i)) => Label::Index(*i),
        Some(PyLabel::Name(n)) => Label::Name(n),
    }
}

#[pyclass(module = "granary._native")]
pub(crate) struct Writer {
    inner: Option<RsWriter>,
}

/// The writer's options as `granary.Writer` passes them (every key present; `None` for
/// what the caller left to the default).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct WriterKeywords {
    shard: Option<(u32, u32)>,
    classes: Option<Vec<Vec<u8>>>,
    compress: String,
    chunk_size: u64,
    chunk_files: u64,
    seed: u64,
    buckets: u32,
    gather_memory: u64,
    memory: Option<u64>,
    threads: Option<usize>,
    resume: bool,
    force: bool,
    progress: bool,
    staging: Option<PathBuf>,
}

impl WriterKeywords {
    /// The writer's options for `out` (its destination is set apart, with the staging).
    fn into_options(self, out: &str) -> PyResult<WriterOptions> {
        let mut o = WriterOptions::new(out);
        if let Some((i, n)) = self.shard {
            o.shard = Some(ShardSpec::parse(&format!("{i}/{n}")).map_err(PyValueError::new_err)?);
        }
        o.classes = self.classes;
        o.compress =
            granary_packer::CompressMode::parse(&self.compress).map_err(PyValueError::new_err)?;
        o.chunk_size = self.chunk_size;
        o.chunk_files = self.chunk_files;
        o.seed = self.seed;
        o.buckets = self.buckets;
        o.gather_memory = self.gather_memory;
        if let Some(m) = self.memory {
            o.memory = m;
        }
        if let Some(t) = self.threads {
            o.threads = t.max(1);
        }
        o.resume = self.resume;
        o.force = self.force;
        o.progress = self.progress;
        Ok(o)
    }
}

/// `import_webdataset`'s options as `granary.import_webdataset` passes them.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct ImportKeywords {
    compress: String,
    chunk_size: u64,
    seed: u64,
    resume: bool,
    force: bool,
    progress: bool,
    staging: Option<PathBuf>,
}

impl ImportKeywords {
    fn into_options(self, out: &str) -> PyResult<WriterOptions> {
        let mut o = WriterOptions::new(out);
        o.compress =
            granary_packer::CompressMode::parse(&self.compress).map_err(PyValueError::new_err)?;
        o.chunk_size = self.chunk_size;
        o.seed = self.seed;
        o.resume = self.resume;
        o.force = self.force;
        o.progress = self.progress;
        Ok(o)
    }
}

fn closed() -> PyErr {
    PyValueError::new_err("the writer is closed")
}

#[pymethods]
impl Writer {
    /// `Writer(out, options)`: `options` is the dict `granary.Writer` builds from its keyword
    /// arguments (the public signature, with Python's own argument errors, lives there).
    #[new]
    fn new(py: Python<'_>, out: String, options: WriterKeywords) -> PyResult<Self> {
        let staging = options.staging.clone();
        let mut o = options.into_options(&out)?;
        set_destination(&mut o, &out, staging)?;
        let w = py.detach(|| RsWriter::create(o)).map_err(pack_err)?;
        Ok(Writer { inner: Some(w) })
    }

    /// Adds one sample; True if it was written, False if an interrupted writer had it.
    #[pyo3(signature = (key, data, label=None))]
    fn write(
        &mut self,
        py: Python<'_>,
        key: Vec<u8>,
        data: &Bound<'_, PyBytes>,
        label: Option<PyLabel>,
    ) -> PyResult<bool> {
        let w = self.inner.as_mut().ok_or_else(closed)?;
        let data = data.as_bytes().to_vec();
        let written = py
            .detach(|| w.write(&key, data, to_label(&label)))
            .map_err(pack_err)?;
        Ok(written == Written::New)
    }

    /// Adds one sample with named fields `[(name, bytes)]`; True if it was written, False if
    /// an interrupted writer had it.
    #[pyo3(signature = (key, fields, label=None))]
    fn write_fields(
        &mut self,
        py: Python<'_>,
        key: Vec<u8>,
        fields: Vec<(Vec<u8>, Bound<'_, PyBytes>)>,
        label: Option<PyLabel>,
    ) -> PyResult<bool> {
        let w = self.inner.as_mut().ok_or_else(closed)?;
        let fields: Vec<(Vec<u8>, Vec<u8>)> = fields
            .into_iter()
            .map(|(n, d)| (n, d.as_bytes().to_vec()))
            .collect();
        let written = py
            .detach(|| w.write_fields(&key, fields, to_label(&label)))
            .map_err(pack_err)?;
        Ok(written == Written::New)
    }

    /// True if an interrupted writer had `key` (not written again yet).
    fn has_resumed(&self, key: Vec<u8>) -> PyResult<bool> {
        Ok(self.inner.as_ref().ok_or_else(closed)?.has_resumed(&key))
    }

    fn __len__(&self) -> PyResult<usize> {
        Ok(self.inner.as_ref().ok_or_else(closed)?.len() as usize)
    }

    /// Samples skipped because an interrupted writer had them.
    #[getter]
    fn resumed(&self) -> PyResult<u64> {
        Ok(self.inner.as_ref().ok_or_else(closed)?.resumed())
    }

    #[getter]
    fn warnings(&self) -> PyResult<Vec<String>> {
        Ok(self.inner.as_ref().ok_or_else(closed)?.warnings().to_vec())
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_none()
    }

    /// Builds the chunks and the snapshot and publishes the dataset; returns the summary as
    /// JSON text.
    fn finish(&mut self, py: Python<'_>) -> PyResult<String> {
        let w = self
            .inner
            .take()
            .ok_or_else(|| PyValueError::new_err("the writer is closed already"))?;
        let s = py.detach(|| w.finish()).map_err(pack_err)?;
        serde_json::to_string(&s).map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// Stops without publishing; the spill logs stay for `resume`.
    fn abort(&mut self, py: Python<'_>) {
        if let Some(w) = self.inner.take() {
            py.detach(|| drop(w));
        }
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

/// Imports WebDataset tar shards (paths or URLs, brace patterns allowed) into a dataset at
/// `out`, as `granary pack --from webdataset` does; returns the summary as JSON text.
#[pyfunction]
pub(crate) fn import_webdataset(
    py: Python<'_>,
    sources: Vec<String>,
    out: String,
    options: ImportKeywords,
) -> PyResult<String> {
    let staging = options.staging.clone();
    let mut o = options.into_options(&out)?;
    set_destination(&mut o, &out, staging)?;
    let (s, _) = py
        .detach(|| granary_packer::import_webdataset(&sources, o, &|_, _, _| {}))
        .map_err(pack_err)?;
    serde_json::to_string(&s).map_err(|e| PyValueError::new_err(e.to_string()))
}
