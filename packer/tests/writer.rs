//! The writer API: samples from memory to a dataset, mixed across chunks, resumable, sharded.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use granary_format::{
    check_chunk, chunk_file_name, decode_record, Snapshot, NO_LABEL, SNAPSHOT_FILE,
};
use granary_packer::{merge, CompressMode, Label, ShardSpec, Writer, WriterOptions, Written};

/// path -> (bytes, class name)
type Samples = BTreeMap<Vec<u8>, (Vec<u8>, Option<Vec<u8>>)>;

/// Every sample of the dataset at `ds`, after checking every chunk.
fn read_all(ds: &Path) -> Samples {
    let snap = Snapshot::open(std::fs::read(ds.join(SNAPSHOT_FILE)).unwrap()).unwrap();
    assert!(snap.check_blocks().is_empty());
    let mut out = BTreeMap::new();
    for c in 0..snap.chunk_count() {
        let ce = snap.chunk(c).unwrap();
        let bytes = std::fs::read(ds.join(chunk_file_name(c as u32))).unwrap();
        assert_eq!(bytes.len() as u64, ce.file_size);
        let check = check_chunk(&bytes, &snap.dataset_id(), c as u32).unwrap();
        assert!(check.bad_records.is_empty());
        for id in ce.samples() {
            let e = snap.sample(id).unwrap();
            let stored = &bytes[e.offset as usize..(e.offset + e.stored_len) as usize];
            let data = decode_record(&e, stored).unwrap().into_owned();
            let class = (e.label != NO_LABEL).then(|| snap.class_name(e.label).unwrap().to_vec());
            out.insert(snap.path(id).unwrap().to_vec(), (data, class));
        }
    }
    out
}

fn sample(i: u32) -> Vec<u8> {
    // Compressible text for some, incompressible-looking bytes for others.
    if i.is_multiple_of(3) {
        format!("sample {i} ")
            .repeat(50 + (i % 7) as usize)
            .into_bytes()
    } else {
        let mut r = granary_format::SplitMix64::new(i as u64);
        (0..(200 + i % 500)).map(|_| r.next_u64() as u8).collect()
    }
}

fn opts(out: &Path) -> WriterOptions {
    let mut o = WriterOptions::new(out);
    o.output.chunk_size = 16 << 10;
    o.buckets = 8;
    o.threads = 2;
    // Some samples held in memory, most in the spill logs: both paths every time.
    o.memory = 64 << 10;
    o
}

/// [`opts`] for a writer told to expect `n` samples (written straight into chunks).
fn expecting(out: &Path, n: u64) -> WriterOptions {
    let mut o = opts(out);
    o.expected = Some(n);
    o
}

#[test]
fn a_class_sorted_stream_becomes_class_mixed_chunks_byte_exact() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("ds.granary");
    let mut w = Writer::create(opts(&out)).unwrap();
    // 10 classes of 100 samples each, in class order (as an ImageFolder walk gives them).
    for i in 0..1000u32 {
        let class = format!("class{:02}", i / 100);
        let key = format!("{class}/{i:05}.bin");
        assert_eq!(
            w.write(key.as_bytes(), sample(i), Label::Name(class.as_bytes()))
                .unwrap(),
            Written::New
        );
    }
    let s = w.finish().unwrap();
    assert_eq!(s.files, 1000);
    assert_eq!(s.classes, 10);
    assert!(s.chunks > 10, "{} chunks", s.chunks);
    assert!(
        !t.path().join(".ds.granary.spill").exists(),
        "spill logs removed"
    );
    assert!(!t.path().join(".ds.granary.partial").exists());
    let all = read_all(&out);
    assert_eq!(all.len(), 1000);
    for i in 0..1000u32 {
        let class = format!("class{:02}", i / 100);
        let (data, c) = &all[format!("{class}/{i:05}.bin").as_bytes()];
        assert_eq!(*data, sample(i));
        assert_eq!(c.as_deref(), Some(class.as_bytes()));
    }
    // Mixing: with 10 sorted classes, a chunk of a contiguous run would hold 1-2 classes.
    let snap = Snapshot::open(std::fs::read(out.join(SNAPSHOT_FILE)).unwrap()).unwrap();
    let mut classes_per_chunk = Vec::new();
    for c in 0..snap.chunk_count() {
        let ce = snap.chunk(c).unwrap();
        let labels: BTreeSet<u32> = ce
            .samples()
            .map(|id| snap.sample(id).unwrap().label)
            .collect();
        if ce.sample_count >= 20 {
            classes_per_chunk.push(labels.len());
        }
    }
    assert!(!classes_per_chunk.is_empty());
    assert!(
        classes_per_chunk.iter().all(|&n| n >= 6),
        "classes per chunk: {classes_per_chunk:?}"
    );
}

