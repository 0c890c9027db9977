//! The store conformance suite: one set of checks every store and every layer must pass, run
//! against each of them and their combinations (as object_store's `integration.rs` is run
//! against every store it has): a local directory (as opened plainly and as tuned for each I/O
//! mode), an object store on the S3 test server and the same objects over plain HTTP, the
//! local tier over each (empty, so that every read falls through, and full), a peer's tier
//! served by `granary serve`, whole stacks built as readers build them, and the metering layer
//! over several of them (it must change nothing but what it counts).
//!
//! The checks ([`conforms`]): every chunk opens with its file's length and a location naming
//! it; batched ranges in any order (whole file, first and last byte, ranges that overlap, a
//! buffer reaching past the end whose `need` stops at it) come back byte-exact in one call; a
//! range that needs bytes past the end is an `UnexpectedEof` error naming the location, never a
//! short buffer; a chunk that does not exist is an error naming its location; a store that lists
//! lists every chunk; and every source says where its bytes came from.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use granary::{
    Access, BytesFrom, ChunkStore, IoMode, LocalDir, LocalTier, Ownership, Peers, RangeRead,
    StoreError, StoreStack, TierPolicy, TierStore,
};

use crate::common::*;

/// A dataset to read through every store: its directory, each chunk file's bytes, the chunk
/// table.
struct Fixture {
    ds: PathBuf,
    chunks: Vec<Vec<u8>>,
    table: Arc<[granary_format::ChunkEntry]>,
    id: [u8; 16],
}

fn fixture(dir: &Path) -> Fixture {
    // Several chunks of different sizes, one larger than a read piece of the peers' client.
    let files = numbered_tree(60, 3, |i| 500 + (i as usize * 997) % 40_000);
    let ds = packed_tree(
        &dir.join("src"),
        &files,
        &dir.join("ds"),
        &["--chunk-size", "200KiB", "--compress", "none"],
    );
    let d = granary::Dataset::open(&ds).unwrap();
    let n = d.chunk_count() as u32;
    assert!(n >= 4, "the fixture needs several chunks, has {n}");
    let chunks = (0..n)
        .map(|c| std::fs::read(ds.join(granary_format::chunk_file_name(c))).unwrap())
        .collect();
    let table = (0..n).map(|c| d.chunk(c).unwrap()).collect();
    Fixture {
        ds,
        chunks,
        table,
        id: d.snapshot().dataset_id(),
    }
}

/// Where a store's bytes must say they came from when a chunk is read whole (as streams read
/// through a tier: a peer serves whole chunks only).
fn expect_from(store: &dyn ChunkStore, f: &Fixture, from: BytesFrom) {
    for (c, want) in f.chunks.iter().enumerate() {
        let src = store.open_chunk(c as u32).unwrap();
        let mut b = vec![0u8; want.len()];
        src.read_ranges(&mut [RangeRead {
            offset: 0,
            buf: &mut b,
            need: want.len(),
        }])
        .unwrap();
        assert!(b == *want, "{store:?}: chunk {c} read whole");
        assert_eq!(src.bytes_from(), from, "{store:?}: chunk {c}");
    }
}

