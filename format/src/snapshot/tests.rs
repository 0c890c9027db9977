use super::*;
use crate::blocks::{BlockIndex, BLOCK_SIZE};
use crate::{ChunkWriter, Compression, BLOCKS_MINOR, LISTING_MINOR, NO_LABEL, PAGES_MINOR};
use proptest::prelude::*;

/// (path, data, label) of one record.
type Rec = (Vec<u8>, Vec<u8>, u32);

/// Builds a dataset in memory: chunk files and the snapshot bytes.
fn build(chunks: &[Vec<Rec>], classes: &[&[u8]]) -> (Vec<Vec<u8>>, Vec<u8>) {
    build_with(chunks, classes, LISTING_MINOR, false)
}

/// [`build`], with or without path pages (format 1.5 or 1.4).
/// A snapshot of `chunks` of format 1.`minor` (4: no pages, 5: path pages, 6: listing
/// pages), with file attributes (sample `i`: [`attrs_of`]) if `attrs`.
fn build_with(
    chunks: &[Vec<Rec>],
    classes: &[&[u8]],
    minor: u16,
    attrs: bool,
) -> (Vec<Vec<u8>>, Vec<u8>) {
    let id = [0xAB; 16];
    let classes: Vec<Vec<u8>> = classes.iter().map(|c| c.to_vec()).collect();
    let mut b = SnapshotBuilder::new(id, classes.clone());
    match minor {
        BLOCKS_MINOR => b.without_path_pages(),
        PAGES_MINOR => b.with_plain_path_pages(),
        _ => {}
    }
    if attrs {
        let n = chunks.iter().map(|c| c.len()).sum::<usize>();
        b.push_attrs(&(0..n as u64).map(attrs_of).collect::<Vec<_>>());
    }
    let mut files = Vec::new();
    for (ci, recs) in chunks.iter().enumerate() {
        let mut w = ChunkWriter::new(Vec::new(), id, ci as u32).unwrap();
        for (path, data, label) in recs {
            w.append(
                path,
                data,
                Compression::None,
                data.len() as u64,
                crate::crc32(data),
                *label,
            )
            .unwrap();
        }
        let (bytes, s) = w.finish(&classes).unwrap();
        b.push_chunk(&s).unwrap();
        files.push(bytes);
    }
    (files, b.build().unwrap())
}

/// The file attributes [`build_with`] gives sample `i`.
fn attrs_of(i: u64) -> FileAttrs {
    FileAttrs {
        mode: [0o644, 0o600, 0o755, 0o7777][i as usize % 4],
        mtime_ns: [-5, 1_700_000_000_123_456_789, i64::MAX][i as usize % 3] ^ (i as i64 * 977),
    }
}

fn small() -> (Vec<Vec<u8>>, Vec<u8>) {
    build(
        &[
            vec![
                (b"cat/1.jpg".to_vec(), b"meow".to_vec(), 0),
                (b"dog/\xff.jpg".to_vec(), b"".to_vec(), 1),
            ],
            vec![(b"cat/2.jpg".to_vec(), b"purr purr".to_vec(), 0)],
        ],
        &[b"cat", b"dog"],
    )
}

fn all_problems(bytes: &[u8]) -> usize {
    match Snapshot::open(bytes) {
        Err(_) => 1,
        Ok(s) => {
            let n = s.check_sections().len() + s.check_structure(100).len();
            // Accessors must never panic, whatever the bytes.
            for id in 0..s.sample_count() {
                let _ = s.sample(id);
                let _ = s.path(id).map(|p| s.lookup(p));
                let _ = s.attrs(id);
            }
            for i in 0..s.dir_count() {
                let _ = s.dir(i);
            }
            let _ = s.prefix_range(b"cat/");
            n
        }
    }
}

