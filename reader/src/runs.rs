//! An epoch's sequence when it reads chunk by chunk, evaluated position by position: every
//! chunk's run (its samples, or the importance draws that fall in it, in id order) back to back
//! in the epoch's chunk order. Ranks and workers take runs of positions of it, so a plan never
//! builds the whole sequence (8 bytes per sample of the dataset).

use std::ops::Range;

use crate::draws::Importance;

/// The sequence of an epoch read chunk by chunk (see the module documentation).
pub(crate) struct ChunkRuns<'a> {
    order: Vec<u32>,
    /// The run of `order[i]` ends at position `ends[i]` (empty runs end where the previous did).
    ends: Vec<u64>,
    /// Chunk `c` holds samples `first[c]..first[c + 1]`: its run is all of them, or with
    /// `draws`, its importance draws.
    first: &'a [u64],
    draws: Option<&'a Importance<'a>>,
    /// The last run whose draws were made: (index in `order`, its draws).
    drawn: Option<(usize, Vec<u64>)>,
}

impl<'a> ChunkRuns<'a> {
    /// The runs of the chunks in `order`.
    pub(crate) fn new(order: Vec<u32>, first: &'a [u64], draws: Option<&'a Importance>) -> Self {
        let len = |c: u32| match draws {
            None => first[c as usize + 1] - first[c as usize],
            Some(imp) => imp.counts[c as usize],
        };
        let ends = order
            .iter()
            .scan(0u64, |at, &c| {
                *at += len(c);
                Some(*at)
            })
            .collect();
        ChunkRuns {
            order,
            ends,
            first,
            draws,
            drawn: None,
        }
    }

    /// Keeps the first `n` positions (all of them when there are no more).
    pub(crate) fn truncate(&mut self, n: u64) {
        if n >= self.len() {
            return;
        }
        let i = self.ends.partition_point(|&e| e < n);
        self.order.truncate(i + 1);
        self.ends.truncate(i + 1);
        self.ends[i] = n;
    }

    /// Positions in the sequence.
    pub(crate) fn len(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    /// The index in the chunk order of the (non-empty) run holding position `q` < len.
    fn run_at(&self, q: u64) -> usize {
        self.ends.partition_point(|&e| e <= q)
    }

    /// Appends the sample ids at positions `pos` to `out`; positions past the end wrap to the
    /// start (padding).
    pub(crate) fn extend(&mut self, pos: Range<u64>, out: &mut Vec<u64>) {
        let n = self.len();
        if n == 0 {
            return;
        }
        out.reserve((pos.end.saturating_sub(pos.start)) as usize);
        let mut p = pos.start;
        while p < pos.end {
            let q = p % n;
            let i = self.run_at(q);
            let start = i.checked_sub(1).map_or(0, |j| self.ends[j]);
            let end = self.ends[i];
            let take = (pos.end - p).min(end - q);
            let from = q - start;
            let c = self.order[i] as usize;
            match self.draws {
                None => out.extend(self.first[c] + from..self.first[c] + from + take),
                Some(imp) => {
                    if self.drawn.as_ref().map(|d| d.0) != Some(i) {
                        self.drawn = Some((i, imp.chunk_draws(c as u32)));
                    }
                    let d = &self.drawn.as_ref().expect("drawn above").1;
                    out.extend_from_slice(&d[from as usize..(from + take) as usize]);
                }
            }
            p += take;
        }
    }

    /// The sample ids at positions `pos` (see [`ChunkRuns::extend`]).
    pub(crate) fn at(&mut self, pos: Range<u64>) -> Vec<u64> {
        let mut out = Vec::new();
        self.extend(pos, &mut out);
        out
    }

    /// The window holding position `at` among the windows of a shard that reads positions
    /// `part` (past the end they wrap): each window is `w` runs of consecutive positions in one
    /// chunk, as a plan groups them. Its index in the shard and its positions.
    pub(crate) fn window_at(&self, part: Range<u64>, w: usize, at: u64) -> (u64, Range<u64>) {
        let n = self.len();
        let (mut index, mut start, mut runs) = (0u64, part.start, 0usize);
        let mut prev = None;
        let mut p = part.start;
        while p < part.end && n > 0 {
            let q = p % n;
            let i = self.run_at(q);
            let c = self.order[i];
            if prev != Some(c) {
                if runs == w {
                    if at < p {
                        return (index, start..p);
                    }
                    (index, start, runs) = (index + 1, p, 0);
                }
                runs += 1;
                prev = Some(c);
            }
            p += (self.ends[i] - q).min(part.end - p);
        }
        (index, start..part.end)
    }
}
