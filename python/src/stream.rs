//! `Stream`: one (rank, worker) share of an epoch of a dataset or a mixture, streamed to
//! Python: samples, batches gathered into one buffer, and the reader's counters.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use granary::{Dataset as RsDataset, EpochState, EpochStream, ReadError, Shard};
use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PyTuple};

use crate::{err, from_keywords, pop_keyword, store_config};

/// One streamed sample: (id, label, bytes, weight).
type PySample<'py> = (u64, u32, Bound<'py, PyBytes>, f32);
/// A batch of samples: (ids, labels, list of bytes, weights).
type PyBatch<'py> = (Vec<u64>, Vec<u32>, Bound<'py, PyList>, Vec<f32>);

/// After the samples' bytes were copied for Python: an error if one of them was a slice of a
/// map whose file was cut short meanwhile (the copy may hold zeros, see
/// `granary::Sample::is_intact`).
fn still_intact(samples: &[granary::Sample]) -> PyResult<()> {
    match samples.iter().find(|s| !s.is_intact()) {
        Some(s) => Err(err(s.cut_error())),
        None => Ok(()),
    }
}

/// The samples' bytes back to back, and the offsets (n + 1) where each starts and ends.
fn gather(samples: &[granary::Sample]) -> (Vec<u8>, Vec<i64>) {
    // Not zero-filled first: the buffer may be reused heap memory, which calloc would clear.
    let mut buf = Vec::with_capacity(packed_len(samples));
    for s in samples {
        buf.extend_from_slice(s.data());
    }
    (buf, offsets(samples))
}

/// Bytes of `samples` back to back.
fn packed_len(samples: &[granary::Sample]) -> usize {
    samples.iter().map(|s| s.data().len()).sum()
}

/// Where each sample starts and ends when packed back to back (n + 1 offsets).
fn offsets(samples: &[granary::Sample]) -> Vec<i64> {
    std::iter::once(0)
        .chain(samples.iter().scan(0i64, |at, s| {
            *at += s.data().len() as i64;
            Some(*at)
        }))
        .collect()
}

/// Copies the samples' bytes back to back to the start of `dst` (at least [`packed_len`]
/// bytes).
fn gather_into(samples: &[granary::Sample], dst: &mut [u8]) {
    let mut at = 0;
    for s in samples {
        let d = s.data();
        dst[at..at + d.len()].copy_from_slice(d);
        at += d.len();
    }
}

/// A packed batch: (ids, labels, all bytes, offsets, weights).
type PyPackedBatch<'py> = (
    Vec<u64>,
    Vec<u32>,
    Bound<'py, PyByteArray>,
    Vec<i64>,
    Vec<f32>,
);

/// A packed batch in numpy arrays: (ids, labels, uint8 bytes, int64 offsets, weights).
type PyArrayBatch<'py> = (
    Vec<u64>,
    Vec<u32>,
    Bound<'py, PyArray1<u8>>,
    Bound<'py, PyArray1<i64>>,
    Vec<f32>,
);

/// One (rank, worker) share of one epoch, streamed: iterate `(id, label, bytes, weight)`, or
/// take batches with `next_batch(n)`.
#[pyclass(frozen, module = "granary._native")]
pub(crate) struct Stream {
    inner: Mutex<EpochStream>,
    len: usize,
    cache: bool,
}

impl Stream {
    /// Up to `n` samples (fewer at the end of the epoch), read with the GIL released.
    fn take(&self, py: Python<'_>, n: usize) -> PyResult<Vec<granary::Sample>> {
        py.detach(|| {
            let mut st = self.inner.lock().expect("stream lock");
            let mut v = Vec::with_capacity(n);
            for s in st.by_ref() {
                v.push(s?);
                if v.len() == n {
                    break;
                }
            }
            Ok::<_, ReadError>(v)
        })
        .map_err(err)
    }

    /// Up to `n` samples gathered back to back: (ids, labels, bytes, offsets, weights); None
    /// at the end of the epoch.
    fn take_packed(&self, py: Python<'_>, n: usize) -> PyResult<Option<Packed>> {
        let got = self.take(py, n)?;
        if got.is_empty() {
            return Ok(None);
        }
        let (buf, offsets) = py.detach(|| gather(&got));
        still_intact(&got)?;
        let (ids, labels, weights) = columns(&got);
        Ok(Some((ids, labels, buf, offsets, weights)))
    }
}