/// The checks every store and layer must pass.
fn conforms(name: &str, store: &dyn ChunkStore, f: &Fixture) {
    let mut rng = granary_format::SplitMix64::new(0x5eed);
    for (c, want) in f.chunks.iter().enumerate() {
        let c = c as u32;
        // A layer may serve a copy named by its digest too: `chunk-NNNNNNNN-<digest>.gchunk`.
        let file = granary_format::chunk_file_name(c);
        let names = |p: &std::path::Path| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            n == file || n.starts_with(&format!("chunk-{c:08}-")) && n.ends_with(".gchunk")
        };
        let src = store
            .open_chunk(c)
            .unwrap_or_else(|e| panic!("{name}: opening chunk {c}: {e}"));
        assert_eq!(src.len(), want.len() as u64, "{name}: chunk {c}'s length");
        assert!(
            names(src.location()),
            "{name}: {} does not name {file}",
            src.location().display()
        );
        assert!(
            store.chunk_location(c).to_string_lossy().ends_with(&file),
            "{name}: chunk_location({c})"
        );
        // One batch: the whole file, its first and last byte, overlapping ranges, random ones,
        // in an order that is not the file's, and a buffer reaching past the end.
        let len = want.len();
        let mut spans: Vec<(usize, usize)> = vec![(0, len), (0, 1), (len - 1, 1)];
        spans.push((len / 3, len / 2));
        spans.push((len / 4, len / 2));
        for _ in 0..8 {
            let a = rng.next_u64() as usize % len;
            let n = 1 + rng.next_u64() as usize % (len - a);
            spans.push((a, n));
        }
        spans.reverse();
        let mut bufs: Vec<Vec<u8>> = spans.iter().map(|&(_, n)| vec![0u8; n]).collect();
        let tail_at = len - len.min(100);
        let mut tail = vec![0xAAu8; 4096];
        let mut reads: Vec<RangeRead<'_>> = spans
            .iter()
            .zip(bufs.iter_mut())
            .map(|(&(a, n), buf)| RangeRead {
                offset: a as u64,
                buf,
                need: n,
            })
            .collect();
        reads.push(RangeRead {
            offset: tail_at as u64,
            buf: &mut tail,
            need: len - tail_at,
        });
        src.read_ranges(&mut reads)
            .unwrap_or_else(|e| panic!("{name}: chunk {c}: {e}"));
        for (&(a, n), got) in spans.iter().zip(&bufs) {
            assert!(got[..] == want[a..a + n], "{name}: chunk {c} at {a}+{n}");
        }
        assert!(
            tail[..len - tail_at] == want[tail_at..],
            "{name}: chunk {c}: the bytes before the end"
        );
        // Past the end: an error naming the location, never a short buffer.
        let mut past = vec![0u8; 16];
        let e = src
            .read_ranges(&mut [RangeRead {
                offset: len as u64 - 8,
                buf: &mut past,
                need: 16,
            }])
            .expect_err("a range past the end must fail");
        let text = e.to_string();
        assert!(
            text.contains(&file) || text.contains(&*src.location().to_string_lossy()),
            "{name}: chunk {c}: {text}"
        );
        assert!(
            matches!(&e, StoreError::Io { source, .. } if source.kind() == std::io::ErrorKind::UnexpectedEof)
                || matches!(&e, StoreError::Damaged { .. }),
            "{name}: chunk {c}: past the end is {e:?}"
        );
    }
    // A chunk that does not exist: an error naming it or where the store is.
    let missing = f.chunks.len() as u32 + 7;
    let names = |e: &StoreError| {
        let t = e.to_string();
        t.contains(&granary_format::chunk_file_name(missing)) || t.contains(&store.location())
    };
    match store.open_chunk(missing) {
        Err(e) => assert!(names(&e), "{name}: {e}"),
        Ok(src) => {
            // Stores that open lazily (object stores: no request per open) fail on reading.
            let mut b = [0u8; 1];
            let e = src
                .read_ranges(&mut [RangeRead {
                    offset: 0,
                    buf: &mut b,
                    need: 1,
                }])
                .expect_err("reading a chunk that does not exist must fail");
            assert!(names(&e), "{name}: {e}");
        }
    }
    let listed = store.list().unwrap_or_else(|e| panic!("{name}: list: {e}"));
    if !listed.is_empty() {
        for c in 0..f.chunks.len() as u32 {
            let file = granary_format::chunk_file_name(c);
            assert!(
                listed.iter().any(|(n, _)| *n == file),
                "{name}: the listing lacks {file}"
            );
        }
    }
}

