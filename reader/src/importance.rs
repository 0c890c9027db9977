//! Per-sample importance scores fed by training losses (SHADE, FAST'23), keyed by sample id.
//!
//! `report(ids, losses)` ranks each loss within its batch (rank 1 = smallest loss), turns the
//! rank into the weight ln(10 + rank), and smooths it into the sample's score with an
//! exponential moving average. Samples never reported score the mean of the reported ones, so
//! new or unseen samples are neither favoured nor starved. Keys are stable sample ids, never
//! positions in a batch, so DataLoader workers and shuffled batches report correctly.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{ReadError, Result};

use granary_format::local::SCORE_TABLE;

/// SHADE weights of one batch: each loss ranked within the batch (rank 1 = smallest) becomes
/// ln(10 + rank) for its sample id. Errors for a length mismatch, an id not below `n`, or a
/// loss that is not finite.
pub fn batch_weights(n: u64, ids: &[u64], losses: &[f32]) -> Result<Vec<(u64, f32)>> {
    if ids.len() != losses.len() {
        return Err(ReadError::invalid(format!(
            "{} ids but {} losses",
            ids.len(),
            losses.len()
        )));
    }
    if let Some(id) = ids.iter().find(|&&id| id >= n) {
        return Err(ReadError::invalid(format!(
            "sample id {id} out of range ({n} samples)"
        )));
    }
    if losses.iter().any(|l| !l.is_finite()) {
        return Err(ReadError::invalid("a loss is not finite".into()));
    }
    let mut order: Vec<usize> = (0..ids.len()).collect();
    order.sort_by(|&a, &b| losses[a].total_cmp(&losses[b]));
    Ok(order
        .iter()
        .enumerate()
        .map(|(rank0, &i)| (ids[i], (10.0 + (rank0 + 1) as f32).ln()))
        .collect())
}

/// The score table of one dataset.
#[derive(Clone, Debug, PartialEq)]
pub struct ImportanceScores {
    scores: Vec<f32>,
    seen: Vec<bool>,
    /// Weight of the old score in the moving average.
    smoothing: f32,
    seen_count: u64,
    seen_sum: f64,
}

impl ImportanceScores {
    /// An empty table for `n` samples; `smoothing` in [0, 1) is the weight kept from the
    /// previous score at each report (0.8 is a good default).
    pub fn new(n: u64, smoothing: f32) -> Self {
        let (scores, seen) = (vec![0.0; n as usize], vec![false; n as usize]);
        Self::from_parts(scores, seen, smoothing.clamp(0.0, 0.999))
    }

    /// The table of `scores`, those with a `seen` flag reported.
    fn from_parts(scores: Vec<f32>, seen: Vec<bool>, smoothing: f32) -> Self {
        let reported = scores.iter().zip(&seen).filter(|(_, &s)| s);
        let (seen_count, seen_sum) =
            reported.fold((0, 0.0), |(n, t), (&v, _)| (n + 1, t + v as f64));
        ImportanceScores {
            scores,
            seen,
            smoothing,
            seen_count,
            seen_sum,
        }
    }

    /// Number of samples.
    pub fn len(&self) -> u64 {
        self.scores.len() as u64
    }

    /// True for an empty table.
    pub fn is_empty(&self) -> bool {
        self.scores.is_empty()
    }

    /// Number of samples reported at least once.
    pub fn reported(&self) -> u64 {
        self.seen_count
    }

    /// Mean score of the samples reported so far (the score of every unseen sample).
    pub fn mean(&self) -> f64 {
        if self.seen_count == 0 {
            (10.0f64 + 1.0).ln()
        } else {
            self.seen_sum / self.seen_count as f64
        }
    }

    /// Score of sample `id`.
    pub fn score(&self, id: u64) -> f64 {
        match self.seen.get(id as usize) {
            Some(true) => self.scores[id as usize] as f64,
            _ => self.mean(),
        }
    }

    /// Folds one batch of per-sample losses in. `ids[i]` is the sample whose loss is
    /// `losses[i]`; ids out of range and non-finite losses are rejected.
    pub fn report(&mut self, ids: &[u64], losses: &[f32]) -> Result<()> {
        let w = batch_weights(self.len(), ids, losses)?;
        self.apply(&w);
        Ok(())
    }

    /// Folds in (sample id, weight) pairs computed by [`batch_weights`] (ids must be in range).
    pub fn apply(&mut self, weights: &[(u64, f32)]) {
        for &(id, w) in weights {
            let id = id as usize;
            if id >= self.scores.len() {
                continue;
            }
            let old = self.scores[id];
            let new = if self.seen[id] {
                self.smoothing * old + (1.0 - self.smoothing) * w
            } else {
                w
            };
            if self.seen[id] {
                self.seen_sum += (new - old) as f64;
            } else {
                self.seen[id] = true;
                self.seen_count += 1;
                self.seen_sum += new as f64;
            }
            self.scores[id] = new;
        }
    }

