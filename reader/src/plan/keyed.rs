//! Keyed permutations and the epoch's global orders: what every rank computes alike from
//! (seed, epoch).

use granary_format::SplitMix64;

use super::*;

pub(super) const TAG_CHUNKS: u64 = 1;
pub(super) const TAG_GLOBAL: u64 = 2;
pub(super) const TAG_HOME: u64 = 3;
pub(super) const TAG_MOVE: u64 = 4;
pub(super) const TAG_DEST: u64 = 5;
pub(super) const TAG_RANK_ORDER: u64 = 6;
pub(super) const TAG_WINDOW: u64 = 7;
pub(super) const TAG_IMPORTANCE: u64 = 8;

/// Rounds of [`KeyedPermutation`]'s Feistel network (four make a pseudo-random permutation
/// with random round functions; two more for margin).
const FEISTEL_ROUNDS: usize = 6;

/// A keyed bijection on `0..n`: position `i` of a global shuffle is [`KeyedPermutation::at`]
/// `(i)`, computed in O(1) time and memory, so that no rank holds the whole permutation (8
/// bytes per sample: 8 GB at a billion samples). A balanced Feistel network on the smallest
/// even number of bits that covers `n`, whose round function is SplitMix64's finaliser of
/// the half-block and a round key; outputs past `n` are walked on through the network until
/// they fall in range (cycle-walking keeps it a bijection; fewer than 4 steps on average, as
/// the network's domain is under 4n).
#[derive(Clone, Debug)]
pub struct KeyedPermutation {
    n: u64,
    half: u32,
    keys: [u64; FEISTEL_ROUNDS],
}

impl KeyedPermutation {
    /// The permutation of `0..n` keyed by `key` (e.g. seed, epoch, a tag).
    pub fn new(n: u64, key: &[u64]) -> Self {
        let bits = (u64::BITS - n.saturating_sub(1).leading_zeros()).max(2);
        let mut r = SplitMix64::keyed(key);
        KeyedPermutation {
            n,
            half: bits.div_ceil(2),
            keys: std::array::from_fn(|_| r.next_u64()),
        }
    }

    /// The image of `i` (`i < n`).
    pub fn at(&self, i: u64) -> u64 {
        assert!(i < self.n, "position {i} outside 0..{}", self.n);
        let mut x = i;
        loop {
            x = self.feistel(x);
            if x < self.n {
                return x;
            }
        }
    }

    fn feistel(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half) - 1;
        let (mut l, mut r) = (x >> self.half, x & mask);
        for k in self.keys {
            let mut z = r ^ k;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (l, r) = (r, l ^ ((z ^ (z >> 31)) & mask));
        }
        (l << self.half) | r
    }
}

/// The epoch's global sequence before the per-rank cut.
#[cfg(test)]
pub(super) fn global_sequence(
    shape: &DatasetShape,
    o: &PlanOptions,
    epoch: u64,
    world: u32,
) -> Vec<u64> {
    let n = shape.samples();
    match o.mode {
        ShuffleMode::Sequential => (0..n).collect(),
        ShuffleMode::Global => {
            let p = KeyedPermutation::new(n, &[o.seed, epoch, TAG_GLOBAL]);
            (0..n).map(|i| p.at(i)).collect()
        }
        ShuffleMode::Chunkwise => {
            let order = chunk_order(shape, o, epoch, world);
            let mut v = Vec::with_capacity(n as usize);
            for c in order {
                v.extend(shape.chunk_samples(c));
            }
            v
        }
    }
}

/// Chunk order of a chunkwise epoch. With locality < 1, each rank keeps a home set of chunks
/// (balanced by sample count) and only a seeded fraction of chunks moves to a random rank.
pub(super) fn chunk_order(
    shape: &DatasetShape,
    o: &PlanOptions,
    epoch: u64,
    world: u32,
) -> Vec<u32> {
    let mut chunks: Vec<u32> = (0..shape.chunks()).collect();
    if o.locality >= 1.0 || world <= 1 {
        SplitMix64::keyed(&[o.seed, epoch, TAG_CHUNKS]).shuffle(&mut chunks);
        return chunks;
    }
    let home = home_ranks(shape, o, world);
    let mut owned: Vec<Vec<u32>> = vec![Vec::new(); world as usize];
    for c in 0..shape.chunks() {
        let mut r = SplitMix64::keyed(&[o.seed, epoch, TAG_MOVE, c as u64]);
        let owner = if r.next_f64() < o.locality {
            SplitMix64::keyed(&[o.seed, epoch, TAG_DEST, c as u64]).below(world as u64) as u32
        } else {
            home[c as usize]
        };
        owned[owner as usize].push(c);
    }
    let mut out = Vec::with_capacity(shape.chunks() as usize);
    for (r, mut cs) in owned.into_iter().enumerate() {
        SplitMix64::keyed(&[o.seed, epoch, TAG_RANK_ORDER, r as u64]).shuffle(&mut cs);
        out.extend(cs);
    }
    out
}
