//! Regression tests, each named after the defect it pins (data safety). Every one of
//! them failed on the code before its fix.

use std::path::Path;

use crate::common::*;

/// Every entry under `root` (files, links, empty directories) with what it is.
fn inventory(root: &Path) -> Vec<(String, String)> {
    let mut v = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let ft = e.file_type().unwrap();
            let rel = e.path().strip_prefix(root).unwrap().display().to_string();
            let kind = if ft.is_symlink() {
                format!("link->{}", std::fs::read_link(e.path()).unwrap().display())
            } else if ft.is_dir() {
                stack.push(e.path());
                "dir".into()
            } else {
                format!("file {:?}", std::fs::read(e.path()).unwrap())
            };
            v.push((rel, kind));
        }
    }
    v.sort();
    v
}

#[test]
fn pack_src_onto_itself_with_force_deletes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let par = tmp.path().join("par");
    let data = par.join("child");
    write_tree(&data, &numbered_tree(20, 2, |i| 100 + i as usize));
    std::os::unix::fs::symlink("c0/f000", data.join("link")).unwrap();
    std::fs::create_dir(data.join("empty")).unwrap();
    write_tree(&par, &[(b"other/important".to_vec(), b"keep me".to_vec())]);
    let before = inventory(&par);

    let alias = tmp.path().join("alias");
    std::os::unix::fs::symlink(&data, &alias).unwrap();
    let dotdot = data.join("c0/../../child");
    for (out, why) in [
        (&data, "is the source"),
        (&alias, "is the source"),
        (&dotdot, "is the source"),
        (&par, "contains the source"),
        (&data.join("c1/new"), "is inside the source"),
    ] {
        for extra in [&["--force"][..], &["--force", "--resume"]] {
            let o = pack(&data, out, extra);
            assert_eq!(
                o.status.code(),
                Some(1),
                "{}: {}",
                out.display(),
                stderr(&o)
            );
            assert!(
                stderr(&o).contains(why),
                "{}: {}",
                out.display(),
                stderr(&o)
            );
        }
    }
    assert_eq!(inventory(&par), before, "the source tree was changed");
    assert!(!tmp.path().join(".par.partial").exists());
}

#[test]
fn force_replaces_only_a_granary_dataset() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &numbered_tree(10, 2, |_| 50));
    let mine = tmp.path().join("mine");
    write_tree(&mine, &[(b"notes.txt".to_vec(), b"mine".to_vec())]);
    let o = pack(&src, &mine, &["--force"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("is not a granary dataset") && stderr(&o).contains("notes.txt"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(mine.join("notes.txt")).unwrap(), b"mine");
    let file = tmp.path().join("file");
    std::fs::write(&file, b"a file").unwrap();
    let o = pack(&src, &file, &["--force"]);
    assert!(stderr(&o).contains("not a directory"), "{}", stderr(&o));
    assert_eq!(std::fs::read(&file).unwrap(), b"a file");

    // A dataset (or an empty directory) is replaced; so is the build directory of one.
    let ds = tmp.path().join("ds");
    std::fs::create_dir(&ds).unwrap();
    for replaced in ["an empty directory", "a dataset"] {
        let o = pack(&src, &ds, &["--force"]);
        assert!(o.status.success(), "{replaced}: {}", stderr(&o));
    }
    // ...but not once the user has put something of theirs beside the chunks.
    std::fs::write(ds.join("README"), b"about this data").unwrap();
    let o = pack(&src, &ds, &["--force"]);
    assert!(stderr(&o).contains("README"), "{}", stderr(&o));
    assert!(ds.join("README").exists());
    let work = tmp.path().join(".ds2.partial");
    std::fs::create_dir(&work).unwrap();
    std::fs::write(work.join("precious"), b"x").unwrap();
    let o = pack(&src, &tmp.path().join("ds2"), &["--force"]);
    assert!(stderr(&o).contains("precious"), "{}", stderr(&o));
    assert!(work.join("precious").exists());
}

#[test]
fn concurrent_packs_of_one_output_never_mix() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(
        &src,
        &numbered_tree(300, 3, |i| 2000 + (i as usize * 37) % 3000),
    );
    let ds = tmp.path().join("ds");
    // Another pack holds the build directory: this one fails at once and touches nothing.
    let work = tmp.path().join(".ds.partial");
    std::fs::create_dir(&work).unwrap();
    let held = std::fs::File::open(&work).unwrap();
    rustix::fs::flock(&held, rustix::fs::FlockOperation::LockExclusive).unwrap();
    for extra in [&["--force"][..], &["--resume"], &[]] {
        let o = pack(&src, &ds, extra);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("another granary pack is building"),
            "{}",
            stderr(&o)
        );
    }
    assert!(work.exists() && !ds.exists());
    drop(held);
    std::fs::remove_dir(&work).unwrap();

    // Racing for real: whatever wins, the published dataset is one pack's, whole.
    for _ in 0..4 {
        let args = |seed: &str| {
            let mut c = granary();
            c.args(["pack", src.to_str().unwrap(), "-o", ds.to_str().unwrap()])
                .args(["--force", "--json", "--chunk-size", "16KiB", "--seed", seed]);
            c.stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            c
        };
        let (a, b) = (args("1").spawn().unwrap(), args("2").spawn().unwrap());
        let ids: Vec<String> = [a, b]
            .into_iter()
            .filter_map(|c| {
                let o = c.wait_with_output().unwrap();
                o.status.success().then(|| {
                    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
                    v["dataset_id"].as_str().unwrap().to_string()
                })
            })
            .collect();
        assert!(!ids.is_empty(), "neither pack succeeded");
        run_ok(["verify", ds.to_str().unwrap()]);
        let info = stdout(&run_ok(["info", ds.to_str().unwrap(), "--json"]));
        assert!(
            ids.iter().any(|id| info.contains(id.as_str())),
            "{info} {ids:?}"
        );
    }
}

