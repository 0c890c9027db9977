use super::*;
use crate::{ChunkWriter, FieldEntry, NO_LABEL};

/// (path, data, label) of one record.
type Rec = (Vec<u8>, Vec<u8>, u32);

const ID: [u8; 16] = [0xAB; 16];

/// Builds a dataset in memory: chunk files and the snapshot bytes, with file attributes
/// (sample `i`: [`attrs_of`]) if `attrs`.
fn build_with(chunks: &[Vec<Rec>], classes: &[&[u8]], attrs: bool) -> (Vec<Vec<u8>>, Vec<u8>) {
    let classes: Vec<Vec<u8>> = classes.iter().map(|c| c.to_vec()).collect();
    let mut b = SnapshotBuilder::new(ID, classes.clone());
    let mut files = Vec::new();
    let mut sample = 0u64;
    for (ci, recs) in chunks.iter().enumerate() {
        let mut w = match attrs {
            true => ChunkWriter::with_attrs(Vec::new(), ID, ci as u32).unwrap(),
            false => ChunkWriter::new(Vec::new(), ID, ci as u32).unwrap(),
        };
        // The first chunk records the directories (the second one repeats one, with other
        // attributes: the first chunk's win).
        if attrs && ci < 2 {
            let mut dirs = vec![(b"cat".to_vec(), attrs_of(7 + ci as u64))];
            dirs.extend((ci == 0).then(|| (b"empty/dir".to_vec(), attrs_of(8))));
            w.dirs(dirs).unwrap();
        }
        for (i, (path, data, label)) in recs.iter().enumerate() {
            // Every third record compressed (when it shrinks).
            let z = zstd::bulk::compress(data, 3).unwrap();
            let (stored, comp) = match i % 3 == 0 && z.len() < data.len() {
                true => (&z[..], Compression::Zstd),
                false => (&data[..], Compression::None),
            };
            w.append(
                path,
                stored,
                comp,
                data.len() as u64,
                crate::crc32(data),
                *label,
            )
            .unwrap();
            if attrs {
                w.attrs(attrs_of(sample)).unwrap();
            }
            sample += 1;
        }
        let (bytes, s) = w.finish(&classes).unwrap();
        b.push_chunk(&s).unwrap();
        files.push(bytes);
    }
    (files, b.build().unwrap())
}

