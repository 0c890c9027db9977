//! Where a stream's consumer waits, and on what.
//!
//! The consumer waits when it asks for a sample and the next window is not decoded yet. The
//! I/O thread records what it does as a timeline of phases: waiting for reads (split among the
//! store stack's layers by the time its reads waited in each), checking CRCs and
//! decompressing, planning the next window. Each wait of the consumer is attributed to the
//! phases it overlapped, and what no phase covers to `other`: the parts add up to the wait.
//! Phases that ended before a wait did are dropped.

use std::sync::Mutex;
use std::time::Instant;

use granary_store::MeterReading;
use serde::Serialize;

/// What the I/O thread was doing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Phase {
    /// Waiting for reads: the shares of the tier, the peers and origin in that time.
    Read([f64; 3]),
    /// Checking CRCs and decompressing (on the decode pool).
    Check,
    /// Planning a window: sample lookups, snapshot blocks, and opening its chunks, which waits
    /// in the store's layers: the shares of the phase spent in the tier, the peers and origin
    /// (the rest is planning).
    Plan([f64; 3]),
}

/// Seconds a consumer waited, by what the reader was doing meanwhile.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct WaitReport {
    /// Seconds the consumer waited for samples (asked and found none decoded).
    pub waited_s: f64,
    /// Times it waited.
    pub waits: u64,
    /// ... while the reader waited for reads from this node's tier,
    pub tier_s: f64,
    /// ... from other nodes' tiers,
    pub peers_s: f64,
    /// ... from origin storage (the dataset's own: a file system or an object store),
    pub origin_s: f64,
    /// ... checked CRCs and decompressed,
    pub check_s: f64,
    /// ... planned a window (sample lookups, snapshot blocks),
    pub plan_s: f64,
    /// ... or did anything else (handing the window over, bookkeeping).
    pub other_s: f64,
}

impl WaitReport {
    /// The parts of `waited_s`, named as reports name them (`tier`, `peers`, `origin`,
    /// `check`, `plan`, `other`): they add up to it.
    pub fn parts(&self) -> [(&'static str, f64); 6] {
        [
            ("tier", self.tier_s),
            ("peers", self.peers_s),
            ("origin", self.origin_s),
            ("check", self.check_s),
            ("plan", self.plan_s),
            ("other", self.other_s),
        ]
    }
}

impl std::ops::AddAssign for WaitReport {
    fn add_assign(&mut self, o: WaitReport) {
        self.waited_s += o.waited_s;
        self.waits += o.waits;
        self.tier_s += o.tier_s;
        self.peers_s += o.peers_s;
        self.origin_s += o.origin_s;
        self.check_s += o.check_s;
        self.plan_s += o.plan_s;
        self.other_s += o.other_s;
    }
}

/// The I/O thread's recent phases and what the consumer's waits were attributed to so far.
#[derive(Debug)]
pub(crate) struct Timeline {
    inner: Mutex<Inner>,
    /// Off (`GRANARY_WAIT_TIMING=off`, for measuring what timing costs): nothing recorded.
    on: bool,
}

#[derive(Debug, Default)]
struct Inner {
    phases: Vec<(Instant, Instant, Phase)>,
    report: WaitReport,
}

impl Default for Timeline {
    fn default() -> Self {
        Timeline {
            inner: Mutex::default(),
            on: std::env::var("GRANARY_WAIT_TIMING").map_or(true, |v| v != "off"),
        }
    }
}

impl Timeline {
    /// True when waits are timed.
    pub(crate) fn on(&self) -> bool {
        self.on
    }

    /// The I/O thread did `phase` from `start` until now.
    pub(crate) fn record(&self, start: Instant, phase: Phase) {
        if self.on {
            let end = Instant::now();
            let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            g.phases.push((start, end, phase));
        }
    }

    /// The consumer waited from `t0` to `t1`: attributed to the phases it overlapped.
    pub(crate) fn waited(&self, t0: Instant, t1: Instant) {
        if !self.on {
            return;
        }
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let total = t1.saturating_duration_since(t0).as_secs_f64();
        let mut covered = 0.0;
        let mut parts = WaitReport {
            waited_s: total,
            waits: 1,
            ..Default::default()
        };
        for &(s, e, phase) in &g.phases {
            let (s, e) = (s.max(t0), e.min(t1));
            if e <= s {
                continue;
            }
            let d = (e - s).as_secs_f64();
            covered += d;
            match phase {
                Phase::Check => parts.check_s += d,
                Phase::Read([t, p, o]) | Phase::Plan([t, p, o]) => {
                    parts.tier_s += d * t;
                    parts.peers_s += d * p;
                    parts.origin_s += d * o;
                    if let Phase::Plan(_) = phase {
                        parts.plan_s += d * (1.0 - t - p - o).max(0.0);
                    }
                }
            }
        }
        parts.other_s = (total - covered).max(0.0);
        g.report += parts;
        // Later waits start after t1.
        g.phases.retain(|&(_, e, _)| e > t1);
    }

    /// What the waits so far were attributed to.
    pub(crate) fn report(&self) -> WaitReport {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).report
    }
}