#[test]
fn open_and_query() {
    let (_, snap) = small();
    let s = Snapshot::open(&snap[..]).unwrap();
    assert_eq!(s.version(), (1, 6));
    assert_eq!(s.sample_count(), 3);
    assert_eq!(s.chunk_count(), 2);
    assert_eq!(s.path(1).unwrap(), b"dog/\xff.jpg");
    assert_eq!(s.lookup(b"cat/2.jpg").unwrap(), Some(2));
    assert_eq!(s.lookup(b"cat/3.jpg").unwrap(), None);
    assert_eq!(s.class_name(1).unwrap(), b"dog");
    assert_eq!(s.chunk(1).unwrap().samples(), 2..3);
    assert_eq!(s.sample(2).unwrap().offset, 64);
    let r = s.prefix_range(b"cat/").unwrap();
    let ids: Vec<u64> = r.map(|p| s.sorted_id(p).unwrap()).collect();
    assert_eq!(ids, vec![0, 2]);
    assert!(s.check_sections().is_empty());
    assert!(
        s.check_structure(10).is_empty(),
        "{:?}",
        s.check_structure(10)
    );
    assert_eq!(all_problems(&snap), 0);
}

#[test]
fn every_byte_flip_is_detected() {
    let (_, snap) = small();
    for pos in 0..snap.len() {
        let mut d = snap.clone();
        d[pos] ^= 0x04;
        assert!(all_problems(&d) > 0, "flip at byte {pos} went unnoticed");
    }
}

#[test]
fn every_truncation_is_rejected() {
    let (_, snap) = small();
    for cut in 0..snap.len() {
        assert!(Snapshot::open(&snap[..cut]).is_err(), "cut at {cut}");
    }
}

#[test]
fn unknown_major_version_names_both() {
    let (_, mut snap) = small();
    snap[8..10].copy_from_slice(&9u16.to_le_bytes());
    let err = Snapshot::open(&snap[..]).err().unwrap().to_string();
    assert!(
        err.contains("9.6") && err.contains("major version 1"),
        "{err}"
    );
}

#[test]
fn duplicate_paths_are_refused() {
    let id = [1; 16];
    let mut b = SnapshotBuilder::new(id, vec![]);
    let mut w = ChunkWriter::new(Vec::new(), id, 0).unwrap();
    w.append(b"a", b"x", Compression::None, 1, 0, NO_LABEL)
        .unwrap();
    w.append(b"a", b"y", Compression::None, 1, 0, NO_LABEL)
        .unwrap();
    let (_, s) = w.finish::<&[u8]>(&[]).unwrap();
    b.push_chunk(&s).unwrap();
    assert!(b.build().is_err());
}

#[test]
fn empty_dataset_round_trips() {
    let (_, snap) = build(&[], &[]);
    let s = Snapshot::open(&snap[..]).unwrap();
    assert_eq!(s.sample_count(), 0);
    assert_eq!(s.lookup(b"x").unwrap(), None);
    assert!(s.check_structure(10).is_empty());
}

fn path_strategy() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        proptest::collection::vec(
            prop_oneof![Just(b'a'), Just(b'z'), Just(0xC3u8), Just(0xFF)],
            1..4,
        ),
        1..4,
    )
    .prop_map(|comps| comps.join(&b'/'))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn round_trip(
        recs in proptest::collection::btree_map(path_strategy(), (proptest::collection::vec(any::<u8>(), 0..64), 0u32..3), 0..40),
        split in 1usize..8,
    ) {
        let recs: Vec<Rec> = recs.into_iter().map(|(p, (d, l))| (p, d, l)).collect();
        let chunks: Vec<Vec<_>> = recs.chunks(split).map(|c| c.to_vec()).collect();
        let (files, snap) = build(&chunks, &[b"x", b"y", b"z"]);
        let s = Snapshot::open(&snap[..]).unwrap();
        prop_assert_eq!(s.sample_count(), recs.len() as u64);
        prop_assert!(s.check_sections().is_empty());
        prop_assert!(s.check_structure(10).is_empty());
        for (id, (p, d, l)) in recs.iter().enumerate() {
            let e = s.sample(id as u64).unwrap();
            prop_assert_eq!(s.path(id as u64).unwrap(), &p[..]);
            prop_assert_eq!(s.lookup(p).unwrap(), Some(id as u64));
            prop_assert_eq!(e.label, *l);
            let f = &files[e.chunk as usize];
            prop_assert_eq!(&f[e.offset as usize..(e.offset + e.stored_len) as usize], &d[..]);
            prop_assert_eq!(e.crc32, crate::crc32(d));
        }
        for (c, f) in files.iter().enumerate() {
            let ce = s.chunk(c as u64).unwrap();
            prop_assert_eq!(ce.file_size, f.len() as u64);
            prop_assert_eq!(ce.file_crc, crate::crc32(f));
        }
    }
}

