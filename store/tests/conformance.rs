//! The store conformance suite: one set of checks every store and every layer must pass, run
//! against each of them and their combinations (as object_store's `integration.rs` is run
//! against every store it has): a local directory (as opened plainly and as tuned for each I/O
//! mode), an object store on the S3 test server and the same objects over plain HTTP, the
//! local tier over each (empty, so that every read falls through, and full), a peer's tier
//! served by the peers' server, whole stacks built as readers build them, and the metering
//! layer over several of them (it must change nothing but what it counts).
//!
//! The checks ([`conforms`]): every chunk opens with its file's length and a location naming
//! it; batched ranges in any order (whole file, first and last byte, ranges that overlap, a
//! buffer reaching past the end whose `need` stops at it) come back byte-exact in one call; a
//! range that needs bytes past the end is an `UnexpectedEof` error naming the location, never a
//! short buffer; a chunk that does not exist is an error naming its location; a store that lists
//! lists every chunk; and every source says where its bytes came from.
//!
//! Beyond them: verified reads over every stack ([`verified_reads_fall_back_past_failed_copies`]:
//! a copy damaged, cut short or removed is given up for the layer below and the bytes come back
//! right, through the engine's batches and through single reads), and the engine's local fast
//! path through a layer ([`a_layer_over_local_files_keeps_the_engines_fast_path`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use granary_format::{ChunkEntry, ChunkWriter, Compression, SplitMix64};
use granary_store::engine::{Engine, Expect, IoKind, Request};
use granary_store::testing::FastOnly;
use granary_store::verified::read_into;
use granary_store::{
    Access, BytesFrom, ChunkStore, IoMode, LocalDir, LocalTier, Meter, Metered, RangeRead, Source,
    StoreError, StoreStack, TierPolicy, TierStore,
};

/// Chunks to read through every store: their directory, each chunk file's bytes, the chunk
/// table and the dataset's id.
struct Fixture {
    ds: PathBuf,
    chunks: Vec<Vec<u8>>,
    table: Arc<[ChunkEntry]>,
    id: [u8; 16],
}

