//! Golden files. Format 2.0: datasets committed under tests/golden/v2*/dataset, written once
//! by the ignored `write_golden_v2*` tests below; every later granary must read them exactly.
//! Format 1.x (granary 0.1): the datasets under tests/golden/v1*/dataset, which granary now
//! refuses to read with a message naming `granary upgrade`, and which `upgrade` turns into 2.0
//! datasets that read exactly as the 1.x ones did (what these tests check, on copies).

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::common::*;

/// A copy of the 1.x golden dataset in `dir`, checked to be refused by name, then upgraded.
fn upgraded(dir: &Path) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let ds = tmp.path().join("dataset");
    copy_dir(&dir.join("dataset"), &ds);
    let o = run(["info".as_ref(), ds.as_os_str()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("granary upgrade"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("reindex"), "no damage: {}", stderr(&o));
    run_ok(["upgrade".as_ref(), ds.as_os_str()]);
    assert!(ds.join(granary_packer::LEGACY_SNAPSHOT_FILE).is_file());
    let o = run_ok(["upgrade".as_ref(), ds.as_os_str()]);
    assert!(stdout(&o).contains("nothing to do"), "{}", stdout(&o));
    (tmp, ds)
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v1")
}

/// The source tree the golden dataset was packed from.
fn golden_source() -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut v = Vec::new();
    for i in 0..24u64 {
        let class = ["apple", "banana", "cherry"][(i % 3) as usize];
        let data = match i % 4 {
            0 => format!("golden text record {i}\n").repeat(30).into_bytes(),
            1 => bytes(i, 500 + i as usize * 40),
            2 => [&b"\x89PNG\r\n\x1a\n"[..], &bytes(i, 300)].concat(),
            _ => bytes(1000 + i, 3000),
        };
        v.push((format!("{class}/{i:03}.bin").into_bytes(), data));
    }
    v.push((b"apple/empty".to_vec(), Vec::new()));
    v.push((
        b"banana/caf\xe9-\xff.raw".to_vec(),
        b"latin-1 name".to_vec(),
    ));
    v.push((b"unlabelled.txt".to_vec(), b"at the root".to_vec()));
    v
}

/// Packs `src` into golden dataset `out` as every golden version was packed (8 KiB chunks,
/// seed 1): several chunks, with zstd and raw records.
fn pack_golden(src: &Path, out: &Path) {
    pack_golden_with(src, out, &[]);
}