#[test]
fn spooled_samples_build_the_same_snapshot() {
    let id = [0xAB; 16];
    let classes = vec![b"cat".to_vec()];
    let mut summaries = Vec::new();
    for c in 0..3u32 {
        let mut w = ChunkWriter::new(Vec::new(), id, c).unwrap();
        for i in 0..1000u32 {
            let data = format!("{c}-{i}").into_bytes();
            let path = format!("cat/{c}/{i}");
            let crc = crate::crc32(&data);
            w.append(
                path.as_bytes(),
                &data,
                Compression::None,
                data.len() as u64,
                crc,
                0,
            )
            .unwrap();
        }
        summaries.push(w.finish(&classes).unwrap().1);
    }
    let mut mem = SnapshotBuilder::new(id, classes.clone());
    let mut spooled = SnapshotBuilder::new(id, classes.clone());
    spooled
        .spool_samples(tempfile::tempfile().unwrap())
        .unwrap();
    for s in &summaries {
        mem.push_chunk(s).unwrap();
        spooled.push_chunk(s).unwrap();
    }
    assert!(spooled
        .spool_samples(tempfile::tempfile().unwrap())
        .is_err());
    let (a, b) = (mem.build().unwrap(), spooled.build().unwrap());
    assert_eq!(a, b);
    assert_eq!(Snapshot::open(&b[..]).unwrap().sample_count(), 3000);
}

/// The `small()` dataset with every sample's attributes and two directories (format 1.2).
fn small_with_attrs() -> Vec<u8> {
    let (files, _) = small();
    let id = [0xAB; 16];
    let mut b = SnapshotBuilder::new(id, vec![b"cat".to_vec(), b"dog".to_vec()]);
    for (ci, f) in files.iter().enumerate() {
        let check = crate::check_chunk(f, &id, ci as u32).unwrap();
        let attrs: Vec<FileAttrs> = (0..check.footer.entries.len())
            .map(|i| FileAttrs {
                mode: 0o640 + i as u32,
                mtime_ns: -1_000 + ci as i64,
            })
            .collect();
        b.push_attrs(&attrs);
        b.push_chunk(&ChunkSummary {
            chunk_id: ci as u32,
            file_size: f.len() as u64,
            file_crc: check.file_crc,
            entries: check.footer.entries,
            paths: check.footer.paths,
            fields: None,
        })
        .unwrap();
    }
    b.dirs(vec![
        (
            b"dog/empty".to_vec(),
            FileAttrs {
                mode: 0o700,
                mtime_ns: 7,
            },
        ),
        (
            b"cat".to_vec(),
            FileAttrs {
                mode: 0o755,
                mtime_ns: 5,
            },
        ),
    ]);
    b.build().unwrap()
}

#[test]
fn attributes_and_directories_round_trip_as_format_1_2() {
    let snap = small_with_attrs();
    crate::testing::dump_fuzz_seed("snapshot", "format-1.2-attrs-dirs", &snap);
    let s = Snapshot::open(&snap[..]).unwrap();
    assert_eq!(s.version(), (1, 6));
    assert!(s.has_attrs());
    assert_eq!(
        s.attrs(0).unwrap(),
        Some(FileAttrs {
            mode: 0o640,
            mtime_ns: -1000
        })
    );
    assert_eq!(
        s.attrs(2).unwrap(),
        Some(FileAttrs {
            mode: 0o640,
            mtime_ns: -999
        })
    );
    assert!(s.attrs(3).is_err());
    assert_eq!(s.dir_count(), 2);
    // Sorted by path.
    assert_eq!(
        s.dir(0).unwrap(),
        (
            &b"cat"[..],
            FileAttrs {
                mode: 0o755,
                mtime_ns: 5
            }
        )
    );
    assert_eq!(s.dir(1).unwrap().0, b"dog/empty");
    assert_eq!(all_problems(&snap), 0);
    // Without them: a 1.0 file that says so.
    let (_, plain) = small();
    let p = Snapshot::open(&plain[..]).unwrap();
    assert_eq!(
        (p.has_attrs(), p.attrs(0).unwrap(), p.dir_count()),
        (false, None, 0)
    );
}

