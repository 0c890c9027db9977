//! `granary._native.Writer` and `merge`: datasets written from Python (the packer's writer API).
//! Arguments are converted here; the Python class in `granary/writer.py` adds the context
//! manager, bytes-like conversion and the progress bar.

use std::path::PathBuf;

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
    let d = pythonize::pythonize(py, &WriterOptions::default())
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
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

#[pyclass(module = "granary._native")]
pub(crate) struct Writer {
    inner: Option<RsWriter>,
}

fn closed() -> PyErr {
    PyValueError::new_err("the writer is closed")
}

#[pymethods]
impl Writer {
    /// `Writer(out, options)`: `options` is the dict `granary.Writer` builds from its keyword
    /// arguments (the public signature, with Python's own argument errors, lives there).
    #[new]
    fn new(py: Python<'_>, out: String, options: &Bound<'_, PyDict>) -> PyResult<Self> {
        let o = writer_options("Writer", &out, options)?;
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

    /// Declares field `name`'s type (a descriptor such as `str`, `json`, `int`,
    /// `ndarray:uint8:32,32,3`, `npy`); every value of the field then has it.
    fn declare_field_type(&mut self, name: Vec<u8>, descriptor: String) -> PyResult<()> {
        let w = self.inner.as_mut().ok_or_else(closed)?;
        w.declare_field_type(&name, &descriptor).map_err(pack_err)
    }

    /// The field types declared so far (`{name: descriptor}`), a resumed writer's included.
    #[getter]
    fn field_types(&self) -> PyResult<std::collections::BTreeMap<String, String>> {
        let w = self.inner.as_ref().ok_or_else(closed)?;
        Ok(w.field_types()
            .iter()
            .map(|(n, t)| (String::from_utf8_lossy(n).into_owned(), t.clone()))
            .collect())
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
    options: &Bound<'_, PyDict>,
) -> PyResult<String> {
    let o = writer_options("from_webdataset", &out, options)?;
    let (s, _) = py
        .detach(|| granary_packer::import_webdataset(&sources, o, &|_, _, _| {}))
        .map_err(pack_err)?;
    serde_json::to_string(&s).map_err(|e| PyValueError::new_err(e.to_string()))
}