/// A tier in `dir` for the fixture, filled with every chunk when `full`.
fn tier(dir: &Path, f: &Fixture, full: bool) -> Arc<LocalTier> {
    let t = Arc::new(LocalTier::open(dir, f.id, u64::MAX, TierPolicy::Static).unwrap());
    if full {
        for (c, bytes) in f.chunks.iter().enumerate() {
            assert!(
                t.admit(&f.table[c], bytes, 1.0).unwrap(),
                "chunk {c} admitted"
            );
        }
    }
    t
}

/// `store` behind the metering layer, which must change nothing but what it counts.
fn metered(store: Arc<dyn ChunkStore>) -> granary::Metered {
    granary::Metered::new(store, Arc::new(granary::Meter::default()))
}

fn access(mode: IoMode) -> Access {
    let mut a = Access::positional();
    a.mode = mode;
    a
}

/// The local layers: a directory as opened and as tuned for each mode, the tier over it (empty
/// and full), and whole stacks.
#[test]
fn local_stores_and_their_layers_conform() {
    let tmp = tempfile::tempdir().unwrap();
    let f = fixture(tmp.path());
    let dir: Arc<dyn ChunkStore> = Arc::new(LocalDir::new(&f.ds));
    conforms("local", &*dir, &f);
    expect_from(&*dir, &f, BytesFrom::Origin);
    conforms("meter over local", &metered(dir.clone()), &f);
    for mode in [IoMode::Auto, IoMode::Direct, IoMode::Buffered] {
        let stack = StoreStack::plain(&dir, access(mode));
        conforms(&format!("local tuned {mode:?}"), &**stack.store(), &f);
    }
    let empty = TierStore::new(
        tier(&tmp.path().join("empty"), &f, false),
        dir.clone(),
        f.table.clone(),
        &access(IoMode::Buffered),
    );
    conforms("empty tier over local", &empty, &f);
    expect_from(&empty, &f, BytesFrom::Origin);
    let full = TierStore::new(
        tier(&tmp.path().join("full"), &f, true),
        dir.clone(),
        f.table.clone(),
        &access(IoMode::Buffered),
    );
    conforms("full tier over local", &full, &f);
    expect_from(&full, &f, BytesFrom::Tier);
    let full = Arc::new(full);
    conforms("meter over a full tier", &metered(full.clone()), &f);
    expect_from(&metered(full), &f, BytesFrom::Tier);
    let over_meter = TierStore::new(
        tier(&tmp.path().join("empty"), &f, false),
        Arc::new(metered(dir.clone())),
        f.table.clone(),
        &access(IoMode::Buffered),
    );
    conforms("empty tier over a meter over local", &over_meter, &f);
    for mode in [IoMode::Auto, IoMode::Direct] {
        let stack = StoreStack::with_tier(
            &dir,
            f.table.clone(),
            access(mode),
            tier(&tmp.path().join("full"), &f, false),
            None,
        );
        conforms(
            &format!("stack {mode:?}: tier over local"),
            &**stack.store(),
            &f,
        );
        expect_from(&**stack.store(), &f, BytesFrom::Tier);
    }
}