#[test]
fn every_byte_flip_and_cut_of_a_1_2_snapshot_is_detected() {
    let snap = small_with_attrs();
    for pos in 0..snap.len() {
        let mut d = snap.clone();
        d[pos] ^= 0x04;
        assert!(all_problems(&d) > 0, "flip at byte {pos} went unnoticed");
    }
    for cut in 0..snap.len() {
        assert!(Snapshot::open(&snap[..cut]).is_err(), "cut at {cut}");
    }
}

#[test]
fn the_builder_refuses_attributes_for_some_samples_and_bad_directories() {
    let (files, _) = small();
    let id = [0xAB; 16];
    let summaries: Vec<ChunkSummary> = files
        .iter()
        .enumerate()
        .map(|(ci, f)| {
            let check = crate::check_chunk(f, &id, ci as u32).unwrap();
            ChunkSummary {
                chunk_id: ci as u32,
                file_size: f.len() as u64,
                file_crc: check.file_crc,
                entries: check.footer.entries,
                paths: check.footer.paths,
                fields: None,
            }
        })
        .collect();
    let with = |attrs: Vec<FileAttrs>, dirs: Vec<(Vec<u8>, FileAttrs)>| {
        let mut b = SnapshotBuilder::new(id, vec![b"cat".to_vec(), b"dog".to_vec()]);
        for s in &summaries {
            b.push_chunk(s).unwrap();
        }
        b.push_attrs(&attrs);
        b.dirs(dirs);
        b.build()
    };
    let a = FileAttrs::default();
    assert!(with(vec![a; 2], vec![]).is_err(), "2 of 3 samples");
    assert!(with(
        vec![
            FileAttrs {
                mode: 0o10000,
                mtime_ns: 0
            };
            3
        ],
        vec![]
    )
    .is_err());
    assert!(with(vec![], vec![(b"../up".to_vec(), a)]).is_err());
    assert!(with(vec![], vec![(b"d".to_vec(), a), (b"d".to_vec(), a)]).is_err());
    assert!(with(vec![a; 3], vec![(b"d".to_vec(), a)]).is_ok());
}

#[test]
fn block_checksums_cover_every_byte_after_the_section_table() {
    let (_, snap) = small();
    let s = Snapshot::open(&snap[..]).unwrap();
    let bi = s
        .block_index()
        .expect("format 1.4 writes block checksums")
        .clone();
    assert_eq!(bi.block_size, BLOCK_SIZE as u64);
    assert!(bi.check(&snap).is_ok());
    assert!(s.check_sections().is_empty());
    // Every byte of the covered range is under a block CRC: a flip there is a block error
    // (besides the section CRC that may also catch it).
    for at in (bi.covered.start..bi.covered.end).step_by(7) {
        let mut bad = snap.clone();
        bad[at as usize] ^= 0x10;
        assert!(
            bi.check(&bad).is_err(),
            "flip at {at} not caught by the blocks"
        );
    }
    // A flip in kind 14 is caught by kind 15's page CRCs.
    let mut bad = snap.clone();
    bad[bi.crcs.start as usize] ^= 1;
    let err = bi.check(&bad).unwrap_err().to_string();
    assert!(err.contains("block checksums block 0"), "{err}");
}

#[test]
fn block_index_refuses_inconsistent_layouts() {
    let (_, snap) = small();
    let s = Snapshot::open(&snap[..]).unwrap();
    let bi = s.block_index().unwrap().clone();
    let table_end = bi.covered.start;
    let (_, k15) = crate::blocks::encode_block_sections(BLOCK_SIZE, bi.covered.clone(), &[0; 1]);
    assert!(BlockIndex::parse(&k15, bi.crcs.clone(), table_end).is_ok());
    assert!(BlockIndex::parse(&k15, bi.crcs.clone(), table_end + 8).is_err());
    assert!(BlockIndex::parse(&k15[..20], bi.crcs.clone(), table_end).is_err());
    let mut odd = k15.clone();
    odd[0..4].copy_from_slice(&1000u32.to_le_bytes());
    assert!(BlockIndex::parse(&odd, bi.crcs.clone(), table_end).is_err());
    let longer = bi.crcs.start..bi.crcs.end + 4;
    assert!(BlockIndex::parse(&k15, longer, table_end).is_err());
}

