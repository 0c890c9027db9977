//! `Stream`: one (rank, worker) share of an epoch of a dataset or a mixture, streamed to
//! Python: samples, batches gathered into one buffer, and the reader's counters.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use granary::{
    Dataset as RsDataset, EpochState, EpochStream, MixReader, MixState, Mixture, ReadError,
    ReaderOptions, SampleStream, Shard, Share, SourceMark, SourceSpec,
};
use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PyTuple};

use crate::{err, from_keywords, pop_keyword, store_config, to_python};

/// One streamed sample: (id, label, bytes, weight, source).
type PySample<'py> = (u64, u32, Bound<'py, PyBytes>, f32, u32);
/// A batch of samples: (ids, labels, list of bytes, weights, sources).
type PyBatch<'py> = (Vec<u64>, Vec<u32>, Bound<'py, PyList>, Vec<f32>, Vec<u32>);

/// After the samples' bytes were copied for Python: an error if one of them was a slice of a
/// map whose file was cut short meanwhile (the copy may hold zeros, see
/// `granary::Sample::intact`).
fn still_intact(samples: &[granary::Sample]) -> PyResult<()> {
    samples.iter().try_for_each(|s| s.intact().map_err(err))
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

/// The samples gathered into the array `alloc(nbytes)` returns (see
/// `Stream::next_batch_into`), with their columns.
fn gather_batch<'py>(
    py: Python<'py>,
    got: &[granary::Sample],
    alloc: &Bound<'py, PyAny>,
) -> PyResult<PyArrayBatch<'py>> {
    let offsets = offsets(got);
    let total = offsets[got.len()] as usize;
    let bad = |what: String| PyValueError::new_err(format!("alloc(nbytes) returned {what}"));
    let out = alloc.call1((total,))?;
    let arr = out.cast::<PyArray1<u8>>().map_err(|_| {
        PyValueError::new_err("alloc(nbytes) must return a one-dimensional numpy uint8 array")
    })?;
    {
        let mut rw = arr
            .try_readwrite()
            .map_err(|e| bad(format!("an array that cannot be written: {e}")))?;
        let dst = rw
            .as_slice_mut()
            .map_err(|e| bad(format!("a strided array: {e}")))?;
        if dst.len() < total {
            return Err(PyValueError::new_err(format!(
                "alloc({total}) returned an array of only {} bytes",
                dst.len()
            )));
        }
        py.detach(|| {
            for (s, &at) in got.iter().zip(&offsets) {
                dst[at as usize..][..s.data().len()].copy_from_slice(s.data());
            }
        });
        still_intact(got)?;
    }
    Ok(packed(got, arr.clone(), PyArray1::from_vec(py, offsets)))
}

/// A packed batch: (ids, labels, the bytes of every sample back to back, offsets (n + 1),
/// weights, sources).
type Packed<B, O> = (Vec<u64>, Vec<u32>, B, O, Vec<f32>, Vec<u32>);

/// A packed batch in numpy arrays: uint8 bytes, int64 offsets.
type PyArrayBatch<'py> = Packed<Bound<'py, PyArray1<u8>>, Bound<'py, PyArray1<i64>>>;

/// The batch of `samples` with their bytes in `buf` at `offsets`.
fn packed<B, O>(samples: &[granary::Sample], buf: B, offsets: O) -> Packed<B, O> {
    let (ids, labels, weights, sources) = columns(samples);
    (ids, labels, buf, offsets, weights, sources)
}

/// One (rank, worker) share of one epoch of a dataset or a mixture, streamed: iterate
/// `(id, label, bytes, weight, source)`, or take batches with `next_batch(n)`.
#[pyclass(frozen, module = "granary._native")]
pub(crate) struct Stream {
    inner: Mutex<Box<dyn SampleStream>>,
    len: usize,
    /// Of a mixture: each source as the epoch was planned (what a resume state records).
    marks: Option<Vec<SourceMark>>,
}

