//! Golden files of format v1: a small dataset committed under tests/golden/v1/dataset, written
//! once by `write_golden_v1` below (run it with `cargo test --test golden -- --ignored`, only
//! when deliberately creating golden files for a new format version). Every future granary must
//! still read these files exactly.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::common::*;

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
    run_ok([
        "pack".as_ref(),
        src.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
        "--chunk-size".as_ref(),
        "8KiB".as_ref(),
        "--seed".as_ref(),
        "1".as_ref(),
    ]);
}

#[test]
#[ignore = "writes the golden files; run only when creating them for a new format version"]
fn write_golden_v1() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &golden_source());
    let out = golden_dir().join("dataset");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(golden_dir()).unwrap();
    pack_golden(&src, &out);
}

#[test]
fn reads_golden_v1() {
    let ds_path = golden_dir().join("dataset");
    let ds = granary::Dataset::open_checked(&ds_path).expect("golden v1 dataset opens");
    assert_eq!(ds.snapshot().version(), (1, 0));
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
    run_ok([
        "extract".as_ref(),
        ds_path.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    assert_eq!(read_tree(&out), sorted(want));
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
#[ignore = "writes the golden files; run only when creating them for a new format version"]
fn write_golden_v1_1() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &golden_appended());
    let out = golden_dir_1_1().join("dataset");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    for e in std::fs::read_dir(golden_dir().join("dataset")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), out.join(e.file_name())).unwrap();
    }
    run_ok([
        "append".as_ref(),
        out.as_os_str(),
        src.as_os_str(),
        "--chunk-size".as_ref(),
        "4KiB".as_ref(),
        "--seed".as_ref(),
        "1".as_ref(),
    ]);
}

#[test]
fn reads_golden_v1_1() {
    let ds_path = golden_dir_1_1().join("dataset");
    let ds = granary::Dataset::open_checked(&ds_path).expect("golden v1.1 dataset opens");
    assert_eq!(ds.snapshot().version(), (1, 1));
    let v1 = granary::Dataset::open_checked(golden_dir().join("dataset")).unwrap();
    let lineage = ds.snapshot().lineage();
    assert_eq!(lineage.generation, 1);
    assert_eq!(lineage.parent, v1.snapshot().header_crc());
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

/// Directories of the 1.2 golden source: (path, mode, mtime ns); `cherry/empty` is empty.
const GOLDEN_DIRS: [(&str, u32, i64); 4] = [
    ("apple", 0o755, 1_550_000_000_000_000_001),
    ("banana", 0o750, 1_550_000_000_000_000_002),
    ("cherry", 0o755, 1_550_000_000_000_000_003),
    ("cherry/empty", 0o700, 1_500_000_000_000_000_000),
];

#[test]
#[ignore = "writes the golden files; run only when creating them for a new format version"]
fn write_golden_v1_2() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let files = golden_source();
    write_tree(&src, &files);
    std::fs::create_dir_all(src.join("cherry/empty")).unwrap();
    for (i, (p, _)) in files.iter().enumerate() {
        let (mode, mtime) = golden_file_attrs(i);
        set_attrs(&src.join(std::ffi::OsStr::from_bytes(p)), mode, mtime);
    }
    for (d, mode, mtime) in GOLDEN_DIRS.iter().rev() {
        set_attrs(&src.join(d), *mode, *mtime);
    }
    let out = golden_dir_1_2().join("dataset");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(golden_dir_1_2()).unwrap();
    pack_golden(&src, &out);
}