    /// Writes the table to `path` atomically (docs/internals.md: framed, temporary file,
    /// fsync, rename, fsync of the directory).
    pub fn save(&self, path: &Path) -> Result<()> {
        Ok(granary_store::tier::write_atomic(path, &self.encode())?)
    }

    /// The framed table: sample count (u64), smoothing (f32), one f32 score per sample, one
    /// byte per sample (1 if a loss was ever reported).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(12 + self.scores.len() * 5);
        b.extend_from_slice(&(self.scores.len() as u64).to_le_bytes());
        b.extend_from_slice(&self.smoothing.to_le_bytes());
        for s in &self.scores {
            b.extend_from_slice(&s.to_le_bytes());
        }
        b.extend(self.seen.iter().map(|&x| x as u8));
        SCORE_TABLE.frame(&b)
    }

    /// Reads a table written by [`ImportanceScores::save`]; damaged files are errors.
    pub fn load(path: &Path) -> Result<Self> {
        let b = granary_store::file::read_regular(path)
            .map_err(|e| ReadError::io("reading", path, e))?;
        Self::decode(&b).map_err(|why| {
            ReadError::invalid(format!("{}: not a score table ({why})", path.display()))
        })
    }

    /// Decodes [`ImportanceScores::encode`]'s bytes.
    pub fn decode(b: &[u8]) -> std::result::Result<Self, String> {
        let body = SCORE_TABLE.unframe(b).map_err(|e| e.to_string())?;
        // The count is read from the file: check it against the length without overflow
        // before anything is sized from it.
        let n = u64::from_le_bytes(body.get(..8).ok_or("too short")?.try_into().expect("8"));
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n.checked_mul(5).and_then(|x| x.checked_add(12)) == Some(body.len()))
            .ok_or("wrong length")?;
        let smoothing = f32::from_le_bytes(body[8..12].try_into().expect("4 bytes"));
        if !(0.0..1.0).contains(&smoothing) {
            return Err(format!("smoothing {smoothing} is not in [0, 1)"));
        }
        let scores: Vec<f32> = body[12..12 + 4 * n]
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        if scores.iter().any(|s| !s.is_finite() || *s < 0.0) {
            return Err("a score is negative or not finite".into());
        }
        let seen = &body[12 + 4 * n..];
        if seen.iter().any(|&x| x > 1) {
            return Err("a seen flag is neither 0 nor 1".into());
        }
        let seen = seen.iter().map(|&x| x == 1).collect();
        Ok(Self::from_parts(scores, seen, smoothing))
    }
}

/// The score table of a dataset shared by every process on a node, kept next to the local tier
/// (`LocalTier::scores_path`). [`SharedScores::report`] only ranks the batch and queues the
/// weights: no I/O and no waiting on other processes, cheap enough for every training step. A
/// background thread folds the queue into the file every `interval` under an exclusive lock
/// (`<file>.lock`): load, apply, save atomically. Reports from every DataLoader worker and rank
/// on the node so add up in one table, which survives restarts; a damaged table file is
/// replaced by a fresh one (scores are advisory: losing them costs hit ratio, never data).
pub struct SharedScores {
    inner: Arc<SharedInner>,
    /// The merging thread, and what stops it when dropped (after a last merge).
    thread: Option<(Sender<()>, std::thread::JoinHandle<()>)>,
}

struct SharedInner {
    path: PathBuf,
    n: u64,
    smoothing: f32,
    queue: Mutex<Vec<(u64, f32)>>,
    view: Mutex<Arc<ImportanceScores>>,
}

impl SharedInner {
    /// Loads the file (a fresh table when missing, damaged or of another size).
    fn load(&self) -> ImportanceScores {
        match ImportanceScores::load(&self.path) {
            Ok(t) if t.len() == self.n => t,
            _ => ImportanceScores::new(self.n, self.smoothing),
        }
    }

    fn merge(&self) -> Result<()> {
        let batch = std::mem::take(&mut *self.queue.lock().expect("score queue"));
        let lock_path = self.path.with_extension("lock");
        let result: Result<()> = (|| {
            let _lock = granary_store::tier::lock_exclusive(&lock_path)?;
            let mut t = self.load();
            if !batch.is_empty() {
                t.apply(&batch);
                t.save(&self.path)?;
            }
            *self.view.lock().expect("score view") = Arc::new(t);
            Ok(())
        })();
        if result.is_err() {
            // Keep the weights for the next attempt.
            self.queue.lock().expect("score queue").splice(..0, batch);
        }
        result
    }
}