#[test]
fn the_layout_is_a_function_of_the_samples_and_the_seed() {
    let t = tempfile::tempdir().unwrap();
    let mut digests = Vec::new();
    for (name, reverse) in [("a", false), ("b", true)] {
        let out = t.path().join(name);
        let mut o = opts(&out);
        o.output.compress = CompressMode::None;
        let mut w = Writer::create(o).unwrap();
        let mut ids: Vec<u32> = (0..300).collect();
        if reverse {
            ids.reverse();
        }
        for i in ids {
            w.write(format!("k{i}").as_bytes(), sample(i), Label::Index(i % 4))
                .unwrap();
        }
        w.finish().unwrap();
        let snap = Snapshot::open(std::fs::read(out.join(SNAPSHOT_FILE)).unwrap()).unwrap();
        let paths: Vec<Vec<u8>> = (0..snap.sample_count())
            .map(|i| snap.path(i).unwrap().to_vec())
            .collect();
        let classes: Vec<Vec<u8>> = (0..snap.class_count() as u32)
            .map(|l| snap.class_name(l).unwrap().to_vec())
            .collect();
        assert_eq!(
            classes,
            vec![b"0".to_vec(), b"1".to_vec(), b"2".to_vec(), b"3".to_vec()]
        );
        digests.push(paths);
    }
    assert_eq!(
        digests[0], digests[1],
        "the same samples in another order give the same chunks"
    );
}