#[test]
fn reads_golden_v1_2() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let ds_path = golden_dir_1_2().join("dataset");
    let ds = granary::Dataset::open_checked(&ds_path).expect("golden v1.2 dataset opens");
    assert_eq!(ds.snapshot().version(), (1, 2));
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
    assert_eq!(ds.dirs().unwrap(), dirs);
    let r = granary::verify(&ds_path);
    assert!(r.is_clean(), "{:?}", r.problems);
    // Extracted with every mode, mtime and directory, the empty one too.
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    run_ok([
        "extract".as_ref(),
        ds_path.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    assert_eq!(read_tree(&out), sorted(want.clone()));
    for (i, (p, _)) in want.iter().enumerate() {
        let m = std::fs::metadata(out.join(std::ffi::OsStr::from_bytes(p))).unwrap();
        let (mode, mtime_ns) = golden_file_attrs(i);
        assert_eq!(m.permissions().mode() & 0o7777, mode);
        assert_eq!(m.mtime() * 1_000_000_000 + m.mtime_nsec(), mtime_ns);
    }
    for (d, mode, mtime_ns) in GOLDEN_DIRS {
        let m = std::fs::metadata(out.join(d)).unwrap();
        assert!(m.is_dir(), "{d}");
        assert_eq!(m.permissions().mode() & 0o7777, mode, "{d}");
        assert_eq!(m.mtime() * 1_000_000_000 + m.mtime_nsec(), mtime_ns, "{d}");
    }
}

fn golden_dir_1_3() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v1.3")
}

/// The WebDataset members the 1.3 golden dataset (samples with named fields) was imported from.
fn golden_members_1_3() -> Vec<(Vec<u8>, Vec<u8>)> {
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
#[ignore = "writes the golden files; run only when creating them for a new format version"]
fn write_golden_v1_3() {
    let tmp = tempfile::tempdir().unwrap();
    let tar_path = tmp.path().join("golden.tar");
    write_tar(&tar_path, &golden_members_1_3());
    let out = golden_dir_1_3().join("dataset");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(golden_dir_1_3()).unwrap();
    run_ok([
        "pack",
        "--from",
        "webdataset",
        tar_path.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--chunk-size",
        "8KiB",
        "--seed",
        "1",
    ]);
}

#[test]
fn reads_golden_v1_3_samples_with_fields() {
    let ds_path = golden_dir_1_3().join("dataset");
    let ds = granary::Dataset::open_checked(&ds_path).expect("golden v1.3 dataset opens");
    assert_eq!(ds.snapshot().version(), (1, 3));
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
    run_ok([
        "extract".as_ref(),
        ds_path.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    assert_eq!(read_tree(&out), sorted(want));
}

fn golden_dir_1_4() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v1.4")
}

/// Format 1.4: the v1 source packed again; the snapshot gains block checksums (kinds 14, 15).
#[test]
#[ignore = "writes the golden files; run only when creating them for a new format version"]
fn write_golden_v1_4() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &golden_source());
    let out = golden_dir_1_4().join("dataset");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(golden_dir_1_4()).unwrap();
    pack_golden(&src, &out);
}

#[test]
fn reads_golden_v1_4_block_checksums() {
    let ds_path = golden_dir_1_4().join("dataset");
    let ds = granary::Dataset::open_checked(&ds_path).expect("golden v1.4 dataset opens");
    assert_eq!(ds.snapshot().version(), (1, 4));
    let bi = ds
        .snapshot()
        .block_index()
        .expect("1.4 has block checksums");
    assert_eq!(bi.block_size, 65536);
    assert_eq!(bi.covered.end, bi.crcs.start);
    assert!(bi.check(ds.snapshot().bytes()).is_ok());
    let want = golden_source();
    assert_eq!(ds.len(), want.len() as u64);
    for (path, data) in &want {
        let id = ds.lookup(path).unwrap().expect("golden path present");
        assert_eq!(&ds.read(id).unwrap(), data);
    }
    assert!(granary::verify(&ds_path).is_clean());
    // The same files as the 1.0 golden set, however the snapshot grew.
    let v1 = granary::Dataset::open(golden_dir().join("dataset")).unwrap();
    assert_eq!(ds.content_digest().unwrap(), v1.content_digest().unwrap());
    // A damaged byte anywhere after the section table fails its block's CRC.
    let mut bad = ds.snapshot().bytes().to_vec();
    let at = (bi.covered.start + bi.covered.end) as usize / 2;
    bad[at] ^= 1;
    let err = bi.check(&bad).unwrap_err().to_string();
    assert!(err.contains("checksum mismatch"), "{err}");
}

fn golden_dir_1_5() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v1.5")
}