impl Stream {
    /// Up to `n` samples (fewer at the end of the epoch), read with the GIL released; None at
    /// the end of the epoch.
    fn take(&self, py: Python<'_>, n: usize) -> PyResult<Option<Vec<granary::Sample>>> {
        let got = py.detach(|| {
            let mut st = self.inner.lock().expect("stream lock");
            let mut v = Vec::with_capacity(n);
            for s in st.by_ref() {
                v.push(s?);
                if v.len() == n {
                    break;
                }
            }
            Ok::<_, ReadError>(v)
        });
        Ok(Some(got.map_err(err)?).filter(|v| !v.is_empty()))
    }

    /// Up to `n` samples gathered back to back into a new buffer, which `wrap` hands to Python
    /// with the offsets; None at the end of the epoch.
    fn take_packed<B, O>(
        &self,
        py: Python<'_>,
        n: usize,
        wrap: impl FnOnce(Vec<u8>, Vec<i64>) -> (B, O),
    ) -> PyResult<Option<Packed<B, O>>> {
        let Some(got) = self.take(py, n)? else {
            return Ok(None);
        };
        // Not zero-filled first: the buffer may be reused heap memory, which calloc would clear.
        let buf = py.detach(|| got.iter().map(|s| s.data()).collect::<Vec<_>>().concat());
        still_intact(&got)?;
        let (buf, offsets) = wrap(buf, offsets(&got));
        Ok(Some(packed(&got, buf, offsets)))
    }
}

/// Ids, labels, loss weights and sources of `samples`.
fn columns(samples: &[granary::Sample]) -> (Vec<u64>, Vec<u32>, Vec<f32>, Vec<u32>) {
    (
        samples.iter().map(|s| s.id).collect(),
        samples.iter().map(|s| s.label).collect(),
        samples.iter().map(|s| s.weight).collect(),
        samples.iter().map(|s| s.source).collect(),
    )
}

/// A mixture's sources as the library takes them: `shares` one per source.
fn mix_specs(sources: Vec<PathBuf>, shares: &[String]) -> PyResult<Vec<SourceSpec>> {
    if shares.len() != sources.len() {
        return Err(PyValueError::new_err(format!(
            "{} shares for {} sources: give one per source",
            shares.len(),
            sources.len()
        )));
    }
    sources
        .into_iter()
        .zip(shares)
        .map(|(location, s)| {
            let share = s.parse::<Share>().map_err(PyValueError::new_err)?;
            Ok(SourceSpec { location, share })
        })
        .collect()
}

/// The mixture of `specs` opened for `config`.
fn mix_reader(
    specs: &[SourceSpec],
    epoch_size: Option<u64>,
    config: &ReaderOptions,
) -> Result<MixReader, ReadError> {
    let cfg = granary::StoreConfig::from_env().map_err(|e| ReadError::invalid(e.to_string()))?;
    let mix = Mixture::open(specs, epoch_size, |p| RsDataset::open_with(p, &cfg))?;
    MixReader::open(Arc::new(mix), config)
}

/// `mixture_info(sources, shares, epoch_size, **options)`: opens and checks a mixture as
/// `Stream.mixture` would (the same errors) and returns (each source's samples per epoch,
/// each source as an epoch plans it: the `sources` of a resume state).
#[pyfunction]
#[pyo3(signature = (sources, shares, epoch_size, **options))]
pub(crate) fn mixture_info<'py>(
    py: Python<'py>,
    sources: Vec<PathBuf>,
    shares: Vec<String>,
    epoch_size: Option<u64>,
    options: Option<&Bound<'py, PyDict>>,
) -> PyResult<(Vec<u64>, Bound<'py, PyAny>)> {
    let kw = options.map_or_else(|| Ok(PyDict::new(py)), |d| d.copy())?;
    let specs = mix_specs(sources, &shares)?;
    let config = stream_config(&kw, 0, 1)?;
    let (counts, marks) = py
        .detach(|| -> Result<_, ReadError> {
            let reader = mix_reader(&specs, epoch_size, &config)?;
            let mix = reader.mixture();
            let counts = (0..mix.len()).map(|i| mix.count(i)).collect();
            Ok((counts, reader.state(0, 1, 1)?.sources))
        })
        .map_err(err)?;
    Ok((counts, to_python(py, "mixture state", &marks)?))
}