fn build(chunks: &[Vec<Rec>], classes: &[&[u8]]) -> (Vec<Vec<u8>>, Vec<u8>) {
    build_with(chunks, classes, false)
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

/// `n` samples over chunks of `per` samples, in three classes and nested directories.
fn many(n: usize, per: usize, attrs: bool) -> (Vec<Vec<u8>>, Vec<u8>, Vec<Rec>) {
    let recs: Vec<Rec> = (0..n)
        .map(|i| {
            let class = (i * 7) % 3;
            let path = format!("class_{class}/sub_{:02}/{:07}.jpg", (i * 13) % 17, i);
            let data = format!("sample {i} ").repeat(1 + i % 5).into_bytes();
            (
                path.into_bytes(),
                data,
                if i % 11 == 0 { NO_LABEL } else { class as u32 },
            )
        })
        .collect();
    let chunks: Vec<Vec<Rec>> = recs.chunks(per).map(|c| c.to_vec()).collect();
    let (files, snap) = build_with(&chunks, &[b"a", b"b", b"c"], attrs);
    (files, snap, recs)
}

fn reseal(b: &mut [u8]) {
    assert!(crate::testing::reseal_snapshot(b));
}

/// Sets header fields through `f` and reseals (the content digest covers them).
fn with_header(b: &[u8], f: impl FnOnce(&mut SnapshotHeader)) -> Vec<u8> {
    let mut b = b.to_vec();
    let mut h = SnapshotHeader::decode(&b).unwrap();
    f(&mut h);
    b[..SNAPSHOT_HEADER_LEN].copy_from_slice(&h.encode());
    reseal(&mut b);
    b
}

/// Where section `k` lies.
fn section_of(b: &[u8], k: SectionKind) -> std::ops::Range<usize> {
    Snapshot::open(b).unwrap().s.get(k)
}

fn err_of(b: &[u8]) -> String {
    match Snapshot::open(b) {
        Err(e) => e.to_string(),
        Ok(s) => {
            let mut v = s.check_blocks();
            v.extend(s.check_structure(10));
            v.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; ")
        }
    }
}

/// Every accessor on every sample and position; none may panic. The number of errors.
fn exercise(b: &[u8]) -> usize {
    let Ok(s) = Snapshot::open(b) else {
        return 1;
    };
    let mut errors = s.check_blocks().len() + s.check_structure(100).len();
    for id in 0..s.sample_count() {
        errors += s.sample(id).is_err() as usize;
        if let Ok(p) = s.path(id) {
            errors += (s.lookup(&p).ok().flatten() != Some(id)) as usize;
        }
    }
    for pos in 0..s.entry_count() {
        errors += s.entry(pos).is_err() as usize;
    }
    for c in 0..s.chunk_count() {
        errors += s.class_counts(c).is_err() as usize;
    }
    errors += s.prefix_range(b"cat/").is_err() as usize;
    errors
}

#[test]
fn open_and_query() {
    let (_, snap) = small();
    let s = Snapshot::open(&snap[..]).unwrap();
    assert_eq!(s.version(), (2, 0));
    assert_eq!((s.sample_count(), s.chunk_count()), (3, 2));
    assert_eq!((s.entry_count(), s.dir_count()), (5, 2));
    assert_eq!(s.path(1).unwrap(), b"dog/\xff.jpg");
    assert_eq!(s.lookup(b"cat/2.jpg").unwrap(), Some(2));
    assert_eq!(s.lookup(b"cat/3.jpg").unwrap(), None);
    assert_eq!(s.lookup(b"cat").unwrap(), None, "a directory is no sample");
    assert!(s.find(b"cat").unwrap().unwrap().1.is_dir());
    assert_eq!(s.class_name(1).unwrap(), b"dog");
    assert_eq!(s.chunk(1).unwrap().samples(), 2..3);
    assert_eq!(s.sample(2).unwrap().offset, 64);
    assert_eq!(s.sample(0).unwrap().stored_len, 4);
    assert_eq!(s.sample(1).unwrap().stored_len, 0);
    let all: Vec<(Vec<u8>, Option<u64>)> = s
        .entries(0..10)
        .unwrap()
        .into_iter()
        .map(|e| (e.path, e.id))
        .collect();
    assert_eq!(
        all,
        vec![
            (b"cat".to_vec(), None),
            (b"cat/1.jpg".to_vec(), Some(0)),
            (b"cat/2.jpg".to_vec(), Some(2)),
            (b"dog".to_vec(), None),
            (b"dog/\xff.jpg".to_vec(), Some(1)),
        ]
    );
    assert_eq!(s.prefix_range(b"cat/").unwrap(), 1..3);
    assert_eq!(s.class_counts(0).unwrap(), vec![(0, 1), (1, 1)]);
    assert_eq!(s.class_counts(1).unwrap(), vec![(0, 1)]);
    let c0 = s.chunk(0).unwrap();
    assert_eq!((c0.orig_bytes, c0.compressed, c0.records_end), (4, 0, 68));
    assert!(s.check_blocks().is_empty());
    assert!(
        s.check_structure(10).is_empty(),
        "{:?}",
        s.check_structure(10)
    );
    assert_eq!(exercise(&snap), 0);
    assert!(!s.has_attrs() && !s.has_fields());
}

#[test]
fn many_samples_round_trip_through_pages_and_blocks() {
    for attrs in [false, true] {
        let (files, snap, recs) = many(20_000, 3000, attrs);
        let s = Snapshot::open(&snap[..]).unwrap();
        assert!(s.blocks().count() > 3, "{} blocks", s.blocks().count());
        assert!(s.page_index().unwrap().len() > 20);
        assert_eq!(s.has_attrs(), attrs);
        for (id, (path, data, label)) in recs.iter().enumerate().step_by(97) {
            let id = id as u64;
            assert_eq!(&s.path(id).unwrap(), path);
            assert_eq!(s.lookup(path).unwrap(), Some(id));
            let e = s.sample(id).unwrap();
            assert_eq!((e.orig_len, e.label), (data.len() as u64, *label));
            let st = s.stat(id).unwrap();
            assert_eq!(st.size, data.len() as u64);
            assert_eq!(st.attrs, attrs.then(|| attrs_of(id)));
        }
        // Sample entries are the chunks' footers' entries.
        for (c, f) in files.iter().enumerate() {
            let check = crate::check_chunk(f, &ID, c as u32).unwrap();
            assert_eq!(
                s.chunk_summary(c as u64).unwrap().entries,
                check.footer.entries
            );
            assert_eq!(s.chunk(c as u64).unwrap().file_crc, check.file_crc);
        }
        // The namespace: every file, every ancestor directory (and the given ones), sorted.
        let mut want: Vec<Vec<u8>> = recs.iter().map(|r| r.0.clone()).collect();
        for r in &recs {
            for (i, _) in r.0.iter().enumerate().filter(|(_, &b)| b == b'/') {
                want.push(r.0[..i].to_vec());
            }
        }
        if attrs {
            want.extend([b"cat".to_vec(), b"empty".to_vec(), b"empty/dir".to_vec()]);
        }
        want.sort();
        want.dedup();
        let got: Vec<Vec<u8>> = s
            .entries(0..s.entry_count())
            .unwrap()
            .into_iter()
            .map(|e| e.path)
            .collect();
        assert!(
            got == want,
            "{} entries, expected {}",
            got.len(),
            want.len()
        );
        if attrs {
            let d = s.find(b"empty/dir").unwrap().unwrap().1;
            assert_eq!(d.attrs, Some(attrs_of(8)));
            let d = s.find(b"class_0").unwrap().unwrap().1;
            assert_eq!(d.attrs, Some(FileAttrs::DIR_DEFAULT));
        }
        let r = s.prefix_range(b"class_1/sub_03/").unwrap();
        let n = recs
            .iter()
            .filter(|x| x.0.starts_with(b"class_1/sub_03/"))
            .count();
        assert_eq!(r.end - r.start, n as u64);
        assert!(s.check_blocks().is_empty());
        assert!(
            s.check_structure(10).is_empty(),
            "{:?}",
            s.check_structure(10)
        );
    }
}

#[test]
fn fields_and_types_round_trip() {
    let names: Vec<Vec<u8>> = vec![b"cls".to_vec(), b"jpg".to_vec(), b"json".to_vec()];
    let mut b = SnapshotBuilder::new(ID, vec![]);
    let mut w = ChunkWriter::with_fields(Vec::new(), ID, 0).unwrap();
    for i in 0..50u32 {
        let vals: Vec<Vec<u8>> = vec![
            (i as i64).to_le_bytes().to_vec(),
            vec![i as u8; 12],
            format!("{{\"i\":{i}}}").into_bytes(),
        ];
        let fields: Vec<(&[u8], &[u8], u32)> = (0..3)
            .map(|k| (&names[k][..], &vals[k][..], crate::crc32(&vals[k])))
            .collect();
        w.append_group(format!("s/{i:03}").as_bytes(), &fields, NO_LABEL)
            .unwrap();
    }
    let types: std::collections::BTreeMap<Vec<u8>, String> = [
        (b"cls".to_vec(), "int".to_string()),
        (b"jpg".to_vec(), "ndarray:uint8:3,4".to_string()),
        (b"json".to_vec(), "json".to_string()),
    ]
    .into();
    w.field_types(&types).unwrap();
    let (bytes, summary) = w.finish::<&[u8]>(&[]).unwrap();
    let check = crate::check_chunk(&bytes, &ID, 0).unwrap();
    assert_eq!(
        check.footer.fields.as_ref().unwrap().types,
        ["int", "ndarray:uint8:3,4", "json"]
    );
    b.push_chunk(&summary).unwrap();
    let snap = b.build().unwrap();
    let s = Snapshot::open(&snap[..]).unwrap();
    assert!(s.has_fields());
    assert_eq!(s.field_names().unwrap(), vec![&b"cls"[..], b"jpg", b"json"]);
    assert_eq!(
        s.field_types().unwrap(),
        vec![
            FieldType::Int,
            FieldType::Ndarray {
                dtype: "uint8".into(),
                shape: vec![3, 4]
            },
            FieldType::Json
        ]
    );
    let f = s.fields(7).unwrap();
    assert_eq!(f.iter().map(|x| x.len).collect::<Vec<_>>(), vec![8, 12, 7]);
    assert_eq!(f[1].offset, 8);
    assert_eq!(s.field_entry_count(), 150);
    assert!(
        s.check_structure(10).is_empty(),
        "{:?}",
        s.check_structure(10)
    );
    // Chunks that disagree on a field's type are refused.
    let mut other = summary.clone();
    other.chunk_id = 1;
    other.fields.as_mut().unwrap().types[0] = "str".into();
    let mut b = SnapshotBuilder::new(ID, vec![]);
    b.push_chunk(&summary).unwrap();
    let e = b.push_chunk(&other).unwrap_err().to_string();
    assert!(
        e.contains("field cls is int in one chunk and str in chunk 1"),
        "{e}"
    );
    // An unknown type descriptor in a chunk is refused.
    let mut w = ChunkWriter::with_fields(Vec::new(), ID, 0).unwrap();
    let bad: std::collections::BTreeMap<Vec<u8>, String> =
        [(b"cls".to_vec(), "blob".to_string())].into();
    assert!(w.field_types(&bad).is_err());
    let _ = FieldEntry {
        name: 0,
        len: 0,
        crc32: 0,
    };
}

#[test]
fn empty_datasets_and_empty_chunks() {
    let (_, snap) = build(&[], &[]);
    let s = Snapshot::open(&snap[..]).unwrap();
    assert_eq!((s.sample_count(), s.entry_count()), (0, 0));
    assert_eq!(s.lookup(b"x").unwrap(), None);
    assert_eq!(s.prefix_range(b"").unwrap(), 0..0);
    assert_eq!(exercise(&snap), 0);
    let (_, snap) = build(
        &[
            vec![],
            vec![(b"a".to_vec(), b"x".to_vec(), NO_LABEL)],
            vec![],
        ],
        &[],
    );
    let s = Snapshot::open(&snap[..]).unwrap();
    assert_eq!(s.chunk(0).unwrap().samples(), 0..0);
    assert_eq!(s.chunk(1).unwrap().samples(), 0..1);
    assert_eq!(s.chunk_of(0).unwrap().chunk_id, 1);
    assert_eq!(exercise(&snap), 0);
}

#[test]
fn builder_refuses_what_the_format_cannot_hold() {
    let dup = build_err(&[vec![
        (b"a/x".to_vec(), b"1".to_vec(), NO_LABEL),
        (b"a/x".to_vec(), b"2".to_vec(), NO_LABEL),
    ]]);
    assert!(dup.contains("duplicate path"), "{dup}");
    let both = build_err(&[vec![
        (b"a".to_vec(), b"1".to_vec(), NO_LABEL),
        (b"a/x".to_vec(), b"2".to_vec(), NO_LABEL),
    ]]);
    assert!(both.contains("both a file and a directory"), "{both}");
    // A chunk with attributes holding one record "x".
    let one = || {
        let mut w = ChunkWriter::with_attrs(Vec::new(), ID, 0).unwrap();
        w.append(
            b"x",
            b"1",
            Compression::None,
            1,
            crate::crc32(b"1"),
            NO_LABEL,
        )
        .unwrap();
        w
    };
    let mut w = one();
    w.attrs(FileAttrs::default()).unwrap();
    assert!(w.attrs(FileAttrs::default()).is_err(), "attributes twice");
    let (_, mut s) = w.finish::<&[u8]>(&[]).unwrap();
    s.attrs.as_mut().unwrap().push(FileAttrs::default());
    let err = SnapshotBuilder::new(ID, vec![]).push_chunk(&s).unwrap_err();
    assert!(err.to_string().contains("attributes for 2 of 1"), "{err}");
    assert!(
        one().finish::<&[u8]>(&[]).is_err(),
        "a record without attributes"
    );
}

fn build_err(chunks: &[Vec<Rec>]) -> String {
    let mut b = SnapshotBuilder::new(ID, vec![]);
    for (ci, recs) in chunks.iter().enumerate() {
        let mut w = ChunkWriter::new(Vec::new(), ID, ci as u32).unwrap();
        for (p, d, l) in recs {
            w.append(p, d, Compression::None, d.len() as u64, crate::crc32(d), *l)
                .unwrap();
        }
        let (_, s) = w.finish::<&[u8]>(&[]).unwrap();
        if let Err(e) = b.push_chunk(&s) {
            return e.to_string();
        }
    }
    b.build().unwrap_err().to_string()
}

#[test]
fn feature_bits_and_sections_must_agree() {
    let (_, snap) = small();
    let e = err_of(&with_header(&snap, |h| h.incompat |= 1 << 9));
    assert!(e.contains("incompatible feature bits 0x200"), "{e}");
    let e = err_of(&with_header(&snap, |h| h.incompat |= features::FIELDS));
    assert!(
        e.contains("required section snapshot fields is missing"),
        "{e}"
    );
    // Unknown compatible bits are fine.
    assert_eq!(err_of(&with_header(&snap, |h| h.compat |= 1 << 3)), "");
    // A fields section without its bit.
    let mut b = SnapshotBuilder::new(ID, vec![]);
    let mut w = ChunkWriter::with_fields(Vec::new(), ID, 0).unwrap();
    let hi = (&b"txt"[..], &b"hi"[..], crate::crc32(b"hi"));
    w.append_group(b"k", &[hi], NO_LABEL).unwrap();
    b.push_chunk(&w.finish::<&[u8]>(&[]).unwrap().1).unwrap();
    let fsnap = b.build().unwrap();
    let e = err_of(&with_header(&fsnap, |h| h.incompat &= !features::FIELDS));
    assert!(e.contains("present without its feature bit"), "{e}");
    // Version 1 names the upgrade.
    let mut v1 = snap.clone();
    v1[8] = 1;
    let e = err_of(&v1);
    assert!(e.contains("granary upgrade"), "{e}");
}

#[test]
fn damaged_ids_pages_and_index_are_named() {
    let (_, snap, _) = many(5000, 1000, true);
    let ns = section_of(&snap, SectionKind::Namespace);
    let s = Snapshot::open(&snap[..]).unwrap();
    let idtab = s.ns.idtab.clone();
    let index = s.ns.index.clone();
    let area = s.ns.area.clone();
    let ix = s.page_index().unwrap().clone();
    drop(s);
    // An id table that is not a permutation.
    let mut b = snap.clone();
    b.copy_within(idtab.start + 4..idtab.start + 8, idtab.start);
    reseal(&mut b);
    let e = err_of(&b);
    assert!(e.contains("id table"), "{e}");
    assert!(Snapshot::open(&b[..]).unwrap().path(0).is_err());
    // A page index whose first path disagrees with its page.
    let mut b = snap.clone();
    let p = 3;
    let fp = ix.first_path(p).to_vec();
    let at = index.start
        + (b[index.clone()]
            .windows(fp.len())
            .position(|w| w == fp)
            .unwrap());
    b[at + fp.len() - 1] ^= 1;
    reseal(&mut b);
    let e = err_of(&b);
    assert!(e.contains("snapshot namespace"), "{e}");
    // Entries out of order inside a page: entry 2's suffix made to start with a 0 byte.
    let mut b = snap.clone();
    let page = area.start + ix.bytes(5).start as usize;
    let mut at = page;
    let varint = |b: &[u8], at: &mut usize| super::namespace::get_varint(b, at).unwrap();
    for entry in 0..3 {
        varint(&b, &mut at);
        let len = varint(&b, &mut at) as usize;
        if entry == 2 {
            assert!(len > 0);
            b[at] = 0;
            break;
        }
        at += len;
        // tag, size (files), mode and mtime delta (attributes)
        let tag = varint(&b, &mut at);
        if tag != 0 {
            varint(&b, &mut at);
        }
        varint(&b, &mut at);
        varint(&b, &mut at);
    }
    reseal(&mut b);
    let e = err_of(&b);
    assert!(
        e.contains("snapshot namespace") && e.contains("does not follow"),
        "{e}"
    );
    // A restart table that points elsewhere.
    let mut b = snap.clone();
    let end = area.start + ix.bytes(5).end as usize;
    b[end - 8] ^= 1;
    reseal(&mut b);
    let e = err_of(&b);
    assert!(
        e.contains("snapshot namespace") && e.contains("restart"),
        "{e}"
    );
    let _ = ns;
}

#[test]
fn truncated_and_flipped_snapshots_serve_nothing_unchecked() {
    let (_, snap, _) = many(3000, 700, true);
    for cut in (0..snap.len())
        .step_by(snap.len() / 97)
        .chain([snap.len() - 1])
    {
        assert!(Snapshot::open(&snap[..cut]).is_err(), "cut at {cut}");
    }
    for at in (0..snap.len()).step_by(snap.len() / 61 + 1) {
        let mut b = snap.clone();
        b[at] ^= 0x41;
        match Snapshot::open(&b[..]) {
            Err(_) => {}
            Ok(s) => {
                let bad = s.check_blocks();
                assert!(!bad.is_empty(), "flip at {at} unnoticed");
                assert!(bad[0].to_string().contains("snapshot block"), "{}", bad[0]);
                // Reading everything fails somewhere; nothing panics.
                assert!(exercise(&b) > 0);
            }
        }
    }
}

#[test]
fn a_paged_snapshot_asks_only_for_what_it_uses() {
    use std::sync::Mutex;
    #[derive(Default)]
    struct Recorder(Mutex<Vec<std::ops::Range<u64>>>);
    impl Pager for Recorder {
        fn need_all(&self, ranges: &[std::ops::Range<u64>]) -> Result<()> {
            self.0.lock().unwrap().extend_from_slice(ranges);
            Ok(())
        }
    }
    let (_, snap, recs) = many(60_000, 2000, true);
    let rec = Arc::new(Recorder::default());
    let asked = |r: &Recorder| -> u64 { r.0.lock().unwrap().iter().map(|x| x.end - x.start).sum() };
    let s = Snapshot::open_paged(&snap[..], rec.clone()).unwrap();
    let at_open = asked(&rec);
    // The header, the CRC table and the blocks holding the small sections.
    assert!(
        at_open <= 3 * 65536 + 4096,
        "open asked for {at_open} of {} bytes",
        snap.len()
    );
    let _ = (s.chunk(29).unwrap(), s.class_counts(29).unwrap());
    let id = s.lookup(&recs[31_337].0).unwrap().unwrap();
    assert_eq!(id, 31_337);
    let e = s.sample(id).unwrap();
    assert_eq!(e.orig_len, recs[31_337].1.len() as u64);
    let used = asked(&rec) - at_open;
    assert!(
        used <= 6 * 65536,
        "a lookup and a read asked for {used} bytes"
    );
    assert!((snap.len() as u64) > 10 * 65536);
    // Each block is asked for once.
    let _ = s.lookup(&recs[31_337].0).unwrap();
    assert_eq!(asked(&rec) - at_open, used);
}

#[test]
fn the_content_digest_names_the_content() {
    let (_, snap) = small();
    let s = Snapshot::open(&snap[..]).unwrap();
    assert!(s.check_digest().is_ok());
    assert_eq!(s.content_digest(), crate::ContentDigest::of_file(&snap));
    // Any byte of the body changed (and every CRC made right again) changes the digest.
    let mut other = snap.clone();
    let last = s.header().body_end as usize - 1;
    other[last] ^= 1;
    reseal(&mut other);
    let o = Snapshot::open(&other[..]).unwrap();
    assert_ne!(o.content_digest(), s.content_digest());
    // A header whose digest is wrong (its CRC made right) opens, and `verify` says so.
    let mut wrong = snap.clone();
    wrong[56] ^= 1;
    let crc = crc32fast::hash(&wrong[..92]);
    wrong[92..96].copy_from_slice(&crc.to_le_bytes());
    let w = Snapshot::open(&wrong[..]).unwrap();
    let e = w.check_digest().unwrap_err().to_string();
    assert!(e.contains("content digest"), "{e}");
    assert!(w
        .check_blocks()
        .iter()
        .any(|e| e.to_string().contains("digest")));
}

#[test]
fn a_lineage_names_its_parent_by_digest() {
    for (generation, parent, ok) in [
        (0, [0u8; 16], true),
        (0, [1u8; 16], false),
        (1, [0u8; 16], true),
        (3, [0xab; 16], true),
    ] {
        let l = Lineage { generation, parent };
        assert_eq!(Lineage::decode(&l.encode()).is_ok(), ok, "{l:?}");
    }
}

#[test]
fn a_record_ends_at_its_chunks_records_end() {
    let (_, snap) = small();
    let s = Snapshot::open(&snap[..]).unwrap();
    assert_eq!(s.chunk(0).unwrap().samples(), 0..2);
    let first = s.sample(0).unwrap();
    assert!(first.offset + first.stored_len > 64);
    drop(s);
    // Chunk 0's records said to end at 64: its first record, which ends where the second
    // starts, lies past that end.
    let mut b = snap.clone();
    let at = section_of(&snap, SectionKind::Chunks).start + 16;
    b[at..at + 8].copy_from_slice(&64u64.to_le_bytes());
    reseal(&mut b);
    let s = Snapshot::open(&b[..]).unwrap();
    let e = s.sample(0).unwrap_err().to_string();
    assert!(e.contains("records_end 64"), "{e}");
}

#[test]
fn padding_inside_sections_is_zero() {
    // 301 samples: the id table (4 bytes each) is followed by 4 bytes of padding.
    let (_, snap, _) = many(301, 100, false);
    let s = Snapshot::open(&snap[..]).unwrap();
    let pad = s.ns.idtab.end..s.ns.area.start;
    assert_eq!(pad.len(), 4);
    assert!(s.check_blocks().is_empty());
    drop(s);
    let mut b = snap.clone();
    b[pad.start + 1] = 1;
    reseal(&mut b);
    let e = err_of(&b);
    assert!(e.contains("padding") && e.contains("not zero"), "{e}");
}

/// A dataset with fields: key `x` (field `jpg`) and key `DIR/y` (field `txt`).
fn field_files_beside(dir: &[u8]) -> Result<Vec<u8>> {
    let mut b = SnapshotBuilder::new(ID, vec![]);
    let mut w = ChunkWriter::with_fields(Vec::new(), ID, 0).unwrap();
    let f = |name: &'static [u8]| (name, &b"v"[..], crate::crc32(b"v"));
    w.append_group(b"x", &[f(b"jpg")], NO_LABEL).unwrap();
    w.append_group(&[dir, b"/y"].concat(), &[f(b"txt")], NO_LABEL)
        .unwrap();
    b.push_chunk(&w.finish::<&[u8]>(&[]).unwrap().1)?;
    b.build()
}

#[test]
fn a_directory_is_never_a_field_file() {
    // The directory x.jpg would be listed beside the file x.jpg of key x.
    let e = field_files_beside(b"x.jpg").unwrap_err().to_string();
    assert!(e.contains("both a directory and the file of key x"), "{e}");
    // x.png names no field of x; x.jpf none either, until a hostile writer renames it.
    assert!(field_files_beside(b"x.png").is_ok());
    let snap = field_files_beside(b"x.jpf").unwrap();
    assert_eq!(err_of(&snap), "");
    let at = snap.windows(4).position(|w| w == b".jpf").unwrap();
    let mut b = snap.clone();
    b[at + 3] = b'g';
    reseal(&mut b);
    let e = err_of(&b);
    assert!(
        e.contains("x.jpg: a directory and a sample's field file"),
        "{e}"
    );
}

#[test]
fn an_empty_chunk_has_nothing_to_count() {
    let (_, snap) = build(
        &[vec![], vec![(b"a".to_vec(), b"x".to_vec(), NO_LABEL)]],
        &[],
    );
    assert_eq!(err_of(&snap), "");
    let table = section_of(&snap, SectionKind::Chunks).start;
    // Chunk 0 is empty: records ending past 64, original bytes or compressed records are lies.
    for (at, v) in [(16, 65u64), (24, 1), (32, 1)] {
        let mut b = snap.clone();
        b[table + at] = v as u8;
        reseal(&mut b);
        let e = err_of(&b);
        assert!(e.contains("chunk 0: samples from 0 to 0"), "{at}: {e}");
    }
}

/// The snapshot of `snap`'s chunks as the next generation with `deleted` (id, generation).
fn with_deletions(snap: &Snapshot<Vec<u8>>, deleted: Vec<(u64, u32)>) -> Result<Vec<u8>> {
    let classes = (0..snap.class_count())
        .map(|c| snap.class_name(c as u32).map(<[u8]>::to_vec))
        .collect::<Result<Vec<_>>>()?;
    let mut b = SnapshotBuilder::new(snap.dataset_id(), classes);
    b.deletions(deleted)?;
    for c in 0..snap.chunk_count() {
        b.push_chunk(&snap.chunk_summary(c)?)?;
    }
    let dirs = snap.dirs()?.into_iter();
    b.push_dirs(dirs.map(|d| (d.path, d.attrs.unwrap_or(FileAttrs::DIR_DEFAULT))))?;
    b.lineage(Lineage {
        generation: snap.lineage().generation + 1,
        parent: snap.content_digest(),
    });
    b.build()
}

#[test]
fn deleted_samples_keep_their_ids_but_have_no_path_sums_or_counts() {
    let (_, bytes) = small();
    let s0 = Snapshot::open(bytes).unwrap();
    let s1 = Snapshot::open(with_deletions(&s0, vec![(0, 1)]).unwrap()).unwrap();
    assert!(s1.header().has_deletions());
    assert_eq!((s1.sample_count(), s1.live_count()), (3, 2));
    assert_eq!(s1.deleted().as_ref(), &[0]);
    assert_eq!((s1.deleted_by(0), s1.deleted_by(1)), (Some(1), None));
    assert_eq!(s1.lookup(b"cat/1.jpg").unwrap(), None);
    assert_eq!(s1.lookup(b"cat/2.jpg").unwrap(), Some(2));
    for e in [s1.sample(0).unwrap_err(), s1.path(0).unwrap_err()] {
        assert!(e.to_string().contains("sample 0 was deleted"), "{e}");
    }
    assert_eq!(s1.sample(1).unwrap(), s0.sample(1).unwrap());
    // Chunk 0's sums and class counts are its one remaining sample's (dog/\xff.jpg, empty).
    assert_eq!(s1.chunk(0).unwrap().orig_bytes, 0);
    assert_eq!(s1.class_counts(0).unwrap(), vec![(1, 1)]);
    assert_eq!(s1.entry_count(), s0.entry_count() - 1);
    assert!(s1.check_structure(10).is_empty());
    assert!(s1.check_blocks().is_empty());
    // One walk of the namespace gives what a lookup per sample gives.
    let each: Vec<_> = (0..s1.chunk_count())
        .map(|c| s1.chunk_summary(c).unwrap())
        .collect();
    assert_eq!(s1.chunk_summaries().unwrap(), each);
    // A second deletion keeps the first's generation; the digests differ.
    let s2 = Snapshot::open(with_deletions(&s1, vec![(0, 1), (2, 2)]).unwrap()).unwrap();
    assert_eq!((s2.deleted_by(0), s2.deleted_by(2)), (Some(1), Some(2)));
    assert_eq!(s2.live_count(), 1);
    assert_ne!(s2.content_digest(), s1.content_digest());
    assert!(s2.dirs().unwrap().iter().any(|d| d.path == b"cat"));
}

#[test]
fn hostile_deletions_are_refused_at_open() {
    let (_, bytes) = small();
    let s0 = Snapshot::open(bytes).unwrap();
    // A deletion by a generation the snapshot has not reached, an id past N, ids not rising.
    for bad in [vec![(0, 2)], vec![(3, 1)], vec![(1, 1), (1, 1)]] {
        match with_deletions(&s0, bad.clone()) {
            Err(_) => {}
            Ok(b) => assert!(Snapshot::open(b).is_err(), "{bad:?}"),
        }
    }
    // Without its section, or the bit without the section: refused, never read as no deletion.
    let s1 = with_deletions(&s0, vec![(0, 1)]).unwrap();
    let e = err_of(&with_header(&s1, |h| h.incompat &= !features::DELETIONS));
    assert!(e.contains("without its feature bit"), "{e}");
}