#[test]
fn bad_keys_labels_and_duplicates_are_refused_and_lose_nothing() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("ds");
    let mut w = Writer::create(opts(&out)).unwrap();
    w.write(b"ok/1", b"one".to_vec(), Label::None).unwrap();
    for bad in [
        &b"/abs"[..],
        b"a//b",
        b"a/../b",
        b"..",
        b"",
        b"a/./b",
        b"a/",
        b"nul\0",
    ] {
        let e = w
            .write(bad, b"x".to_vec(), Label::None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a valid path"), "{bad:?}: {e}");
    }
    let e = w
        .write(b"ok/1", b"again".to_vec(), Label::None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("written twice"), "{e}");
    w.write(b"ok/2", b"two".to_vec(), Label::Index(3)).unwrap();
    let e = w
        .write(b"ok/3", b"3".to_vec(), Label::Name(b"cat"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("mixed"), "{e}");
    let s = w.finish().unwrap();
    assert_eq!(s.files, 2);
    let all = read_all(&out);
    assert_eq!(all[&b"ok/1"[..]].0, b"one");
    assert_eq!(all[&b"ok/2"[..]].1.as_deref(), Some(&b"3"[..]));
    // The dataset exists now: a second writer needs force.
    let e = Writer::create(opts(&out)).unwrap_err().to_string();
    assert!(e.contains("already exists"), "{e}");
    // Labels against a given class table.
    let mut o = opts(&t.path().join("c"));
    o.classes = Some(vec![b"cat".to_vec(), b"dog".to_vec()]);
    let mut w = Writer::create(o).unwrap();
    assert!(w.write(b"x", vec![1], Label::Name(b"cow")).is_err());
    assert!(w.write(b"y", vec![1], Label::Index(2)).is_err());
    w.write(b"z", vec![1], Label::Name(b"dog")).unwrap();
    assert_eq!(w.finish().unwrap().classes, 2);
    // Nothing written: nothing published.
    let w = Writer::create(opts(&t.path().join("empty"))).unwrap();
    assert!(w.finish().unwrap_err().to_string().contains("no samples"));
    assert!(!t.path().join("empty").exists());
    assert!(!t.path().join(".empty.spill").exists());
}

#[test]
fn an_interrupted_writer_resumes_skipping_what_it_had() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("ds");
    let mut w = Writer::create(opts(&out)).unwrap();
    for i in 0..400u32 {
        w.write(format!("s/{i}").as_bytes(), sample(i), Label::None)
            .unwrap();
    }
    drop(w); // stopped without finishing: the logs stay
    assert!(!out.exists());
    // A crash mid-record: the last bytes of one log are cut.
    let spill = t.path().join(".ds.spill");
    let log = spill.join("spill-0003.log");
    let len = std::fs::metadata(&log).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&log).unwrap();
    f.set_len(len - 5).unwrap();
    drop(f);
    let e = Writer::create(opts(&out)).unwrap_err().to_string();
    assert!(e.contains("pass resume"), "{e}");
    let mut o = opts(&out);
    o.output.resume = true;
    o.output.seed = 9;
    let e = Writer::create(o).unwrap_err().to_string();
    assert!(e.contains("other settings"), "{e}");
    let mut o = opts(&out);
    o.output.resume = true;
    let mut w = Writer::create(o).unwrap();
    assert!(
        w.warnings().iter().any(|m| m.contains("spill-0003.log")),
        "{:?}",
        w.warnings()
    );
    assert_eq!(w.len(), 399);
    let (mut new, mut old) = (0, 0);
    for i in 0..500u32 {
        match w
            .write(format!("s/{i}").as_bytes(), sample(i), Label::None)
            .unwrap()
        {
            Written::New => new += 1,
            Written::Resumed => old += 1,
        }
    }
    assert_eq!((new, old), (101, 399));
    let e = w
        .write(b"s/7", sample(7), Label::None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("twice"), "{e}");
    let s = w.finish().unwrap();
    assert_eq!(s.files, 500);
    let all = read_all(&out);
    assert_eq!(all.len(), 500);
    for i in 0..500u32 {
        assert_eq!(all[format!("s/{i}").as_bytes()].0, sample(i));
    }
    assert!(!spill.exists());
}

#[test]
fn a_resumed_key_with_other_bytes_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("ds");
    let mut w = Writer::create(opts(&out)).unwrap();
    w.write(b"a", b"first".to_vec(), Label::None).unwrap();
    drop(w);
    let mut o = opts(&out);
    o.output.resume = true;
    let mut w = Writer::create(o).unwrap();
    assert!(w.has_resumed(b"a"));
    let e = w
        .write(b"a", b"other".to_vec(), Label::None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("other bytes"), "{e}");
}

#[test]
fn shards_written_apart_merge_into_one_dataset() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("ds");
    let classes = vec![b"even".to_vec(), b"odd".to_vec()];
    for i in 0..3u32 {
        let mut o = opts(&out);
        o.output.shard = Some(ShardSpec::parse(&format!("{i}/3")).unwrap());
        o.classes = Some(classes.clone());
        let mut w = Writer::create(o).unwrap();
        for k in (0..600u32).filter(|k| k % 3 == i) {
            let class: &[u8] = if k % 2 == 0 { b"even" } else { b"odd" };
            w.write(format!("p{k}").as_bytes(), sample(k), Label::Name(class))
                .unwrap();
        }
        let s = w.finish().unwrap();
        assert_eq!(s.action, "shard");
        assert_eq!(s.files, 200);
    }
    // A shard with labels but no class table is refused.
    let mut o = opts(&t.path().join("other"));
    o.output.shard = Some(ShardSpec::parse("0/2").unwrap());
    let mut w = Writer::create(o).unwrap();
    assert!(w
        .write(b"k", vec![1], Label::Index(0))
        .unwrap_err()
        .to_string()
        .contains("class table"));
    let m = merge(&out).unwrap();
    assert_eq!(m.files, 600);
    let all = read_all(&out);
    assert_eq!(all.len(), 600);
    for k in 0..600u32 {
        let (data, class) = &all[format!("p{k}").as_bytes()];
        assert_eq!(*data, sample(k));
        assert_eq!(
            class.as_deref(),
            Some(if k % 2 == 0 { &b"even"[..] } else { b"odd" })
        );
    }
}