impl SharedScores {
    /// Opens (creating it on the first merge) the table at `path` for `n` samples, merging
    /// queued reports every `interval`.
    pub fn open(path: &Path, n: u64, smoothing: f32, interval: Duration) -> Result<Self> {
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d).map_err(|e| ReadError::io("creating", d, e))?;
        }
        let inner = Arc::new(SharedInner {
            path: path.to_path_buf(),
            n,
            smoothing,
            queue: Mutex::new(Vec::new()),
            view: Mutex::new(Arc::new(ImportanceScores::new(n, smoothing))),
        });
        *inner.view.lock().expect("score view") = Arc::new(inner.load());
        let (i2, (stop, wake)) = (inner.clone(), channel());
        let thread = std::thread::Builder::new()
            .name("granary-scores".into())
            .spawn(move || loop {
                let done = wake.recv_timeout(interval) != Err(RecvTimeoutError::Timeout);
                if let Err(e) = i2.merge() {
                    // The reports stay queued for the next merge (or `flush`, which returns
                    // the error); at exit they are lost, so it is said.
                    log::warn!("importance scores: merging reported losses failed: {e}");
                }
                if done {
                    return;
                }
            })
            .map_err(|e| ReadError::io("starting the score thread", path, e))?;
        Ok(SharedScores {
            inner,
            thread: Some((stop, thread)),
        })
    }

    /// Queues one batch of per-sample losses (see [`ImportanceScores::report`]); returns at
    /// once. Bad input (length mismatch, id out of range, non-finite loss) is an error and
    /// nothing of the batch is queued.
    pub fn report(&self, ids: &[u64], losses: &[f32]) -> Result<()> {
        let w = batch_weights(self.inner.n, ids, losses)?;
        self.inner.queue.lock().expect("score queue").extend(w);
        Ok(())
    }

    /// Folds everything queued into the shared file now.
    pub fn flush(&self) -> Result<()> {
        self.inner.merge()
    }

    /// The table as of the last merge (all processes' reports up to then).
    pub fn snapshot(&self) -> Arc<ImportanceScores> {
        self.inner.view.lock().expect("score view").clone()
    }
}

impl Drop for SharedScores {
    fn drop(&mut self) {
        if let Some((stop, thread)) = self.thread.take() {
            drop(stop);
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_within_the_batch_keyed_by_id() {
        let mut s = ImportanceScores::new(10, 0.5);
        // Shuffled batch: ids and losses travel together.
        s.report(&[7, 2, 5], &[0.3, 2.0, 0.1]).unwrap();
        assert!(
            (s.score(5) - 11f64.ln()).abs() < 1e-6,
            "smallest loss, rank 1"
        );
        assert!((s.score(7) - 12f64.ln()).abs() < 1e-6);
        assert!(
            (s.score(2) - 13f64.ln()).abs() < 1e-6,
            "largest loss, rank 3"
        );
        let mean = (11f64.ln() + 12f64.ln() + 13f64.ln()) / 3.0;
        assert!(
            (s.score(0) - mean).abs() < 1e-6,
            "unseen samples score the mean"
        );
        s.report(&[2, 9], &[0.0, 1.0]).unwrap();
        let expect = 0.5 * 13f32.ln() + 0.5 * 11f32.ln();
        assert!((s.score(2) - expect as f64).abs() < 1e-6, "smoothed");
        assert!(s.report(&[10], &[1.0]).is_err());
        assert!(s.report(&[1], &[f32::NAN]).is_err());
        assert!(s.report(&[1, 2], &[1.0]).is_err());
    }

    #[test]
    fn save_load_round_trip_and_damage() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("scores");
        let mut s = ImportanceScores::new(100, 0.8);
        s.report(
            &(0..50).collect::<Vec<_>>(),
            &(0..50).map(|i| i as f32).collect::<Vec<_>>(),
        )
        .unwrap();
        s.save(&p).unwrap();
        let t = ImportanceScores::load(&p).unwrap();
        assert_eq!(t, s);
        let b = std::fs::read(&p).unwrap();
        granary_format::testing::dump_fuzz_seed("score_table", "half-reported", &b);
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 1;
            assert!(ImportanceScores::decode(&d).is_err(), "flip at {i}");
            assert!(ImportanceScores::decode(&b[..i]).is_err(), "cut at {i}");
        }
        let mut d = b.clone();
        d[40] ^= 1;
        std::fs::write(&p, &d).unwrap();
        assert!(ImportanceScores::load(&p).is_err());
    }

    #[test]
    fn a_crafted_count_is_refused_without_overflow() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("scores");
        ImportanceScores::new(3, 0.8).save(&p).unwrap();
        let good = std::fs::read(&p).unwrap();
        for n in [u64::MAX, u64::MAX / 5 + 1, 1 << 62, 4] {
            // A well-framed body whose count does not match its length.
            let mut body = SCORE_TABLE.unframe(&good).unwrap().to_vec();
            body[..8].copy_from_slice(&n.to_le_bytes());
            std::fs::write(&p, SCORE_TABLE.frame(&body)).unwrap();
            let e = ImportanceScores::load(&p).unwrap_err().to_string();
            assert!(e.contains("wrong length"), "{n}: {e}");
        }
    }
}
