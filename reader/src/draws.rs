//! Importance sampling's epoch in bounded memory: N draws with replacement, sample i with
//! probability p_i, grouped by chunk, without a table of N probabilities or N draws.
//!
//! Drawing N samples from p is drawing, first, how many fall in each chunk (a multinomial of
//! N over the chunks' masses M_c = Σ p_i, by conditional binomials: O(chunks)), then, for each
//! chunk, that many samples from p restricted to the chunk. The two-stage draw has exactly the
//! distribution of N independent draws; every rank computes the same per-chunk counts (the
//! same keyed generator), and then only the draws of the chunks its share covers (each chunk's
//! from a generator keyed by the chunk). Memory: 8 bytes a chunk, plus the share, plus one
//! chunk's alias table at a time; time: one pass over the scores, O(chunks) binomials, and
//! the share's draws.

use granary_format::SplitMix64;

/// ln(k!) − Stirling's approximation `(k + ½) ln(k + 1) − (k + 1) + ½ ln 2π`, the tail of the
/// series for ln Γ(k + 1): exact below 10, the next three terms above.
fn stirling_tail(k: f64) -> f64 {
    if k < 10.0 {
        let ln_fact: f64 = (2..=k as u64).map(|i| (i as f64).ln()).sum();
        let approx =
            (k + 0.5) * (k + 1.0).ln() - (k + 1.0) + 0.5 * (2.0 * std::f64::consts::PI).ln();
        return ln_fact - approx;
    }
    let kp1 = k + 1.0;
    let sq = kp1 * kp1;
    (1.0 / 12.0 - (1.0 / 360.0 - 1.0 / 1260.0 / sq) / sq) / kp1
}

/// A Binomial(`n`, `p`) variate: inversion for means under 10, Hörmann's BTRS (transformed
/// rejection with squeeze, 1993) otherwise; exact up to floating point.
pub(crate) fn binomial(n: u64, p: f64, r: &mut SplitMix64) -> u64 {
    if n == 0 || p.is_nan() || p <= 0.0 {
        return 0;
    }
    if p >= 1.0 {
        return n;
    }
    if p > 0.5 {
        return n - binomial(n, 1.0 - p, r);
    }
    if n as f64 * p < 10.0 {
        return inversion(n, p, r);
    }
    btrs(n as f64, p, r)
}

/// Sequential search of the CDF from 0 (expected n·p + 1 steps).
fn inversion(n: u64, p: f64, r: &mut SplitMix64) -> u64 {
    let q = 1.0 - p;
    let s = p / q;
    let a = (n as f64 + 1.0) * s;
    let first = (n as f64 * q.ln()).exp();
    loop {
        let mut u = r.next_f64();
        let mut pk = first;
        let mut k = 0u64;
        while u > pk {
            u -= pk;
            k += 1;
            if k > n || pk <= 0.0 {
                break;
            }
            pk *= a / k as f64 - s;
        }
        if k <= n && pk > 0.0 {
            return k;
        }
        // Rounding ran past the end of the distribution: draw again.
    }
}

/// BTRS for n·p ≥ 10, p ≤ ½.
fn btrs(n: f64, p: f64, rng: &mut SplitMix64) -> u64 {
    let spq = (n * p * (1.0 - p)).sqrt();
    let b = 1.15 + 2.53 * spq;
    let a = -0.0873 + 0.0248 * b + 0.01 * p;
    let c = n * p + 0.5;
    let v_r = 0.92 - 4.2 / b;
    let r = p / (1.0 - p);
    let alpha = (2.83 + 5.1 / b) * spq;
    let m = ((n + 1.0) * p).floor();
    loop {
        let u = rng.next_f64() - 0.5;
        let v = rng.next_f64();
        let us = 0.5 - u.abs();
        let k = ((2.0 * a / us + b) * u + c).floor();
        if k < 0.0 || k > n {
            continue;
        }
        if us >= 0.07 && v <= v_r {
            return k as u64;
        }
        // ln f(k) − ln f(m), grouped so that no two large terms cancel.
        let v = (v * alpha / (a / (us * us) + b)).ln();
        let bound = (m + 0.5) * ((m + 1.0) / (r * (n - m + 1.0))).ln()
            + (n + 1.0) * ((n - m + 1.0) / (n - k + 1.0)).ln()
            + (k + 0.5) * (r * (n - k + 1.0) / (k + 1.0)).ln()
            + stirling_tail(m)
            + stirling_tail(n - m)
            - stirling_tail(k)
            - stirling_tail(n - k);
        if v <= bound {
            return k as u64;
        }
    }
}

/// Vose's alias method over `p` (any non-negative weights): O(n) setup, O(1) per draw.
pub(crate) struct Alias {
    prob: Vec<f64>,
    alias: Vec<usize>,
}