/// Builds a dataset and rewrites its chunk table with the given edit, CRCs recomputed.
fn dataset_with_chunk_table(tmp: &Path, edit: impl Fn(&mut [u8])) -> std::path::PathBuf {
    dataset_with_section(tmp, 2, edit)
}

/// Builds a dataset and rewrites snapshot section `kind` with the given edit, CRCs recomputed.
fn dataset_with_section(tmp: &Path, kind: u32, edit: impl Fn(&mut [u8])) -> std::path::PathBuf {
    let files = numbered_tree(40, 2, |_| 500);
    let ds = packed_tree(
        &tmp.join("src"),
        &files,
        &tmp.join("ds"),
        &["--chunk-size", "4KiB"],
    );
    let snap = ds.join(granary_format::SNAPSHOT_FILE);
    let mut b = std::fs::read(&snap).unwrap();
    let head = granary_format::SNAPSHOT_HEADER_LEN;
    let n = u32::from_le_bytes(b[head..head + 4].try_into().unwrap()) as usize;
    let (off, len) = (0..n)
        .map(|i| head + 8 + i * 24)
        .find(|&e| u32::from_le_bytes(b[e..e + 4].try_into().unwrap()) == kind)
        .map(|e| {
            let at = |o: usize| u64::from_le_bytes(b[e + o..e + o + 8].try_into().unwrap());
            (at(8) as usize, at(16) as usize)
        })
        .unwrap();
    edit(&mut b[off..off + len]);
    reseal_snapshot(&mut b);
    std::fs::write(&snap, &b).unwrap();
    ds
}

#[test]
fn wrong_sample_count_in_a_resealed_chunk_table_is_refused_not_a_panic() {
    type Edit = fn(&mut [u8]);
    // Chunk 1's first sample (bytes 8..16 of its 56-byte entry).
    let edits: [(&str, Edit); 3] = [
        ("300000000", |t| {
            t[64..72].copy_from_slice(&300_000_000u64.to_le_bytes())
        }),
        ("u64::MAX", |t| {
            t[64..72].copy_from_slice(&u64::MAX.to_le_bytes())
        }),
        // Chunk 2 starting before chunk 1: ranges that overlap.
        ("overlap", |t| {
            let c1 = u64::from_le_bytes(t[64..72].try_into().unwrap());
            t[120..128].copy_from_slice(&(c1 - 1).to_le_bytes());
        }),
    ];
    for (what, edit) in edits {
        let tmp = tempfile::tempdir().unwrap();
        let ds = dataset_with_chunk_table(tmp.path(), edit);
        for cmd in ["read", "plan", "info", "verify"] {
            let o = run([cmd, ds.to_str().unwrap()]);
            assert_eq!(o.status.code(), Some(1), "{what} {cmd}: {}", stderr(&o));
            let said = stdout(&o) + &stderr(&o);
            assert!(said.contains("chunk table"), "{what} {cmd}: {said}");
        }
    }
}