/// [`pack_golden`] with `extra` arguments.
fn pack_golden_with(src: &Path, out: &Path, extra: &[&str]) {
    let o = pack(
        src,
        out,
        &[&["--chunk-size", "8KiB", "--seed", "1"], extra].concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn upgrades_golden_v1() {
    let (_tmp, ds_path) = upgraded(&golden_dir());
    let ds = granary::Dataset::open_checked(&ds_path).expect("upgraded golden v1 dataset opens");
    assert_eq!(ds.snapshot().version(), (2, 0));
    let want = golden_source();
    assert_eq!(ds.len(), want.len() as u64);
    assert!(ds.chunk_count() >= 3);
    let classes: Vec<&[u8]> = ds.classes().unwrap();
    assert_eq!(classes, vec![&b"apple"[..], b"banana", b"cherry"]);
    let mut compressed = 0;
    for (path, data) in &want {
        let id = ds.lookup(path).unwrap().expect("golden path present");
        assert_eq!(
            &ds.read(id).unwrap(),
            data,
            "{}",
            String::from_utf8_lossy(path)
        );
        let s = ds.sample(id).unwrap();
        compressed += (s.compression == granary::Compression::Zstd) as u32;
        let label = match path.iter().position(|&b| b == b'/') {
            Some(i) => classes.iter().position(|c| *c == &path[..i]).unwrap() as u32,
            None => granary::NO_LABEL,
        };
        assert_eq!(s.entry.label, label);
    }
    assert!(compressed >= 6, "golden set must exercise zstd records");
    let r = granary::verify(&ds_path);
    assert!(r.is_clean(), "{:?}", r.problems);
    // The binary reads it too, byte-exact.
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    assert_eq!(extracted(&ds_path, &out), sorted(want));
}

fn golden_dir_1_1() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v1.1")
}

/// The files appended to the v1 golden dataset to make the 1.1 one (generation 1).
fn golden_appended() -> Vec<(Vec<u8>, Vec<u8>)> {
    (0..6u64)
        .map(|i| {
            let class = ["apple", "cherry"][(i % 2) as usize];
            let data = match i % 2 {
                0 => format!("appended record {i}\n").repeat(40).into_bytes(),
                _ => bytes(2000 + i, 900),
            };
            (format!("{class}/appended-{i}.bin").into_bytes(), data)
        })
        .collect()
}

#[test]
fn upgrades_golden_v1_1() {
    let (_tmp, ds_path) = upgraded(&golden_dir_1_1());
    let ds = granary::Dataset::open_checked(&ds_path).expect("upgraded golden v1.1 opens");
    let (_tmp1, v1_path) = upgraded(&golden_dir());
    let v1 = granary::Dataset::open_checked(&v1_path).unwrap();
    let lineage = ds.snapshot().lineage();
    assert_eq!(lineage.generation, 1);
    // 1.x named a parent by a header CRC, which 2.0 does not record: the parent is unknown.
    assert!(!lineage.has_parent(), "{lineage:?}");
    // Generation 1 keeps every chunk and sample id of generation 0.
    for c in 0..v1.chunk_count() {
        assert_eq!(
            v1.snapshot().chunk(c).unwrap(),
            ds.snapshot().chunk(c).unwrap()
        );
    }
    let mut want = golden_source();
    want.extend(golden_appended());
    assert_eq!(ds.len(), want.len() as u64);
    for (path, data) in &want {
        let id = ds.lookup(path).unwrap().expect("golden path present");
        assert_eq!(&ds.read(id).unwrap(), data);
    }
    let r = granary::verify(&ds_path);
    assert!(r.is_clean(), "{:?}", r.problems);
}

fn golden_dir_1_2() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v1.2")
}

/// The mode and mtime (ns) the 1.2 golden source gives file `i` of `golden_source()`.
fn golden_file_attrs(i: usize) -> (u32, i64) {
    let mode = [0o644, 0o600, 0o755, 0o444][i % 4];
    (mode, 1_600_000_000_000_000_000 + i as i64 * 1_000_000_123)
}

/// Checks that the directories of [`GOLDEN_DIRS`] were restored under `out` with their modes
/// and mtimes.
fn assert_golden_dirs(out: &Path) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    for (d, mode, mtime_ns) in GOLDEN_DIRS {
        let m = std::fs::metadata(out.join(d)).unwrap();
        assert!(m.is_dir(), "{d}");
        assert_eq!(m.permissions().mode() & 0o7777, mode, "{d}");
        assert_eq!(m.mtime() * 1_000_000_000 + m.mtime_nsec(), mtime_ns, "{d}");
    }
}

/// Directories of the 1.2 golden source: (path, mode, mtime ns); `cherry/empty` is empty.
const GOLDEN_DIRS: [(&str, u32, i64); 4] = [
    ("apple", 0o755, 1_550_000_000_000_000_001),
    ("banana", 0o750, 1_550_000_000_000_000_002),
    ("cherry", 0o755, 1_550_000_000_000_000_003),
    ("cherry/empty", 0o700, 1_500_000_000_000_000_000),
];

