//! An interrupted pack (kill -9 mid-run) continues with --resume and produces the same dataset
//! as an uninterrupted pack (up to the random dataset id).

use std::path::Path;

use crate::common::*;

fn chunk_files(ds: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(ds)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".gchunk"))
        .map(|e| {
            let mut b = std::fs::read(e.path()).unwrap();
            // Mask the dataset id and the header CRC that covers it.
            b[16..32].fill(0);
            b[60..64].fill(0);
            (e.file_name().to_string_lossy().into_owned(), b)
        })
        .collect();
    v.sort();
    v
}

#[test]
fn killed_pack_resumes_to_an_identical_dataset() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let files: Vec<(Vec<u8>, Vec<u8>)> = (0..4000u64)
        .map(|i| {
            let data = if i % 2 == 0 {
                bytes(i, 2000 + (i as usize % 3000))
            } else {
                format!("text {i} ").repeat(200).into_bytes()
            };
            (format!("class{}/item{i:05}.dat", i % 10).into_bytes(), data)
        })
        .collect();
    write_tree(&src, &files);
    let args = ["--chunk-size", "24KiB", "--seed", "5"];

    let reference = tmp.path().join("reference");
    let mut cmd = granary();
    cmd.arg("pack")
        .arg(&src)
        .arg("-o")
        .arg(&reference)
        .args(args);
    assert!(cmd.output().unwrap().status.success());

    let ds = tmp.path().join("ds");
    let work = tmp.path().join(".ds.partial");
    let mut interrupted = false;
    for attempt in 0..5 {
        let _ = std::fs::remove_dir_all(&work);
        let child = granary()
            .arg("pack")
            .arg(&src)
            .arg("-o")
            .arg(&ds)
            .args(args)
            .spawn()
            .unwrap();
        // Kill it once a few chunks are on disk (each is fsynced, so this takes a while).
        let want = 3 + attempt;
        kill_when(child, || {
            std::fs::read_dir(&work)
                .map(|rd| {
                    rd.flatten()
                        .filter(|e| e.file_name().to_string_lossy().ends_with(".gchunk"))
                        .count()
                })
                .unwrap_or(0)
                >= want
        });
        if !ds.exists() && work.exists() {
            interrupted = true;
            break;
        }
        let _ = std::fs::remove_dir_all(&ds);
    }
    assert!(interrupted, "could not interrupt the pack mid-run");
    // Damage one completed chunk and leave a torn temporary: both must be redone.
    let c0 = work.join(granary_format::chunk_file_name(0));
    if c0.exists() {
        let mut b = std::fs::read(&c0).unwrap();
        let n = b.len();
        b[n / 2] ^= 0x40;
        std::fs::write(&c0, &b).unwrap();
    }
    std::fs::write(work.join("chunk-00000099.gchunk.tmp"), b"torn").unwrap();

    let o = granary()
        .arg("pack")
        .arg(&src)
        .arg("-o")
        .arg(&ds)
        .args(args)
        .arg("--resume")
        .arg("--json")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(s["chunks_resumed"].as_u64().unwrap() >= 1, "{s}");
    assert!(!work.exists());

    assert_eq!(chunk_files(&ds), chunk_files(&reference));
    let ls = |d: &Path| stdout(&run_ok(["ls".as_ref(), d.as_os_str(), "--long".as_ref()]));
    assert_eq!(ls(&ds), ls(&reference));
    run_ok(["verify".as_ref(), ds.as_os_str()]);
    let out = tmp.path().join("out");
    run_ok([
        "extract".as_ref(),
        ds.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    assert_eq!(read_tree(&out), sorted(files));
}