#[test]
fn a_log_larger_than_the_memory_budget_is_read_record_by_record() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("ds");
    let mut o = opts(&out);
    o.gather_memory = 1000;
    o.memory = 0;
    o.buckets = 2;
    let mut w = Writer::create(o).unwrap();
    for i in 0..200u32 {
        w.write(format!("{i}").as_bytes(), sample(i), Label::None)
            .unwrap();
    }
    w.finish().unwrap();
    let all = read_all(&out);
    assert_eq!(all.len(), 200);
    for i in 0..200u32 {
        assert_eq!(all[format!("{i}").as_bytes()].0, sample(i));
    }
}

#[test]
fn samples_with_named_fields_are_field_groups_readable_field_by_field() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("ds");
    let mut w = Writer::create(opts(&out)).unwrap();
    let sample_fields = |i: u32| {
        let mut f = vec![
            (b"jpg".to_vec(), sample(i)),
            (b"txt".to_vec(), format!("a caption for {i}").into_bytes()),
        ];
        if i.is_multiple_of(2) {
            f.push((b"json".to_vec(), format!("{{\"i\": {i}}}").into_bytes()));
        }
        if i.is_multiple_of(5) {
            f.push((b"empty".to_vec(), Vec::new()));
        }
        f
    };
    for i in 0..300u32 {
        let key = format!("shard{}/s{i:04}", i % 3);
        w.write_fields(key.as_bytes(), sample_fields(i), Label::Index(i % 7))
            .unwrap();
    }
    // Bad input: a blob among field samples, a dotted key, bad or repeated names, no fields.
    let e = w
        .write(b"blob", vec![1], Label::None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("all have named fields or none"), "{e}");
    let e = w
        .write_fields(b"k.v1", vec![(b"jpg".to_vec(), vec![1])], Label::None)
        .unwrap_err();
    assert!(e.to_string().contains("no '.'"), "{e}");
    for name in [&b"a/b"[..], b"", b".x", b"sp ace"] {
        let e = w
            .write_fields(b"k", vec![(name.to_vec(), vec![1])], Label::None)
            .unwrap_err();
        assert!(
            e.to_string().contains("not a valid field name"),
            "{name:?}: {e}"
        );
    }
    let twice = vec![(b"a".to_vec(), vec![1]), (b"a".to_vec(), vec![2])];
    assert!(w
        .write_fields(b"k", twice, Label::None)
        .unwrap_err()
        .to_string()
        .contains("twice"));
    assert!(w
        .write_fields(b"k", vec![], Label::None)
        .unwrap_err()
        .to_string()
        .contains("no fields"));
    let s = w.finish().unwrap();
    assert_eq!(s.files, 300);

    let snap = Snapshot::open(std::fs::read(out.join(SNAPSHOT_FILE)).unwrap()).unwrap();
    assert_eq!(snap.version(), (2, 0));
    assert!(snap.has_fields());
    assert!(snap.check_blocks().is_empty());
    assert_eq!(snap.check_structure(10), vec![]);
    assert_eq!(
        snap.field_names().unwrap(),
        vec![&b"empty"[..], b"jpg", b"json", b"txt"]
    );
    let mut seen = 0;
    for c in 0..snap.chunk_count() {
        let ce = snap.chunk(c).unwrap();
        let bytes = std::fs::read(out.join(chunk_file_name(c as u32))).unwrap();
        let check = check_chunk(&bytes, &snap.dataset_id(), c as u32).unwrap();
        assert!(check.bad_records.is_empty());
        assert!(check.footer.fields.is_some());
        for id in ce.samples() {
            let e = snap.sample(id).unwrap();
            assert!(e.has_fields());
            let record = &bytes[e.offset as usize..(e.offset + e.stored_len) as usize];
            // The record is the fields' bytes back to back, checked as a whole by its CRC.
            assert_eq!(decode_record(&e, record).unwrap().len() as u64, e.orig_len);
            let path = String::from_utf8(snap.path(id).unwrap().to_vec()).unwrap();
            let i: u32 = path.rsplit("/s").next().unwrap().parse().unwrap();
            let want = sample_fields(i);
            let fields = snap.fields(id).unwrap();
            assert_eq!(fields.len(), want.len());
            for (f, (name, data)) in fields.iter().zip(&want) {
                assert_eq!(f.name, &name[..]);
                let got = &record[f.offset as usize..(f.offset + f.len) as usize];
                assert_eq!(got, &data[..]);
                assert_eq!(f.crc32, crc32fast::hash(data));
            }
            assert_eq!(e.label, i % 7);
            seen += 1;
        }
    }
    assert_eq!(seen, 300);
}