#[test]
fn resume_after_the_source_changed_is_refused_and_says_what_changed() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, ds) = (tmp.path().join("src"), tmp.path().join("ds"));
    interrupted_pack(tmp.path());
    let same = INTERRUPTED_PACK_ARGS;

    // Same sizes, new content (a kept chunk's file), one file added.
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(src.join("c0/f000"), bytes(1000, 3000)).unwrap();
    std::fs::write(src.join("c1/new"), b"arrived later").unwrap();
    let o = pack(&src, &ds, &[&same[..], &["--resume"]].concat());
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("source changed"), "{e}");
    assert!(
        e.contains("1 modified, e.g. c0/f000") && e.contains("1 added, e.g. c1/new"),
        "{e}"
    );
    assert!(!ds.exists());

    // --force packs the source as it is now.
    let o = pack(&src, &ds, &[&same[..], &["--force"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let out = tmp.path().join("out");
    run_ok(["extract", ds.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(read_tree(&out), read_tree(&src));
}

#[test]
fn cache_stats_survives_a_non_ascii_32_byte_directory_name() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("tier");
    // 32 bytes whose even byte offsets fall inside characters (the name was sliced there).
    let odd = format!("a{}b", "é".repeat(15));
    assert_eq!(odd.len(), 32);
    std::fs::create_dir_all(root.join(&odd)).unwrap();
    std::fs::create_dir_all(root.join("é".repeat(16))).unwrap();
    std::fs::create_dir_all(root.join("+f".repeat(16))).unwrap();
    let o = run_ok(["cache", "stats", root.to_str().unwrap()]);
    assert!(!stdout(&o).contains("é"), "{}", stdout(&o));
    run_ok(["cache", "clear", root.to_str().unwrap()]);
    assert!(root.join(&odd).exists(), "not a tier: left alone");
}

#[test]
fn read_digest_covers_content_not_only_sample_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let mut files = numbered_tree(60, 3, |i| 300 + i as usize);
    let digest_of = |files: &[(Vec<u8>, Vec<u8>)], name: &str| -> (String, String) {
        let src = tmp.path().join(format!("src-{name}"));
        let ds = packed_tree(
            &src,
            files,
            &tmp.path().join(name),
            &["--chunk-size", "4KiB"],
        );
        let o = run_ok(["read", ds.to_str().unwrap(), "--json", "--workers", "2"]);
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let o = run_ok(["verify", ds.to_str().unwrap(), "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (
            r[0]["digest"].as_str().unwrap().to_string(),
            v["digest"].as_str().unwrap().to_string(),
        )
    };
    let (read_a, verify_a) = digest_of(&files, "a");
    assert_eq!(read_a, verify_a, "a complete epoch shows verify's digest");
    // Same paths, sizes and layout (so the same sample ids), one byte different.
    files[17].1[5] ^= 1;
    let (read_b, verify_b) = digest_of(&files, "b");
    assert_eq!(read_b, verify_b);
    assert_ne!(read_a, read_b, "the digest cannot tell the contents apart");
}

#[test]
fn extract_refuses_a_namespace_that_repeats_or_skips_samples() {
    let tmp = tempfile::tempdir().unwrap();
    // Kind 7 is the namespace: its first page lists the first file's sample twice, the
    // second file's not at all.
    let ds = dataset_with_section(tmp.path(), 7, |t| {
        let word = |at: usize| u64::from_le_bytes(t[at..at + 8].try_into().unwrap()) as usize;
        let pages = t.len() - word(24);
        // Entries: varint shared, varint suffix length, suffix, varint tag (0: a directory),
        // varint size for a file; no attributes in this dataset... but pack records them:
        // mode and zigzag mtime delta follow.
        let varint = |t: &[u8], at: &mut usize| {
            let mut v = 0u64;
            for i in 0.. {
                let b = t[*at];
                *at += 1;
                v |= u64::from(b & 0x7f) << (7 * i);
                if b < 0x80 {
                    break;
                }
            }
            v
        };
        let mut at = pages;
        let mut tags = Vec::new();
        while tags.len() < 2 {
            let _shared = varint(t, &mut at);
            let len = varint(t, &mut at) as usize;
            at += len;
            let tag_at = at;
            let tag = varint(t, &mut at);
            if tag != 0 {
                varint(t, &mut at);
                tags.push((tag_at, at - tag_at));
            }
            varint(t, &mut at);
            varint(t, &mut at);
        }
        assert_eq!(t[tags[0].0] >> 7, t[tags[1].0] >> 7, "one-byte tags");
        t[tags[1].0] = t[tags[0].0];
    });
    // A prefix is looked up through the order: refused, nothing written.
    let out = tmp.path().join("out");
    let o = run([
        "extract",
        ds.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "c",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("namespace is damaged"),
        "{}",
        stderr(&o)
    );
    assert!(!out.exists() || read_tree(&out).is_empty());
    // The whole tree: the sample whose entry is gone has no path (its id table entry points
    // at the other one's), so it fails by name; every other file is extracted right.
    let o = run(["extract", ds.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("id table"), "{}", stderr(&o));
    let src = read_tree(&tmp.path().join("src"));
    let got = read_tree(&out);
    assert_eq!(got.len(), src.len() - 1);
    assert!(
        got.iter().all(|f| src.contains(f)),
        "a file extracted with wrong bytes"
    );
}

#[test]
fn reindex_on_a_full_disk_leaves_no_temporary_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let files = numbered_tree(3000, 3, |_| 10);
    let ds = packed_tree(&tmp.path().join("src"), &files, &tmp.path().join("ds"), &[]);
    let snap = ds.join(granary_format::SNAPSHOT_FILE);
    let size = std::fs::metadata(&snap).unwrap().len();
    std::fs::remove_file(&snap).unwrap();
    // A file size limit below the snapshot's size fails its write as a full disk would.
    let o = run_with_file_size_limit(size / 1024 / 2, ["reindex", ds.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let left: Vec<_> = std::fs::read_dir(&ds)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".gchunk"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    run_ok(["reindex", ds.to_str().unwrap()]);
    run_ok(["verify", ds.to_str().unwrap()]);
}

#[test]
fn readers_killed_mid_write_leave_the_tier_within_its_quota() {
    let tmp = tempfile::tempdir().unwrap();
    let files = numbered_tree(400, 4, |i| 3000 + (i as usize * 53) % 4000);
    let (src, ds) = (tmp.path().join("src"), tmp.path().join("ds"));
    let ds = packed_tree(&src, &files, &ds, &["--chunk-size", "64KiB"]);
    let tier = tmp.path().join("tier");
    let quota: u64 = 400 << 10;
    let on_disk = || -> u64 {
        let mut total = 0;
        for d in std::fs::read_dir(&tier).unwrap().flatten() {
            for f in std::fs::read_dir(d.path()).unwrap().flatten() {
                let n = f.file_name().to_string_lossy().into_owned();
                // The tier's own bookkeeping (index, lock, map) is not data.
                if n.contains(".gchunk") || n.contains(".tmp") {
                    total += f.metadata().unwrap().len();
                }
            }
        }
        total
    };
    let mut worst = 0;
    for i in 0..24u64 {
        let mut c = granary()
            .args([
                "read",
                ds.to_str().unwrap(),
                "--cache-dir",
                tier.to_str().unwrap(),
            ])
            .args([
                "--cache-size",
                &quota.to_string(),
                "--policy",
                "lru",
                "--io",
                "buffered",
            ])
            .args(["--first-epoch", &i.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5 + (i * 7) % 40));
        let _ = c.kill(); // SIGKILL, wherever it is
        c.wait().unwrap();
        if tier.exists() {
            worst = worst.max(on_disk());
        }
    }
    // The next reader to take the lock removes what the killed ones left.
    run_ok(["cache", "stats", tier.to_str().unwrap()]);
    assert!(
        on_disk() <= quota,
        "{} bytes on disk, quota {quota}",
        on_disk()
    );
    run_ok(["cache", "clear", tier.to_str().unwrap()]);
    assert_eq!(on_disk(), 0);
    eprintln!("worst on disk between kills: {worst} bytes (quota {quota})");
}

/// A copy of the 1.x golden dataset (format 1.6) in a new temporary directory.
fn golden_v1_copy() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let ds = tmp.path().join("dataset");
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v1.6/dataset");
    copy_dir(&golden, &ds);
    (tmp, ds)
}

/// The names in `dir` that are not the dataset's own files.
fn strays(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".gchunk") && n != "snapshot.gsnap" && n != "snapshot-1.x.gsnap")
        .collect()
}

#[test]
fn metrics_are_never_written_over_what_is_not_a_report() {
    let tmp = tempfile::tempdir().unwrap();
    let files = numbered_tree(40, 2, |_| 100);
    let ds = packed_tree(&tmp.path().join("src"), &files, &tmp.path().join("ds"), &[]);
    let link = tmp.path().join("null-link");
    std::os::unix::fs::symlink("/dev/null", &link).unwrap();
    let sub = tmp.path().join("a-dir");
    std::fs::create_dir(&sub).unwrap();
    let snap = ds.join("snapshot.gsnap");
    let before = std::fs::read(&snap).unwrap();
    for (target, want) in [
        (link.clone(), "a symbolic link"),
        (sub.clone(), "a directory"),
        (snap.clone(), "a granary file's name"),
        (ds.join("m.prom"), "inside the dataset"),
    ] {
        let o = run([
            "read".as_ref(),
            ds.as_os_str(),
            "--metrics".as_ref(),
            target.as_os_str(),
        ]);
        assert_eq!(
            o.status.code(),
            Some(1),
            "{}: {}",
            target.display(),
            stderr(&o)
        );
        assert!(
            stderr(&o).contains(want),
            "{}: {}",
            target.display(),
            stderr(&o)
        );
    }
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(sub.is_dir());
    assert_eq!(std::fs::read(&snap).unwrap(), before);
    assert_eq!(strays(&ds), Vec::<String>::new());
    // A regular file is replaced whole, and nothing else is left beside it.
    let m = tmp.path().join("m.prom");
    std::fs::write(&m, b"old").unwrap();
    run_ok([
        "read".as_ref(),
        ds.as_os_str(),
        "--metrics".as_ref(),
        m.as_os_str(),
    ]);
    assert!(std::fs::read_to_string(&m)
        .unwrap()
        .contains("granary_epoch_seconds"));
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn an_intact_1x_dataset_is_pointed_to_upgrade_not_called_damaged_or_reindexed() {
    let (_tmp, ds) = golden_v1_copy();
    let snap = ds.join("snapshot.gsnap");
    let before = std::fs::read(&snap).unwrap();
    let o = run(["verify".as_ref(), ds.as_os_str()]);
    assert_eq!(o.status.code(), Some(3), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("UPGRADE") && stdout(&o).contains("granary upgrade"));
    assert!(!stdout(&o).contains("DAMAGED"), "{}", stdout(&o));
    let o = run(["reindex".as_ref(), ds.as_os_str()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("granary upgrade"), "{}", stderr(&o));
    assert_eq!(
        std::fs::read(&snap).unwrap(),
        before,
        "reindex replaced a 1.x snapshot"
    );
    // Upgraded, it verifies; and `pack --force` may replace it (the kept 1.x snapshot is
    // the dataset's own file).
    run_ok(["upgrade".as_ref(), ds.as_os_str()]);
    run_ok(["verify".as_ref(), ds.as_os_str()]);
    let src = tempfile::tempdir().unwrap();
    write_tree(src.path(), &numbered_tree(10, 2, |_| 50));
    let o = pack(src.path(), &ds, &["--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    run_ok(["verify".as_ref(), ds.as_os_str()]);
}

#[test]
fn concurrent_upgrades_of_one_dataset_all_end_in_the_upgraded_dataset() {
    for round in 0..3 {
        let (_tmp, ds) = golden_v1_copy();
        let children: Vec<_> = (0..4)
            .map(|_| spawn(["upgrade".as_ref(), ds.as_os_str()]))
            .collect();
        for c in children {
            let o = c.wait_with_output().unwrap();
            assert!(o.status.success(), "round {round}: {}", stderr(&o));
        }
        run_ok(["verify".as_ref(), ds.as_os_str()]);
        assert_eq!(strays(&ds), Vec::<String>::new(), "round {round}");
        assert!(ds.join("snapshot-1.x.gsnap").is_file());
    }
}

#[test]
fn a_view_is_what_cat_info_and_verify_speak_of() {
    let tmp = tempfile::tempdir().unwrap();
    let files = numbered_tree(60, 3, |_| 100);
    let ds = packed_tree(&tmp.path().join("src"), &files, &tmp.path().join("ds"), &[]);
    let view = tmp.path().join("c1.gview");
    run_ok([
        "view".as_ref(),
        ds.as_os_str(),
        "-o".as_ref(),
        view.as_os_str(),
        "--class".as_ref(),
        "c1".as_ref(),
    ]);
    let d = granary::Dataset::open(&view).unwrap();
    let inside = d.view().unwrap().ids[0];
    let outside = (0..d.len()).find(|&i| !d.selects(i)).unwrap();
    run_ok([
        "cat".as_ref(),
        view.as_os_str(),
        "--id".as_ref(),
        inside.to_string().as_ref(),
    ]);
    let o = run([
        "cat".as_ref(),
        view.as_os_str(),
        "--id".as_ref(),
        outside.to_string().as_ref(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains(&format!("no sample {outside} there")),
        "{}",
        stderr(&o)
    );
    assert!(o.stdout.is_empty());
    let o = run_ok(["info".as_ref(), view.as_os_str()]);
    assert!(
        stdout(&o).contains("selects        20 of the dataset's 60 samples"),
        "{}",
        stdout(&o)
    );
    let o = run_ok(["verify".as_ref(), view.as_os_str()]);
    assert!(
        stdout(&o).contains("is a view selecting 20 of the 60 samples"),
        "{}",
        stdout(&o)
    );
    // A damaged view is made again: nothing points at the dataset's snapshot.
    let mut b = std::fs::read(&view).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 0xff;
    std::fs::write(&view, &b).unwrap();
    let o = run(["info".as_ref(), view.as_os_str()]);
    assert!(
        stderr(&o).contains("make it again with `granary view`"),
        "{}",
        stderr(&o)
    );
    assert!(!stderr(&o).contains("reindex"), "{}", stderr(&o));
}

#[test]
fn cat_reads_names_as_ls_shows_them() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(
        &src,
        &[
            (b"p\\q".to_vec(), b"one".to_vec()),
            (b"p\\\\q".to_vec(), b"two".to_vec()),
        ],
    );
    let ds = tmp.path().join("ds");
    assert!(pack(&src, &ds, &[]).status.success());
    let listed = stdout(&run_ok(["ls".as_ref(), ds.as_os_str()]));
    let names: Vec<&str> = listed.lines().collect();
    assert_eq!(names, ["p\\\\\\\\q", "p\\\\q"]);
    for (name, want) in names.iter().zip(["two", "one"]) {
        let o = run_ok(["cat".as_ref(), ds.as_os_str(), name.as_ref()]);
        assert_eq!(o.stdout, want.as_bytes(), "{name}");
    }
}

#[test]
fn a_pack_that_fails_in_its_scan_leaves_nothing_that_blocks_the_next() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &numbered_tree(5, 1, |_| 10));
    let list = tmp.path().join("list");
    let first = read_tree(&src)[0].0.clone();
    std::fs::write(&list, [&first[..], b"\nmissing/file\n"].concat()).unwrap();
    let out = tmp.path().join("out");
    let o = pack(&src, &out, &["--files-from", list.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(!tmp.path().join(".out.partial").exists());
    std::fs::write(&list, [&first[..], b"\n"].concat()).unwrap();
    let o = pack(&src, &out, &["--files-from", list.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    // A chunk size larger than the machine can allocate packs with buffers of what is there.
    let o = pack(&src, &tmp.path().join("big"), &["--chunk-size", "1TiB"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn the_view_help_example_selects_something() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(
        &src,
        &[
            (b"train/part-0/a/x.jpg".to_vec(), b"1".to_vec()),
            (b"train/part-0/y.jpg".to_vec(), b"2".to_vec()),
            (b"train/part-0/z.txt".to_vec(), b"3".to_vec()),
            (b"train/part-1/w.jpg".to_vec(), b"4".to_vec()),
        ],
    );
    let ds = tmp.path().join("ds");
    assert!(pack(&src, &ds, &[]).status.success());
    let help = stdout(&run_ok(["view", "--help"]));
    let line = help.lines().find(|l| l.contains("--glob '")).unwrap();
    let glob = line.split('\'').nth(1).unwrap();
    let prefix = line
        .split("--prefix ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap();
    let v = tmp.path().join("v.gview");
    let o = run_ok([
        "view".as_ref(),
        ds.as_os_str(),
        "--prefix".as_ref(),
        prefix.as_ref(),
        "--glob".as_ref(),
        glob.as_ref(),
        "-o".as_ref(),
        v.as_os_str(),
    ]);
    assert!(stdout(&o).contains("2 of 4 samples"), "{}", stdout(&o));
}

#[test]
fn mixture_numbers_past_their_bound_are_refused_before_planning() {
    let tmp = tempfile::tempdir().unwrap();
    let mut ds = Vec::new();
    for name in ["a", "b", "c"] {
        let files = numbered_tree(20, 1, |_| 10);
        ds.push(packed_tree(
            &tmp.path().join(format!("src-{name}")),
            &files,
            &tmp.path().join(name),
            &[],
        ));
    }
    let d: Vec<&str> = ds.iter().map(|p| p.to_str().unwrap()).collect();
    for (extra, want) in [
        (
            vec!["--weights", "1e305,1,1", "--epoch-size", "100000000000"],
            "an epoch size of 100000000000",
        ),
        (
            vec!["--weights", "repeat=1e300,repeat=1,repeat=1"],
            "repeat=1e300 of 20 samples",
        ),
        (
            vec!["--weights", "choose=18446744073709551615,repeat=1,repeat=1"],
            "at most 4294967296 samples",
        ),
        (
            vec!["--weights", "1,1,1", "--epoch-size", "18446744073709551615"],
            "at most 4294967296 samples",
        ),
        (vec!["--weights", "1e308,1e308,1e-300"], "too small beside"),
    ] {
        let o = run([&["read"], &d[..], &extra[..]].concat());
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(stderr(&o).contains(want), "{extra:?}: {}", stderr(&o));
    }
}

/// A chunk whose footer carries another class table than the snapshot's is reported by
/// `verify` (every chunk carries the snapshot's table, SPEC.md §4).
#[test]
fn verify_compares_each_chunks_class_table_with_the_snapshots() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = tmp.path().join("ds");
    std::fs::create_dir_all(&ds).unwrap();
    let id = [7u8; 16];
    let mut b = granary_format::SnapshotBuilder::new(id, vec![b"cat".to_vec(), b"dog".to_vec()]);
    for (c, table) in [
        (0u32, vec![&b"cat"[..], b"dog"]),
        (1, vec![&b"cat"[..], b"emu"]),
    ] {
        let mut w = granary_format::ChunkWriter::new(Vec::new(), id, c).unwrap();
        let data = format!("sample of chunk {c}").into_bytes();
        let crc = granary_format::crc32(&data);
        let path = format!("cat/{c}.bin").into_bytes();
        w.append(
            &path,
            &data,
            granary_format::Compression::None,
            data.len() as u64,
            crc,
            0,
        )
        .unwrap();
        let (bytes, summary) = w.finish(&table).unwrap();
        std::fs::write(ds.join(granary_format::chunk_file_name(c)), bytes).unwrap();
        b.push_chunk(&summary).unwrap();
    }
    std::fs::write(ds.join(granary_format::SNAPSHOT_FILE), b.build().unwrap()).unwrap();
    let o = run(["verify".as_ref(), ds.as_os_str()]);
    assert_ne!(o.status.code(), Some(0));
    let text = stdout(&o) + &stderr(&o);
    assert!(text.contains("chunk 1: its footer's class table"), "{text}");
    assert!(
        !text.contains("chunk 0: its footer's class table"),
        "{text}"
    );
}