#[test]
fn upgrades_golden_v1_2() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let (_tmp, ds_path) = upgraded(&golden_dir_1_2());
    let ds = granary::Dataset::open_checked(&ds_path).expect("upgraded golden v1.2 opens");
    let want = golden_source();
    assert_eq!(ds.len(), want.len() as u64);
    for (i, (path, data)) in want.iter().enumerate() {
        let id = ds.lookup(path).unwrap().expect("golden path present");
        assert_eq!(&ds.read(id).unwrap(), data);
        let (mode, mtime_ns) = golden_file_attrs(i);
        assert_eq!(
            ds.attrs(id).unwrap(),
            Some(granary::FileAttrs { mode, mtime_ns }),
            "{}",
            String::from_utf8_lossy(path)
        );
    }
    let dirs: Vec<(Vec<u8>, granary::FileAttrs)> = GOLDEN_DIRS
        .iter()
        .map(|(d, mode, mtime_ns)| {
            let a = granary::FileAttrs {
                mode: *mode,
                mtime_ns: *mtime_ns,
            };
            (d.as_bytes().to_vec(), a)
        })
        .collect();
    let got: Vec<(Vec<u8>, granary::FileAttrs)> = ds
        .dirs()
        .unwrap()
        .into_iter()
        .map(|d| (d.path, d.attrs.expect("attributes recorded")))
        .collect();
    assert_eq!(got, dirs);
    let r = granary::verify(&ds_path);
    assert!(r.is_clean(), "{:?}", r.problems);
    // Extracted with every mode, mtime and directory, the empty one too.
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    assert_eq!(extracted(&ds_path, &out), sorted(want.clone()));
    for (i, (p, _)) in want.iter().enumerate() {
        let m = std::fs::metadata(out.join(std::ffi::OsStr::from_bytes(p))).unwrap();
        let (mode, mtime_ns) = golden_file_attrs(i);
        assert_eq!(m.permissions().mode() & 0o7777, mode);
        assert_eq!(m.mtime() * 1_000_000_000 + m.mtime_nsec(), mtime_ns);
    }
    assert_golden_dirs(&out);
}

fn golden_dir_1_3() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v1.3")
}

/// The WebDataset members the 1.3 golden dataset (samples with named fields) was imported from.
pub(crate) fn golden_members_1_3() -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut v = Vec::new();
    for i in 0..14u64 {
        let key = format!("part{}/{i:04}", i % 2);
        v.push((
            format!("{key}.jpg").into_bytes(),
            bytes(300 + i, 700 + 90 * i as usize),
        ));
        v.push((
            format!("{key}.txt").into_bytes(),
            format!("caption number {i}").into_bytes(),
        ));
        if i % 3 == 0 {
            v.push((
                format!("{key}.json").into_bytes(),
                format!("{{\"i\": {i}}}").into_bytes(),
            ));
        }
        v.push((
            format!("{key}.cls").into_bytes(),
            format!("{}", i % 3).into_bytes(),
        ));
    }
    v
}

#[test]
fn upgrades_golden_v1_3_samples_with_fields() {
    let (_tmp, ds_path) = upgraded(&golden_dir_1_3());
    let ds = granary::Dataset::open_checked(&ds_path).expect("upgraded golden v1.3 opens");
    assert!(ds.has_fields());
    assert!(ds.chunk_count() >= 3);
    assert_eq!(
        ds.field_names().unwrap(),
        vec![&b"cls"[..], b"jpg", b"json", b"txt"]
    );
    assert_eq!(ds.classes().unwrap(), vec![&b"0"[..], b"1", b"2"]);
    let want = golden_members_1_3();
    for (name, data) in &want {
        let (id, field) = ds
            .lookup_field(name)
            .unwrap()
            .expect("golden member present");
        let got = ds.read_fields(id, Some(&[&field[..]])).unwrap();
        assert_eq!(&got[0].1, data, "{}", String::from_utf8_lossy(name));
    }
    assert_eq!(ds.len(), 14);
    let r = granary::verify(&ds_path);
    assert!(r.is_clean(), "{:?}", r.problems);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    assert_eq!(extracted(&ds_path, &out), sorted(want));
}

fn golden_dir_1_4() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v1.4")
}

fn golden_dir_1_5() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v1.5")
}