#[test]
fn a_resumed_writer_of_field_samples_keeps_them_fields() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("ds");
    let f = |i: u32| {
        vec![
            (b"bin".to_vec(), sample(i)),
            (b"cls".to_vec(), format!("{}", i % 2).into_bytes()),
        ]
    };
    let mut w = Writer::create(opts(&out)).unwrap();
    for i in 0..50u32 {
        w.write_fields(format!("k{i}").as_bytes(), f(i), Label::None)
            .unwrap();
    }
    drop(w);
    let mut o = opts(&out);
    o.output.resume = true;
    let mut w = Writer::create(o).unwrap();
    assert!(
        w.write(b"blob", vec![1], Label::None).is_err(),
        "still a dataset of fields"
    );
    for i in 0..80u32 {
        w.write_fields(format!("k{i}").as_bytes(), f(i), Label::None)
            .unwrap();
    }
    assert_eq!(w.resumed(), 50);
    w.finish().unwrap();
    let snap = Snapshot::open(std::fs::read(out.join(SNAPSHOT_FILE)).unwrap()).unwrap();
    assert_eq!(snap.sample_count(), 80);
    assert!(snap.check_structure(10).is_empty());
}

#[test]
fn a_dataset_held_in_memory_is_the_same_as_one_spilled() {
    let t = tempfile::tempdir().unwrap();
    let mut layouts = Vec::new();
    for (name, memory) in [("mem", 1u64 << 30), ("disk", 0)] {
        let out = t.path().join(name);
        let mut o = opts(&out);
        o.memory = memory;
        let mut w = Writer::create(o).unwrap();
        for i in 0..400u32 {
            w.write(format!("k{i}").as_bytes(), sample(i), Label::Index(i % 3))
                .unwrap();
        }
        w.finish().unwrap();
        let snap = Snapshot::open(std::fs::read(out.join(SNAPSHOT_FILE)).unwrap()).unwrap();
        let paths: Vec<Vec<u8>> = (0..snap.sample_count())
            .map(|i| snap.path(i).unwrap().to_vec())
            .collect();
        layouts.push((paths, read_all(&out)));
    }
    assert_eq!(layouts[0], layouts[1]);
}

/// Writes samples 0..n (10 classes in class order, labels by name) and returns the summary.
fn write_sorted(o: WriterOptions, n: u32) -> granary_packer::PackSummary {
    let mut w = Writer::create(o).unwrap();
    for i in 0..n {
        let class = format!("class{:02}", i * 10 / n);
        let key = format!("{class}/{i:05}.bin");
        w.write(key.as_bytes(), sample(i), Label::Name(class.as_bytes()))
            .unwrap();
    }
    w.finish().unwrap()
}