/// Records the ranges asked for (first run), or refuses any range outside them (second run).
struct Recorder {
    asked: std::sync::Mutex<Vec<Range<u64>>>,
    allowed: Option<Vec<Range<u64>>>,
}

impl Pager for Recorder {
    fn need(&self, r: Range<u64>) -> Result<()> {
        if let Some(allowed) = &self.allowed {
            if !r.is_empty() && !allowed.iter().any(|a| a.start <= r.start && r.end <= a.end) {
                return Err(FormatError::invalid(
                    "pager",
                    format!("{r:?} was never asked"),
                ));
            }
        }
        self.asked.lock().unwrap().push(r);
        Ok(())
    }
}

/// Every query a reader makes of a paged snapshot.
fn queries<B: AsRef<[u8]>>(s: &Snapshot<B>) -> Vec<String> {
    let mut out = vec![format!(
        "{:?}",
        (s.sample_count(), s.chunk_count(), s.class_count())
    )];
    for c in 0..s.chunk_count() {
        out.push(format!("{:?}", s.chunk(c)));
    }
    for id in 0..s.sample_count() {
        let p = s.path(id).unwrap().to_vec();
        out.push(format!("{:?}", (s.sample(id), s.lookup(&p), s.attrs(id))));
        out.push(format!("{:?}", s.lookup_stat(&p)));
    }
    out.push(format!("{:?}", s.sorted_paths(0..s.sample_count())));
    out.push(format!("{:?}", s.lookup(b"no/such/path")));
    for pos in 0..s.sample_count() {
        out.push(format!("{:?}", s.sorted_id(pos)));
    }
    out.push(format!("{:?}", s.prefix_range(b"cat/")));
    for i in 0..s.dir_count() {
        out.push(format!("{:?}", s.dir(i)));
    }
    out
}

#[test]
fn a_paged_snapshot_reads_only_what_it_asks_for() {
    for (name, snap) in [("small", small().1), ("attrs-dirs", small_with_attrs())] {
        crate::testing::dump_fuzz_seed("paged_snapshot", &format!("format-1.6-{name}"), &snap);
        crate::testing::dump_fuzz_seed("snapshot", &format!("format-1.6-{name}"), &snap);
        asks_only_for_what_it_reads(&snap, |s: &Snapshot<&[u8]>| queries(s));
    }
}

/// Checks that `answers` of a paged snapshot equal those of the whole one, and that they
/// read no byte they did not ask for: run again over bytes holding only what the first run
/// asked for (the rest garbage), with a pager that refuses anything else, they are the same.
fn asks_only_for_what_it_reads<T: PartialEq + std::fmt::Debug>(
    snap: &[u8],
    answers: impl Fn(&Snapshot<&[u8]>) -> T,
) {
    let whole = answers(&Snapshot::open(snap).unwrap());
    let rec = std::sync::Arc::new(Recorder {
        asked: Default::default(),
        allowed: None,
    });
    let s = Snapshot::open_paged(snap, rec.clone()).unwrap();
    assert_eq!(answers(&s), whole);
    let asked = rec.asked.lock().unwrap().clone();
    let mut masked = vec![0x5Au8; snap.len()];
    for r in &asked {
        masked[r.start as usize..r.end as usize]
            .copy_from_slice(&snap[r.start as usize..r.end as usize]);
    }
    let strict = std::sync::Arc::new(Recorder {
        asked: Default::default(),
        allowed: Some(asked),
    });
    let s = Snapshot::open_paged(&masked[..], strict).unwrap();
    assert_eq!(answers(&s), whole);
}