fn golden_dir_1_6() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v1.6")
}

/// Formats 1.4 to 1.6: the v1 source packed again (the snapshots gained block checksums,
/// path pages, listing pages); upgraded, each is the same dataset as the upgraded 1.0 one.
#[test]
fn upgrades_golden_v1_4_to_v1_6() {
    let (_tmp1, v1_path) = upgraded(&golden_dir());
    let v1 = granary::Dataset::open(&v1_path).unwrap();
    let mut want = golden_source();
    want.sort();
    for dir in [golden_dir_1_4(), golden_dir_1_5(), golden_dir_1_6()] {
        let (_tmp, ds_path) = upgraded(&dir);
        let ds = granary::Dataset::open_checked(&ds_path).expect("upgraded golden opens");
        assert_eq!(ds.samples_digest().unwrap(), v1.samples_digest().unwrap());
        assert!(granary::verify(&ds_path).is_clean());
        let s = ds.snapshot();
        // The namespace lists every file, sorted, and the directories above them.
        let files: Vec<granary::NsEntry> = s
            .entries(0..s.entry_count())
            .unwrap()
            .into_iter()
            .filter(|e| !e.is_dir())
            .collect();
        assert_eq!(
            files.iter().map(|e| e.path.clone()).collect::<Vec<_>>(),
            want.iter().map(|w| w.0.clone()).collect::<Vec<_>>()
        );
        for (e, w) in files.iter().zip(&want) {
            let id = e.id.unwrap();
            assert_eq!(&ds.read(id).unwrap(), &w.1);
            assert_eq!(e.size, w.1.len() as u64);
            assert_eq!(ds.lookup(&e.path).unwrap(), Some(id));
        }
        let dirs: Vec<Vec<u8>> = ds.dirs().unwrap().into_iter().map(|d| d.path).collect();
        assert_eq!(
            dirs,
            vec![b"apple".to_vec(), b"banana".to_vec(), b"cherry".to_vec()]
        );
        let bananas = s.prefix_range(b"banana/").unwrap();
        assert_eq!(bananas.end - bananas.start, 9);
        assert_eq!(ds.lookup_stat(b"banana").unwrap(), None, "a directory");
    }
}

fn golden_dir_2() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v2")
}

fn golden_dir_2_fields() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v2-fields")
}

/// The 2.0 golden source: the v1 source, its modes, mtimes and directories (the empty one
/// too), and 3,000 small files in nested directories, enough for several namespace pages and
/// several 64 KiB blocks of snapshot.
fn golden_source_2() -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut v = golden_source();
    for i in 0..3000u64 {
        let path = format!("many/d{:02}/s{:02}/{i:05}.txt", i % 23, (i * 7) % 11);
        v.push((path.into_bytes(), format!("small file {i}\n").into_bytes()));
    }
    v
}

/// The mode and mtime file `i` of [`golden_source_2`] has.
fn golden_attrs_2(i: usize) -> (u32, i64) {
    match i < golden_source().len() {
        true => golden_file_attrs(i),
        false => (0o640, 1_700_000_000_000_000_000 + i as i64 * 977),
    }
}

/// Writes the 2.0 golden source tree (files, modes, mtimes, directories) under `src`.
fn write_golden_source_2(src: &Path) {
    let files = golden_source_2();
    write_tree(src, &files);
    std::fs::create_dir_all(src.join("cherry/empty")).unwrap();
    for (i, (p, _)) in files.iter().enumerate() {
        let (mode, mtime) = golden_attrs_2(i);
        set_attrs(&src.join(std::ffi::OsStr::from_bytes(p)), mode, mtime);
    }
    // Every directory gets fixed attributes (those the tree creates take the clock's).
    let subdirs = (0..23).flat_map(|d| (0..11).map(move |s| (d, s)));
    for (i, (d, s)) in subdirs.enumerate() {
        let sub = src.join(format!("many/d{d:02}"));
        set_attrs(
            &sub.join(format!("s{s:02}")),
            0o750,
            1_650_000_000_000_000_000 + i as i64,
        );
    }
    for d in 0..23 {
        set_attrs(
            &src.join(format!("many/d{d:02}")),
            0o755,
            1_640_000_000_000_000_000 + d,
        );
    }
    set_attrs(&src.join("many"), 0o755, 1_630_000_000_000_000_000);
    for (d, mode, mtime) in GOLDEN_DIRS.iter().rev() {
        set_attrs(&src.join(d), *mode, *mtime);
    }
}

