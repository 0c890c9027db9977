//! Golden files of format v1: a small dataset committed under tests/golden/v1/dataset, written
//! once by `write_golden_v1` below (run it with `cargo test --test golden -- --ignored`, only
//! when deliberately creating golden files for a new format version). Every future granary must
//! still read these files exactly.

mod common;

use std::path::{Path, PathBuf};

use common::*;

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

#[test]
#[ignore = "writes the golden files; run only when creating them for a new format version"]
fn write_golden_v1() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &golden_source());
    let out = golden_dir().join("dataset");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(golden_dir()).unwrap();
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