/// The object store (S3 test server) and the same objects read over plain HTTP, alone and
/// under a tier.
#[test]
fn object_stores_and_a_tier_over_them_conform() {
    if std::env::var_os("GRANARY_TEST_S3").is_none() {
        if std::env::var("GRANARY_REQUIRE_S3").is_ok_and(|v| v == "1") {
            panic!("GRANARY_REQUIRE_S3=1 but no S3 server: source the env file of scripts/s3-server.sh");
        }
        eprintln!("skipping the object store conformance: no S3 server");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // The source tree (tmp/src), packed again into the bucket below.
    let _local = fixture(tmp.path());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let url = format!(
        "s3://granary/tests/conformance-{}-{nanos}",
        std::process::id()
    );
    let home = tmp.path().join("home");
    let src = tmp.path().join("src");
    let o = granary()
        .args(["pack", src.to_str().unwrap(), "-o", &url])
        .args(["--chunk-size", "200KiB", "--compress", "none"])
        .env("XDG_CACHE_HOME", &home)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    // The dataset in the bucket: compare against its own chunks.
    let cfg = granary::StoreConfig {
        snapshot_cache: home.join("snapshots"),
        ..Default::default()
    };
    let remote = granary::Dataset::open_with(&url, &cfg).unwrap();
    let g = Fixture {
        ds: PathBuf::from(&url),
        chunks: (0..remote.chunk_count() as u32)
            .map(|c| remote.load_chunk(c).unwrap().to_vec())
            .collect(),
        table: (0..remote.chunk_count() as u32)
            .map(|c| remote.chunk(c).unwrap())
            .collect(),
        id: remote.snapshot().dataset_id(),
    };
    conforms("s3", &**remote.store(), &g);
    expect_from(&**remote.store(), &g, BytesFrom::Origin);
    conforms("meter over s3", &metered(remote.store().clone()), &g);
    let empty = TierStore::new(
        tier(&tmp.path().join("empty"), &g, false),
        remote.store().clone(),
        g.table.clone(),
        &access(IoMode::Buffered),
    );
    conforms("empty tier over s3", &empty, &g);
    let full = TierStore::new(
        tier(&tmp.path().join("full"), &g, true),
        remote.store().clone(),
        g.table.clone(),
        &access(IoMode::Buffered),
    );
    conforms("full tier over s3", &full, &g);
    expect_from(&full, &g, BytesFrom::Tier);
    if let Ok(http) = std::env::var("GRANARY_TEST_HTTP") {
        let name = url.rsplit('/').next().unwrap();
        let over_http = granary::Dataset::open_with(format!("{http}/tests/{name}"), &cfg).unwrap();
        conforms("http", &**over_http.store(), &g);
    }
}

/// A peer's tier, served by `granary serve`: the peer layer over local origin, reading every
/// chunk from the peer that owns it, and a whole stack (tier over peers over origin).
#[test]
fn a_peers_tier_conforms() {
    let tmp = tempfile::tempdir().unwrap();
    let f = fixture(tmp.path());
    let served = tmp.path().join("served");
    let t = tier(&served, &f, true);
    drop(t);
    let mut server = granary()
        .args([
            "serve",
            f.ds.to_str().unwrap(),
            "--cache-dir",
            served.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--insecure",
        ])
        .env_remove("GRANARY_PEER_SECRET")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(server.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    /// The server, stopped when the test ends (passed or failed).
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _server = Stop(server);
    let addr = line
        .trim()
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("serve printed {line:?}"));
    // Two nodes; this is node 0, and node 1 (the server) keeps every chunk.
    let n = f.chunks.len();
    let sizes: Vec<u64> = f.chunks.iter().map(|c| c.len() as u64).collect();
    let ownership = Ownership::assign(&vec![1; n], &sizes, &[0, u64::MAX]);
    let peers = |secret| {
        Arc::new(
            Peers::new(
                f.id,
                vec!["127.0.0.1:9".into(), addr.to_string()],
                0,
                ownership.clone(),
                Duration::from_secs(5),
                secret,
                None,
            )
            .unwrap(),
        )
    };
    let dir: Arc<dyn ChunkStore> = Arc::new(LocalDir::new(&f.ds));
    {
        let layer = granary::PeerStore::new(peers(None), dir.clone(), f.table.clone());
        conforms("peers over local", &layer, &f);
        expect_from(&layer, &f, BytesFrom::Peer);
        let layer: Arc<dyn ChunkStore> = Arc::new(layer);
        conforms("meter over peers", &metered(layer.clone()), &f);
        expect_from(&metered(layer), &f, BytesFrom::Peer);
        let stack = StoreStack::with_tier(
            &dir,
            f.table.clone(),
            access(IoMode::Buffered),
            tier(&tmp.path().join("mine"), &f, false),
            Some(peers(None)),
        );
        conforms(
            "stack: empty tier over peers over local",
            &**stack.store(),
            &f,
        );
        expect_from(&**stack.store(), &f, BytesFrom::Peer);
    }
}
