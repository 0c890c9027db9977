//! The seeded PRNG behind every granary layout and epoch plan. Stable across versions: a seed
//! means the same order in every granary release, which is what makes plans resumable.

/// SplitMix64 (Steele, Lea, Flood 2014).
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (Lemire's multiply-shift with rejection), `n > 0`.
    pub fn below(&mut self, n: u64) -> u64 {
        loop {
            let m = (self.next_u64() as u128) * (n as u128);
            let lo = m as u64;
            if lo >= n.wrapping_neg() % n {
                return (m >> 64) as u64;
            }
        }
    }

    /// A generator for a tuple of inputs (seed, epoch, rank, ...): each word is mixed in.
    pub fn keyed(words: &[u64]) -> Self {
        let mut r = SplitMix64::new(0x6772_616e_6172_7921);
        for &w in words {
            let x = r.next_u64() ^ w;
            r = SplitMix64::new(x);
            r.next_u64();
        }
        r
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Fisher–Yates shuffle.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn stable_sequence() {
        // Reference values of SplitMix64 seeded with 1234567.
        let mut r = super::SplitMix64::new(1234567);
        assert_eq!(r.next_u64(), 6457827717110365317);
        assert_eq!(r.next_u64(), 3203168211198807973);
    }
}