#[test]
fn a_paged_open_asks_for_o_chunks_bytes() {
    let recs: Vec<Vec<Rec>> = (0..50)
        .map(|c| {
            (0..200)
                .map(|i| (format!("c{c}/{i:05}").into_bytes(), vec![c as u8; 3], 0))
                .collect()
        })
        .collect();
    let (_, snap) = build(&recs, &[b"x"]);
    let rec = std::sync::Arc::new(Recorder {
        asked: Default::default(),
        allowed: None,
    });
    let s = Snapshot::open_paged(&snap[..], rec.clone()).unwrap();
    let asked: u64 = rec
        .asked
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.end - r.start)
        .sum();
    let tab_end = s.block_index().unwrap().covered.start;
    // Header, section table, chunk table, classes, the block index, a few words.
    let bound = tab_end + 50 * CHUNK_ENTRY_LEN as u64 + 200;
    assert!(
        asked <= bound,
        "open asked for {asked} bytes of {}, bound {bound}",
        snap.len()
    );
    // A chunk's sample entries are one range.
    let c3 = s.chunk(3).unwrap().samples();
    rec.asked.lock().unwrap().clear();
    s.prefetch_samples(c3).unwrap();
    let asked = rec.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].end - asked[0].start, 200 * SAMPLE_ENTRY_LEN as u64);
    // A full listing asks for the paths and the path order, whole, at once.
    rec.asked.lock().unwrap().clear();
    s.prefetch_paths().unwrap();
    let asked = rec.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 2);
    assert_eq!(asked[1].end - asked[1].start, 10_000 * 4);
    // A snapshot held whole asks nothing.
    assert!(Snapshot::open(&snap[..]).unwrap().prefetch_paths().is_ok());
}

#[test]
fn paged_searches_of_the_path_order_agree_with_binary_search_and_read_only_what_they_ask() {
    // 10,000 paths: runs of every length the searches take apart.
    let recs: Vec<Vec<Rec>> = (0..50)
        .map(|c| {
            (0..200)
                .map(|i| (format!("c{c}/{:05}", i * 7).into_bytes(), vec![1], 0))
                .collect()
        })
        .collect();
    let (_, snap) = build(&recs, &[b"x"]);
    let keys: Vec<&[u8]> = vec![
        b"",
        b"c",
        b"c1",
        b"c1/",
        b"c10/",
        b"c3/00007",
        b"c3/0000",
        b"c49/01393",
        b"c49/",
        b"d",
        b"c25/006",
        b"c0/00000",
        b"b",
    ];
    let answers = |s: &Snapshot<&[u8]>| -> Vec<String> {
        let mut out = Vec::new();
        for k in &keys {
            let lb = s.lower_bound(k).unwrap();
            let range = s.prefix_range(k).unwrap();
            out.push(format!("{k:?} {lb} {range:?} {:?}", s.prefix_end(k, lb)));
            out.push(format!("{:?}", s.prefix_end(k, lb + 1)));
        }
        out
    };
    let whole = Snapshot::open(&snap[..]).unwrap();
    // Against a plain scan of the sorted paths.
    let paths: Vec<Vec<u8>> = (0..whole.sample_count())
        .map(|p| whole.path(whole.sorted_id(p).unwrap()).unwrap().to_vec())
        .collect();
    for k in &keys {
        let lb = paths.partition_point(|p| &p[..] < *k) as u64;
        let end = lb
            + paths[lb as usize..]
                .iter()
                .take_while(|p| p.starts_with(k))
                .count() as u64;
        assert_eq!(whole.lower_bound(k).unwrap(), lb, "{k:?}");
        assert_eq!(whole.prefix_range(k).unwrap(), lb..end, "{k:?}");
    }
    asks_only_for_what_it_reads(&snap, answers);
}