impl Alias {
    pub(crate) fn new(p: &[f64]) -> Self {
        let n = p.len();
        let total: f64 = p.iter().sum::<f64>().max(f64::MIN_POSITIVE);
        let mut prob = vec![0.0; n];
        let mut alias = vec![0; n];
        let mut scaled: Vec<f64> = p.iter().map(|x| x / total * n as f64).collect();
        let (mut small, mut large): (Vec<usize>, Vec<usize>) =
            (0..n).partition(|&i| scaled[i] < 1.0);
        // Peek both before taking: popping `small` when `large` is empty (rounding) would
        // drop that entry, leaving it probability 0 and its mass to entry 0.
        while let (Some(&s), Some(&l)) = (small.last(), large.last()) {
            small.pop();
            prob[s] = scaled[s];
            alias[s] = l;
            scaled[l] -= 1.0 - scaled[s];
            if scaled[l] < 1.0 {
                large.pop();
                small.push(l);
            }
        }
        for i in small.into_iter().chain(large) {
            prob[i] = 1.0;
        }
        Alias { prob, alias }
    }

    pub(crate) fn draw(&self, r: &mut SplitMix64) -> usize {
        let i = r.below(self.prob.len() as u64) as usize;
        if r.next_f64() < self.prob[i] {
            i
        } else {
            self.alias[i]
        }
    }
}

/// A sample's mass (its score times its cache boost): p_i is proportional to it, mixed with
/// the uniform floor.
pub(crate) type Mass<'a> = &'a (dyn Fn(u64) -> f64 + Sync);

/// One epoch's importance draws: how many fall in each chunk, and p_i on demand.
pub(crate) struct Importance<'a> {
    mass: Mass<'a>,
    n: u64,
    alpha: f64,
    /// Σ of every sample's mass.
    total: f64,
    /// Chunk `c` holds samples `starts[c]..starts[c + 1]`.
    starts: &'a [u64],
    /// The epoch's key: the counts' generator's, and with a chunk id, the chunk's draws'.
    key: Vec<u64>,
    /// Draws per chunk (by chunk id); they add up to N (or the draws asked for).
    pub(crate) counts: Vec<u64>,
}

impl<'a> Importance<'a> {
    /// One pass over the masses (the chunks' sums), then the chunks' counts (chunk `c` holds
    /// samples `starts[c]..starts[c + 1]`), drawing `draws` samples (default N, the sample
    /// count: a mixture's source gives its epoch count); the same on every rank for the same
    /// scores and key.
    pub(crate) fn new(
        mass: Mass<'a>,
        alpha: f64,
        starts: &'a [u64],
        key: &[u64],
        draws: Option<u64>,
    ) -> Self {
        let n = *starts.last().expect("starts from 0");
        let alpha = alpha.clamp(0.0, 0.999_999);
        let sums: Vec<f64> = starts
            .windows(2)
            .map(|w| (w[0]..w[1]).map(mass).sum())
            .collect();
        let total = sums.iter().sum::<f64>().max(f64::MIN_POSITIVE);
        // Multinomial(N, M) by conditional binomials, in chunk id order.
        let mut r = SplitMix64::keyed(key);
        let (mut left, mut mass_left) = (draws.unwrap_or(n), 1.0f64);
        let chunks = sums.len();
        let counts = sums
            .iter()
            .enumerate()
            .map(|(c, &sum)| {
                let len = starts[c + 1] - starts[c];
                let m = (1.0 - alpha) * len as f64 / n.max(1) as f64 + alpha * sum / total;
                let k = match c + 1 == chunks {
                    true => left,
                    false => binomial(left, (m / mass_left).clamp(0.0, 1.0), &mut r),
                };
                left -= k;
                mass_left = (mass_left - m).max(0.0);
                k
            })
            .collect();
        Importance {
            mass,
            n,
            alpha,
            total,
            starts,
            key: key.to_vec(),
            counts,
        }
    }

    /// p_i: (1 − α)/N + α · mass_i / Σ mass.
    pub(crate) fn p(&self, i: u64) -> f64 {
        (1.0 - self.alpha) / self.n as f64 + self.alpha * (self.mass)(i) / self.total
    }