/// Format 1.5: the v1 source packed again; the snapshot gains path pages (kinds 16, 17).
#[test]
#[ignore = "writes the golden files; run only when creating them for a new format version"]
fn write_golden_v1_5() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &golden_source());
    let out = golden_dir_1_5().join("dataset");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(golden_dir_1_5()).unwrap();
    pack_golden(&src, &out);
}

#[test]
fn reads_golden_v1_5_path_pages() {
    let ds = reads_paged_golden(&golden_dir_1_5(), (1, 5));
    // Path pages carry no sizes, modes or mtimes.
    let listed = ds.sorted_paths(0..ds.len()).unwrap();
    assert!(listed.iter().all(|e| e.stat.is_none()));
    assert!(!ds.listings_carry_stats());
}

/// The golden dataset in `dir`, of format `version` with pages (1.5 or later): opened,
/// checked against the source, its pages listing the path order and searched as the 1.4
/// golden set (no pages) is.
fn reads_paged_golden(dir: &Path, version: (u16, u16)) -> granary::Dataset {
    let ds_path = dir.join("dataset");
    let ds = granary::Dataset::open_checked(&ds_path).expect("golden dataset opens");
    let s = ds.snapshot();
    assert_eq!(s.version(), version);
    let ix = s.page_index().unwrap().expect("pages");
    assert_eq!(ix.len(), 1);
    let mut want = golden_source();
    want.sort();
    // The pages list the path order: every path, sorted, at its own sample id.
    let listed = s.sorted_paths(0..ds.len()).unwrap();
    assert_eq!(
        listed.iter().map(|e| e.path.clone()).collect::<Vec<_>>(),
        want.iter().map(|w| w.0.clone()).collect::<Vec<_>>()
    );
    for (pos, e) in listed.iter().enumerate() {
        assert_eq!(s.sorted_id(pos as u64).unwrap(), e.id);
        assert_eq!(s.lower_bound(&e.path).unwrap(), pos as u64);
        assert_eq!(&ds.read(e.id).unwrap(), &want[pos].1);
    }
    let bananas = s.prefix_range(b"banana/").unwrap();
    assert_eq!(bananas.end - bananas.start, 9);
    assert!(granary::verify(&ds_path).is_clean());
    let v1 = granary::Dataset::open(golden_dir().join("dataset")).unwrap();
    assert_eq!(ds.content_digest().unwrap(), v1.content_digest().unwrap());
    // The same searches on the 1.4 golden set (no pages) agree.
    let v14 = granary::Dataset::open(golden_dir_1_4().join("dataset")).unwrap();
    for key in [
        &b""[..],
        b"b",
        b"banana/",
        b"banana/caf",
        b"cherry/",
        b"z",
        b"\xff",
    ] {
        assert_eq!(
            s.prefix_range(key).unwrap(),
            v14.snapshot().prefix_range(key).unwrap(),
            "{key:?}"
        );
    }
    ds
}

fn golden_dir_1_6() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v1.6")
}

/// Format 1.6: the v1 source packed again; the path pages become listing pages (kinds 18,
/// 19), whose entries carry each file's size, mode and mtime.
#[test]
#[ignore = "writes the golden files; run only when creating them for a new format version"]
fn write_golden_v1_6() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &golden_source());
    let out = golden_dir_1_6().join("dataset");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(golden_dir_1_6()).unwrap();
    pack_golden(&src, &out);
}

#[test]
fn reads_golden_v1_6_listing_pages() {
    let ds = reads_paged_golden(&golden_dir_1_6(), (1, 6));
    assert!(ds.listings_carry_stats());
    let mut want = golden_source();
    want.sort();
    // Every entry carries the file's size, and the mode and mtime kind 8 records.
    let listed = ds.sorted_paths(0..ds.len()).unwrap();
    for (e, w) in listed.iter().zip(&want) {
        let st = e.stat.expect("listing pages carry stats");
        assert_eq!(st.size, w.1.len() as u64);
        let attrs = ds.attrs(e.id).unwrap();
        assert!(attrs.is_some(), "the golden pack records attributes");
        assert_eq!(st.attrs, attrs);
        assert_eq!(ds.lookup_stat(&e.path).unwrap(), Some((e.id, st)));
    }
    assert_eq!(ds.lookup_stat(b"banana/").unwrap(), None);
}