/// Five chunk files of different sizes (one larger than a read piece of the peers' client and
/// of the engine), written with the format's chunk writer.
fn fixture(dir: &Path) -> Fixture {
    let ds = dir.join("ds");
    std::fs::create_dir_all(&ds).unwrap();
    let mut rng = SplitMix64::new(0xc0f_f1e);
    let mut id = [0u8; 16];
    id.iter_mut().for_each(|b| *b = rng.next_u64() as u8);
    let (mut chunks, mut table) = (Vec::new(), Vec::new());
    let mut first = 0;
    for c in 0..5u32 {
        let mut w = ChunkWriter::new(Vec::new(), id, c).unwrap();
        let n = 2 + c as usize * 3;
        let mut end = granary_format::CHUNK_HEADER_LEN as u64;
        for i in 0..n {
            let len = match (c, i) {
                (4, 0) => 5 << 20,
                _ => 500 + (rng.next_u64() % 40_000) as usize,
            };
            let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            let crc = granary_format::crc32(&data);
            let path = format!("c{c}/{i}.bin");
            let e = w
                .append(
                    path.as_bytes(),
                    &data,
                    Compression::None,
                    len as u64,
                    crc,
                    0,
                )
                .unwrap();
            end = e.offset + e.stored_len;
        }
        let (bytes, s) = w.finish(&[b"only"]).unwrap();
        std::fs::write(ds.join(granary_format::chunk_file_name(c)), &bytes).unwrap();
        table.push(ChunkEntry {
            chunk_id: c,
            file_size: s.file_size,
            first_sample: first,
            sample_count: n as u64,
            records_end: end,
            file_crc: s.file_crc,
            digest: s.digest,
            ..Default::default()
        });
        first += n as u64;
        chunks.push(bytes);
    }
    Fixture {
        ds,
        chunks,
        table: table.into(),
        id,
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
    let mut rng = SplitMix64::new(0x5eed);
    for (c, want) in f.chunks.iter().enumerate() {
        let c = c as u32;
        // A layer may serve a copy named by its digest too: `chunk-NNNNNNNN-<digest>.gchunk`.
        let file = granary_format::chunk_file_name(c);
        let names = |p: &Path| {
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
fn metered(store: Arc<dyn ChunkStore>) -> Metered {
    Metered::new(store, Arc::new(Meter::default()))
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
    let over = |t, next: Arc<dyn ChunkStore>| {
        TierStore::new(t, next, f.table.clone(), &access(IoMode::Buffered))
    };
    let empty = over(tier(&tmp.path().join("empty"), &f, false), dir.clone());
    conforms("empty tier over local", &empty, &f);
    expect_from(&empty, &f, BytesFrom::Origin);
    let full = over(tier(&tmp.path().join("full"), &f, true), dir.clone());
    conforms("full tier over local", &full, &f);
    expect_from(&full, &f, BytesFrom::Tier);
    let full = Arc::new(full);
    conforms("meter over a full tier", &metered(full.clone()), &f);
    expect_from(&metered(full), &f, BytesFrom::Tier);
    let over_meter = over(
        tier(&tmp.path().join("empty"), &f, false),
        Arc::new(metered(dir.clone())),
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
        let name = format!("stack {mode:?}: tier over local");
        conforms(&name, &**stack.store(), &f);
        expect_from(&**stack.store(), &f, BytesFrom::Tier);
    }
}

/// Reads every chunk whole through `stack`, once in one engine batch and once chunk by chunk
/// with single verified reads, as the stream and random access read: the bytes must be the
/// chunks' own, and come from `from`.
fn reads_right(name: &str, stack: &StoreStack, f: &Fixture, from: BytesFrom) {
    let open = |c: usize| stack.store().open_chunk(c as u32).unwrap();
    let expect = |c: usize| whole(f, c);
    let reqs: Vec<Request> = (0..f.chunks.len())
        .map(|c| Request {
            source: open(c),
            offset: 0,
            len: f.chunks[c].len(),
            expect: expect(c),
        })
        .collect();
    let mut engine = Engine::new(IoKind::Pread, 4, 64 << 20).unwrap();
    let got = engine.read(&reqs).unwrap_or_else(|e| panic!("{name}: {e}"));
    for (c, b) in got.iter().enumerate() {
        assert!(b.data() == &f.chunks[c][..], "{name}: chunk {c} in a batch");
        assert_eq!(b.from(), from, "{name}: chunk {c} in a batch");
    }
    for (c, want) in f.chunks.iter().enumerate() {
        let mut buf = vec![0u8; want.len()];
        let got = read_into(&open(c), 0, &mut buf, &expect(c));
        assert_eq!(got.unwrap(), from, "{name}: chunk {c} read alone");
        assert!(buf == *want, "{name}: chunk {c} read alone");
    }
}

/// What a read of chunk `c` whole must be: its header, and the whole file's CRC-32. (The CRC
/// alone does not tell chunks apart by their headers: a header ends with its own CRC-32, so
/// every valid header leaves the file's CRC-32 as it is.)
fn whole(f: &Fixture, c: usize) -> Expect {
    Expect {
        header: Some((granary_store::DatasetId(f.id), c as u32)),
        file_crc: Some(f.table[c].file_crc),
        ..Expect::default()
    }
}

/// A stack whose tier holds every chunk, and its tier's directory.
fn full_stack(dir: &Path, f: &Fixture, origin: &Arc<dyn ChunkStore>) -> (StoreStack, PathBuf) {
    let t = tier(dir, f, true);
    let copies = t.dir().to_path_buf();
    let stack = StoreStack::with_tier(origin, f.table.clone(), access(IoMode::Buffered), t, None);
    (stack, copies)
}

/// The path of chunk `c`'s copy in the tier at `dir`.
fn copy_of(dir: &Path, f: &Fixture, c: usize) -> PathBuf {
    dir.join(granary_store::copy_file_name(c as u32, &f.table[c].digest))
}

/// Copies that fail in each way a tier copy can (a flipped byte, cut short, removed, replaced
/// by another chunk's bytes): every read still returns the chunk's own bytes, from the store
/// below, and the copy is given up (counted in the tier's meter, and gone from the tier).
#[test]
fn verified_reads_fall_back_past_failed_copies() {
    let tmp = tempfile::tempdir().unwrap();
    let f = fixture(tmp.path());
    let origin: Arc<dyn ChunkStore> = Arc::new(LocalDir::new(&f.ds));
    let (stack, _) = full_stack(&tmp.path().join("sound"), &f, &origin);
    reads_right("sound copies", &stack, &f, BytesFrom::Tier);
    type Damage = fn(&Path, &Fixture);
    let damages: [(&str, Damage); 4] = [
        ("a flipped byte", |p, _| {
            let mut b = std::fs::read(p).unwrap();
            let at = b.len() / 2;
            b[at] ^= 1;
            std::fs::write(p, b).unwrap();
        }),
        ("cut short", |p, _| {
            let file = std::fs::OpenOptions::new().write(true).open(p).unwrap();
            let len = file.metadata().unwrap().len();
            file.set_len(len / 2).unwrap();
        }),
        ("removed", |p, _| std::fs::remove_file(p).unwrap()),
        ("another chunk's header", |p, f| {
            let mut b = std::fs::read(p).unwrap();
            let other = &f.chunks[0][..granary_format::CHUNK_HEADER_LEN];
            b[..other.len()].copy_from_slice(other);
            std::fs::write(p, b).unwrap();
        }),
    ];
    for (i, (how, damage)) in damages.iter().enumerate() {
        let dir = tmp.path().join(format!("damaged-{i}"));
        // Opened first (the copies are sound then), damaged while open, read afterwards.
        let (stack, copies) = full_stack(&dir, &f, &origin);
        let open: Vec<Source> = (0..f.chunks.len())
            .map(|c| stack.store().open_chunk(c as u32).unwrap())
            .collect();
        for c in 1..f.chunks.len() {
            damage(&copy_of(&copies, &f, c), &f);
        }
        let reqs: Vec<Request> = open
            .iter()
            .enumerate()
            .map(|(c, s)| Request {
                source: s.clone(),
                offset: 0,
                len: f.chunks[c].len(),
                expect: whole(&f, c),
            })
            .collect();
        let mut engine = Engine::new(IoKind::Pread, 4, 64 << 20).unwrap();
        let got = engine.read(&reqs).unwrap_or_else(|e| panic!("{how}: {e}"));
        // A copy removed while open stays readable through its descriptor, and is right.
        let gives_up = *how != "removed";
        for (c, b) in got.iter().enumerate() {
            assert!(b.data() == &f.chunks[c][..], "{how}: chunk {c}");
            let want = if c == 0 || !gives_up {
                BytesFrom::Tier
            } else {
                BytesFrom::Origin
            };
            assert_eq!(b.from(), want, "{how}: chunk {c}");
            // The source itself reads below the copy from now on.
            assert_eq!(open[c].bytes_from(), want, "{how}: chunk {c}'s source");
        }
        let tier = stack.layers()[0].1;
        let given_up = if gives_up { f.chunks.len() - 1 } else { 0 };
        assert_eq!(tier.fallbacks, given_up as u64, "{how}");
        for c in 1..f.chunks.len() {
            assert!(!copy_of(&copies, &f, c).exists(), "{how}: copy {c} stays");
        }
        // Opened after the damage: the tier no longer lists the copies, or gives them up.
        for c in 1..f.chunks.len() {
            let src = stack.store().open_chunk(c as u32).unwrap();
            let mut buf = vec![0u8; f.chunks[c].len()];
            let from = read_into(&src, 0, &mut buf, &whole(&f, c)).unwrap();
            assert_eq!(from, BytesFrom::Origin, "{how}: chunk {c} opened again");
            assert!(buf == f.chunks[c], "{how}: chunk {c} opened again");
        }
        // A copy damaged under a single read: the same (removed before it is opened).
        let (stack, copies) = full_stack(&dir.join("single"), &f, &origin);
        let early = (!gives_up).then(|| damage(&copy_of(&copies, &f, 2), &f));
        let src = stack.store().open_chunk(2).unwrap();
        if early.is_none() {
            damage(&copy_of(&copies, &f, 2), &f);
        }
        let mut buf = vec![0u8; f.chunks[2].len()];
        assert_eq!(
            read_into(&src, 0, &mut buf, &whole(&f, 2)).unwrap(),
            BytesFrom::Origin,
            "{how}: a single read"
        );
        assert!(buf == f.chunks[2], "{how}: a single read");
    }
    // Bytes of the dataset's own storage are the caller's to check: no copy below to go to.
    let plain = StoreStack::plain(&origin, access(IoMode::Buffered));
    let src = plain.store().open_chunk(1).unwrap();
    let mut buf = vec![0u8; f.chunks[1].len()];
    let expect = Expect {
        file_crc: Some(f.table[1].file_crc ^ 1),
        ..Expect::default()
    };
    assert_eq!(
        read_into(&src, 0, &mut buf, &expect).unwrap(),
        BytesFrom::Origin
    );
}

/// A layer that offers its local file keeps the engine's fast path (both engines, every I/O
/// mode, under the meter): nothing is read through `read_ranges`, and the layer and the meter
/// are told every byte.
#[test]
fn a_layer_over_local_files_keeps_the_engines_fast_path() {
    let tmp = tempfile::tempdir().unwrap();
    let f = fixture(tmp.path());
    let total: u64 = f.chunks.iter().map(|c| c.len() as u64).sum();
    for kind in [IoKind::Pread, IoKind::Auto] {
        for mode in [IoMode::Auto, IoMode::Direct, IoMode::Buffered] {
            let (layer, observed) = FastOnly::over(Arc::new(LocalDir::new(&f.ds)));
            let layer: Arc<dyn ChunkStore> = Arc::new(layer);
            let stack = StoreStack::plain(&layer, access(mode));
            let reqs: Vec<Request> = (0..f.chunks.len())
                .map(|c| Request {
                    source: stack.store().open_chunk(c as u32).unwrap(),
                    offset: 0,
                    len: f.chunks[c].len(),
                    expect: Expect::default(),
                })
                .collect();
            let mut engine = Engine::new(kind, 8, 64 << 20).unwrap();
            let got = engine.read(&reqs).unwrap();
            for (c, b) in got.iter().enumerate() {
                assert!(b.data() == &f.chunks[c][..], "{kind:?} {mode:?}: chunk {c}");
            }
            assert_eq!(observed.load(Relaxed), total, "{kind:?} {mode:?}");
            assert_eq!(stack.layers()[0].1.bytes, total, "{kind:?} {mode:?}");
        }
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
    let f = fixture(tmp.path());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let name = format!("store-conformance-{}-{nanos}", std::process::id());
    let url = format!("s3://granary/tests/{name}");
    let cfg = granary_store::StoreConfig::default();
    let bucket = Arc::new(granary_store::object::ObjectUrl::open(&url, &cfg).unwrap());
    for (c, bytes) in f.chunks.iter().enumerate() {
        let file = granary_format::chunk_file_name(c as u32);
        bucket.put_bytes(&file, bytes.clone()).unwrap();
    }
    let sizes: Vec<u64> = f.chunks.iter().map(|c| c.len() as u64).collect();
    let s3: Arc<dyn ChunkStore> = Arc::new(granary_store::object::ObjectChunks::new(
        bucket,
        sizes.clone(),
    ));
    conforms("s3", &*s3, &f);
    expect_from(&*s3, &f, BytesFrom::Origin);
    conforms("meter over s3", &metered(s3.clone()), &f);
    let over = |t, next: Arc<dyn ChunkStore>| {
        TierStore::new(t, next, f.table.clone(), &access(IoMode::Buffered))
    };
    let empty = over(tier(&tmp.path().join("empty"), &f, false), s3.clone());
    conforms("empty tier over s3", &empty, &f);
    let full = over(tier(&tmp.path().join("full"), &f, true), s3.clone());
    conforms("full tier over s3", &full, &f);
    expect_from(&full, &f, BytesFrom::Tier);
    let (stack, copies) = full_stack(&tmp.path().join("damaged"), &f, &s3);
    std::fs::remove_file(copy_of(&copies, &f, 3)).unwrap();
    let mut want = vec![BytesFrom::Tier; f.chunks.len()];
    want[3] = BytesFrom::Origin;
    for (c, from) in want.into_iter().enumerate() {
        let src = stack.store().open_chunk(c as u32).unwrap();
        let mut buf = vec![0u8; f.chunks[c].len()];
        let expect = Expect {
            file_crc: Some(f.table[c].file_crc),
            ..Expect::default()
        };
        assert_eq!(read_into(&src, 0, &mut buf, &expect).unwrap(), from);
        assert!(buf == f.chunks[c], "chunk {c} under a tier over s3");
    }
    if let Ok(http) = std::env::var("GRANARY_TEST_HTTP") {
        let over_http = format!("{http}/tests/{name}");
        let url = Arc::new(granary_store::object::ObjectUrl::open(&over_http, &cfg).unwrap());
        let http = granary_store::object::ObjectChunks::new(url, sizes);
        conforms("http", &http, &f);
    }
}

/// A peer's tier, served by the peers' server: the peer layer over local origin, reading every
/// chunk from the peer that owns it, and a whole stack (tier over peers over origin); a peer
/// whose copy is damaged is given up for origin.
#[cfg(feature = "server")]
#[test]
fn a_peers_tier_conforms() {
    use granary_store::peers::server::{PeerServer, ServeConfig};
    use granary_store::{Ownership, PeerStore, Peers};
    let tmp = tempfile::tempdir().unwrap();
    let f = fixture(tmp.path());
    let served = LocalTier::tier_dir(&tmp.path().join("served"), &f.id);
    drop(tier(&tmp.path().join("served"), &f, true));
    let hex: String = f.id.iter().map(|b| format!("{b:02x}")).collect();
    let server = PeerServer::bind(
        "127.0.0.1:0",
        ServeConfig {
            tiers: [(hex, served.clone())].into_iter().collect(),
            secret: None,
            tls: None,
            threads: 2,
        },
    )
    .unwrap();
    let addr = server.url().trim_start_matches("http://").to_string();
    // Serves until the test process ends.
    std::thread::spawn(move || server.serve());
    // Two nodes; this is node 0, and node 1 (the server) keeps every chunk.
    let n = f.chunks.len();
    let sizes: Vec<u64> = f.chunks.iter().map(|c| c.len() as u64).collect();
    let ownership = Ownership::assign(&vec![1; n], &sizes, &[0, u64::MAX]);
    let peers = || {
        let nodes = vec!["127.0.0.1:9".into(), addr.clone()];
        let timeout = std::time::Duration::from_secs(5);
        let p = Peers::new(f.id, nodes, 0, ownership.clone(), timeout, None, None);
        Arc::new(p.unwrap())
    };
    let dir: Arc<dyn ChunkStore> = Arc::new(LocalDir::new(&f.ds));
    let meter = Arc::new(Meter::default());
    let layer = PeerStore::new(peers(), dir.clone(), f.table.clone(), meter.clone());
    conforms("peers over local", &layer, &f);
    // What the peers did is counted in the layer's meter: every whole read came from the peer
    // (ranges are read from origin).
    let before = meter.reading();
    expect_from(&layer, &f, BytesFrom::Peer);
    let r = meter.reading() - before;
    let all: u64 = f.chunks.iter().map(|c| c.len() as u64).sum();
    assert_eq!((r.chunks_from_peers, r.bytes_from_peers), (n as u64, all));
    assert_eq!(
        (r.rejected, r.unreachable, r.bytes_from_origin_instead),
        (0, 0, 0)
    );
    let layer: Arc<dyn ChunkStore> = Arc::new(layer);
    conforms("meter over peers", &metered(layer.clone()), &f);
    expect_from(&metered(layer), &f, BytesFrom::Peer);
    let stack = StoreStack::with_tier(
        &dir,
        f.table.clone(),
        access(IoMode::Buffered),
        tier(&tmp.path().join("mine"), &f, false),
        Some(peers()),
    );
    let name = "stack: empty tier over peers over local";
    conforms(name, &**stack.store(), &f);
    expect_from(&**stack.store(), &f, BytesFrom::Peer);
    reads_right(name, &stack, &f, BytesFrom::Peer);
    // The peer's copy of chunk 2 damaged: the peers' client refuses it (its digest), and the
    // bytes come from origin.
    let mut b = std::fs::read(copy_of(&served, &f, 2)).unwrap();
    b[100] ^= 1;
    std::fs::write(copy_of(&served, &f, 2), b).unwrap();
    let stack = StoreStack::with_tier(
        &dir,
        f.table.clone(),
        access(IoMode::Buffered),
        tier(&tmp.path().join("mine2"), &f, false),
        Some(peers()),
    );
    let src = stack.store().open_chunk(2).unwrap();
    let mut buf = vec![0u8; f.chunks[2].len()];
    let expect = Expect {
        file_crc: Some(f.table[2].file_crc),
        ..Expect::default()
    };
    assert_eq!(
        read_into(&src, 0, &mut buf, &expect).unwrap(),
        BytesFrom::Origin
    );
    assert!(buf == f.chunks[2]);
    let r = stack.layer("peers");
    assert_eq!(
        (r.rejected, r.bytes_from_origin_instead),
        (1, f.chunks[2].len() as u64),
        "{r:?}"
    );
}