/// A stack's meters' readings, top first.
type Readings<'a> = &'a [(&'static str, MeterReading)];

/// What the tier, the peers and origin each did of their own between two readings of a
/// stack's meters (top first), as `count` measures a reading: layers are nested (the tier's
/// meter counts what the layers below served too), so each one's own part is its count less
/// the next one's.
fn own(before: Readings, after: Readings, count: impl Fn(&MeterReading) -> f64) -> [f64; 3] {
    let deltas: Vec<(&str, f64)> = after
        .iter()
        .zip(before)
        .map(|((name, a), (_, b))| (*name, (count(a) - count(b)).max(0.0)))
        .collect();
    let mut own = [0.0f64; 3];
    for (i, (name, d)) in deltas.iter().enumerate() {
        let below = deltas.get(i + 1).map_or(0.0, |x| x.1);
        let slot = match *name {
            "tier" => 0,
            "peers" => 1,
            _ => 2,
        };
        own[slot] += (d - below).max(0.0);
    }
    own
}

/// A read phase's split among the layers: in proportion to their own waits during it
/// ([`own`]); without any wait (reads served from maps of the page cache), in
/// proportion to the bytes each layer served of its own; with neither, origin's.
pub(crate) fn read_shares(before: Readings, after: Readings) -> [f64; 3] {
    let share = |own: [f64; 3]| {
        let sum: f64 = own.iter().sum();
        (sum > 0.0).then(|| own.map(|x| x / sum))
    };
    share(own(before, after, |r| r.wait_s))
        .or_else(|| share(own(before, after, |r| r.bytes as f64)))
        .unwrap_or([0.0, 0.0, 1.0])
}

/// A planning phase of `secs` seconds: the shares the layers' own waits during it take of it
/// (the I/O thread opens chunks itself while planning; at most the whole phase).
pub(crate) fn plan_shares(before: Readings, after: Readings, secs: f64) -> [f64; 3] {
    let waits = own(before, after, |r| r.wait_s);
    let sum: f64 = waits.iter().sum();
    if sum <= 0.0 || secs <= 0.0 {
        return [0.0; 3];
    }
    let scale = (sum.min(secs) / secs) / sum;
    waits.map(|x| x * scale)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_wait_is_split_by_the_phases_it_overlaps_and_adds_up() {
        let tl = Timeline {
            inner: Mutex::default(),
            on: true,
        };
        let t = Instant::now();
        let at = |ms: u64| t + Duration::from_millis(ms);
        {
            let mut g = tl.inner.lock().unwrap();
            g.phases
                .push((at(0), at(40), Phase::Read([0.25, 0.0, 0.75])));
            g.phases.push((at(40), at(60), Phase::Check));
            g.phases
                .push((at(70), at(80), Phase::Plan([0.5, 0.0, 0.0])));
            g.phases
                .push((at(100), at(200), Phase::Read([0.0, 0.0, 1.0])));
        }
        // The consumer waited from 20 to 90 ms: 20 ms of reads, 20 of checks, 10 of planning
        // (half of it opening chunks in the tier), 20 of nothing recorded.
        tl.waited(at(20), at(90));
        let r = tl.report();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(r.waited_s, 0.070), "{r:?}");
        assert!(close(r.tier_s, 0.010) && close(r.origin_s, 0.015), "{r:?}");
        assert!(close(r.check_s, 0.020) && close(r.plan_s, 0.005), "{r:?}");
        assert!(close(r.other_s, 0.020), "{r:?}");
        let parts: f64 = r.parts().iter().map(|p| p.1).sum();
        assert!(close(parts, r.waited_s));
        // Phases that ended before the wait did are gone; the one after stays.
        assert_eq!(tl.inner.lock().unwrap().phases.len(), 1);
    }

    #[test]
    fn read_time_goes_to_each_layers_own_wait() {
        let m = |w: f64| MeterReading {
            wait_s: w,
            ..Default::default()
        };
        // The tier's meter counts everything (3 s), the peers' what the tier missed (2 s),
        // origin what the peers missed (0.5 s): own times 1, 1.5, 0.5.
        let before = [("tier", m(0.0)), ("peers", m(0.0)), ("origin", m(0.0))];
        let after = [("tier", m(3.0)), ("peers", m(2.0)), ("origin", m(0.5))];
        let s = read_shares(&before, &after);
        assert!(
            (s[0] - 1.0 / 3.0).abs() < 1e-9 && (s[1] - 0.5).abs() < 1e-9,
            "{s:?}"
        );
        assert_eq!(
            read_shares(&[("origin", m(1.0))], &[("origin", m(1.0))]),
            [0.0, 0.0, 1.0]
        );
        // Planning for 2 s, of which the tier's opens waited 0.5 s; a layer that waited longer
        // than the phase (reads in flight completing meanwhile) takes the whole phase.
        let p = plan_shares(&[("tier", m(0.0))], &[("tier", m(0.5))], 2.0);
        assert!((p[0] - 0.25).abs() < 1e-9, "{p:?}");
        let p = plan_shares(&[("origin", m(0.0))], &[("origin", m(5.0))], 2.0);
        assert!((p[2] - 1.0).abs() < 1e-9, "{p:?}");
    }
}