/// Searches and listings of the path order give the same answers with path pages (format
/// 1.5) and listing pages (1.6, with and without file attributes) as without (1.4: a binary
/// search through the paths by id) and as a scan of the sorted paths, held whole or fetched in
/// pieces, over many pages, keys between, before and after every path, prefixes ending in
/// 0xff, and starting points inside and outside each run; listing pages' sizes, modes and
/// mtimes are the sample table's and kind 8's.
#[test]
fn path_pages_answer_as_the_path_order_does() {
    let mut r = crate::SplitMix64::new(5);
    let mut recs: Vec<Vec<Rec>> = (0..40)
        .map(|c| {
            (0..800)
                .map(|i| {
                    let dir = ["a", "ab", "b", "bb", "zz/deep/er"][(i % 5) as usize];
                    let name = format!("{dir}/{:06}-{}", r.below(1 << 20), c * 800 + i);
                    (name.into_bytes(), vec![1; (i % 9) as usize], 0)
                })
                .collect()
        })
        .collect();
    // Names with raw 0xff bytes.
    for (i, rec) in recs[0].iter_mut().enumerate().take(50) {
        rec.0 = [&b"b\xff/"[..], format!("{i:03}").as_bytes()].concat();
    }
    for (i, rec) in recs[1].iter_mut().enumerate().take(50) {
        rec.0 = [&b"b\xff\xff"[..], format!("{i:03}").as_bytes()].concat();
    }
    let (_, old) = build_with(&recs, &[b"x"], BLOCKS_MINOR, false);
    let (_, b15) = build_with(&recs, &[b"x"], PAGES_MINOR, false);
    let (_, b16) = build_with(&recs, &[b"x"], LISTING_MINOR, false);
    let (_, b16a) = build_with(&recs, &[b"x"], LISTING_MINOR, true);
    let s14 = Snapshot::open(&old[..]).unwrap();
    let paged: Vec<Snapshot<&[u8]>> = [&b15, &b16, &b16a]
        .map(|b| Snapshot::open(&b[..]).unwrap())
        .into();
    let versions: Vec<_> = paged.iter().map(|s| s.version()).collect();
    assert_eq!(versions, [(1, 5), (1, 6), (1, 6)]);
    assert_eq!(s14.version(), (1, 4));
    let ix = paged[0].page_index().unwrap().expect("1.5 has path pages");
    assert!(ix.len() >= 5, "{} pages", ix.len());
    assert!(s14.page_index().unwrap().is_none());
    for s in &paged {
        assert!(s.check_structure(10).is_empty() && s.check_sections().is_empty());
    }
    let s15 = &paged[0];
    let n = s15.sample_count();
    let paths: Vec<Vec<u8>> = (0..n)
        .map(|p| s14.path(s14.sorted_id(p).unwrap()).unwrap().to_vec())
        .collect();
    let mut keys: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"\xff".to_vec(),
        b"b\xff".to_vec(),
        b"b\xff\xff".to_vec(),
        b"0".to_vec(),
    ];
    for i in (0..n as usize).step_by(401) {
        let p = &paths[i];
        keys.extend([
            p.clone(),
            p[..p.len() / 2].to_vec(),
            [&p[..], b"\xff"].concat(),
        ]);
        if let Some(slash) = p.iter().position(|&b| b == b'/') {
            keys.push(p[..slash + 1].to_vec());
        }
    }
    // Every page's first path and the one before it.
    for p in 0..ix.len() {
        let at = ix.positions(p).start as usize;
        keys.push(paths[at].clone());
        keys.push(paths[at.saturating_sub(1)].clone());
    }
    let starts = |lb: u64| [0, lb.saturating_sub(1), lb, lb + 1, lb + 40, n];
    // Exact lookups too: by the hash index, or (read in blocks, the page index read) by the
    // pages.
    let answers = |s: &Snapshot<&[u8]>| -> Vec<(u64, u64, Vec<u64>, Option<u64>)> {
        keys.iter()
            .map(|k| {
                let lb = s.lower_bound(k).unwrap();
                let ends = starts(lb).map(|from| s.prefix_end(k, from).unwrap());
                let found = s.lookup(k).unwrap();
                (lb, s.prefix_range(k).unwrap().end, ends.to_vec(), found)
            })
            .collect()
    };
    let want: Vec<(u64, u64, Vec<u64>, Option<u64>)> = keys
        .iter()
        .map(|k| {
            let lb = paths.partition_point(|p| p < k) as u64;
            let end_from = |from: u64| {
                let mut e = from.min(n);
                while e < n && paths[e as usize].starts_with(k) {
                    e += 1;
                }
                e
            };
            let found = (paths.get(lb as usize) == Some(k)).then(|| s14.sorted_id(lb).unwrap());
            (lb, end_from(lb), starts(lb).map(end_from).to_vec(), found)
        })
        .collect();
    for (s, b) in paged.iter().zip([&b15, &b16, &b16a]) {
        assert_eq!(answers(s), want);
        asks_only_for_what_it_reads(b, answers);
        // Stats by path: held whole, the hash index and the tables by id; read in blocks,
        // the listing pages (1.6).
        asks_only_for_what_it_reads(b, |s: &Snapshot<&[u8]>| {
            keys.iter()
                .map(|k| s.lookup_stat(k).unwrap())
                .collect::<Vec<_>>()
        });
    }
    assert_eq!(answers(&s14), want);
    listings_agree(&s14, &paged, &[&b15, &b16, &b16a], &paths);
}