/// Format 2.0: the golden source packed (8 KiB chunks, seed 1): several chunks, zstd and raw
/// records, attributes, an empty directory.
#[test]
#[ignore = "writes the golden files; run only when creating them for a new format version"]
fn write_golden_v2() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_golden_source_2(&src);
    let out = golden_dir_2().join("dataset");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(golden_dir_2()).unwrap();
    pack_golden(&src, &out);
}

fn golden_dir_2_shards() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v2-shards")
}

/// Format 2.0, sharded: the golden source packed in three shards and merged (8 KiB chunks,
/// seed 1), which leaves empty chunks (where a shard had fewer chunks than another).
#[test]
#[ignore = "writes the golden files; run only when creating them for a new format version"]
fn write_golden_v2_shards() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_golden_source_2(&src);
    let out = golden_dir_2_shards().join("dataset");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(golden_dir_2_shards()).unwrap();
    for i in 0..3 {
        pack_golden_with(&src, &out, &["--shard", &format!("{i}/3")]);
    }
    run_ok(["merge".as_ref(), out.as_os_str()]);
}

#[test]
fn reads_golden_v2_shards_with_empty_chunks() {
    let ds_path = golden_dir_2_shards().join("dataset");
    let ds = granary::Dataset::open_checked(&ds_path).expect("golden v2 shards opens");
    let s = ds.snapshot();
    assert!(
        s.chunks().iter().any(|c| c.sample_count == 0),
        "an empty chunk"
    );
    assert!(granary::verify(&ds_path).is_clean());
    let v2 = granary::Dataset::open(golden_dir_2().join("dataset")).unwrap();
    assert_eq!(ds.samples_digest().unwrap(), v2.samples_digest().unwrap());
    for (path, data) in golden_source_2().iter().step_by(7) {
        let id = ds.lookup(path).unwrap().expect("golden path present");
        assert_eq!(&ds.read(id).unwrap(), data);
    }
    // The same namespace as the single pack: every file's size and attributes, every
    // directory with its own (each shard's chunks record the directories it owns).
    let entries =
        |s: &granary_format::Snapshot<_>| -> Vec<(Vec<u8>, u64, Option<granary::FileAttrs>)> {
            let all = s.entries(0..s.entry_count()).unwrap();
            all.into_iter().map(|e| (e.path, e.size, e.attrs)).collect()
        };
    let (mine, single) = (entries(s), entries(v2.snapshot()));
    let differ = mine.iter().zip(&single).find(|(a, b)| a != b);
    assert!(mine.len() == single.len() && differ.is_none(), "{differ:?}");
}

