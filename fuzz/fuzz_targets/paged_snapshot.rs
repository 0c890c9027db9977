//! A snapshot read in pieces (as from an object store): `Snapshot::open_paged` and every
//! accessor, on any bytes, resealed so that the checks behind the block CRCs are reached.
//! Whatever the bytes, every byte an accessor reads must be one it asked its pager for: the
//! same queries over a copy that holds only the bytes asked for (the rest garbage) must give
//! the same answers.
#![no_main]
use std::ops::Range;
use std::sync::{Arc, Mutex};

use granary_format::{FormatError, Pager, Snapshot};
use libfuzzer_sys::fuzz_target;

/// Records what is asked (first run); refuses anything else (second run).
struct Recorder {
    asked: Mutex<Vec<Range<u64>>>,
    allowed: Option<Vec<Range<u64>>>,
}

impl Pager for Recorder {
    fn need_all(&self, ranges: &[Range<u64>]) -> granary_format::Result<()> {
        for r in ranges {
            if let Some(a) = &self.allowed {
                if !r.is_empty() && !a.iter().any(|x| x.start <= r.start && r.end <= x.end) {
                    return Err(FormatError::Unavailable {
                        what: "pager".into(),
                        detail: format!("{r:?} never asked for"),
                    });
                }
            }
            self.asked.lock().unwrap().push(r.clone());
        }
        Ok(())
    }
}

fn queries(data: &[u8], pager: Arc<Recorder>) -> Vec<String> {
    let s = match Snapshot::open_paged(data, pager) {
        Ok(s) => s,
        Err(e) => return vec![format!("open: {e}")],
    };
    let mut out = vec![format!("{:?}", (s.sample_count(), s.chunk_count(), s.class_count()))];
    let n = s.sample_count();
    for c in 0..s.chunk_count().min(64) {
        out.push(format!("{:?}", (s.chunk(c), s.class_counts(c))));
        if let Ok(c) = s.chunk(c) {
            out.push(format!("{:?}", s.prefetch_records(c.samples())));
        }
    }
    for id in (0..n.min(256)).chain([n]) {
        out.push(format!("{:?}", (s.sample(id), s.attrs(id), s.fields(id))));
        let p = s.path(id);
        out.push(format!("{p:?}"));
        if let Ok(p) = p {
            out.push(format!("{:?}", (s.lookup(&p), s.prefix_range(&p), s.lookup_stat(&p))));
        }
    }
    out.push(format!("{:?}", s.entries(0..s.entry_count().min(300))));
    out.push(format!("{:?}", (s.lower_bound(b"m"), s.prefetch_namespace(), s.dirs())));
    out.push(format!("{:?}", s.lookup(b"no/such/path")));
    out
}

fn run(data: &[u8]) {
    let rec = Arc::new(Recorder {
        asked: Mutex::new(Vec::new()),
        allowed: None,
    });
    let first = queries(data, rec.clone());
    let asked = rec.asked.lock().unwrap().clone();
    let mut masked = vec![0xA5u8; data.len()];
    for r in &asked {
        let (a, b) = (r.start as usize, (r.end as usize).min(data.len()));
        if a < b {
            masked[a..b].copy_from_slice(&data[a..b]);
        }
    }
    let strict = Arc::new(Recorder {
        asked: Mutex::new(Vec::new()),
        allowed: Some(asked),
    });
    assert_eq!(queries(&masked, strict), first, "an accessor read bytes it did not ask for");
}

fuzz_target!(|data: &[u8]| {
    let mut sealed = data.to_vec();
    if granary_format::testing::reseal_snapshot(&mut sealed) {
        run(&sealed);
    } else {
        run(data);
    }
});
