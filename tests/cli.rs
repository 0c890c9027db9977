//! End-to-end tests of the `granary` binary.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::common::*;

#[test]
fn round_trip_edge_tree_in_every_mode() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let files = edge_tree();
    write_tree(&src, &files);
    let modes: &[&[&str]] = &[
        &[],
        &["--order", "walk", "--compress", "none"],
        &["--compress", "zstd:5", "--seed", "9", "--labels", "none"],
        &["--chunk-size", "1"],
    ];
    for (i, extra) in modes.iter().enumerate() {
        let ds = tmp.path().join(format!("ds{i}"));
        let mut args = extra.to_vec();
        if !extra.contains(&"--chunk-size") {
            args.extend_from_slice(&["--chunk-size", "20KiB"]);
        }
        let o = pack(&src, &ds, &args);
        assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
        run_ok(["verify".as_ref(), ds.as_os_str()]);
        let out = tmp.path().join(format!("out{i}"));
        run_ok([
            "extract".as_ref(),
            ds.as_os_str(),
            "-o".as_ref(),
            out.as_os_str(),
        ]);
        assert_eq!(read_tree(&out), sorted(files.clone()), "mode {extra:?}");
    }
}

#[test]
fn info_ls_cat_and_json() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let files = edge_tree();
    write_tree(&src, &files);
    let ds = tmp.path().join("ds");
    let o = pack(&src, &ds, &["--json", "--chunk-size", "64KiB"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["files"], files.len() as u64);
    assert_eq!(s["classes"], 12);
    assert!(s["chunks"].as_u64().unwrap() > 1);
    assert!(s["compressed_records"].as_u64().unwrap() > 0);
    assert!(stderr(&o).contains("outside any class directory"));

    let info: serde_json::Value = serde_json::from_slice(
        &run_ok(["info".as_ref(), ds.as_os_str(), "--json".as_ref()]).stdout,
    )
    .unwrap();
    assert_eq!(info["samples"], files.len() as u64);
    // Modes, mtimes and directories recorded.
    assert_eq!(info["format_version"], "2.0");
    assert_eq!(info["file_attributes"], true);
    let plain = tmp.path().join("plain");
    assert!(pack(&src, &plain, &["--no-metadata"]).status.success());
    let plain_info: serde_json::Value = serde_json::from_slice(
        &run_ok(["info".as_ref(), plain.as_os_str(), "--json".as_ref()]).stdout,
    )
    .unwrap();
    assert_eq!(plain_info["format_version"], "2.0");
    assert_eq!(plain_info["file_attributes"], false);

    // --chunk-files caps the files of a chunk whatever the chunk size.
    let capped = tmp.path().join("capped");
    let o = pack(&src, &capped, &["--json", "--chunk-files", "3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let c: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(c["chunks"], (files.len() as u64).div_ceil(3));
    let v: serde_json::Value = serde_json::from_slice(
        &run_ok(["verify".as_ref(), capped.as_os_str(), "--json".as_ref()]).stdout,
    )
    .unwrap();
    assert_eq!(v["clean"], true);
    assert_eq!(v["samples"], files.len() as u64);
    let o = pack(&src, &tmp.path().join("x"), &["--chunk-files", "0"]);
    assert!(stderr(&o).contains("at least 1 file"), "{}", stderr(&o));
    assert_eq!(info["classes"][3], "c03");
    assert_eq!(info["dataset_id"], s["dataset_id"]);

    let ls = stdout(&run_ok(["ls".as_ref(), ds.as_os_str()]));
    let listed: Vec<&str> = ls.lines().collect();
    assert_eq!(listed.len(), files.len());
    assert!(listed.contains(&"c02/\\xff\\xfe-latin1-\\xe9.jpg"));
    let mut sorted_listing = listed.clone();
    sorted_listing.sort();
    let ls_c03 = stdout(&run_ok([
        "ls".as_ref(),
        ds.as_os_str(),
        "c03/".as_ref(),
        "--long".as_ref(),
    ]));
    assert_eq!(ls_c03.lines().count(), 16);
    assert!(ls_c03.lines().all(|l| l.contains(" c03 ")));

    for (path, data) in &files {
        let o = run_ok([
            "cat".as_ref(),
            ds.as_os_str(),
            std::ffi::OsStr::from_bytes(path),
        ]);
        assert_eq!(&o.stdout, data, "{}", String::from_utf8_lossy(path));
    }
    // The escaped form shown by ls works too, and ids work.
    let o = run_ok([
        "cat",
        ds.to_str().unwrap(),
        "c02/\\xff\\xfe-latin1-\\xe9.jpg",
    ]);
    assert_eq!(o.stdout, b"\xff\xd8\xff\xe0jpeg-ish");
    let o = run(["cat", ds.to_str().unwrap(), "nope"]);
    assert!(!o.status.success() && stderr(&o).contains("no such path"));
    let o = run(["cat", ds.to_str().unwrap(), "--id", "999999"]);
    assert!(!o.status.success() && stderr(&o).contains("out of range"));
}

#[test]
fn refuses_bad_requests_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let ds = tmp.path().join("ds");
    let o = pack(&src, &ds, &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no files to pack"), "{}", stderr(&o));
    assert!(!ds.exists());

    write_tree(&src, &[(b"a/x".to_vec(), b"x".to_vec())]);
    let o = pack(&src, &src.join("inside"), &[]);
    assert!(stderr(&o).contains("inside the source"), "{}", stderr(&o));
    run_ok([
        "pack".as_ref(),
        src.as_os_str(),
        "-o".as_ref(),
        ds.as_os_str(),
    ]);
    let o = pack(&src, &ds, &[]);
    assert!(stderr(&o).contains("already exists"), "{}", stderr(&o));
    let o = pack(&src, &ds, &["--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = pack(&tmp.path().join("missing"), &tmp.path().join("ds2"), &[]);
    assert!(stderr(&o).contains("missing"), "{}", stderr(&o));
    let o = pack(&src, &tmp.path().join("ds3"), &["--compress", "lz77"]);
    assert_eq!(o.status.code(), Some(2));
    let o = run(["info", tmp.path().join("nothing").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("nothing"));
}

#[test]
fn files_from_list_and_vanished_files() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let files = edge_tree();
    write_tree(&src, &files);
    let list = tmp.path().join("list");
    let mut l = Vec::new();
    for (p, _) in files.iter().take(20) {
        l.extend_from_slice(b"./");
        l.extend_from_slice(p);
        l.push(0);
    }
    std::fs::write(&list, &l).unwrap();
    let ds = tmp.path().join("ds");
    let o = pack(
        &src,
        &ds,
        &["--files-from", list.to_str().unwrap(), "--json"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["files"], 20);

    // A listed file that does not exist: a clear error naming it, or skipped with exit 3.
    std::fs::write(&list, "c00/s000.bin\nc00/gone.bin\n").unwrap();
    let o = pack(
        &src,
        &tmp.path().join("ds2"),
        &["--files-from", list.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("c00/gone.bin"), "{}", stderr(&o));
    let o = pack(
        &src,
        &tmp.path().join("ds3"),
        &["--files-from", list.to_str().unwrap(), "--skip-unreadable"],
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("c00/gone.bin"));
    run_ok(["verify", tmp.path().join("ds3").to_str().unwrap()]);

    std::fs::write(&list, "../etc/passwd\n").unwrap();
    let o = pack(
        &src,
        &tmp.path().join("ds4"),
        &["--files-from", list.to_str().unwrap()],
    );
    assert!(stderr(&o).contains("'..'"), "{}", stderr(&o));
}

#[test]
fn symlinks_are_skipped_unless_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &[(b"a/real".to_vec(), b"real".to_vec())]);
    std::os::unix::fs::symlink("real", src.join("a/link")).unwrap();
    let ds = tmp.path().join("ds");
    let o = pack(&src, &ds, &["--json"]);
    assert!(stderr(&o).contains("symbolic link"), "{}", stderr(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["files"], 1);
    let o = pack(&src, &tmp.path().join("ds2"), &["--json", "--follow-links"]);
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["files"], 2);
}

#[test]
fn damaged_chunk_is_reported_and_never_served() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let files = edge_tree();
    write_tree(&src, &files);
    let ds = tmp.path().join("ds");
    let o = pack(
        &src,
        &ds,
        &[
            "--chunk-size",
            "16KiB",
            "--compress",
            "none",
            "--order",
            "walk",
        ],
    );
    assert!(o.status.success());
    // Flip one byte inside the record of c05/s004.bin.
    let long = stdout(&run_ok([
        "ls",
        ds.to_str().unwrap(),
        "c05/s004.bin",
        "--long",
    ]));
    let chunk: u32 = long.split_whitespace().nth(4).unwrap().parse().unwrap();
    let id: u64 = long.split_whitespace().next().unwrap().parse().unwrap();
    let snap = granary::Dataset::open(&ds).unwrap();
    let off = snap.sample(id).unwrap().entry.offset;
    drop(snap);
    let cpath = ds.join(granary_format::chunk_file_name(chunk));
    let mut bytes = std::fs::read(&cpath).unwrap();
    bytes[off as usize + 3] ^= 0x01;
    std::fs::write(&cpath, &bytes).unwrap();

    let o = run(["verify", ds.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let report = stdout(&o);
    assert!(
        report.contains("c05/s004.bin") && report.contains(&format!("offset {off}")),
        "{report}"
    );
    let o = run(["cat", ds.to_str().unwrap(), "c05/s004.bin"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty());
    assert!(stderr(&o).contains("checksum mismatch"), "{}", stderr(&o));
    let out = tmp.path().join("out");
    let o = run(["extract", ds.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("c05/s004.bin"));
    assert!(!out.join("c05/s004.bin").exists());
    let mut want = sorted(files.clone());
    want.retain(|(p, _)| p != b"c05/s004.bin");
    assert_eq!(read_tree(&out), want);
    // reindex refuses to build over damage (even when told to replace the snapshot).
    let o = run(["reindex", ds.to_str().unwrap(), "--force"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("damaged"), "{}", stderr(&o));
}

#[test]
fn reindex_rebuilds_a_lost_snapshot_byte_identically() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &edge_tree());
    let ds = tmp.path().join("ds");
    // Without modes, mtimes and directories (--no-metadata) too: checked below with them.
    assert!(pack(&src, &ds, &["--chunk-size", "32KiB", "--no-metadata"])
        .status
        .success());
    let snap = ds.join(granary_format::SNAPSHOT_FILE);
    let original = std::fs::read(&snap).unwrap();
    // An intact snapshot is replaced only with --force.
    let o = run(["reindex", ds.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("intact") && stderr(&o).contains("--force"));
    run_ok(["reindex", ds.to_str().unwrap(), "--force"]);
    assert_eq!(std::fs::read(&snap).unwrap(), original);
    std::fs::remove_file(&snap).unwrap();
    let o = run(["info", ds.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    run_ok(["reindex", ds.to_str().unwrap()]);
    assert_eq!(std::fs::read(&snap).unwrap(), original);
    // A damaged snapshot too.
    let mut bad = original.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0xFF;
    std::fs::write(&snap, &bad).unwrap();
    assert_eq!(run(["verify", ds.to_str().unwrap()]).status.code(), Some(1));
    run_ok(["reindex", ds.to_str().unwrap()]);
    assert_eq!(std::fs::read(&snap).unwrap(), original);
    // Without its snapshot, a dataset's commands say that reindex rebuilds it.
    let saved = std::fs::read(&snap).unwrap();
    std::fs::remove_file(&snap).unwrap();
    let o = run(["info", ds.to_str().unwrap()]);
    assert!(stderr(&o).contains("`granary reindex`"), "{}", stderr(&o));
    std::fs::write(&snap, saved).unwrap();
    // A missing chunk is named; the last one too, while a snapshot says how many there are.
    let chunks = std::fs::read_dir(&ds)
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            granary_format::parse_chunk_file_name(name.to_str().unwrap()).is_some()
        })
        .count() as u32;
    assert!(chunks > 2);
    let last = granary_format::chunk_file_name(chunks - 1);
    std::fs::rename(ds.join(&last), tmp.path().join("last")).unwrap();
    let o = run(["reindex", ds.to_str().unwrap(), "--force"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains(&last), "{}", stderr(&o));
    assert_eq!(std::fs::read(&snap).unwrap(), original);
    std::fs::rename(tmp.path().join("last"), ds.join(&last)).unwrap();
    std::fs::remove_file(ds.join(granary_format::chunk_file_name(1))).unwrap();
    let o = run(["reindex", ds.to_str().unwrap(), "--force"]);
    assert!(
        stderr(&o).contains("chunk-00000001.gchunk"),
        "{}",
        stderr(&o)
    );

    // A dataset with modes, mtimes and directories (empty ones too): the chunks record them,
    // so the rebuilt snapshot is byte for byte the packed one.
    let full = tmp.path().join("full");
    std::fs::create_dir_all(src.join("empty/inner")).unwrap();
    assert!(pack(&src, &full, &["--chunk-size", "32KiB"])
        .status
        .success());
    let snap = full.join(granary_format::SNAPSHOT_FILE);
    let original = std::fs::read(&snap).unwrap();
    std::fs::remove_file(&snap).unwrap();
    let o = run_ok(["reindex", full.to_str().unwrap()]);
    assert!(stdout(&o).contains("mtimes restored"), "{}", stdout(&o));
    assert_eq!(std::fs::read(&snap).unwrap(), original);
}

#[test]
fn foreign_chunk_is_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &edge_tree());
    let a = tmp.path().join("a");
    let b = tmp.path().join("b");
    assert!(pack(&src, &a, &["--order", "walk"]).status.success());
    assert!(pack(&src, &b, &["--order", "walk"]).status.success());
    let c0 = granary_format::chunk_file_name(0);
    std::fs::copy(b.join(&c0), a.join(&c0)).unwrap();
    let o = run(["verify", a.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("another dataset"), "{}", stdout(&o));
    let o = run(["cat", a.to_str().unwrap(), "c00/s000.bin"]);
    assert!(stderr(&o).contains("another dataset"), "{}", stderr(&o));
}

#[test]
fn crafted_snapshot_cannot_escape_the_target() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(
        &src,
        &[
            (b"xx/evil".to_vec(), b"evil1".to_vec()),
            (b"_tmp/ev".to_vec(), b"evil2".to_vec()),
            (b"ok/fine".to_vec(), b"fine".to_vec()),
        ],
    );
    let ds = tmp.path().join("ds");
    assert!(pack(&src, &ds, &[]).status.success());
    // The snapshot rewritten with two paths that leave the target, as a hostile author would.
    let snap = ds.join(granary_format::SNAPSHOT_FILE);
    let old = std::fs::read(&snap).unwrap();
    let s = granary_format::Snapshot::open(&old[..]).unwrap();
    let classes = (0..s.class_count())
        .map(|c| s.class_name(c as u32).unwrap().to_vec())
        .collect();
    let mut b = granary_format::SnapshotBuilder::new(s.dataset_id(), classes);
    b.unchecked_paths();
    for c in 0..s.chunk_count() {
        let mut sum = s.chunk_summary(c).unwrap();
        for p in sum.paths.iter_mut() {
            if p == b"xx/evil" {
                *p = b"../evil".to_vec();
            } else if p == b"_tmp/ev" {
                *p = b"/tmp/ev".to_vec();
            }
        }
        b.push_chunk(&sum).unwrap();
    }
    std::fs::write(&snap, b.build().unwrap()).unwrap();
    let out = tmp.path().join("deep/out");
    let o = run(["extract", ds.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("refusing unsafe path"),
        "{}",
        stderr(&o)
    );
    assert!(!tmp.path().join("deep/evil").exists());
    assert!(!Path::new("/tmp/ev").exists());
    assert_eq!(std::fs::read(out.join("ok/fine")).unwrap(), b"fine");
    // verify calls the crafted paths damage as well.
    let o = run(["verify", ds.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("'..' path component"), "{}", stdout(&o));
}

#[test]
fn extract_never_follows_symlinks_or_overwrites() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(
        &src,
        &[
            (b"cls/file".to_vec(), b"data".to_vec()),
            (b"other/x".to_vec(), b"x".to_vec()),
        ],
    );
    let ds = tmp.path().join("ds");
    assert!(pack(&src, &ds, &[]).status.success());
    let out = tmp.path().join("out");
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, out.join("cls")).unwrap();
    std::fs::create_dir_all(out.join("other")).unwrap();
    std::fs::write(out.join("other/x"), b"mine").unwrap();
    let o = run(["extract", ds.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("symbolic link"), "{}", stderr(&o));
    assert!(std::fs::read_dir(&elsewhere).unwrap().next().is_none());
    assert_eq!(std::fs::read(out.join("other/x")).unwrap(), b"mine");
}

/// The packer reads a chunk's files into one buffer that later chunks reuse (grown, or
/// larger than they need) and writes records of 64 KiB and more straight from it: chunks of
/// very different sizes, empty files, records either side of 64 KiB, compressed and raw, and
/// two chunk sizes (so a buffer is reused by chunks of other shapes) must all come back
/// byte-exact and verify.
#[test]
fn reused_read_buffers_give_byte_exact_chunks_of_every_shape() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let mut files = numbered_tree(90, 3, |i| match i % 6 {
        0 => 0,
        1 => 17,
        2 => (64 << 10) - 1,
        3 => 64 << 10,
        4 => 300_000 + i as usize,
        _ => 5_000,
    });
    for (i, (_, data)) in files.iter_mut().enumerate() {
        if i % 4 == 1 && data.len() > 100 {
            // compressible: zstd is kept, the record's bytes are not the buffer's
            let n = data.len();
            let pattern = b"granary ".repeat(n / 8 + 1);
            data.copy_from_slice(&pattern[..n]);
        }
    }
    write_tree(&src, &files);
    for chunk in ["48KiB", "1MiB"] {
        let ds = tmp.path().join(format!("ds-{chunk}"));
        let o = pack(&src, &ds, &["--chunk-size", chunk, "--json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(s["chunks"].as_u64().unwrap() > 4, "{s}");
        run_ok(["verify", ds.to_str().unwrap()]);
        let out = tmp.path().join(format!("out-{chunk}"));
        run_ok(["extract", ds.to_str().unwrap(), "-o", out.to_str().unwrap()]);
        assert_eq!(read_tree(&out), sorted(files.clone()), "chunk size {chunk}");
    }
}

#[test]
fn write_failure_keeps_work_for_resume() {
    // RLIMIT_FSIZE makes chunk writes fail with EFBIG, as a full disk fails them with ENOSPC.
    let tmp = tempfile::tempdir().unwrap();
    let (src, ds) = (tmp.path().join("src"), tmp.path().join("ds"));
    let files = interrupted_pack(tmp.path());
    assert!(!ds.exists());
    let same = INTERRUPTED_PACK_ARGS;
    let o = pack(&src, &ds, &same);
    assert!(stderr(&o).contains("--resume"), "{}", stderr(&o));
    // Other settings than the interrupted run's are refused.
    let o = pack(&src, &ds, &[&same[..4], &["--resume", "--json"]].concat());
    assert!(stderr(&o).contains("other settings"), "{}", stderr(&o));
    let o = pack(&src, &ds, &[&same[..], &["--resume", "--json"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        s["chunks_resumed"].as_u64().unwrap() + 1,
        s["chunks"].as_u64().unwrap(),
        "{s}"
    );
    let out = tmp.path().join("out");
    run_ok(["extract", ds.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(read_tree(&out), sorted(files));
}

#[test]
fn read_digests_of_all_ranks_add_up_to_the_whole_dataset() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let files = numbered_tree(240, 5, |i| 200 + (i as usize * 37) % 3000);
    write_tree(&src, &files);
    let ds = tmp.path().join("ds");
    assert!(pack(&src, &ds, &["--chunk-size", "16KiB"]).status.success());
    let read = |args: &[&str], env: &[(&str, &str)]| -> Vec<serde_json::Value> {
        let mut c = granary();
        c.arg("read").arg(&ds).arg("--json").args(args);
        for (k, v) in env {
            c.env(k, v);
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let whole = &read(&["--shuffle", "sequential"], &[])[0];
    assert_eq!(whole["samples"], 240);
    let total_bytes: u64 = files.iter().map(|f| f.1.len() as u64).sum();
    assert_eq!(whole["bytes"], total_bytes);
    let digest = whole["digest"].as_str().unwrap().to_string();
    let v: serde_json::Value =
        serde_json::from_slice(&run_ok(["verify", ds.to_str().unwrap(), "--json"]).stdout).unwrap();
    assert_eq!(
        v["digest"].as_str().unwrap(),
        digest,
        "verify shows the same digest"
    );
    let mut sums = [0u64; 2];
    for rank in 0..3 {
        let r = rank.to_string();
        let e = &read(
            &[
                "--world-size",
                "3",
                "--rank",
                &r,
                "--workers",
                "2",
                "--epochs",
                "2",
            ],
            &[],
        );
        assert_eq!(e.len(), 2);
        for (epoch, sum) in sums.iter_mut().enumerate() {
            assert_eq!(e[epoch]["samples"], 80);
            *sum = sum.wrapping_add(
                u64::from_str_radix(e[epoch]["digest"].as_str().unwrap(), 16).unwrap(),
            );
        }
    }
    for sum in sums {
        assert_eq!(
            format!("{sum:016x}"),
            digest,
            "the ranks of an epoch cover the dataset once"
        );
    }
    for (mode, env) in [
        ("global", "pread"),
        ("chunkwise", "pread"),
        ("chunkwise", "uring"),
    ] {
        let e = &read(&["--shuffle", mode], &[("GRANARY_IO", env)])[0];
        assert_eq!(e["digest"].as_str().unwrap(), digest);
        assert_eq!(e["backend"], env);
    }
    let o = run_ok([
        "plan",
        ds.to_str().unwrap(),
        "--world-size",
        "4",
        "--workers",
        "2",
        "--json",
    ]);
    let p: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(p["delivered"], 240);
    assert_eq!(p["repeats"], 0);
    assert_eq!(p["shares"].as_array().unwrap().len(), 8);
    assert!(p["quality"]["block_label_tv"].as_f64().is_some());
    let o = run([
        "read",
        ds.to_str().unwrap(),
        "--rank",
        "3",
        "--world-size",
        "2",
    ]);
    assert!(
        !o.status.success() && stderr(&o).contains("rank 3"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn bench_gen_pack_and_compare_write_matching_digests_and_a_report() {
    let tmp = tempfile::tempdir().unwrap();
    let raw = tmp.path().join("raw");
    let o = run_ok([
        "bench",
        "gen",
        raw.to_str().unwrap(),
        "--files",
        "300",
        "--classes",
        "7",
        "--sizes",
        "tiny",
        "--json",
    ]);
    let g: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(g["files"], 300);
    assert_eq!(g["classes"], 7);
    // The same seed gives the same tree.
    let again = tmp.path().join("again");
    run_ok([
        "bench",
        "gen",
        again.to_str().unwrap(),
        "--files",
        "300",
        "--classes",
        "7",
        "--sizes",
        "tiny",
    ]);
    assert_eq!(read_tree(&raw), read_tree(&again));
    let ds = tmp.path().join("ds");
    assert!(pack(&raw, &ds, &["--chunk-size", "64KiB"]).status.success());
    let report = tmp.path().join("report");
    for cold in ["none", "fadvise"] {
        let o = run_ok([
            "bench",
            "compare",
            "--raw",
            raw.to_str().unwrap(),
            "--packed",
            ds.to_str().unwrap(),
            "--workers",
            "2",
            "--epochs",
            "2",
            "--cold",
            cold,
            "--json",
            "--report",
            report.to_str().unwrap(),
        ]);
        let c: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(c["digests_match"], true);
        for side in ["raw_epochs", "granary_epochs"] {
            let e = &c[side];
            assert_eq!(e.as_array().unwrap().len(), 2);
            assert_eq!(e[0]["samples"], 300);
            for key in [
                "startup_s",
                "samples_per_s",
                "mb_per_s",
                "latency_p50_us",
                "latency_p99_us",
                "cpu_s",
            ] {
                assert!(e[0][key].as_f64().unwrap() >= 0.0, "{side} {key}");
            }
            assert!(e[0]["metadata_ops"].as_u64().unwrap() > 0);
        }
        assert_eq!(
            c["raw_epochs"][1]["digest"],
            c["granary_epochs"][1]["digest"]
        );
        // 300 files: 2 metadata operations each, plus the directories, against a handful.
        assert!(c["metadata_ratio"].as_f64().unwrap() > 10.0, "{c}");
        assert_eq!(c["ratios"].as_array().unwrap().len(), 2);
    }
    // Warm: both trees checked resident right before each side, the CRC-32 ceilings measured
    // before the granary epoch, the maps its process kept reported.
    let o = run_ok([
        "bench",
        "compare",
        "--raw",
        raw.to_str().unwrap(),
        "--packed",
        ds.to_str().unwrap(),
        "--states",
        "warm",
        "--json",
    ]);
    let c: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let (r, g) = (&c["raw_epochs"][0], &c["granary_epochs"][0]);
    assert_eq!(
        (r["resident"].as_f64(), g["resident"].as_f64()),
        (Some(1.0), Some(1.0)),
        "{c}"
    );
    assert!(g["ceiling_mb_per_s"].as_f64().unwrap() > 0.0, "{c}");
    assert!(g["ceiling_kept_mb_per_s"].as_f64().unwrap() > 0.0, "{c}");
    assert!(g["kept_map_bytes"].as_u64().unwrap() > 0, "{c}");
    assert_eq!(c["digests_match"], true);
    let md = std::fs::read_to_string(report.join("report.md")).unwrap();
    assert!(
        md.contains("digests match") && md.contains("throughput.svg"),
        "{md}"
    );
    for svg in ["throughput.svg", "latency.svg", "ratio.svg"] {
        let s = std::fs::read_to_string(report.join(svg)).unwrap();
        assert!(
            s.starts_with("<svg") && s.trim_end().ends_with("</svg>") && s.contains("rect"),
            "{svg}"
        );
    }
    let o = run_ok([
        "bench",
        "pack",
        raw.to_str().unwrap(),
        "-o",
        tmp.path().join("bp").to_str().unwrap(),
        "--lookups",
        "100",
        "--json",
    ]);
    let p: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(p["files"], 300);
    assert!(p["speed_ratio"].as_f64().unwrap() > 0.0);
    assert!(p["lookup_median_ns"].as_f64().unwrap() > 0.0);
}

#[test]
fn cache_stats_and_clear() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &edge_tree());
    let ds_path = tmp.path().join("ds");
    assert!(pack(&src, &ds_path, &["--chunk-size", "16KiB"])
        .status
        .success());
    let ds = granary::Dataset::open(&ds_path).unwrap();
    let root = tmp.path().join("cache");
    let cache = granary::LocalTier::open(
        &root,
        ds.snapshot().dataset_id(),
        u64::MAX,
        granary::TierPolicy::Lru,
    )
    .unwrap();
    for c in 0..2 {
        let ce = ds.chunk(c).unwrap();
        assert!(cache
            .admit(&ce, &std::fs::read(ds.chunk_path(c)).unwrap(), 1.0)
            .unwrap());
    }
    let o = run_ok(["cache", "stats", root.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["entries"], 2);
    assert!(v[0]["bytes"].as_u64().unwrap() > 0);
    let o = run_ok(["cache", "clear", root.to_str().unwrap()]);
    assert!(stdout(&o).contains("cleared 1"));
    let o = run_ok(["cache", "stats", root.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["entries"], 0);
    let o = run(["cache", "stats", tmp.path().join("none").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn several_reader_processes_share_one_tier_within_its_quota() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let files = numbered_tree(400, 4, |i| 1000 + (i as usize * 53) % 2000);
    write_tree(&src, &files);
    let ds = tmp.path().join("ds");
    assert!(pack(&src, &ds, &["--chunk-size", "16KiB"]).status.success());
    let cache = tmp.path().join("tier");
    let quota: u64 = 200 << 10;
    // Four processes (two ranks x two seeds), three epochs each, one LRU tier.
    let args = |i: u32, tier: bool| {
        let (rank, seed) = ((i % 2).to_string(), (i / 2).to_string());
        let mut v: Vec<String> = [
            "read",
            ds.to_str().unwrap(),
            "--epochs",
            "3",
            "--json",
            "--window",
            "2",
            "--rank",
            &rank,
            "--world-size",
            "2",
            "--seed",
            &seed,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if tier {
            v.extend(
                [
                    "--cache-dir",
                    cache.to_str().unwrap(),
                    "--cache-size",
                    &quota.to_string(),
                    "--policy",
                    "lru",
                ]
                .iter()
                .map(|s| s.to_string()),
            );
        }
        v
    };
    let digests = |v: &serde_json::Value| -> Vec<String> {
        let epochs = v.as_array().unwrap();
        assert_eq!(epochs.len(), 3);
        epochs
            .iter()
            .map(|e| e["digest"].as_str().unwrap().to_string())
            .collect()
    };
    // What each process must deliver: its epochs read without a tier.
    let want: Vec<Vec<String>> = (0..4)
        .map(|i| digests(&wait_json(spawn(args(i, false)))))
        .collect();
    // The tier filled by one process first, so that there are copies to damage.
    wait_json(spawn(args(0, true)));
    let tier_dir = tier_subdir(&cache);
    let children: Vec<_> = (0..4).map(|i| spawn(args(i, true))).collect();
    // Meanwhile copies are replaced with damaged ones (a flipped byte, or truncated), as a
    // failing disk or a stray process would leave them: no reader may deliver them.
    let done = std::sync::atomic::AtomicBool::new(false);
    let damaged = std::thread::scope(|s| {
        let damager = s.spawn(|| {
            let mut n = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                for e in std::fs::read_dir(&tier_dir).unwrap().flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let Ok(mut b) = std::fs::read(e.path()) else {
                        continue;
                    };
                    if !name.starts_with("chunk-") || b.len() < 200 {
                        continue;
                    }
                    if n.is_multiple_of(2) {
                        let mid = b.len() / 2;
                        b[mid] ^= 0x5a;
                    } else {
                        b.truncate(b.len() - 100);
                    }
                    let tmp = tier_dir.join("damage.partial");
                    std::fs::write(&tmp, &b).unwrap();
                    // Under the tier's lock, as every change of the tier is, and only over a
                    // copy still there: a rename after the tier evicted the copy would bring
                    // back a file the tier no longer counts (more bytes than its quota, by the
                    // damager's doing).
                    let lock = std::fs::OpenOptions::new()
                        .create(true)
                        .truncate(false)
                        .write(true)
                        .open(tier_dir.join("lock"))
                        .unwrap();
                    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).unwrap();
                    if e.path().exists() && std::fs::rename(&tmp, e.path()).is_ok() {
                        n += 1;
                    }
                    drop(lock);
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            n
        });
        // Stops the damage even when an assertion below fails (else the scope never ends).
        struct Stop<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let stop = Stop(&done);
        for (i, c) in children.into_iter().enumerate() {
            let epochs = wait_json(c);
            assert_eq!(
                digests(&epochs),
                want[i],
                "process {i} delivered other bytes"
            );
            assert!(epochs[2]["cache_byte_hit_ratio"].as_f64().is_some());
        }
        drop(stop);
        damager.join().unwrap()
    });
    assert!(damaged > 0, "no copy was damaged");
    let _ = std::fs::remove_file(tier_dir.join("damage.partial"));
    let o = run_ok(["cache", "stats", cache.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let used = v[0]["bytes"].as_u64().unwrap();
    assert!(
        used > 0 && used <= quota,
        "tier holds {used} bytes, quota {quota}"
    );
    let dir = std::path::PathBuf::from(v[0]["dir"].as_str().unwrap());
    let mut on_disk = 0;
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        assert!(!name.contains(".tmp"), "torn file left: {name}");
        if name.ends_with(".gchunk") {
            on_disk += e.metadata().unwrap().len();
        }
    }
    assert!(on_disk <= quota, "{on_disk} bytes of copies, quota {quota}");
}

/// The one dataset sub-directory of a tier root.
fn tier_subdir(root: &std::path::Path) -> std::path::PathBuf {
    let mut dirs: Vec<_> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs.pop().unwrap()
}

#[test]
fn reader_processes_share_an_importance_tier_of_hot_chunks() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let files = numbered_tree(300, 3, |i| 3000 + (i as usize * 97) % 3000);
    write_tree(&src, &files);
    let ds = tmp.path().join("ds");
    assert!(
        pack(&src, &ds, &["--chunk-size", "64KiB", "--compress", "none"])
            .status
            .success()
    );
    let cache = tmp.path().join("tier");
    let quota: u64 = 300 << 10;
    let ds_args = |extra: &[&str]| {
        let mut v: Vec<String> = vec![
            "read".into(),
            ds.to_str().unwrap().into(),
            "--cache-dir".into(),
            cache.to_str().unwrap().into(),
            "--cache-size".into(),
            quota.to_string(),
            "--policy".into(),
            "importance".into(),
        ];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    // Importance sampling needs scores: a clear error, nothing written.
    let o = run(ds_args(&["--sampling", "importance"]));
    assert!(!o.status.success());
    assert!(stderr(&o).contains("needs scores"), "{}", stderr(&o));
    // The node's shared score table (as report() from training writes it).
    let (dataset, tier) = save_every_seventh_scores(&ds, &cache);
    // Three processes (three ranks), three importance-sampled epochs each, one tier.
    let children: Vec<_> = (0..3)
        .map(|r| {
            spawn(ds_args(&[
                "--sampling",
                "importance",
                "--alpha",
                "0.8",
                "--range-gap",
                "0",
                "--epochs",
                "3",
                "--window",
                "2",
                "--json",
                "--rank",
                &r.to_string(),
                "--world-size",
                "3",
            ]))
        })
        .collect();
    let mut later_hits = 0.0;
    for c in children {
        later_hits += wait_json(c)[2]["cache_sample_hit_ratio"].as_f64().unwrap();
    }
    assert!(later_hits > 0.0, "hot chunks never served");
    let o = run_ok(["cache", "stats", cache.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let used = v[0]["bytes"].as_u64().unwrap();
    assert!(
        used > 0 && used <= quota,
        "tier holds {used}, quota {quota}"
    );
    assert!(v[0]["hot_samples"].as_u64().unwrap() > 0, "{v}");
    // No sample is in two hot chunks, and every hot record is the sample's stored bytes.
    let hot = tier.hot_map(dataset.snapshot().chunks());
    let listed: usize = hot.chunks.values().map(|h| h.samples.len()).sum();
    assert_eq!(listed, hot.by_sample.len(), "a sample re-packed twice");
    for h in hot.chunks.values() {
        let b = std::fs::read(tier.hot_path(h).unwrap()).unwrap();
        for &(id, off) in &h.samples {
            let e = dataset.sample(id).unwrap().entry;
            let rec = &b[off as usize..(off + e.stored_len) as usize];
            assert_eq!(rec, &dataset.read(id).unwrap()[..], "sample {id}");
        }
    }
}

#[test]
fn pack_creates_missing_output_parents_and_errors_name_the_cause_once() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &numbered_tree(5, 1, |_| 100));
    let out = tmp.path().join("new/deeper/ds.granary");
    assert!(pack(&src, &out, &[]).status.success());
    assert!(out.join("snapshot.gsnap").exists());
    let o = run(["info", tmp.path().join("missing").to_str().unwrap()]);
    assert!(!o.status.success());
    let msg = stderr(&o);
    assert_eq!(msg.matches("No such file").count(), 1, "{msg}");
}

/// A dataset path that does not exist is not damage: `verify` says it could not look (exit 4).
#[test]
fn verify_of_a_missing_dataset_cannot_check_it() {
    let tmp = tempfile::tempdir().unwrap();
    let o = run(["verify", tmp.path().join("nothing").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(4), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("CANNOT CHECK"), "{}", stdout(&o));
}

/// The fuzz smoke run fails, rather than passing with nothing fuzzed, when it is required
/// (`GRANARY_REQUIRE_FUZZ=1`, as scripts/test.sh sets, or `CI=true`) and there is no nightly
/// toolchain; elsewhere it says it skipped and exits 0. No nightly here: an empty RUSTUP_HOME.
#[test]
fn the_fuzz_script_fails_without_nightly_when_fuzzing_is_required() {
    let tmp = tempfile::tempdir().unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/fuzz.sh");
    let fuzz = |required: bool| {
        let mut c = std::process::Command::new("bash");
        c.arg(&script)
            .arg("1")
            .env("RUSTUP_HOME", tmp.path())
            .env_remove("CI")
            .env_remove("GRANARY_REQUIRE_FUZZ");
        if required {
            c.env("GRANARY_REQUIRE_FUZZ", "1");
        }
        c.output().unwrap()
    };
    let o = fuzz(true);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("requires fuzzing"), "{}", stderr(&o));
    let o = fuzz(false);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("skipped"), "{}", stderr(&o));
}

#[test]
fn modes_mtimes_and_empty_directories_survive_pack_and_extract() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(
        &src,
        &[
            (b"bin/run.sh".to_vec(), b"#!/bin/sh\necho run\n".to_vec()),
            (b"keys/secret".to_vec(), b"hush".to_vec()),
            (b"old/file".to_vec(), b"from 1999".to_vec()),
        ],
    );
    std::fs::create_dir_all(src.join("valid")).unwrap(); // empty, as a benchmark expects it
    std::fs::create_dir_all(src.join("deep/er/est")).unwrap();
    let set = |p: &str, mode: u32, secs: i64| set_attrs(&src.join(p), mode, secs * 1_000_000_000);
    set("bin/run.sh", 0o755, 1_700_000_000);
    set("keys/secret", 0o600, 1_700_000_001);
    set("old/file", 0o444, 915_148_800);
    set("valid", 0o750, 1_600_000_000);
    set("deep/er/est", 0o700, 1_500_000_000);
    set("keys", 0o700, 1_700_000_002);
    let ds = tmp.path().join("ds");
    assert!(pack(&src, &ds, &[]).status.success());

    let out = tmp.path().join("out");
    let o = run_ok([
        "extract".as_ref(),
        ds.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    assert!(stdout(&o).contains("and 7 directories"), "{}", stdout(&o));
    let info = stdout(&run_ok(["info".as_ref(), ds.as_os_str()]));
    assert!(
        info.contains("every file's and directory's mode and mtime (7 directories)"),
        "{info}"
    );
    for p in [
        "bin/run.sh",
        "keys/secret",
        "old/file",
        "valid",
        "deep/er/est",
        "keys",
        "deep",
    ] {
        let (a, b) = (
            std::fs::metadata(src.join(p)).unwrap(),
            std::fs::metadata(out.join(p)).unwrap(),
        );
        assert_eq!(a.mode(), b.mode(), "{p}");
        assert_eq!(a.modified().unwrap(), b.modified().unwrap(), "{p}");
    }
    let run = std::process::Command::new(out.join("bin/run.sh"))
        .output()
        .unwrap();
    assert_eq!(run.stdout, b"run\n", "the executable bit survives");

    // extract --no-metadata: the umask's modes and the time of extraction; the empty
    // directories are still there.
    let plain = tmp.path().join("plain");
    run_ok([
        "extract".as_ref(),
        ds.as_os_str(),
        "-o".as_ref(),
        plain.as_os_str(),
        "--no-metadata".as_ref(),
    ]);
    assert!(plain.join("valid").is_dir() && plain.join("deep/er/est").is_dir());
    let m = std::fs::metadata(plain.join("old/file")).unwrap();
    assert_ne!(m.mode() & 0o7777, 0o444);
    assert!(
        m.modified().unwrap()
            > std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000)
    );

    // pack --no-metadata: a 1.0 dataset that records none of it (no empty directories).
    let ds0 = tmp.path().join("ds0");
    assert!(pack(&src, &ds0, &["--no-metadata"]).status.success());
    let out0 = tmp.path().join("out0");
    run_ok([
        "extract".as_ref(),
        ds0.as_os_str(),
        "-o".as_ref(),
        out0.as_os_str(),
    ]);
    assert!(!out0.join("valid").exists());
    assert_eq!(read_tree(&out0), read_tree(&src));
}

/// `bench plan` builds one shard's plan on a synthetic shape of any size: equal shares in
/// every mode, and a clear refusal of a rank outside the world.
#[test]
fn bench_plan_builds_a_share_of_a_synthetic_shape() {
    let plan = |mode: &str, extra: &[&str]| -> serde_json::Value {
        let mut args = vec![
            "bench",
            "plan",
            "--samples",
            "100003",
            "--world-size",
            "7",
            "--rank",
            "6",
            "--shuffle",
            mode,
            "--json",
        ];
        args.extend_from_slice(extra);
        serde_json::from_slice(&run_ok(args).stdout).unwrap()
    };
    for mode in ["global", "chunkwise", "sequential"] {
        let v = plan(mode, &[]);
        assert_eq!(v["share"], 100003 / 7, "{mode}: {v}");
        assert_eq!(v["chunks"], 100, "{mode}: {v}");
        assert!(v["peak_rss_mb"].as_f64().is_some_and(|m| m > 0.0), "{v}");
        // Resumed from 3 ranks that each delivered half their share (16,667 of 33,334): the
        // 50,001 samples left, cut for 7 ranks.
        let v = plan(mode, &["--resume-from-world-size", "3"]);
        assert_eq!(v["share"], 50001 / 7, "{mode}: {v}");
    }
    let o = run([
        "bench",
        "plan",
        "--samples",
        "10",
        "--world-size",
        "2",
        "--rank",
        "2",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("rank 2 is not in 0..2"),
        "{}",
        stderr(&o)
    );
}

/// `bench gen --packed` writes the same samples (paths, bytes, labels) as generating the tree
/// and packing it: `verify` prints the same content digest for both.
#[test]
fn bench_gen_packed_equals_packing_the_generated_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let (tree, a, b) = (
        tmp.path().join("tree"),
        tmp.path().join("a.granary"),
        tmp.path().join("b.granary"),
    );
    let args = [
        "--files",
        "3001",
        "--classes",
        "7",
        "--sizes",
        "tiny",
        "--seed",
        "5",
    ];
    let gen = |out: &std::path::Path, extra: &[&str]| {
        let mut v: Vec<std::ffi::OsString> = vec!["bench".into(), "gen".into(), out.into()];
        v.extend(args.iter().chain(extra).map(|s| s.into()));
        run_ok(v)
    };
    gen(&tree, &[]);
    run_ok([
        "pack".as_ref(),
        tree.as_os_str(),
        "-o".as_ref(),
        a.as_os_str(),
    ]);
    gen(&b, &["--packed"]);
    let digest = |ds: &std::path::Path| {
        let o = run_ok(["verify".as_ref(), ds.as_os_str()]);
        let out = String::from_utf8_lossy(&o.stdout).into_owned() + &stderr(&o);
        let line = out
            .lines()
            .find(|l| l.starts_with("samples digest:"))
            .unwrap_or_else(|| panic!("no digest in {out}"))
            .to_string();
        assert!(out.contains("3001 samples"), "{out}");
        line
    };
    assert_eq!(digest(&a), digest(&b));
}

#[test]
fn field_values_must_fit_their_types() {
    let tmp = tempfile::tempdir().unwrap();
    // The writer refuses a value that does not fit its field's declared type.
    let mut w =
        granary_packer::Writer::create(granary_packer::WriterOptions::new(tmp.path().join("w")))
            .unwrap();
    w.declare_field_type(b"n", "int").unwrap();
    w.declare_field_type(b"t", "str").unwrap();
    let e = w
        .write_fields(
            b"a",
            vec![(b"n".to_vec(), vec![1, 2, 3])],
            granary_packer::Label::None,
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("field \"n\": 3 bytes for int, expected 8"),
        "{e}"
    );
    let e = w
        .write_fields(
            b"b",
            vec![(b"t".to_vec(), vec![0xff])],
            granary_packer::Label::None,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("not UTF-8"), "{e}");
    drop(w);
    // A dataset written without that check (as a hostile author would): verify names the
    // value, its field and its record.
    let ds = tmp.path().join("ds");
    std::fs::create_dir_all(&ds).unwrap();
    let id = [9u8; 16];
    let mut cw = granary_format::ChunkWriter::with_fields(Vec::new(), id, 0).unwrap();
    let types = [
        (b"j".to_vec(), "json".to_string()),
        (b"n".to_vec(), "int".to_string()),
    ]
    .into();
    cw.field_types(&types).unwrap();
    for (key, n, j) in [
        (&b"k0"[..], &7i64.to_le_bytes()[..], &b"{\"a\":1}"[..]),
        (b"k1", b"123", b"{broken"),
    ] {
        let f = [
            (&b"j"[..], j, granary_format::crc32(j)),
            (&b"n"[..], n, granary_format::crc32(n)),
        ];
        cw.append_group(key, &f, granary_format::NO_LABEL).unwrap();
    }
    let (bytes, summary) = cw.finish::<&[u8]>(&[]).unwrap();
    std::fs::write(ds.join(granary_format::chunk_file_name(0)), bytes).unwrap();
    let mut b = granary_format::SnapshotBuilder::new(id, vec![]);
    b.push_chunk(&summary).unwrap();
    std::fs::write(ds.join(granary_format::SNAPSHOT_FILE), b.build().unwrap()).unwrap();
    let o = run(["verify", ds.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let out = stdout(&o);
    assert!(
        out.contains("record 1 (k1), field n: 3 bytes for int"),
        "{out}"
    );
    assert!(
        out.contains("record 1 (k1), field j: not a JSON document"),
        "{out}"
    );
    assert!(!out.contains("(k0)"), "{out}");
}

/// `read --metrics FILE` writes each epoch's figures in Prometheus' text format: the waits by
/// part adding up to the JSON's `waited_s`, the samples, each layer's bytes.
#[test]
fn read_writes_prometheus_metrics() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &numbered_tree(200, 4, |i| 500 + i as usize));
    let ds = tmp.path().join("ds");
    assert!(pack(&src, &ds, &["--chunk-size", "16KiB"]).status.success());
    let prom = tmp.path().join("m/granary.prom");
    std::fs::create_dir_all(prom.parent().unwrap()).unwrap();
    let o = run_ok([
        "read".as_ref(),
        ds.as_os_str(),
        "--json".as_ref(),
        "--metrics".as_ref(),
        prom.as_os_str(),
    ]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let text = std::fs::read_to_string(&prom).unwrap();
    let value = |name: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} missing: {text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(value("granary_samples "), 200.0);
    assert_eq!(
        value("granary_layer_bytes{layer=\"origin\"}"),
        j[0]["bytes_read"].as_f64().unwrap()
    );
    let parts: f64 = ["tier", "peers", "origin", "check", "plan", "other"]
        .iter()
        .map(|p| value(&format!("granary_wait_seconds{{part=\"{p}\"}}")))
        .sum();
    let waited = j[0]["waits"]["waited_s"].as_f64().unwrap();
    assert!((parts - waited).abs() < 1e-5, "{parts} vs {waited}");
    assert_eq!(
        std::fs::read_dir(prom.parent().unwrap()).unwrap().count(),
        1,
        "no temporary left"
    );
}

/// The bill before the run: `plan --bill --prices` predicts per rank what `read` then
/// measures - requests and bytes of origin and of the tier, and origin's cost - for
/// chunk-wise and global epochs, a view, and a tier before and after it fills.
#[test]
fn the_bill_before_the_run_is_what_the_run_reads() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(
        &src,
        &numbered_tree(600, 5, |i| 300 + (i as usize * 37) % 4000),
    );
    let ds = tmp.path().join("ds");
    assert!(pack(&src, &ds, &["--chunk-size", "32KiB"]).status.success());
    let view = tmp.path().join("v.gview");
    run_ok([
        "view".as_ref(),
        ds.as_os_str(),
        "-o".as_ref(),
        view.as_os_str(),
        "--class".as_ref(),
        "c1".as_ref(),
    ]);
    let tier = tmp.path().join("tier");
    let json = |args: Vec<&std::ffi::OsStr>| -> serde_json::Value {
        serde_json::from_slice(&run_ok(args).stdout).unwrap()
    };
    let os = |s: &'static str| std::ffi::OsStr::new(s);
    // With a tier, one worker per rank: two workers share the chunk on their boundary, and
    // the second to read it may find it admitted by the first (the prediction counts it as
    // origin's); the plan of every rank is made before rank 0 admits anything, so only rank 0's
    // is compared with the plan (the others with read's own prediction, made just before).
    for (target, extra, workers) in [
        (&ds, vec![], "2"),
        (&ds, vec!["--shuffle", "global"], "2"),
        (&view, vec![], "2"),
        (
            &ds,
            vec!["--cache-dir", "TIER", "--cache-size", "1GiB"],
            "1",
        ),
        (
            &ds,
            vec!["--cache-dir", "TIER", "--cache-size", "1GiB"],
            "1",
        ),
    ] {
        let tiered = !extra.is_empty() && extra[0] == "--cache-dir";
        let extra: Vec<&std::ffi::OsStr> = extra
            .iter()
            .map(|e| {
                if *e == "TIER" {
                    tier.as_os_str()
                } else {
                    os(e)
                }
            })
            .collect();
        let mut plan = vec![os("plan"), target.as_os_str(), os("--json"), os("--prices")];
        plan.extend([
            os("0.0004,0.09"),
            os("--world-size"),
            os("2"),
            os("--workers"),
            os(workers),
        ]);
        plan.extend(extra.iter().copied());
        let bill = json(plan);
        for rank in 0..2u64 {
            let r = rank.to_string();
            let mut read = vec![os("read"), target.as_os_str(), os("--json"), os("--prices")];
            read.extend([
                os("0.0004,0.09"),
                os("--world-size"),
                os("2"),
                os("--workers"),
                os(workers),
            ]);
            read.extend([os("--rank"), std::ffi::OsStr::new(&r)]);
            read.extend(extra.iter().copied());
            let got = json(read);
            let predicted = &bill["ranks"][rank as usize]["layers"];
            let measured = &got[0]["bill"]["measured"];
            let in_read = &got[0]["bill"]["predicted"];
            if rank == 0 || !tiered {
                assert_eq!(predicted, in_read, "{target:?} {extra:?}");
            }
            for (p, m) in in_read
                .as_array()
                .unwrap()
                .iter()
                .zip(measured.as_array().unwrap())
            {
                assert_eq!(p["layer"], m["layer"]);
                assert_eq!(
                    p["requests"], m["requests"],
                    "{target:?} {extra:?}: {p} vs {m}"
                );
                assert_eq!(p["bytes"], m["bytes"], "{target:?} {extra:?}: {p} vs {m}");
            }
        }
    }
    // After the tier filled (the last two runs read every chunk once), origin is free.
    let mut plan = vec![os("plan"), ds.as_os_str(), os("--json"), os("--prices")];
    plan.extend([
        os("0.0004,0.09"),
        os("--cache-dir"),
        tier.as_os_str(),
        os("--cache-size"),
        os("1GiB"),
    ]);
    let b = json(plan);
    let origin = layer(&b["total"], "origin");
    assert_eq!(origin["bytes"], 0, "{b}");
    assert_eq!(origin["cost"], 0.0, "{b}");
    let o = run([os("plan"), ds.as_os_str(), os("--prices"), os("0.1")]);
    assert!(
        stderr(&o).contains("PER_1000_REQUESTS,PER_GB"),
        "{}",
        stderr(&o)
    );
}

/// A resident dataset's chunk maps are kept for the next epoch within the page-cache budget,
/// and `read` says so (they are in the process's RSS); `--page-cache 0` keeps none. Both read
/// every sample with the same digest.
#[test]
fn kept_maps_are_reported_and_bounded_by_the_page_cache_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let files: Vec<(Vec<u8>, Vec<u8>)> = (0..300u64)
        .map(|i| {
            let p = format!("c{}/f{i:03}.bin", i % 3).into_bytes();
            (p, bytes(i, 2000 + (i as usize * 53) % 3000))
        })
        .collect();
    let ds = packed_tree(
        &tmp.path().join("src"),
        &files,
        &tmp.path().join("ds"),
        &["--chunk-size", "64KiB", "--compress", "none"],
    );
    let read = |extra: &[&str]| -> serde_json::Value {
        let mut a = vec!["read", ds.to_str().unwrap(), "--epochs", "2", "--json"];
        a.extend(extra);
        serde_json::from_slice(&run_ok(a).stdout).unwrap()
    };
    let kept = read(&[]);
    let none = read(&["--page-cache", "0"]);
    let total: u64 = std::fs::read_dir(&ds)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".gchunk"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    // The chunks were just written: resident, so the first epoch maps and keeps all of them.
    assert_eq!(kept[1]["kept_map_bytes"].as_u64(), Some(total), "{kept}");
    assert_eq!(none[1]["kept_map_bytes"].as_u64(), Some(0), "{none}");
    for e in 0..2 {
        assert_eq!(kept[e]["samples"], 300);
        assert_eq!(kept[e]["digest"], none[e]["digest"]);
    }
    let text = stdout(&run_ok(["read", ds.to_str().unwrap()]));
    assert!(text.contains("maps of resident chunks kept"), "{text}");
}

/// The tier's own score table damaged (emptied, or not a table): every policy reads on without
/// it, saying so; an explicit `--scores FILE` that is not a table stays an error naming it. A
/// global shuffle with a tier says once that it reads the dataset itself.
#[test]
fn a_damaged_tier_score_table_is_a_miss_and_a_global_shuffle_says_it_skips_the_tier() {
    let tmp = tempfile::tempdir().unwrap();
    let files = numbered_tree(60, 3, |i| 300 + i as usize * 7);
    let ds = packed_tree(&tmp.path().join("src"), &files, &tmp.path().join("ds"), &[]);
    let cache = tmp.path().join("tier");
    let read = |extra: &[&str]| {
        let mut a = vec!["read", ds.to_str().unwrap(), "--json"];
        a.extend_from_slice(&[
            "--cache-dir",
            cache.to_str().unwrap(),
            "--cache-size",
            "1GiB",
        ]);
        a.extend_from_slice(extra);
        run(a)
    };
    let first = read(&[]);
    assert!(first.status.success(), "{}", stderr(&first));
    let id = granary::Dataset::open(&ds).unwrap().snapshot().dataset_id();
    let scores = granary::LocalTier::tier_dir(&cache, &id).join("scores");
    for (i, damage) in [&b""[..], &b"not a table at all"[..]]
        .into_iter()
        .enumerate()
    {
        std::fs::write(&scores, damage).unwrap();
        for policy in ["static", "lru", "importance"] {
            let o = read(&["--policy", policy]);
            assert!(o.status.success(), "damage {i}, {policy}: {}", stderr(&o));
            let e = stderr(&o);
            assert!(e.contains("score table cannot be used"), "{policy}: {e}");
        }
    }
    let bad = tmp.path().join("bad.scores");
    std::fs::write(&bad, b"nope").unwrap();
    let o = read(&["--scores", bad.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("bad.scores"), "{}", stderr(&o));
    std::fs::remove_file(&scores).unwrap();
    let o = read(&["--shuffle", "global"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stderr(&o).matches("the local tier is not used").count(),
        1,
        "{}",
        stderr(&o)
    );
}

/// Every delivered sample counts in the layer that served it, whatever the order and the
/// stack: without a tier (chunk-wise, global, a view) origin serves them all; with a warm tier
/// the tier does, and the tier's copies are opened in the tier's meter, not origin's.
#[test]
fn every_sample_counts_in_the_layer_that_served_it() {
    let tmp = tempfile::tempdir().unwrap();
    let files = numbered_tree(600, 3, |i| 500 + (i as usize * 37) % 3000);
    let (src, ds) = (tmp.path().join("src"), tmp.path().join("ds"));
    let ds = packed_tree(&src, &files, &ds, &["--chunk-size", "64KiB"]);
    let read = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["read", ds.to_str().unwrap(), "--json"];
        args.extend_from_slice(extra);
        let v: serde_json::Value = serde_json::from_slice(&run_ok(&args).stdout).unwrap();
        v[0].clone()
    };
    for order in ["chunkwise", "global", "sequential"] {
        let r = read(&["--shuffle", order]);
        let origin = layer(&r["layers"], "origin");
        assert_eq!(origin["served_samples"], 600, "{order}: {r}");
        assert!(origin["served_bytes"].as_u64().unwrap() >= r["bytes"].as_u64().unwrap());
        let opened = ["opened_buffered", "opened_resident", "opened_direct"]
            .map(|k| origin[k].as_u64().unwrap())
            .iter()
            .sum::<u64>();
        assert_eq!(opened, origin["opens"].as_u64().unwrap(), "{order}: {r}");
        assert!(
            origin["metadata_ops"].as_u64().unwrap() >= 2 * opened,
            "{order}: {r}"
        );
    }
    let tier = tmp.path().join("tier");
    let with_tier = [
        "--cache-dir",
        tier.to_str().unwrap(),
        "--cache-size",
        "1GiB",
    ];
    read(&with_tier);
    let warm = read(&with_tier);
    let (t, o) = (
        layer(&warm["layers"], "tier"),
        layer(&warm["layers"], "origin"),
    );
    assert_eq!(t["served_samples"], 600, "{warm}");
    assert_eq!(o["served_samples"], 0, "{warm}");
    assert_eq!(o["opens"], 0, "{warm}");
    assert_eq!(o["metadata_ops"], 0, "origin opened nothing: {warm}");
    assert!(t["metadata_ops"].as_u64().unwrap() > 0, "{warm}");
}

/// `--metrics` into a directory that does not exist is refused before the epoch is read, not
/// after it (the epoch's report would be lost).
#[test]
fn metrics_into_a_missing_directory_is_refused_before_reading() {
    let tmp = tempfile::tempdir().unwrap();
    let files = numbered_tree(20, 2, |i| 100 + i as usize);
    let (src, ds) = (tmp.path().join("src"), tmp.path().join("ds"));
    let ds = packed_tree(&src, &files, &ds, &[]);
    let target = tmp.path().join("missing").join("m.prom");
    let o = run([
        "read",
        ds.to_str().unwrap(),
        "--metrics",
        target.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(stdout(&o).is_empty(), "an epoch was read: {}", stdout(&o));
    assert!(stderr(&o).contains("no such directory"), "{}", stderr(&o));
}

#[test]
fn a_closed_pipe_ends_a_command_quietly() {
    // `granary plan DS | head -1`: plan prints with `println!`, info and ls through a checked
    // write; each ends with success and says nothing once its reader has gone.
    let tmp = tempfile::tempdir().unwrap();
    let (src, ds) = (tmp.path().join("src"), tmp.path().join("ds"));
    // More output than a pipe holds (64 KiB), so that the commands write after it closed.
    write_tree(&src, &numbered_tree(20_000, 3, |_| 10));
    let o = pack(&src, &ds, &["--chunk-size", "4KiB"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ds = ds.to_str().unwrap();
    for args in [&["plan", ds, "--world-size", "4000"][..], &["ls", ds]] {
        let mut child = granary()
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = [0u8; 1];
        std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut first).unwrap();
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{args:?}: {} {err}", o.status);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// `bench pack` replaces -o on every run: it refuses the source, what holds it, a path inside
/// it and anything there that is not a dataset, deleting nothing; a new path and the dataset
/// it made are fine.
#[test]
fn bench_pack_refuses_an_output_it_would_destroy() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &numbered_tree(20, 2, |i| 100 + i as usize));
    let keep = tmp.path().join("precious");
    std::fs::create_dir_all(&keep).unwrap();
    std::fs::write(keep.join("important.txt"), b"x").unwrap();
    let bench_pack = |out: &Path| {
        run([
            "bench".as_ref(),
            "pack".as_ref(),
            src.as_os_str(),
            "-o".as_ref(),
            out.as_os_str(),
            "--lookups".as_ref(),
            "10".as_ref(),
        ])
    };
    for out in [
        tmp.path().to_path_buf(),
        src.clone(),
        src.join("in"),
        keep.clone(),
    ] {
        let o = bench_pack(&out);
        assert!(!o.status.success(), "{}", out.display());
        assert!(
            stderr(&o).contains("bench pack replaces -o"),
            "{}",
            stderr(&o)
        );
    }
    assert!(keep.join("important.txt").is_file());
    assert_eq!(read_tree(&src).len(), 20);
    let ds = tmp.path().join("ds.granary");
    for _ in 0..2 {
        let o = bench_pack(&ds);
        assert!(o.status.success(), "{}", stderr(&o));
    }
}