/// The chunk footers of the 2.0 golden set record what its namespace needs: every record's
/// mode and mtime, and (chunk 0) every directory; a snapshot rebuilt from them is the same.
#[test]
fn golden_v2_chunks_record_attributes_and_directories() {
    let dir = golden_dir_2().join("dataset");
    let ds = granary::Dataset::open(&dir).unwrap();
    let mut dirs = Vec::new();
    for c in 0..ds.snapshot().chunk_count() as u32 {
        let bytes = std::fs::read(dir.join(granary_format::chunk_file_name(c))).unwrap();
        let check = granary_format::check_chunk(&bytes, &ds.snapshot().dataset_id(), c).unwrap();
        let first = ds.snapshot().chunk(c as u64).unwrap().first_sample;
        for (k, a) in check.footer.attrs.unwrap().iter().enumerate() {
            assert_eq!(Some(*a), ds.attrs(first + k as u64).unwrap());
        }
        dirs.extend(check.footer.dirs);
    }
    let want: Vec<(Vec<u8>, granary::FileAttrs)> = ds
        .dirs()
        .unwrap()
        .into_iter()
        .map(|d| (d.path, d.attrs.unwrap()))
        .collect();
    assert_eq!(dirs, want);
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("ds");
    copy_dir(&dir, &copy);
    let snap = std::fs::read(dir.join(granary_format::SNAPSHOT_FILE)).unwrap();
    run_ok(["reindex".as_ref(), copy.as_os_str(), "--force".as_ref()]);
    assert_eq!(
        std::fs::read(copy.join(granary_format::SNAPSHOT_FILE)).unwrap(),
        snap
    );
}

#[test]
fn reads_golden_v2() {
    let ds_path = golden_dir_2().join("dataset");
    let ds = granary::Dataset::open_checked(&ds_path).expect("golden v2 dataset opens");
    let s = ds.snapshot();
    assert_eq!(s.version(), (2, 0));
    assert!(s.has_attrs() && !s.has_fields());
    assert!(s.blocks().count() >= 2, "{} blocks", s.blocks().count());
    assert!(s.page_index().unwrap().len() >= 10);
    let want = golden_source_2();
    assert_eq!(ds.len(), want.len() as u64);
    let mut compressed = 0;
    for (i, (path, data)) in want.iter().enumerate() {
        let id = ds.lookup(path).unwrap().expect("golden path present");
        assert_eq!(&ds.read(id).unwrap(), data);
        let (mode, mtime_ns) = golden_attrs_2(i);
        assert_eq!(
            ds.attrs(id).unwrap(),
            Some(granary::FileAttrs { mode, mtime_ns })
        );
        compressed += (ds.sample(id).unwrap().compression == granary::Compression::Zstd) as u32;
    }
    assert!(compressed >= 6, "golden set must exercise zstd records");
    // What info and plan read: the chunk table's sums and class counts.
    let orig: u64 = s.chunks().iter().map(|c| c.orig_bytes).sum();
    assert_eq!(orig, want.iter().map(|w| w.1.len() as u64).sum::<u64>());
    let labelled: u64 = (0..s.chunk_count())
        .flat_map(|c| s.class_counts(c).unwrap())
        .map(|(_, n)| n)
        .sum();
    assert_eq!(
        labelled,
        want.len() as u64 - 1,
        "every file but the root one has a class"
    );
    let dirs: Vec<Vec<u8>> = ds.dirs().unwrap().into_iter().map(|d| d.path).collect();
    assert!(dirs.contains(&b"cherry/empty".to_vec()) && dirs.contains(&b"many/d07/s03".to_vec()));
    let r = granary::verify(&ds_path);
    assert!(r.is_clean(), "{:?}", r.problems);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    assert_eq!(extracted(&ds_path, &out), sorted(want.clone()));
    assert_golden_dirs(&out);
}

/// Format 2.0 with fields: the 1.3 golden WebDataset members imported (8 KiB chunks, seed 1).
#[test]
#[ignore = "writes the golden files; run only when creating them for a new format version"]
fn write_golden_v2_fields() {
    let tmp = tempfile::tempdir().unwrap();
    let tar_path = tmp.path().join("golden.tar");
    write_tar(&tar_path, &golden_members_1_3());
    let out = golden_dir_2_fields().join("dataset");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(golden_dir_2_fields()).unwrap();
    import_tar(&tar_path, &out, &["--chunk-size", "8KiB", "--seed", "1"]);
}

