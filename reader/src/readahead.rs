//! Read-ahead shared by the streams of one consumer that reads them in turn (a mixture's
//! sources): one pool of read buffers, and one order of reads.
//!
//! Each stream always reads the window it needs next. Its read-ahead is decided here for all
//! of them together: the window the consumer will need soonest goes first, and reads in flight
//! are kept to what one stream alone would have in flight (`ahead_bytes`), so that windows
//! needed late do not share the device with the one needed now (docs/reading.md, "Mixtures").

use std::sync::{Arc, Mutex, MutexGuard};

use granary_store::buf::BufPool;

/// What the streams share. Made by [`SharedReadAhead::new`]; each stream gets a
/// [`ReadAheadSeat`].
#[derive(Debug)]
pub struct SharedReadAhead {
    pool: Arc<BufPool>,
    ahead_bytes: usize,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Per stream: when the consumer needs its window that waits to be read ahead (as a
    /// fraction of the consumer's sequence), `None` when none waits.
    waiting: Vec<Option<f64>>,
    /// Bytes of the streams' windows whose reads are in flight.
    in_flight: usize,
}

impl SharedReadAhead {
    /// For `streams` streams sharing `pool`, with at most `ahead_bytes` of reads in flight
    /// beyond the windows each stream needs next.
    pub fn new(streams: usize, pool: Arc<BufPool>, ahead_bytes: usize) -> Arc<Self> {
        Arc::new(SharedReadAhead {
            pool,
            ahead_bytes,
            state: Mutex::new(State {
                waiting: vec![None; streams],
                in_flight: 0,
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The state is two counters: a panic elsewhere leaves it consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One stream's place in a [`SharedReadAhead`]: its index, and where its samples fall in the
/// consumer's sequence — its sample `k` (of the stream's plan) is needed at
/// `(2 (first + k) + 1) / (2 count)` of it, as a mixture interleaves its sources.
#[derive(Clone, Debug)]
pub struct ReadAheadSeat {
    shared: Arc<SharedReadAhead>,
    index: usize,
    first: u64,
    count: u64,
}

impl ReadAheadSeat {
    /// Stream `index` of `shared`, whose plan starts at its sample `first` of `count` in the
    /// consumer's sequence (`first` > 0 when an epoch is resumed).
    pub fn new(shared: Arc<SharedReadAhead>, index: usize, first: u64, count: u64) -> Self {
        ReadAheadSeat {
            shared,
            index,
            first,
            count,
        }
    }

    /// The read buffers the streams share.
    pub fn pool(&self) -> &Arc<BufPool> {
        &self.shared.pool
    }

    fn need(&self, sample: u64) -> f64 {
        (2 * (self.first + sample) + 1) as f64 / (2 * self.count.max(1)) as f64
    }

    /// The window starting at the stream's sample `sample`, of `bytes` buffer bytes, may be
    /// read ahead now: no other stream's waiting window is needed sooner and the reads in
    /// flight leave room. If so its bytes are in flight until the returned guard drops; if
    /// not it waits in line (until [`ReadAheadSeat::step_aside`] or the next call).
    pub(crate) fn try_read_ahead(&self, sample: u64, bytes: usize) -> Option<InFlight> {
        let need = self.need(sample);
        let mut s = self.shared.state();
        s.waiting[self.index] = Some(need);
        let first = s.waiting.iter().enumerate().all(|(j, w)| match w {
            Some(w) if j != self.index => (need, self.index) < (*w, j),
            _ => true,
        });
        if !first || s.in_flight + bytes > self.shared.ahead_bytes {
            return None;
        }
        Some(self.admit(&mut s, bytes))
    }

    /// The stream reads its next window now, whatever waits: its bytes are in flight until
    /// the guard drops.
    pub(crate) fn read_now(&self, bytes: usize) -> InFlight {
        self.admit(&mut self.shared.state(), bytes)
    }

    /// The stream will not read ahead for a while (it waits for its consumer): its waiting
    /// window no longer holds the others back.
    pub(crate) fn step_aside(&self) {
        self.shared.state().waiting[self.index] = None;
    }

    /// The stream's window of `bytes` leaves the line: in flight until the guard drops.
    fn admit(&self, s: &mut State, bytes: usize) -> InFlight {
        s.waiting[self.index] = None;
        s.in_flight += bytes;
        InFlight {
            shared: self.shared.clone(),
            bytes,
        }
    }
}

/// Steps its stream aside when dropped (its I/O thread ended, however).
pub(crate) struct Leaving(pub(crate) ReadAheadSeat);

impl Drop for Leaving {
    fn drop(&mut self) {
        self.0.step_aside();
    }
}

/// A window's reads in flight, counted until dropped (when they completed, failed or were
/// abandoned).
pub(crate) struct InFlight {
    shared: Arc<SharedReadAhead>,
    bytes: usize,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut s = self.shared.state();
        s.in_flight = s.in_flight.saturating_sub(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seats(counts: &[u64], ahead: usize) -> Vec<ReadAheadSeat> {
        let shared = SharedReadAhead::new(counts.len(), BufPool::new(1 << 30), ahead);
        counts
            .iter()
            .enumerate()
            .map(|(i, &c)| ReadAheadSeat::new(shared.clone(), i, 0, c))
            .collect()
    }

    #[test]
    fn the_window_needed_soonest_reads_ahead_first_within_the_bytes_in_flight() {
        // Sources of 1000 and 100 samples: sample 300 of the first is needed at 0.30, sample
        // 20 of the second at 0.205.
        let s = seats(&[1000, 100], 100);
        let mut next = vec![s[0].read_now(45), s[1].read_now(45)];
        assert!(
            s[1].try_read_ahead(20, 20).is_none(),
            "110 bytes would be in flight"
        );
        assert!(
            s[0].try_read_ahead(300, 5).is_none(),
            "room, but the second's is needed sooner"
        );
        next.remove(0);
        let b = s[1]
            .try_read_ahead(20, 20)
            .expect("needed soonest, room now");
        let a = s[0].try_read_ahead(300, 5).expect("first in line now");
        assert!(
            s[1].try_read_ahead(30, 40).is_none(),
            "no room: waits in line at 0.305"
        );
        assert!(
            s[0].try_read_ahead(500, 5).is_none(),
            "needed at 0.5005: behind it"
        );
        // The second waits for its consumer: it no longer holds the first back.
        s[1].step_aside();
        let c = s[0]
            .try_read_ahead(500, 5)
            .expect("nothing needed sooner waits");
        drop((next, a, b, c));
        assert_eq!(
            s[0].shared.state().in_flight,
            0,
            "every guard gave its bytes back"
        );
    }

    #[test]
    fn a_resumed_stream_is_placed_where_its_samples_fall() {
        let shared = SharedReadAhead::new(2, BufPool::new(1 << 20), 1 << 20);
        // 400 of 1000 delivered: its sample 0 is the 401st, needed at 0.4005.
        let resumed = ReadAheadSeat::new(shared.clone(), 0, 400, 1000);
        let fresh = ReadAheadSeat::new(shared, 1, 0, 1000);
        let busy = fresh.read_now(1 << 20);
        assert!(
            resumed.try_read_ahead(0, 1).is_none(),
            "no room: it waits in line"
        );
        drop(busy);
        assert!(
            fresh.try_read_ahead(401, 1).is_none(),
            "needed at 0.4015: after it"
        );
        assert!(
            fresh.try_read_ahead(399, 1).is_some(),
            "needed at 0.3995: before it"
        );
    }
}