/// With the expected count, samples go straight into chunks: the same samples and labels,
/// chunks of about the chunk size, each a mix of the classes of a class-sorted stream, and no
/// spill log on the way.
#[test]
fn an_expected_count_writes_straight_into_mixed_chunks() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("ds.granary");
    let o = expecting(&out, 1000);
    let s = write_sorted(o, 1000);
    assert_eq!((s.files, s.classes), (1000, 10));
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
    assert!(!t.path().join(".ds.granary.spill").exists());
    let all = read_all(&out);
    assert_eq!(all.len(), 1000);
    for i in 0..1000u32 {
        let class = format!("class{:02}", i / 100);
        let (data, c) = &all[format!("{class}/{i:05}.bin").as_bytes()];
        assert_eq!(*data, sample(i));
        assert_eq!(c.as_deref(), Some(class.as_bytes()), "sample {i}");
    }
    let snap = Snapshot::open(std::fs::read(out.join(SNAPSHOT_FILE)).unwrap()).unwrap();
    // 1000 samples of ~500 bytes on average in 16 KiB chunks: about 31 chunks.
    let n = snap.chunk_count();
    assert!((20..=45).contains(&n), "{n} chunks");
    for c in 0..n {
        let ce = snap.chunk(c).unwrap();
        let labels: BTreeSet<u32> = ce
            .samples()
            .map(|id| snap.sample(id).unwrap().label)
            .collect();
        assert!(labels.len() >= 6, "chunk {c}: classes {labels:?}");
        assert!(
            ce.file_size < 3 * (16 << 10),
            "chunk {c}: {} bytes",
            ce.file_size
        );
    }
}

/// Named fields, a count far too low (a warning, larger chunks, every sample there), fewer
/// samples than it takes to size the chunks, and resume refused with the reason.
#[test]
fn an_expected_count_far_off_still_writes_every_sample() {
    let t = tempfile::tempdir().unwrap();
    // Far too low: 100 expected, 1000 written.
    let out = t.path().join("low");
    let o = expecting(&out, 100);
    let s = write_sorted(o, 1000);
    assert_eq!(s.files, 1000);
    assert!(
        s.warnings.iter().any(|w| w.contains("were expected")),
        "{:?}",
        s.warnings
    );
    assert_eq!(read_all(&out).len(), 1000);
    // Far too high: fewer samples than slots; empty slots make no chunk.
    let out = t.path().join("high");
    let o = expecting(&out, 1_000_000);
    let s = write_sorted(o, 50);
    assert!(s.chunks <= 50, "{} chunks", s.chunks);
    let all = read_all(&out);
    assert_eq!(all.len(), 50);
    // Named fields go straight in too.
    let out = t.path().join("fields");
    let o = expecting(&out, 200);
    let mut w = Writer::create(o).unwrap();
    for i in 0..200u32 {
        let fields = vec![
            (b"jpg".to_vec(), sample(i)),
            (b"txt".to_vec(), format!("caption {i}").into_bytes()),
        ];
        w.write_fields(format!("s/{i:04}").as_bytes(), fields, Label::Index(i % 3))
            .unwrap();
    }
    assert_eq!(w.finish().unwrap().files, 200);
    let all = read_all(&out);
    assert_eq!(all.len(), 200);
    let (data, class) = &all[&b"s/0007"[..]];
    assert_eq!(data[..], [sample(7), b"caption 7".to_vec()].concat()[..]);
    assert_eq!(class.as_deref(), Some(&b"1"[..]));
    // Nothing to resume from: refused, saying why; a zero count too.
    let mut o = expecting(&t.path().join("r"), 10);
    o.output.resume = true;
    let e = Writer::create(o).unwrap_err().to_string();
    assert!(e.contains("nothing to resume"), "{e}");
    let o = expecting(&t.path().join("z"), 0);
    assert!(Writer::create(o)
        .unwrap_err()
        .to_string()
        .contains("at least 1"));
}

/// A writer with an expected count stopped without finishing leaves no chunk behind, and the
/// next writer of the same dataset starts over without being told to.
#[test]
fn an_unfinished_writer_with_an_expected_count_leaves_nothing() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("ds");
    let o = expecting(&out, 300);
    let mut w = Writer::create(o.clone()).unwrap();
    for i in 0..300u32 {
        w.write(format!("s/{i}").as_bytes(), sample(i), Label::None)
            .unwrap();
    }
    drop(w);
    assert!(!out.exists());
    let partial = t.path().join(".ds.partial");
    let left: Vec<_> = std::fs::read_dir(&partial)
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left behind: {left:?}");
    let s = write_sorted(o, 300);
    assert_eq!(s.files, 300);
    assert_eq!(read_all(&out).len(), 300);
}