/// The shard (rank, world_size, worker, num_workers: by position in `shard`, or by name in
/// `options`) and the other keyword options of `func`.
fn shard_and_options<'py>(
    py: Python<'py>,
    func: &str,
    shard: &Bound<'py, PyTuple>,
    options: Option<&Bound<'py, PyDict>>,
) -> PyResult<(Shard, Bound<'py, PyDict>)> {
    let kw = options.map_or_else(|| Ok(PyDict::new(py)), |d| d.copy())?;
    let names = ["rank", "world_size", "worker", "num_workers"];
    if shard.len() > names.len() {
        return Err(PyTypeError::new_err(format!(
            "{func}() takes rank, world_size, worker and num_workers by position after the \
             epoch; everything else by keyword"
        )));
    }
    let mut ids = [0u32; 4];
    for (i, name) in names.iter().enumerate() {
        let got = match (shard.get_item(i).ok(), pop_keyword::<u32>(func, &kw, name)?) {
            (Some(v), None) => Ok(v.extract()?),
            (None, Some(v)) => Ok(v),
            (Some(_), Some(_)) => Err("got multiple values for argument"),
            (None, None) => Err("missing required argument:"),
        };
        ids[i] = got.map_err(|why| PyTypeError::new_err(format!("{func}() {why} '{name}'")))?;
    }
    let [rank, world_size, worker, num_workers] = ids;
    let shard = Shard {
        rank,
        world_size,
        worker,
        num_workers,
    };
    Ok((shard, kw))
}

/// Stream's keyword options (`kw`, without the shard's) as the reader configuration, for rank
/// `rank` of `world_size`: the library's options and checks, with what Python's loaders read
/// differently from the command line (a score table that training creates as it reports) and
/// the environment's variables (`GRANARY_PEER_SECRET`, `GRANARY_IO`), read here, at the
/// front end.
fn stream_config(kw: &Bound<'_, PyDict>, rank: u32, world_size: u32) -> PyResult<ReaderOptions> {
    let mut o = loader_options("Stream", kw)?;
    o.rank = rank;
    o.world_size = world_size;
    o.check().map_err(err)?;
    Ok(o)
}

/// The keywords `kw` of `func` as reader options, with what a loader adds: a lenient tier
/// score table, and the job's secret and the backend from the environment when not given.
fn loader_options(func: &str, kw: &Bound<'_, PyDict>) -> PyResult<ReaderOptions> {
    let backend_given = kw.contains("backend")?;
    let mut o: ReaderOptions = from_keywords(func, kw)?;
    o.lenient_scores = true;
    if o.peer_secret.is_none() {
        o.peer_secret = granary_store::auth::Secret::from_env().map_err(|e| err(e.into()))?;
    }
    if !backend_given {
        // GRANARY_IO=uring|pread forces the backend, as `granary read` takes it (set but
        // empty, it is refused there, so here too).
        if let Ok(v) = std::env::var("GRANARY_IO") {
            o.backend = v
                .parse()
                .map_err(|e| PyValueError::new_err(format!("GRANARY_IO={v}: {e}")))?;
        }
    }
    Ok(o)
}

/// Checks a loader's reader options (keywords of `Stream`, without the shard) as the library
/// does, before any stream is made: ValueError or TypeError as `Stream` would raise them.
#[pyfunction]
#[pyo3(signature = (**options))]
pub(crate) fn check_reader_options(options: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
    let Some(kw) = options else {
        return Ok(());
    };
    let mut o = loader_options("IterableDataset", kw)?;
    // The shard is not known yet (DataLoader workers, torch.distributed): a peer list is
    // checked for its nodes when a stream is made.
    o.world_size = o.peers.as_ref().map_or(1, |p| p.len().max(1) as u32);
    o.check().map_err(err)
}