#[test]
fn reads_golden_v2_fields() {
    let ds_path = golden_dir_2_fields().join("dataset");
    let ds = granary::Dataset::open_checked(&ds_path).expect("golden v2 fields opens");
    assert_eq!(ds.snapshot().version(), (2, 0));
    assert!(ds.has_fields());
    assert_eq!(
        ds.field_names().unwrap(),
        vec![&b"cls"[..], b"jpg", b"json", b"txt"]
    );
    assert_eq!(
        ds.snapshot().field_types().unwrap(),
        vec![granary_format::FieldType::Bytes; 4]
    );
    for (name, data) in &golden_members_1_3() {
        let (id, field) = ds.lookup_field(name).unwrap().expect("member present");
        let got = ds.read_fields(id, Some(&[&field[..]])).unwrap();
        assert_eq!(&got[0].1, data, "{}", String::from_utf8_lossy(name));
    }
    assert!(granary::verify(&ds_path).is_clean());
    // The same samples as the upgraded 1.3 golden set.
    let (_tmp, v13) = upgraded(&golden_dir_1_3());
    let v13 = granary::Dataset::open(&v13).unwrap();
    assert_eq!(ds.samples_digest().unwrap(), v13.samples_digest().unwrap());
}

fn golden_dir_2_typed() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v2-typed")
}

/// A typed field of a golden sample: name, type descriptor, stored bytes.
type TypedField = (&'static str, &'static str, Vec<u8>);

/// The samples of the typed 2.0 golden dataset: (key, fields).
fn golden_typed() -> Vec<(String, Vec<TypedField>)> {
    (0..40u8)
        .map(|i| {
            let img: Vec<u8> = (0..48u8).map(|b| b.wrapping_mul(i)).collect();
            let fields = vec![
                ("img", "ndarray:uint8:4,4,3", img),
                ("meta", "json", format!("{{\"i\":{i}}}").into_bytes()),
                ("n", "int", (i as i64 - 20).to_le_bytes().to_vec()),
                ("txt", "str", format!("sample {i} \u{e9}").into_bytes()),
            ];
            (format!("part{}/s{i:03}", i % 2), fields)
        })
        .collect()
}

/// Format 2.0 with typed fields, written by the writer API with each field's type declared
/// (1 KiB chunks, seed 1).
#[test]
#[ignore = "writes the golden files; run only when creating them for a new format version"]
fn write_golden_v2_typed() {
    let out = golden_dir_2_typed().join("dataset");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(golden_dir_2_typed()).unwrap();
    let mut o = granary_packer::WriterOptions::new(&out);
    o.output.chunk_size = 1024;
    o.output.seed = 1;
    let mut w = granary_packer::Writer::create(o).unwrap();
    for (key, fields) in golden_typed() {
        for (n, t, _) in &fields {
            w.declare_field_type(n.as_bytes(), t).unwrap();
        }
        let f = fields
            .into_iter()
            .map(|(n, _, b)| (n.as_bytes().to_vec(), b))
            .collect();
        w.write_fields(key.as_bytes(), f, granary_packer::Label::None)
            .unwrap();
    }
    w.finish().unwrap();
}

#[test]
fn reads_golden_v2_typed() {
    let ds_path = golden_dir_2_typed().join("dataset");
    let ds = granary::Dataset::open_checked(&ds_path).expect("golden v2 typed opens");
    assert!(ds.chunk_count() >= 2);
    let types: Vec<String> = ds
        .snapshot()
        .field_types()
        .unwrap()
        .iter()
        .map(|t| t.descriptor())
        .collect();
    assert_eq!(types, ["ndarray:uint8:4,4,3", "json", "int", "str"]);
    for (key, fields) in golden_typed() {
        let id = ds
            .lookup(key.as_bytes())
            .unwrap()
            .expect("golden key present");
        let got = ds.read_fields(id, None).unwrap();
        let want: Vec<(Vec<u8>, Vec<u8>)> = fields
            .into_iter()
            .map(|(n, _, b)| (n.as_bytes().to_vec(), b))
            .collect();
        assert_eq!(got, want, "{key}");
    }
    assert!(granary::verify(&ds_path).is_clean());
}
