//! Deleting samples (`granary delete`): the next generation delivers, lists and finds every
//! remaining sample exactly once and no deleted one, through every reader (streams on any
//! ranks and workers and shuffles, random access, ls, cat, extract, verify), with the deleted
//! records' bytes accounted for; bad input changes nothing.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use granary::{Dataset, PlanOptions, Shard, ShuffleMode, StreamOptions};

use crate::common::*;

/// 300 files in 3 class directories.
fn tree() -> Vec<(Vec<u8>, Vec<u8>)> {
    (0..300u64)
        .map(|i| {
            let path = format!("c{}/f{i:03}.bin", i % 3);
            (path.into_bytes(), bytes(i, 100 + (i as usize * 37) % 1500))
        })
        .collect()
}

fn packed(tmp: &Path) -> (std::path::PathBuf, BTreeMap<Vec<u8>, Vec<u8>>) {
    let src = tmp.join("src");
    let files = tree();
    write_tree(&src, &files);
    let ds = tmp.join("ds");
    let o = pack(&src, &ds, &["--chunk-size", "16KiB", "--seed", "3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    (ds, files.into_iter().collect())
}

fn delete(ds: &Path, args: &[&str]) -> std::process::Output {
    let mut a: Vec<&std::ffi::OsStr> = vec!["delete".as_ref(), ds.as_os_str()];
    a.extend(args.iter().map(std::ffi::OsStr::new));
    run(a)
}

/// Every sample a whole epoch delivers over `world` ranks of `workers` workers, bytes checked.
fn epoch(
    ds: &Arc<Dataset>,
    mode: ShuffleMode,
    world: u32,
    workers: u32,
    want: &BTreeMap<Vec<u8>, Vec<u8>>,
) -> Vec<Vec<u8>> {
    let o = PlanOptions {
        mode,
        seed: 7,
        window_chunks: 2,
        ..PlanOptions::default()
    };
    let mut got = Vec::new();
    for slot in 0..world * workers {
        let s = Shard {
            rank: slot / workers,
            world_size: world,
            worker: slot % workers,
            num_workers: workers,
        };
        for x in ds
            .stream_epoch(&o, 0, s, None, &StreamOptions::default())
            .unwrap()
        {
            let x = x.unwrap();
            let p = ds.path(x.id).unwrap();
            assert_eq!(x.data(), &want[&p][..], "sample {}", x.id);
            got.push(p);
        }
    }
    got.sort();
    got
}

#[test]
fn deleted_samples_are_gone_from_every_reader_and_the_rest_is_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let (ds_path, mut want) = packed(tmp.path());
    let before = run_ok(["verify".as_ref(), ds_path.as_os_str(), "--json".as_ref()]);
    let before: serde_json::Value = serde_json::from_slice(&before.stdout).unwrap();
    // Two deletions: listed paths (one not in the dataset: reported, left out), then a class
    // and a glob together.
    let list = tmp.path().join("gone.txt");
    std::fs::write(&list, "c0/f000.bin\nc1/f004.bin\nnot/there.bin\n").unwrap();
    let o = delete(
        &ds_path,
        &["--paths-from", list.to_str().unwrap(), "--json"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("line 3: no sample not/there.bin"),
        "{}",
        stderr(&o)
    );
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (j["deleted"].as_u64(), j["generation"].as_u64()),
        (Some(2), Some(1))
    );
    let o = delete(
        &ds_path,
        &["--class", "c2", "--glob", "c2/f1*.bin", "--json"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let gone: Vec<Vec<u8>> = want
        .keys()
        .filter(|p| {
            let s = String::from_utf8_lossy(p);
            s == "c0/f000.bin" || s == "c1/f004.bin" || s.starts_with("c2/f1")
        })
        .cloned()
        .collect();
    assert_eq!(gone.len(), 2 + 33);
    let dead: u64 = gone.iter().map(|p| want[p].len() as u64).sum();
    for p in &gone {
        want.remove(p);
    }
    let info = run_ok(["info".as_ref(), ds_path.as_os_str(), "--json".as_ref()]);
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(info["samples"].as_u64(), Some(want.len() as u64));
    assert_eq!(info["deleted"]["samples"].as_u64(), Some(gone.len() as u64));
    assert_eq!(
        info["deleted"]["bytes"].as_u64(),
        Some(dead),
        "raw records: their bytes"
    );
    assert_eq!(info["generation"].as_u64(), Some(2));
    // Streams: every remaining sample once, in every mode, on any ranks and workers.
    let ds = Arc::new(Dataset::open(&ds_path).unwrap());
    let keys: Vec<Vec<u8>> = want.keys().cloned().collect();
    for mode in [
        ShuffleMode::Chunkwise,
        ShuffleMode::Global,
        ShuffleMode::Sequential,
    ] {
        for (world, workers) in [(1, 1), (1, 3), (2, 3)] {
            // Ranks get equal counts: the remainder of an odd count is dropped.
            let mut got = epoch(&ds, mode, world, workers, &want);
            let n = got.len();
            got.dedup();
            assert_eq!(got.len(), n, "{mode:?} {world}x{workers}: a sample twice");
            assert_eq!(
                n,
                keys.len() - keys.len() % world as usize,
                "{mode:?} {world}x{workers}"
            );
            assert!(
                got.iter().all(|p| want.contains_key(p)),
                "{mode:?}: a deleted sample"
            );
        }
    }
    // Random access, lookups, listings, cat, extract, verify.
    for p in &gone {
        assert_eq!(ds.lookup(p).unwrap(), None);
        let o = run([
            "cat".as_ref(),
            ds_path.as_os_str(),
            std::ffi::OsStr::new(std::str::from_utf8(p).unwrap()),
        ]);
        assert!(!o.status.success() && o.stdout.is_empty());
    }
    let deleted_id = (0..ds.len()).find(|&i| !ds.selects(i)).unwrap();
    let e = ds.read(deleted_id).unwrap_err().to_string();
    assert!(e.contains("was deleted"), "{e}");
    let ls = stdout(&run_ok(["ls".as_ref(), ds_path.as_os_str()]));
    assert!(!ls.contains("f000.bin") && ls.contains("f003.bin"), "{ls}");
    let out = tmp.path().join("restored");
    assert_eq!(
        extracted(&ds_path, &out),
        want.clone().into_iter().collect::<Vec<_>>()
    );
    let v = run(["verify".as_ref(), ds_path.as_os_str(), "--json".as_ref()]);
    assert!(v.status.success(), "{}", stderr(&v));
    let v: serde_json::Value = serde_json::from_slice(&v.stdout).unwrap();
    assert_ne!(v["samples_digest"], before["samples_digest"]);
    // `read` agrees with verify's digest of the remaining samples.
    let r = run_ok(["read".as_ref(), ds_path.as_os_str(), "--json".as_ref()]);
    let r: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    let ep = &r[0];
    assert_eq!(ep["samples"].as_u64(), Some(want.len() as u64), "{r}");
    assert_eq!(ep["digest"], v["digest"], "{r} {v}");
}

#[test]
fn bad_deletions_change_nothing_and_views_follow_the_generation() {
    let tmp = tempfile::tempdir().unwrap();
    let (ds_path, want) = packed(tmp.path());
    let snap = ds_path.join("snapshot.gsnap");
    let original = std::fs::read(&snap).unwrap();
    let ids = tmp.path().join("ids.txt");
    // --strict: a listed id the dataset does not hold is an error, nothing deleted.
    std::fs::write(&ids, "3\n999\n").unwrap();
    let o = delete(&ds_path, &["--ids-from", ids.to_str().unwrap(), "--strict"]);
    assert!(
        stderr(&o).contains("sample 999 of a dataset of 300"),
        "{}",
        stderr(&o)
    );
    // Nothing to select by; a selection of nothing; a dry run.
    for args in [
        vec![],
        vec!["--glob", "nothing/*"],
        vec!["--class", "c1", "--dry-run"],
    ] {
        let o = delete(&ds_path, &args);
        assert_eq!(
            o.status.success(),
            args.contains(&"--dry-run"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    assert_eq!(std::fs::read(&snap).unwrap(), original, "nothing changed");
    // A view made before a deletion is refused after it as stale.
    let view = tmp.path().join("c1.gview");
    run_ok([
        "view".as_ref(),
        ds_path.as_os_str(),
        "--class".as_ref(),
        "c1".as_ref(),
        "-o".as_ref(),
        view.as_os_str(),
    ]);
    std::fs::write(&ids, "3\n").unwrap();
    let o = delete(&ds_path, &["--ids-from", ids.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let e = Dataset::open(&view).unwrap_err().to_string();
    assert!(e.contains("a stale view"), "{e}");
    // Deleting it again is refused as nothing new; a view made now leaves it out.
    let o = delete(&ds_path, &["--ids-from", ids.to_str().unwrap()]);
    assert!(stderr(&o).contains("deleted already"), "{}", stderr(&o));
    std::fs::write(&ids, "3\n4\n").unwrap();
    let o = run([
        "view".as_ref(),
        ds_path.as_os_str(),
        "--ids-from".as_ref(),
        ids.as_os_str(),
        "-o".as_ref(),
        view.as_os_str(),
        "--force".as_ref(),
    ]);
    assert!(
        stderr(&o).contains("sample 3 was deleted"),
        "{}",
        stderr(&o)
    );
    // A view of what to remove: deletes exactly its samples.
    let rm = tmp.path().join("rm.gview");
    run_ok([
        "view".as_ref(),
        ds_path.as_os_str(),
        "--prefix".as_ref(),
        "c1/f01".as_ref(),
        "-o".as_ref(),
        rm.as_os_str(),
    ]);
    let o = delete(&ds_path, &["--view", rm.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["deleted"].as_u64(), Some(4), "{j}"); // c1/f010, f013, f016, f019
                                                       // An append after a deletion keeps it; deleting everything leaves an empty epoch.
    let more = tmp.path().join("more");
    write_tree(&more, &[(b"c0/new.bin".to_vec(), bytes(9999, 500))]);
    run_ok(["append".as_ref(), ds_path.as_os_str(), more.as_os_str()]);
    let ds = Dataset::open(&ds_path).unwrap();
    assert_eq!(ds.selected_len(), 300 - 5 + 1);
    assert!(!ds.selects(3) && ds.lookup(b"c0/new.bin").unwrap().is_some());
    drop(ds);
    let o = delete(&ds_path, &["--prefix", "c"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ds = Arc::new(Dataset::open(&ds_path).unwrap());
    assert_eq!(ds.selected_len(), 0);
    assert!(epoch(&ds, ShuffleMode::Chunkwise, 2, 2, &want).is_empty());
    let v = run(["verify".as_ref(), ds_path.as_os_str()]);
    assert!(v.status.success(), "{}", stderr(&v));
}

/// Whether any file under `dir` holds `marker`.
fn holds(dir: &Path, marker: &[u8]) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for e in walkdir(dir) {
        if std::fs::read(&e).is_ok_and(|b| b.windows(marker.len()).any(|w| w == marker)) {
            found.push(e);
        }
    }
    found
}

fn walkdir(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walkdir(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn a_tier_drops_and_never_again_copies_chunks_holding_deleted_samples() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    // Every fifth file carries a marker found nowhere else.
    let files: Vec<(Vec<u8>, Vec<u8>)> = (0..120u64)
        .map(|i| {
            let mut b = bytes(i, 800);
            if i % 5 == 0 {
                b.extend_from_slice(format!("MARKER-{i:04}-TAKEDOWN").as_bytes());
            }
            (format!("c{}/f{i:03}.bin", i % 2).into_bytes(), b)
        })
        .collect();
    write_tree(&src, &files);
    let ds = tmp.path().join("ds");
    assert!(
        pack(&src, &ds, &["--chunk-size", "8KiB", "--compress", "none"])
            .status
            .success()
    );
    let tier = tmp.path().join("tier");
    let read = |ds: &Path| {
        let o = run([
            "read".as_ref(),
            ds.as_os_str(),
            "--cache-dir".as_ref(),
            tier.as_os_str(),
            "--cache-size".as_ref(),
            "64MiB".as_ref(),
            "--json".as_ref(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v[0]["samples"].as_u64().unwrap()
    };
    assert_eq!(read(&ds), 120);
    let marked = |i: u64| format!("MARKER-{i:04}-TAKEDOWN").into_bytes();
    assert!(
        !holds(&tier, &marked(0)).is_empty(),
        "the tier holds copies"
    );
    // Delete the marked samples: `cache purge` removes every copy holding one.
    let list = tmp.path().join("gone.txt");
    let gone: String = (0..120)
        .filter(|i| i % 5 == 0)
        .map(|i| format!("c{}/f{i:03}.bin\n", i % 2))
        .collect();
    std::fs::write(&list, gone).unwrap();
    let o = delete(&ds, &["--paths-from", list.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run([
        "cache".as_ref(),
        "purge".as_ref(),
        ds.as_os_str(),
        tier.as_os_str(),
        "--json".as_ref(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["entries_removed"].as_u64().unwrap() > 0, "{v}");
    for i in (0..120).step_by(5) {
        assert!(
            holds(&tier, &marked(i)).is_empty(),
            "marker {i} in the tier after purge"
        );
    }
    // Epochs of the new generation through the tier: the rest, and still no marker there.
    assert_eq!(read(&ds), 96);
    assert_eq!(read(&ds), 96);
    for i in (0..120).step_by(5) {
        assert!(
            holds(&tier, &marked(i)).is_empty(),
            "marker {i} copied again"
        );
    }
    assert!(!holds(&tier, &bytes(1, 800)).is_empty() || !walkdir(&tier).is_empty());
}

fn compact(ds: &Path, args: &[&str]) -> serde_json::Value {
    let mut a: Vec<&std::ffi::OsStr> = vec!["compact".as_ref(), ds.as_os_str(), "--json".as_ref()];
    a.extend(args.iter().map(std::ffi::OsStr::new));
    let o = run(a);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn json_of(args: &[&std::ffi::OsStr]) -> serde_json::Value {
    let o = run(args);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn compaction_removes_every_deleted_byte_and_keeps_the_rest_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    // Every seventh file carries a marker found nowhere else; text files compress (zstd).
    let files: Vec<(Vec<u8>, Vec<u8>)> = (0..210u64)
        .map(|i| {
            let mut b = match i % 3 {
                0 => format!("text {i} ").repeat(60).into_bytes(),
                _ => bytes(i, 700 + (i as usize * 13) % 900),
            };
            if i % 7 == 0 {
                b.extend_from_slice(format!("MARKER-{i:04}-GONE").as_bytes());
            }
            (format!("c{}/f{i:03}.bin", i % 3).into_bytes(), b)
        })
        .collect();
    write_tree(&src, &files);
    let ds = tmp.path().join("ds");
    assert!(
        pack(&src, &ds, &["--chunk-size", "16KiB", "--compress", "none"])
            .status
            .success()
    );
    let list = tmp.path().join("gone.txt");
    let gone: String = (0..210)
        .filter(|i| i % 7 == 0)
        .map(|i| format!("c{}/f{i:03}.bin\n", i % 3))
        .collect();
    std::fs::write(&list, gone).unwrap();
    let receipt = tmp.path().join("takedown.receipt");
    let o = delete(
        &ds,
        &[
            "--paths-from",
            list.to_str().unwrap(),
            "--receipt",
            receipt.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // Before compaction the deleted records are still there: verify --deleted finds each.
    let scan = |ds: &Path| {
        run([
            "verify".as_ref(),
            ds.as_os_str(),
            "--deleted".as_ref(),
            receipt.as_os_str(),
            "--json".as_ref(),
        ])
    };
    let o = scan(&ds);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["deleted"]["found"].as_array().unwrap().len(), 30, "{j}");
    let verify = |ds: &Path| json_of(&["verify".as_ref(), ds.as_os_str(), "--json".as_ref()]);
    let before = verify(&ds);
    let want: Vec<(Vec<u8>, Vec<u8>)> = files
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 7 != 0)
        .map(|(_, f)| f.clone())
        .collect();
    let want = sorted(want);
    // A reader that opened this generation before the compaction.
    let old = Arc::new(Dataset::open(&ds).unwrap());
    let wanted: BTreeMap<Vec<u8>, Vec<u8>> = want.iter().cloned().collect();
    // Above a share nobody reaches, nothing is rewritten.
    let none = compact(&ds, &["--min-dead", "1"]);
    assert!(
        none["generation"].is_null() && none["chunks_left"].as_u64() > Some(0),
        "{none}"
    );
    // With the default grace the replaced files stay: the old reader reads them.
    let s = compact(&ds, &["--all"]);
    assert_eq!(s["records_removed"].as_u64(), Some(30), "{s}");
    assert!(
        s["files_waiting"].as_array().unwrap().len() as u64
            == s["chunks_rewritten"].as_u64().unwrap()
    );
    assert_eq!(
        epoch(&old, ShuffleMode::Chunkwise, 1, 1, &wanted).len(),
        want.len()
    );
    let v = verify(&ds);
    assert_eq!(
        (v["digest"].clone(), v["samples_digest"].clone()),
        (before["digest"].clone(), before["samples_digest"].clone())
    );
    let out = tmp.path().join("x1");
    assert_eq!(extracted(&ds, &out), want);
    assert!(
        !holds(&ds, b"MARKER-0007-GONE").is_empty(),
        "kept for the grace period"
    );
    // Grace 0: the replaced files go; the old reader now fails naming the missing file.
    let s = compact(&ds, &["--grace", "0"]);
    assert!(
        s["generation"].is_null() && !s["files_removed"].as_array().unwrap().is_empty(),
        "{s}"
    );
    for i in (0..210).step_by(7) {
        let m = format!("MARKER-{i:04}-GONE");
        assert!(
            holds(&ds, m.as_bytes()).is_empty(),
            "{m} still in the dataset"
        );
    }
    // ... and verify --deleted proves it from the receipt.
    let o = scan(&ds);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(j["deleted"]["found"].as_array().unwrap().is_empty(), "{j}");
    assert!(j["deleted"]["records"].as_u64() > Some(100), "{j}");
    let o = Shard {
        rank: 0,
        world_size: 1,
        worker: 0,
        num_workers: 1,
    };
    let err = old
        .stream_epoch(
            &PlanOptions::default(),
            0,
            o,
            None,
            &StreamOptions::default(),
        )
        .and_then(|s| s.collect::<granary::Result<Vec<_>>>());
    let e = err.map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("chunk-0"), "{e}");
    // The compacted dataset: every remaining sample once, verify clean, reads as before.
    let new = Arc::new(Dataset::open(&ds).unwrap());
    for (world, workers) in [(1, 1), (1, 3)] {
        assert_eq!(
            epoch(&new, ShuffleMode::Chunkwise, world, workers, &wanted).len(),
            want.len()
        );
    }
    let v = verify(&ds);
    assert_eq!(v["digest"], before["digest"]);
    let info = json_of(&["info".as_ref(), ds.as_os_str(), "--json".as_ref()]);
    assert_eq!(info["deleted"]["bytes"].as_u64(), Some(0), "{info}");
    // It grows and shrinks on: an append and another deletion, then compaction again.
    let more = tmp.path().join("more");
    write_tree(&more, &[(b"c0/new.bin".to_vec(), bytes(77, 900))]);
    run_ok(["append".as_ref(), ds.as_os_str(), more.as_os_str()]);
    std::fs::write(&list, "c1/f001.bin\nc0/new.bin\n").unwrap();
    assert!(delete(&ds, &["--paths-from", list.to_str().unwrap()])
        .status
        .success());
    let s = compact(&ds, &["--all", "--grace", "0"]);
    assert_eq!(s["records_removed"].as_u64(), Some(2), "{s}");
    let v = verify(&ds);
    assert!(v["problems"].as_array().is_none_or(|p| p.is_empty()), "{v}");
    let names: Vec<String> = std::fs::read_dir(&ds)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().any(|n| n.contains(".r2.")), "{names:?}");
    assert_eq!(
        Dataset::open(&ds).unwrap().selected_len(),
        want.len() as u64 - 1
    );
}

#[test]
fn compaction_of_samples_with_fields() {
    let tmp = tempfile::tempdir().unwrap();
    let members: Vec<(String, Vec<u8>)> = (0..40u64)
        .flat_map(|s| {
            let key = format!("{s:04}");
            vec![
                (format!("{key}.jpg"), bytes(s, 300)),
                (format!("{key}.txt"), format!("caption {s}").into_bytes()),
            ]
        })
        .collect();
    let tar = tmp.path().join("shard.tar");
    write_tar(&tar, &members);
    let ds = tmp.path().join("ds");
    import_tar(&tar, &ds, &["--chunk-size", "4KiB"]);
    let list = tmp.path().join("gone.txt");
    std::fs::write(&list, "0003\n0010\n0011\n").unwrap();
    let o = delete(&ds, &["--paths-from", list.to_str().unwrap(), "--strict"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let before = json_of(&["verify".as_ref(), ds.as_os_str(), "--json".as_ref()]);
    // The temporary file of a compaction killed while it wrote a chunk: the next one removes it.
    let stale = ds.join("chunk-00000001.r1.gchunk.0badc0de-7-0.tmp");
    std::fs::write(&stale, b"half a chunk").unwrap();
    let s = compact(&ds, &["--all", "--grace", "0"]);
    assert_eq!(s["records_removed"].as_u64(), Some(3), "{s}");
    assert!(!stale.exists(), "{s}");
    let v = json_of(&["verify".as_ref(), ds.as_os_str(), "--json".as_ref()]);
    assert_eq!(v["digest"], before["digest"], "{v}");
    let ds = Dataset::open(&ds).unwrap();
    assert_eq!(ds.selected_len(), 37);
    let id = ds.lookup(b"0012").unwrap().unwrap();
    let f = ds.read_fields(id, None).unwrap();
    assert_eq!(f[1].1, b"caption 12");
}

#[test]
fn importance_sampling_of_a_dataset_with_deleted_samples_is_refused_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let (ds, _) = packed(tmp.path());
    let cache = tmp.path().join("tier");
    drop(save_every_seventh_scores(&ds, &cache));
    let read = || {
        run([
            "read".as_ref(),
            ds.as_os_str(),
            "--cache-dir".as_ref(),
            cache.as_os_str(),
            "--cache-size".as_ref(),
            "1GiB".as_ref(),
            "--sampling".as_ref(),
            "importance".as_ref(),
        ])
    };
    assert!(read().status.success(), "{}", stderr(&read()));
    assert!(delete(&ds, &["--prefix", "c1/f00"]).status.success());
    let o = read();
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("dataset with deleted samples"),
        "{}",
        stderr(&o)
    );
    // The importance policy of the tier (hot chunks of the samples that matter) goes on: it
    // takes no deleted sample.
    let o = run([
        "read".as_ref(),
        ds.as_os_str(),
        "--cache-dir".as_ref(),
        cache.as_os_str(),
        "--cache-size".as_ref(),
        "1GiB".as_ref(),
        "--policy".as_ref(),
        "importance".as_ref(),
        "--epochs".as_ref(),
        "2".as_ref(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn a_mixture_of_a_source_with_deletions_reads_its_rest_and_keeps_its_shares() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, _) = packed(&tmp.path().join("one"));
    let (b, _) = packed(&tmp.path().join("two"));
    assert!(delete(&a, &["--class", "c2"]).status.success());
    // One pass over each: source A delivers exactly its remaining samples (verify's digest).
    let r = json_of(&[
        "read".as_ref(),
        a.as_os_str(),
        b.as_os_str(),
        "--json".as_ref(),
    ]);
    let va = json_of(&["verify".as_ref(), a.as_os_str(), "--json".as_ref()]);
    let src = &r[0]["sources"];
    assert_eq!(src[0]["samples"].as_u64(), Some(200), "{r}");
    assert_eq!(src[0]["digest"], va["digest"], "{r}");
    assert_eq!(src[1]["samples"].as_u64(), Some(300), "{r}");
    // Weights: the epoch's shares as asked, A's from its 200 samples.
    let r = json_of(&[
        "read".as_ref(),
        a.as_os_str(),
        b.as_os_str(),
        "--weights".as_ref(),
        "0.5,0.5".as_ref(),
        "--json".as_ref(),
    ]);
    let src = &r[0]["sources"];
    assert_eq!(
        (src[0]["samples"].as_u64(), src[1]["samples"].as_u64()),
        (Some(250), Some(250)),
        "{r}"
    );
}
