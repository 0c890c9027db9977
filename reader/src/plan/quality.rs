//! How well an epoch's order mixes samples: [`ShuffleQuality`].

use std::collections::HashMap;

use super::*;

/// How well an order is shuffled, measured on labels (see [`shuffle_quality`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct ShuffleQuality {
    /// Mean length of runs of consecutive samples with the same label (a global shuffle over C
    /// balanced classes gives about C / (C - 1)).
    pub mean_label_run: f64,
    /// Mean total-variation distance between the label histogram of each block of
    /// consecutive samples and the histogram of the whole sequence (0 = perfectly mixed).
    pub block_label_tv: f64,
    /// Fraction of consecutive pairs that come from the same chunk.
    pub same_chunk_pairs: f64,
}

/// Measures `seq` (sample ids in delivery order) with blocks of `block` samples.
pub fn shuffle_quality(
    shape: &DatasetShape,
    label: impl Fn(u64) -> u32,
    seq: &[u64],
    block: usize,
) -> ShuffleQuality {
    if seq.is_empty() {
        return ShuffleQuality::default();
    }
    let labels: Vec<u32> = seq.iter().map(|&s| label(s)).collect();
    let runs = 1 + labels.windows(2).filter(|w| w[0] != w[1]).count();
    let mut global: HashMap<u32, f64> = HashMap::new();
    for &l in &labels {
        *global.entry(l).or_default() += 1.0 / labels.len() as f64;
    }
    let block = block.max(1);
    let mut tv_sum = 0.0;
    let mut blocks = 0;
    for b in labels.chunks(block) {
        let mut h: HashMap<u32, f64> = HashMap::new();
        for &l in b {
            *h.entry(l).or_default() += 1.0 / b.len() as f64;
        }
        let tv: f64 = global
            .iter()
            .map(|(l, p)| (h.get(l).copied().unwrap_or(0.0) - p).abs())
            .sum::<f64>()
            / 2.0;
        tv_sum += tv;
        blocks += 1;
    }
    let same = seq
        .windows(2)
        .filter(|w| shape.chunk_of(w[0]) == shape.chunk_of(w[1]))
        .count();
    ShuffleQuality {
        mean_label_run: labels.len() as f64 / runs as f64,
        block_label_tv: tv_sum / blocks as f64,
        same_chunk_pairs: same as f64 / (seq.len() - 1).max(1) as f64,
    }
}