#[pymethods]
impl Stream {
    /// `Stream(path, epoch, rank, world_size, worker, num_workers, **options)`; options:
    /// shuffle ("chunkwise"), seed (0), drop_last (True), window, memory, cache_dir,
    /// cache_size, policy ("static"), sampling ("uniform"), alpha (0.5), cache_boost (4.0),
    /// resume, locality (1.0), peers, node, peer_timeout (2.0), ownership_epoch (0),
    /// peer_secret (default: GRANARY_PEER_SECRET), peer_ca (a PEM file: peers over TLS). The
    /// arguments become a `ReaderOptions`; the reader library does the rest.
    #[new]
    #[pyo3(signature = (path, epoch, *shard, **options))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        epoch: u64,
        shard: &Bound<'_, PyTuple>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let (shard, kw) = shard_and_options(py, "Stream", shard, options)?;
        // (epoch, world size, workers, counts, the worker whose own state it is, where an
        // epoch resumed under another configuration got there: (world size, workers, counts),
        // and the chunks an epoch of an earlier generation was planned over); see
        // `granary::EpochState`.
        type Then = (u32, u32, Vec<u64>);
        type Resume = (
            u64,
            u32,
            u32,
            Vec<u64>,
            Option<u32>,
            Option<Then>,
            Option<u32>,
        );
        let resume = pop_keyword::<Option<Resume>>("Stream", &kw, "resume")?
            .flatten()
            .map(
                |(epoch, world_size, num_workers, consumed, column, then, chunks)| EpochState {
                    epoch,
                    world_size,
                    num_workers,
                    consumed,
                    column,
                    then: then.map(|(world_size, num_workers, consumed)| granary::Continued {
                        world_size,
                        num_workers,
                        consumed,
                    }),
                    chunks,
                },
            );
        let config = stream_config(&kw, shard.rank, shard.world_size)?;
        let cfg = store_config()?;
        let build = || -> Result<Stream, ReadError> {
            let ds = Arc::new(RsDataset::open_with(&path, &cfg)?);
            let reader = config.open(&ds)?;
            let setup = reader.setup()?;
            let plan = setup.plan(&ds, epoch, shard, resume.as_ref())?;
            let len = plan.samples.len();
            let mode = setup.plan.mode;
            let stream = EpochStream::new(ds, plan, mode, &setup.stream)?;
            Ok(Stream {
                inner: Mutex::new(Box::new(stream)),
                len,
                marks: None,
            })
        };
        py.detach(build).map_err(err)
    }

    /// `Stream.mixture(sources, shares, epoch_size, epoch, rank, world_size, worker,
    /// num_workers, **options)`: a share of one epoch of the mixture of `sources` (paths,
    /// URLs or view files), `shares` one per source ("0.5", "weight=0.5", "repeat=2",
    /// "choose=1000"), `epoch_size` (weights only) or None; options as for `Stream`, `resume`
    /// a mixture state (a dict: epoch, world_size, num_workers, consumed, sources). Samples
    /// carry their source's index.
    #[staticmethod]
    #[pyo3(signature = (sources, shares, epoch_size, epoch, *shard, **options))]
    fn mixture(
        py: Python<'_>,
        sources: Vec<PathBuf>,
        shares: Vec<String>,
        epoch_size: Option<u64>,
        epoch: u64,
        shard: &Bound<'_, PyTuple>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let (shard, kw) = shard_and_options(py, "Stream.mixture", shard, options)?;
        let resume: Option<MixState> =
            pop_keyword::<Option<Bound<'_, PyAny>>>("Stream.mixture", &kw, "resume")?
                .flatten()
                .map(|v| pythonize::depythonize(&v))
                .transpose()
                .map_err(|e| {
                    PyValueError::new_err(format!("resume is not a mixture's state: {e}"))
                })?;
        let specs = mix_specs(sources, &shares)?;
        let config = stream_config(&kw, shard.rank, shard.world_size)?;
        let build = || -> Result<Stream, ReadError> {
            let reader = mix_reader(&specs, epoch_size, &config)?;
            let marks = match &resume {
                Some(st) => st.sources.clone(),
                None => reader.state(epoch, 1, 1)?.sources,
            };
            let stream = reader.stream(epoch, shard, resume.as_ref())?;
            Ok(Stream {
                len: stream.len() as usize,
                inner: Mutex::new(Box::new(stream)),
                marks: Some(marks),
            })
        };
        py.detach(build).map_err(err)
    }

    /// Of a mixture's stream: each source as the epoch was planned (dataset id, chunks,
    /// samples, the samples the epoch takes, window), the `sources` of its resume state;
    /// None for a dataset's.
    fn mix_marks<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.marks
            .as_ref()
            .map(|m| to_python(py, "mixture state", m))
            .transpose()
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
                Ok(Some((s.id, s.label, data, s.weight, s.source)))
            }
        }
    }

    /// Up to `n` samples as (ids, labels, list of bytes, weights); None at the end. The GIL
    /// is released while they are read and checked.
    fn next_batch<'py>(&self, py: Python<'py>, n: usize) -> PyResult<Option<PyBatch<'py>>> {
        let Some(got) = self.take(py, n)? else {
            return Ok(None);
        };
        let data = PyList::new(py, got.iter().map(|s| PyBytes::new(py, s.data())))?;
        still_intact(&got)?;
        let (ids, labels, weights, sources) = columns(&got);
        Ok(Some((ids, labels, data, weights, sources)))
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
    ) -> PyResult<Option<Packed<Bound<'py, PyByteArray>, Vec<i64>>>> {
        // A bytearray: tensors and arrays made over it are writable, as torch expects.
        self.take_packed(py, n, |buf, offsets| (PyByteArray::new(py, &buf), offsets))
    }

    /// [`Stream::next_batch_packed`] with the bytes in a numpy uint8 array that owns the
    /// buffer they were gathered into (no further copy; needs numpy).
    fn next_batch_array<'py>(
        &self,
        py: Python<'py>,
        n: usize,
    ) -> PyResult<Option<PyArrayBatch<'py>>> {
        let arrays = |buf, offsets| (PyArray1::from_vec(py, buf), PyArray1::from_vec(py, offsets));
        self.take_packed(py, n, arrays)
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
        let Some(got) = self.take(py, n)? else {
            return Ok(None);
        };
        gather_batch(py, &got, alloc).map(Some)
    }

    /// [`Stream::next_batch_into`], except that when every sample of the batch is a slice of
    /// a mapped local chunk file nothing is copied: returns (ids, labels, None, offsets,
    /// weights, sources, (files, file index per sample, offset per sample in its file)), each
    /// file as (path, device, inode), for another process to map ([`crate::handover`]); else
    /// the batch gathered by `alloc` as [`Stream::next_batch_into`] does, and None last.
    fn next_batch_refs<'py>(
        &self,
        py: Python<'py>,
        n: usize,
        alloc: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let Some(got) = self.take(py, n)? else {
            return Ok(None);
        };
        if let Some(refs) = crate::handover::refs_of(&got)? {
            still_intact(&got)?;
            let (ids, labels, weights, sources) = columns(&got);
            let offsets = PyArray1::from_vec(py, offsets(&got));
            let none = py.None().into_bound(py);
            let t = (ids, labels, none, offsets, weights, sources, refs);
            return Ok(Some(t.into_pyobject(py)?));
        }
        let (ids, labels, arr, offsets, weights, sources) = gather_batch(py, &got, alloc)?;
        let t = (ids, labels, arr, offsets, weights, sources, py.None());
        Ok(Some(t.into_pyobject(py)?))
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
    /// per layer, as `granary read --json` reports it (``layer``: "tier", "peers" or "origin";
    /// ``opens``, ``reads``, ``ranges``, ``bytes``, ``errors``, ``fallbacks``,
    /// ``served_samples``, ``served_bytes``, and ``wait_s``, the seconds the stream's reads
    /// waited there).
    fn layers<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let layers = self.inner.lock().expect("stream lock").layers();
        layers
            .into_iter()
            .map(|(layer, reading)| {
                to_python(py, "layers", &granary::LayerReading { layer, reading })
            })
            .collect()
    }

    /// How long the consumer of this stream waited for samples so far, and on what the reader
    /// spent that time: a dict of seconds (``waited_s``; ``tier_s``, ``peers_s``, ``origin_s``:
    /// waiting for reads from that layer; ``check_s``: CRC checks and decompression; ``plan_s``:
    /// planning windows; ``other_s``: the rest; the parts add up to ``waited_s``) and ``waits``.
    fn waits<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let w = self.inner.lock().expect("stream lock").waits();
        to_python(py, "waits", &w)
    }
}