/// A packed batch before it becomes Python objects.
type Packed = (Vec<u64>, Vec<u32>, Vec<u8>, Vec<i64>, Vec<f32>);

/// Ids, labels and loss weights of `samples`.
fn columns(samples: &[granary::Sample]) -> (Vec<u64>, Vec<u32>, Vec<f32>) {
    (
        samples.iter().map(|s| s.id).collect(),
        samples.iter().map(|s| s.label).collect(),
        samples.iter().map(|s| s.weight).collect(),
    )
}

/// Stream's keyword options (`kw`, without the shard's) as the reader configuration, for rank
/// `rank` of `world_size`: the library's options and checks, with what Python's loaders read
/// differently from the command line (a score table that training creates as it reports) and
/// the environment's variables (`GRANARY_PEER_SECRET`, `GRANARY_IO`), read here, at the
/// front end.
fn stream_config(
    kw: &Bound<'_, PyDict>,
    rank: u32,
    world_size: u32,
) -> PyResult<granary::ReaderConfig> {
    let backend_given = kw.contains("backend")?;
    let mut o: granary::ReaderOptions = from_keywords("Stream", kw)?;
    o.rank = rank;
    o.world_size = world_size;
    o.lenient_scores = true;
    if o.peer_secret.is_none() {
        o.peer_secret = granary::auth::Secret::from_env().map_err(|e| err(e.into()))?;
    }
    if !backend_given {
        // GRANARY_IO=uring|pread forces the backend, as `granary read` takes it.
        if let Some(v) = std::env::var("GRANARY_IO").ok().filter(|v| !v.is_empty()) {
            o.backend = v
                .parse()
                .map_err(|e| PyValueError::new_err(format!("GRANARY_IO={v}: {e}")))?;
        }
    }
    o.config().map_err(err)
}

/// Checks a loader's reader options (keywords of `Stream`, without the shard) as the library
/// does, before any stream is made: ValueError or TypeError as `Stream` would raise them.
#[pyfunction]
#[pyo3(signature = (**options))]
pub(crate) fn check_reader_options(options: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
    let Some(kw) = options else {
        return Ok(());
    };
    let mut o: granary::ReaderOptions = from_keywords("IterableDataset", kw)?;
    // The shard is not known yet (DataLoader workers, torch.distributed): a peer list is
    // checked for its nodes when a stream is made.
    o.world_size = o.peers.as_ref().map_or(1, |p| p.len().max(1) as u32);
    o.config().map(|_| ()).map_err(err)
}

/// The library's defaults of the reader options loaders take (`alpha`, `cache_boost`,
/// `peer_timeout`, the modes, ...): the values Python's signatures show.
pub(crate) fn reader_defaults(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let o = granary::ReaderOptions::default();
    let d = PyDict::new(py);
    d.set_item("shuffle", o.shuffle.to_string())?;
    d.set_item("seed", o.seed)?;
    d.set_item("policy", o.policy.to_string())?;
    d.set_item("sampling", o.sampling.to_string())?;
    d.set_item("alpha", o.alpha)?;
    d.set_item("cache_boost", o.cache_boost)?;
    d.set_item("locality", o.locality)?;
    d.set_item("peer_timeout", o.peer_timeout)?;
    d.set_item("ownership_epoch", o.ownership_epoch.unwrap_or(0))?;
    Ok(d)
}