/// [`path_pages_answer_as_the_path_order_does`]'s listings: any run of positions, across pages,
/// lists the same entries with pages as without (`s14`), the listing pages' stats are the
/// sample table's and kind 8's, and each snapshot asks only for what it reads.
fn listings_agree(
    s14: &Snapshot<&[u8]>,
    paged: &[Snapshot<&[u8]>],
    bytes: &[&Vec<u8>],
    paths: &[Vec<u8>],
) {
    let n = s14.sample_count();
    // Listings of any run of positions, across pages.
    let listing = |s: &Snapshot<&[u8]>| -> Vec<PathEntry> {
        [
            0..0,
            0..1,
            0..n,
            5..6000,
            n - 1..n + 5,
            7000..9000,
            n + 1..n + 2,
        ]
        .into_iter()
        .flat_map(|r| s.sorted_paths(r).unwrap())
        .collect()
    };
    let plain = listing(s14);
    assert!(plain.iter().all(|e| e.stat.is_none()));
    assert_eq!(listing(&paged[0]), plain);
    for (s, b) in paged.iter().zip(bytes) {
        asks_only_for_what_it_reads(b, listing);
        let stats: Vec<PathEntry> = listing(s);
        let without: Vec<PathEntry> = stats
            .iter()
            .map(|e| PathEntry {
                stat: None,
                ..e.clone()
            })
            .collect();
        assert_eq!(without, plain);
        // Listing pages' stats are the sample table's and kind 8's; so are lookups'.
        for e in &stats {
            assert_eq!(e.stat.is_some(), s.pages_carry_stats());
            if let Some(st) = e.stat {
                assert_eq!(st, s.stat(e.id).unwrap());
                assert_eq!(st.attrs.is_some(), s.has_attrs());
            }
        }
        for e in stats.iter().step_by(97) {
            let want = (e.id, s.stat(e.id).unwrap());
            assert_eq!(s.lookup_stat(&e.path).unwrap(), Some(want));
            assert_eq!(s14.lookup_stat(&e.path).unwrap().map(|x| x.0), Some(e.id));
        }
        assert_eq!(s.lookup_stat(b"b\xff/zz").unwrap(), None);
        let all: Vec<Vec<u8>> = s
            .sorted_paths(0..n)
            .unwrap()
            .into_iter()
            .map(|e| e.path)
            .collect();
        assert_eq!(all, paths);
    }
    assert!(paged[2].sorted_paths(0..1).unwrap()[0]
        .stat
        .unwrap()
        .attrs
        .is_some());
    assert!(paged[1].sorted_paths(0..1).unwrap()[0]
        .stat
        .unwrap()
        .attrs
        .is_none());
}

/// `check_structure` (what `verify` runs) finds listing pages whose sizes, modes or mtimes
/// are not the sample table's and kind 8's: what section CRCs cannot catch (a writer's bug).
#[test]
fn listing_pages_that_disagree_with_the_tables_are_found() {
    let recs: Vec<Vec<Rec>> = vec![(0..50)
        .map(|i| (format!("d/{i:03}").into_bytes(), vec![7; i], 0))
        .collect()];
    let (_, snap) = build_with(&recs, &[b"x"], LISTING_MINOR, true);
    let s = Snapshot::open(&snap[..]).unwrap();
    assert!(s.check_structure(10).is_empty());
    let (attrs, samples) = (s.l.attrs.clone().unwrap(), s.l.sample_tab.clone());
    for (at, what) in [
        (attrs.start + 16 * 3, "mode"),
        (attrs.start + 16 * 3 + 8, "mtime"),
        (samples.start + 40 * 3 + 24, "size"),
    ] {
        let mut bad = snap.clone();
        bad[at] ^= 1;
        let errs = Snapshot::open(&bad[..]).unwrap().check_structure(10);
        assert!(
            errs.iter()
                .any(|e| e.to_string().contains("snapshot listing pages")),
            "{what}: {errs:?}"
        );
    }
}