    /// The `counts[c]` draws in chunk `c`, sorted by sample id (keyed by the chunk, so any
    /// rank computes the same ones).
    pub(crate) fn chunk_draws(&self, c: u32) -> Vec<u64> {
        let k = self.counts[c as usize];
        let ids = self.starts[c as usize]..self.starts[c as usize + 1];
        if k == 0 || ids.is_empty() {
            return Vec::new();
        }
        let p: Vec<f64> = ids.clone().map(|i| self.p(i)).collect();
        let alias = Alias::new(&p);
        let mut r = SplitMix64::keyed(&[&self.key[..], &[u64::from(c)]].concat());
        let mut v: Vec<u64> = (0..k)
            .map(|_| ids.start + alias.draw(&mut r) as u64)
            .collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mean and variance of many draws within 5 standard errors of n·p and n·p·q.
    #[test]
    fn binomial_draws_have_the_binomial_mean_and_variance() {
        let mut r = SplitMix64::new(7);
        for &(n, p) in &[
            (1u64, 0.3),
            (10, 0.5),
            (40, 0.1),
            (100, 0.05),
            (1000, 0.3),
            (1000, 0.9),
            (1_000_000_000, 3e-7),
            (1_000_000_000, 0.25),
            (50, 0.999),
        ] {
            let draws = 20_000;
            let xs: Vec<f64> = (0..draws)
                .map(|_| {
                    let k = binomial(n, p, &mut r);
                    assert!(k <= n);
                    k as f64
                })
                .collect();
            let mean = xs.iter().sum::<f64>() / draws as f64;
            let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (draws - 1) as f64;
            let (mu, sigma2) = (n as f64 * p, n as f64 * p * (1.0 - p));
            let se_mean = (sigma2 / draws as f64).sqrt();
            assert!(
                (mean - mu).abs() < 5.0 * se_mean + 1e-9,
                "n {n} p {p}: mean {mean}, expected {mu} ± {se_mean}"
            );
            // The variance's standard error is about σ²·√(2/draws).
            let se_var = sigma2 * (2.0 / draws as f64).sqrt();
            assert!(
                (var - sigma2).abs() < 5.0 * se_var + 1e-9,
                "n {n} p {p}: variance {var}, expected {sigma2} ± {se_var}"
            );
        }
        assert_eq!(binomial(0, 0.5, &mut r), 0);
        assert_eq!(binomial(9, 0.0, &mut r), 0);
        assert_eq!(binomial(9, 1.0, &mut r), 9);
    }

    /// Over many epochs, each sample is drawn N·p_i times per epoch on average (chunks of
    /// uneven sizes, uneven masses), and every epoch has exactly N draws.
    #[test]
    fn two_stage_draws_follow_p() {
        let lens = [5u64, 40, 1, 17, 0, 33];
        let starts: Vec<u64> = [0]
            .into_iter()
            .chain(lens.iter().scan(0, |a, l| {
                *a += l;
                Some(*a)
            }))
            .collect();
        let n: u64 = lens.iter().sum();
        let mass = |i: u64| ((i * 7919) % 13) as f64 + 0.5;
        let alpha = 0.9;
        let total: f64 = (0..n).map(mass).sum();
        let probs: Vec<f64> = (0..n)
            .map(|i| (1.0 - alpha) / n as f64 + alpha * mass(i) / total)
            .collect();
        let epochs = 4000u64;
        let mut freq = vec![0u64; n as usize];
        for e in 0..epochs {
            let key = [1, e, 8];
            let imp = Importance::new(&mass, alpha, &starts, &key, None);
            assert_eq!(imp.counts.iter().sum::<u64>(), n);
            for (i, &p) in probs.iter().enumerate() {
                assert!((imp.p(i as u64) - p).abs() < 1e-12);
            }
            let all: Vec<u64> = (0..lens.len() as u32)
                .flat_map(|c| imp.chunk_draws(c))
                .collect();
            assert_eq!(all.len() as u64, n);
            for s in all {
                freq[s as usize] += 1;
            }
        }
        for (i, &p) in probs.iter().enumerate() {
            let want = (epochs * n) as f64 * p;
            let se = (want * (1.0 - p)).sqrt();
            assert!(
                (freq[i] as f64 - want).abs() < 5.0 * se,
                "sample {i}: drawn {} times, expected {want:.1} ± {se:.1}",
                freq[i]
            );
        }
    }

    #[test]
    fn binomial_frequencies_match_the_pmf() {
        // n = 30, p = 0.4 (BTRS: n·p = 12): every k's frequency within 5 standard errors.
        let (n, p, draws) = (30u64, 0.4f64, 200_000usize);
        let mut r = SplitMix64::new(3);
        let mut freq = vec![0usize; n as usize + 1];
        for _ in 0..draws {
            freq[binomial(n, p, &mut r) as usize] += 1;
        }
        let ln_choose = |k: u64| -> f64 {
            (1..=n).map(|i| (i as f64).ln()).sum::<f64>()
                - (1..=k).map(|i| (i as f64).ln()).sum::<f64>()
                - (1..=n - k).map(|i| (i as f64).ln()).sum::<f64>()
        };
        for k in 0..=n {
            let pk = (ln_choose(k) + k as f64 * p.ln() + (n - k) as f64 * (1.0 - p).ln()).exp();
            let want = pk * draws as f64;
            let se = (want * (1.0 - pk)).sqrt().max(1.0);
            assert!(
                (freq[k as usize] as f64 - want).abs() < 5.0 * se,
                "k {k}: {} draws, expected {want:.1}",
                freq[k as usize]
            );
        }
    }
}