#[pymethods]
impl Stream {
    /// `Stream(path, epoch, rank, world_size, worker, num_workers, **options)`; options:
    /// shuffle ("chunkwise"), seed (0), drop_last (True), window, memory, cache_dir,
    /// cache_size, policy ("static"), sampling ("uniform"), alpha (0.5), cache_boost (4.0),
    /// resume, locality (1.0), peers, node, peer_timeout (2.0), ownership_epoch (0),
    /// peer_secret (default: GRANARY_PEER_SECRET), peer_ca (a PEM file: peers over TLS). The
    /// arguments become a `granary::ReaderConfig`; the reader library does the rest.
    #[new]
    #[pyo3(signature = (path, epoch, *shard, **options))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        epoch: u64,
        shard: &Bound<'_, PyTuple>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        // rank, world_size, worker, num_workers: by position, or by name.
        let kw = match options {
            Some(d) => d.copy()?,
            None => PyDict::new(py),
        };
        let names = ["rank", "world_size", "worker", "num_workers"];
        if shard.len() > names.len() {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "Stream() takes path, epoch, rank, world_size, worker and num_workers by \
                 position; everything else by keyword",
            ));
        }
        let mut ids = [0u32; 4];
        for (i, name) in names.iter().enumerate() {
            let named = pop_keyword::<u32>("Stream", &kw, name)?;
            ids[i] = match (shard.get_item(i), named) {
                (Ok(_), Some(_)) => {
                    return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                        "Stream() got multiple values for argument '{name}'"
                    )))
                }
                (Ok(v), None) => v.extract()?,
                (Err(_), Some(v)) => v,
                (Err(_), None) => {
                    return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                        "Stream() missing required argument: '{name}'"
                    )))
                }
            };
        }
        let [rank, world_size, worker, num_workers] = ids;
        let resume = pop_keyword::<Option<(u64, u32, u32, Vec<u64>)>>("Stream", &kw, "resume")?
            .flatten()
            .map(|(epoch, world_size, num_workers, consumed)| EpochState {
                epoch,
                world_size,
                num_workers,
                consumed,
            });
        let config = stream_config(&kw, rank, world_size)?;
        let cfg = store_config()?;
        let shard = Shard {
            rank,
            world_size,
            worker,
            num_workers,
        };
        let build = || -> Result<(EpochStream, usize, bool), ReadError> {
            let ds = Arc::new(RsDataset::open_with(&path, &cfg)?);
            let reader = config.open(&ds)?;
            let setup = reader.setup()?;
            let plan = setup.plan(&ds, epoch, shard, resume.as_ref())?;
            let len = plan.samples.len();
            let mode = setup.plan.mode;
            let stream = EpochStream::new(ds, plan, mode, &setup.stream)?;
            Ok((stream, len, reader.tier().is_some()))
        };
        let (stream, len, cache) = py.detach(build).map_err(err)?;
        Ok(Stream {
            inner: Mutex::new(stream),
            len,
            cache,
        })
    }

    /// Samples in this share of the epoch (after any resume).
    fn __len__(&self) -> usize {
        self.len
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<PySample<'py>>> {
        let next = py.detach(|| self.inner.lock().expect("stream lock").next());
        match next {
            None => Ok(None),
            Some(Err(e)) => Err(err(e)),
            Some(Ok(s)) => {
                let data = PyBytes::new(py, s.data());
                still_intact(std::slice::from_ref(&s))?;
                Ok(Some((s.id, s.label, data, s.weight)))
            }
        }
    }

    /// Up to `n` samples as (ids, labels, list of bytes, weights); None at the end. The GIL
    /// is released while they are read and checked.
    fn next_batch<'py>(&self, py: Python<'py>, n: usize) -> PyResult<Option<PyBatch<'py>>> {
        let got = self.take(py, n)?;
        if got.is_empty() {
            return Ok(None);
        }
        let data = PyList::new(py, got.iter().map(|s| PyBytes::new(py, s.data())))?;
        still_intact(&got)?;
        let (ids, labels, weights) = columns(&got);
        Ok(Some((ids, labels, data, weights)))
    }

    /// Up to `n` samples packed into one buffer: (ids, labels, bytes of every sample back to
    /// back in a bytearray, offsets (n + 1; sample i is bytes[offsets[i]..offsets[i + 1]]),
    /// weights); None at the end. One Python object for the whole batch: what crosses from
    /// DataLoader workers as a tensor in shared memory instead of being pickled sample by
    /// sample. (Without numpy; with it, [`Stream::next_batch_array`] saves a copy.)
    fn next_batch_packed<'py>(
        &self,
        py: Python<'py>,
        n: usize,
    ) -> PyResult<Option<PyPackedBatch<'py>>> {
        let Some((ids, labels, buf, offsets, weights)) = self.take_packed(py, n)? else {
            return Ok(None);
        };
        // A bytearray: tensors and arrays made over it are writable, as torch expects.
        Ok(Some((
            ids,
            labels,
            PyByteArray::new(py, &buf),
            offsets,
            weights,
        )))
    }

    /// [`Stream::next_batch_packed`] with the bytes in a numpy uint8 array that owns the
    /// buffer they were gathered into (no further copy; needs numpy).
    fn next_batch_array<'py>(
        &self,
        py: Python<'py>,
        n: usize,
    ) -> PyResult<Option<PyArrayBatch<'py>>> {
        let Some((ids, labels, buf, offsets, weights)) = self.take_packed(py, n)? else {
            return Ok(None);
        };
        let (buf, offsets) = (PyArray1::from_vec(py, buf), PyArray1::from_vec(py, offsets));
        Ok(Some((ids, labels, buf, offsets, weights)))
    }

    /// [`Stream::next_batch_array`] gathered into a buffer of the caller's: `alloc(nbytes)`
    /// returns a writable, contiguous numpy uint8 array of at least `nbytes` (for instance a
    /// view of a torch tensor in shared memory, which a DataLoader worker then hands over
    /// without copying it again). Returns (ids, labels, that array, offsets, weights); None at
    /// the end of the epoch.
    fn next_batch_into<'py>(
        &self,
        py: Python<'py>,
        n: usize,
        alloc: &Bound<'py, PyAny>,
    ) -> PyResult<Option<PyArrayBatch<'py>>> {
        let got = self.take(py, n)?;
        if got.is_empty() {
            return Ok(None);
        }
        let total = packed_len(&got);
        let out = alloc.call1((total,))?;
        let arr = out.cast::<PyArray1<u8>>().map_err(|_| {
            PyValueError::new_err("alloc(nbytes) must return a one-dimensional numpy uint8 array")
        })?;
        {
            let mut rw = arr.try_readwrite().map_err(|e| {
                PyValueError::new_err(format!(
                    "alloc(nbytes) returned an array that cannot be written: {e}"
                ))
            })?;
            let dst = rw.as_slice_mut().map_err(|e| {
                PyValueError::new_err(format!("alloc(nbytes) returned a strided array: {e}"))
            })?;
            if dst.len() < total {
                return Err(PyValueError::new_err(format!(
                    "alloc({total}) returned an array of only {} bytes",
                    dst.len()
                )));
            }
            py.detach(|| gather_into(&got, dst));
            still_intact(&got)?;
        }
        let (ids, labels, weights) = columns(&got);
        Ok(Some((
            ids,
            labels,
            arr.clone(),
            PyArray1::from_vec(py, offsets(&got)),
            weights,
        )))
    }

    /// What other nodes' tiers served so far (with ``peers``): (samples, bytes); None without
    /// a tier.
    fn peer_hits(&self) -> Option<(u64, u64)> {
        let h = self.inner.lock().expect("stream lock").tier_hits();
        self.cache
            .then_some((h.samples_from_peers, h.bytes_from_peers))
    }

    /// The I/O backend the stream reads with: "uring" or "pread".
    #[getter]
    fn backend(&self) -> &'static str {
        self.inner.lock().expect("stream lock").backend()
    }

    /// Why the stream reads with pread although the default backend prefers io_uring (what
    /// switched io_uring off here, and what to change); None when it is no fallback.
    #[getter]
    fn backend_fallback(&self) -> Option<String> {
        let st = self.inner.lock().expect("stream lock");
        st.backend_fallback().map(str::to_owned)
    }

    /// What passed through each layer of the stream's store stack so far, top first: one dict
    /// per layer (``layer``: "tier", "peers" or "origin"; ``opens``, ``reads``, ``ranges``,
    /// ``bytes``, ``errors``, and ``wait_s``, the seconds the stream's reads waited there).
    fn layers<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let layers = self.inner.lock().expect("stream lock").layers();
        layers
            .into_iter()
            .map(|(layer, m)| {
                let d = PyDict::new(py);
                d.set_item("layer", layer)?;
                d.set_item("opens", m.opens)?;
                d.set_item("reads", m.reads)?;
                d.set_item("ranges", m.ranges)?;
                d.set_item("bytes", m.bytes)?;
                d.set_item("errors", m.errors)?;
                d.set_item("wait_s", m.wait_s)?;
                Ok(d)
            })
            .collect()
    }

    /// Hits of the local tier so far: (samples from tier, samples from source, bytes from
    /// tier, bytes from source); None without a tier.
    fn cache_hits(&self) -> Option<(u64, u64, u64, u64)> {
        let h = self.inner.lock().expect("stream lock").tier_hits();
        self.cache.then_some((
            h.samples_from_tier,
            h.samples_from_origin,
            h.bytes_from_tier,
            h.bytes_from_origin,
        ))
    }
}
