//! How well an epoch's order mixes samples: [`ShuffleQuality`].

use std::collections::{BTreeMap, HashMap};

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
    // Ordered: the distance is a sum over it, and a printed figure must not vary by run.
    let mut global: BTreeMap<u32, f64> = BTreeMap::new();
    for &l in &labels {
        *global.entry(l).or_default() += 1.0 / labels.len() as f64;
    }
    let (mut tv_sum, mut blocks) = (0.0, 0);
    for b in labels.chunks(block.max(1)) {
        let mut h: HashMap<u32, f64> = HashMap::new();
        for &l in b {
            *h.entry(l).or_default() += 1.0 / b.len() as f64;
        }
        let diff = |(l, p): (&u32, &f64)| (h.get(l).copied().unwrap_or(0.0) - p).abs();
        tv_sum += global.iter().map(diff).sum::<f64>() / 2.0;
        blocks += 1;
    }
    let same = seq
        .windows(2)
        .filter(|w| shape.chunk_of_sample(w[0]) == shape.chunk_of_sample(w[1]))
        .count();
    ShuffleQuality {
        mean_label_run: labels.len() as f64 / runs as f64,
        block_label_tv: tv_sum / blocks as f64,
        same_chunk_pairs: same as f64 / (seq.len() - 1).max(1) as f64,
    }
}

/// Labels standing in for the samples' own, made from each chunk's class counts alone (what a
/// snapshot read in blocks gives without fetching its record table): chunk `c`'s samples get
/// its counted classes, and no label for the rest, in an order drawn by a permutation seeded
/// with the chunk's id. Packing mixes samples across and within chunks, and plans reorder
/// samples within windows, so the figures [`shuffle_quality`] computes from these labels have
/// the distribution they have from the real ones; within an unshuffled chunk of a dataset
/// packed in walk order (class-sorted), they are lower than the real ones.
pub fn labels_from_class_counts(shape: &DatasetShape, counts: &[Vec<(u32, u64)>]) -> Vec<u32> {
    let mut out = Vec::with_capacity(shape.samples() as usize);
    for (c, cc) in counts.iter().enumerate().take(shape.chunks() as usize) {
        let n = shape.chunk_len(c as u32) as usize;
        let start = out.len();
        for &(class, k) in cc {
            out.extend(std::iter::repeat_n(class, k as usize));
        }
        out.truncate(start + n);
        out.resize(start + n, granary_format::NO_LABEL);
        // Fisher-Yates with a generator keyed by the chunk.
        granary_format::SplitMix64::keyed(&[0x6c61_6265_6c73, c as u64]).shuffle(&mut out[start..]);
    }
    out
}

#[cfg(test)]
mod count_tests {
    use super::*;

    #[test]
    fn labels_from_counts_keep_each_chunks_counts_and_measure_like_the_real_labels() {
        // 40 chunks of 250 samples, 10 classes mixed at random (as packing mixes them).
        let shape = DatasetShape::from_counts(vec![250; 40]);
        let mut rng = granary_format::SplitMix64::new(3);
        let real: Vec<u32> = (0..10_000)
            .map(|_| match rng.below(20) {
                0 => granary_format::NO_LABEL,
                _ => rng.below(10) as u32,
            })
            .collect();
        let counts: Vec<Vec<(u32, u64)>> = (0..40)
            .map(|c| {
                let mut m = std::collections::BTreeMap::new();
                for &l in &real[c * 250..(c + 1) * 250] {
                    if l != granary_format::NO_LABEL {
                        *m.entry(l).or_insert(0u64) += 1;
                    }
                }
                m.into_iter().collect()
            })
            .collect();
        let drawn = labels_from_class_counts(&shape, &counts);
        assert_eq!(drawn.len(), real.len());
        for c in 0..40 {
            let mut a = real[c * 250..(c + 1) * 250].to_vec();
            let mut b = drawn[c * 250..(c + 1) * 250].to_vec();
            a.sort_unstable();
            b.sort_unstable();
            assert_eq!(a, b, "chunk {c} keeps its labels");
        }
        let opts = PlanOptions {
            window_chunks: 4,
            ..Default::default()
        };
        let p = EpochPlan::build(&shape, &opts, 0, Shard::WHOLE, None).unwrap();
        let q_real = shuffle_quality(&shape, |id| real[id as usize], &p.samples, 256);
        let q_drawn = shuffle_quality(&shape, |id| drawn[id as usize], &p.samples, 256);
        assert!(
            (q_real.mean_label_run - q_drawn.mean_label_run).abs() < 0.05,
            "{q_real:?} {q_drawn:?}"
        );
        assert!(
            (q_real.block_label_tv - q_drawn.block_label_tv).abs() < 0.03,
            "{q_real:?} {q_drawn:?}"
        );
    }
}
