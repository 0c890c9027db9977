//! Sharded packing + merge, and append: the same content as a single pack, refusals that change
//! nothing, a killed shard that resumes, and readers of an old snapshot during an append.

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::common::*;

const ARGS: [&str; 4] = ["--chunk-size", "16KiB", "--seed", "3"];

/// A class-sorted tree: 10 classes of mixed sizes, some compressible.
fn tree(n: u64) -> Vec<(Vec<u8>, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let data = if i % 3 == 0 {
                format!("text {i} ").repeat(50).into_bytes()
            } else {
                bytes(i, 500 + (i as usize * 37) % 4000)
            };
            (
                format!("class{}/f{i:05}.bin", i / (n / 10)).into_bytes(),
                data,
            )
        })
        .collect()
}

fn shard(src: &Path, ds: &Path, spec: &str, extra: &[&str]) -> std::process::Output {
    let mut c = granary();
    c.arg("pack")
        .arg(src)
        .arg("-o")
        .arg(ds)
        .args(ARGS)
        .arg("--shard")
        .arg(spec)
        .args(extra);
    c.output().unwrap()
}

fn shard_ok(src: &Path, ds: &Path, spec: &str, extra: &[&str]) {
    let o = shard(src, ds, spec, extra);
    assert!(o.status.success(), "shard {spec}: {}", stderr(&o));
}

fn merge(ds: &Path) -> std::process::Output {
    run(["merge".as_ref(), ds.as_os_str()])
}

fn verify_json(ds: &Path) -> serde_json::Value {
    let o = run_ok(["verify".as_ref(), ds.as_os_str(), "--json".as_ref()]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["clean"], true, "{v}");
    v
}

/// Every file under `dir` with its length and modification time: what "changed nothing" means.
fn listing(dir: &Path) -> BTreeMap<PathBuf, (u64, std::time::SystemTime)> {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            let m = e.metadata().unwrap();
            (e.path().to_path_buf(), (m.len(), m.modified().unwrap()))
        })
        .collect()
}

#[test]
fn sharded_pack_and_merge_equal_a_single_pack() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let files = tree(1500);
    write_tree(&src, &files);
    let single = tmp.path().join("single");
    let o = pack(&src, &single, &ARGS);
    assert!(o.status.success(), "{}", stderr(&o));
    let want = verify_json(&single);

    for n in [1u32, 3, 4] {
        let ds = tmp.path().join(format!("ds{n}"));
        // The shards run at once, as on n machines.
        let children: Vec<_> = (0..n)
            .map(|i| {
                let mut args: Vec<std::ffi::OsString> = vec![
                    "pack".into(),
                    src.clone().into(),
                    "-o".into(),
                    ds.clone().into(),
                    "--json".into(),
                    "--shard".into(),
                    format!("{i}/{n}").into(),
                ];
                args.extend(ARGS.iter().map(Into::into));
                spawn(args)
            })
            .collect();
        let mut files_packed = 0;
        let mut ids = Vec::new();
        for c in children {
            let s = wait_json(c);
            files_packed += s["files"].as_u64().unwrap();
            ids.push(s["dataset_id"].as_str().unwrap().to_string());
        }
        assert_eq!(files_packed, files.len() as u64);
        ids.dedup();
        assert_eq!(ids.len(), 1, "shards agree on the dataset id alone");
        // Before the merge the directory is not a dataset, and says what to run.
        let o = run(["info".as_ref(), ds.as_os_str()]);
        assert!(!o.status.success());
        assert!(stderr(&o).contains("`granary merge`"), "{}", stderr(&o));
        let o = run_ok(["merge".as_ref(), ds.as_os_str(), "--json".as_ref()]);
        let m: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(m["merged"], true);
        assert_eq!(m["files"], files.len() as u64);
        let got = verify_json(&ds);
        assert_eq!(got["samples_digest"], want["samples_digest"], "{n} shards");
        assert_eq!(got["samples"], want["samples"]);
        assert!(got["notes"].as_array().unwrap().is_empty(), "{got}");
        // A complete epoch reads every sample once, right.
        let r = run_ok([
            "read".as_ref(),
            ds.as_os_str(),
            "--workers".as_ref(),
            "2".as_ref(),
            "--json".as_ref(),
        ]);
        let r: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
        assert_eq!(r[0]["digest"].as_str(), got["digest"].as_str(), "{r}");
        let out = tmp.path().join(format!("out{n}"));
        assert_eq!(extracted(&ds, &out), sorted(files.clone()));
        // Rerunning merge changes nothing.
        let before = listing(&ds);
        let o = run_ok(["merge".as_ref(), ds.as_os_str(), "--json".as_ref()]);
        let m: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(m["merged"], false);
        assert_eq!(listing(&ds), before);
    }
}

#[test]
fn merge_refuses_bad_parts_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &tree(600));
    let ds = tmp.path().join("ds");
    shard_ok(&src, &ds, "0/3", &[]);
    shard_ok(&src, &ds, "2/3", &[]);

    let refused = |want: &str| {
        let before = listing(&ds);
        let o = merge(&ds);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(stderr(&o).contains(want), "want {want:?}: {}", stderr(&o));
        assert_eq!(
            listing(&ds),
            before,
            "a refused merge changed {}",
            ds.display()
        );
    };
    refused("shard(s) 1/3 of this 3-way pack never started");

    // A shard from another pack: other compression (foreign settings).
    let o = shard(&src, &ds, "1/3", &["--compress", "none"]);
    assert!(o.status.success(), "{}", stderr(&o));
    refused("was packed from other input or with other settings");
    // A shard that packed another tree (one more file): its listing differs.
    let src2 = tmp.path().join("src2");
    let mut more = tree(600);
    more.push((b"class0/extra.bin".to_vec(), b"extra".to_vec()));
    write_tree(&src2, &more);
    let o = shard(&src2, &ds, "1/3", &["--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    refused("was packed from other input or with other settings");

    // Now the right shard 1; then an incomplete part, a damaged part file, a missing chunk,
    // a part of another shard count.
    let o = shard(&src, &ds, "1/3", &["--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let part1 = ds.join("part-0001-of-0003").join("part.gpart");
    let good = std::fs::read(&part1).unwrap();
    std::fs::remove_file(&part1).unwrap();
    refused("shard 1/3 has not finished");
    let mut bad = good.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 1;
    std::fs::write(&part1, &bad).unwrap();
    refused("is unusable (part file: checksum mismatch");
    std::fs::write(&part1, &good[..good.len() - 10]).unwrap();
    refused("is unusable (part file: header says a body of");
    // A part file from another granary version is named as such.
    let mut old = good.clone();
    old[8] = 2;
    std::fs::write(&part1, &old).unwrap();
    refused("version 2; this granary reads version 4");
    std::fs::write(&part1, &good).unwrap();

    let c4 = ds.join(granary_format::chunk_file_name(4)); // shard 1's second chunk
    let chunk = std::fs::read(&c4).unwrap();
    std::fs::remove_file(&c4).unwrap();
    refused("chunk-00000004.gchunk of shard 1/3 is missing");
    std::fs::write(&c4, &chunk[..chunk.len() - 1]).unwrap();
    refused("rerun the shard with --force");
    // Same size, but a byte of its footer (the entries merge builds the snapshot from) flipped.
    let mut flipped = chunk.clone();
    flipped[chunk.len() - granary_format::CHUNK_TRAILER_LEN - 5] ^= 0x10;
    std::fs::write(&c4, &flipped).unwrap();
    refused("rerun shard 1/3 with --force");
    std::fs::write(&c4, &chunk).unwrap();

    std::fs::create_dir(ds.join("part-0000-of-0002")).unwrap();
    refused("parts of a 2-way and of a 3-way sharded pack");
    std::fs::remove_dir(ds.join("part-0000-of-0002")).unwrap();

    let stray = ds.join(granary_format::chunk_file_name(9999));
    std::fs::write(&stray, b"not ours").unwrap();
    refused("is not listed by any part");
    std::fs::remove_file(&stray).unwrap();

    // Shards refuse to write into a dataset; all is well now.
    let o = merge(&ds);
    assert!(o.status.success(), "{}", stderr(&o));
    verify_json(&ds);
    let o = shard(&src, &ds, "0/3", &["--force"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("is a dataset already"),
        "{}",
        stderr(&o)
    );
    // Bad shard specs are usage errors.
    for bad in ["3/3", "1", "a/b", "auto"] {
        let o = run([
            "pack".as_ref(),
            src.as_os_str(),
            "-o".as_ref(),
            tmp.path().join("x").as_os_str(),
            "--shard".as_ref(),
            bad.as_ref(),
        ]);
        assert_eq!(o.status.code(), Some(2), "--shard {bad}: {}", stderr(&o));
    }
}

#[test]
fn killed_shard_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let files = tree(3000);
    write_tree(&src, &files);
    let ds = tmp.path().join("ds");
    let part = ds.join("part-0000-of-0002");
    let own_chunks = |ds: &Path| {
        std::fs::read_dir(ds)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| {
                        granary_format::parse_chunk_file_name(&e.file_name().to_string_lossy())
                    })
                    .filter(|id| id % 2 == 0)
                    .count()
            })
            .unwrap_or(0)
    };
    shard_ok(&src, &ds, "1/2", &["--compress", "zstd:19"]);
    let mut interrupted = false;
    for attempt in 0..5 {
        let child = granary()
            .arg("pack")
            .arg(&src)
            .arg("-o")
            .arg(&ds)
            .args(ARGS)
            .args(["--shard", "0/2", "--force", "--compress", "zstd:19"])
            .spawn()
            .unwrap();
        kill_when(child, || own_chunks(&ds) >= 3 + attempt);
        if !part.join("part.gpart").exists() && own_chunks(&ds) > 0 {
            interrupted = true;
            break;
        }
    }
    assert!(interrupted, "could not interrupt the shard mid-run");
    let o = merge(&ds);
    assert!(stderr(&o).contains("has not finished"), "{}", stderr(&o));
    let o = shard(&src, &ds, "0/2", &["--compress", "zstd:19"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--resume"), "{}", stderr(&o));
    let o = shard(
        &src,
        &ds,
        "0/2",
        &["--compress", "zstd:19", "--resume", "--json"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(s["chunks_resumed"].as_u64().unwrap() >= 1, "{s}");
    // A finished shard run again does nothing (a requeued array task, say).
    let o = shard(&src, &ds, "0/2", &["--compress", "zstd:19", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = merge(&ds);
    assert!(o.status.success(), "{}", stderr(&o));
    verify_json(&ds);
    assert_eq!(extracted(&ds, &tmp.path().join("out")), sorted(files));
}

#[test]
fn append_adds_a_generation_and_old_readers_keep_reading() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let old = tree(1000);
    write_tree(&src, &old);
    let ds = tmp.path().join("ds");
    let o = pack(&src, &ds, &ARGS);
    assert!(o.status.success(), "{}", stderr(&o));

    // A reader holds the old snapshot open across the append.
    let reader = granary::Dataset::open(&ds).unwrap();
    assert_eq!(reader.len(), 1000);
    let half: Vec<u64> = (0..500).collect();
    for &id in &half {
        reader.read(id).unwrap();
    }

    let new_src = tmp.path().join("new");
    let new: Vec<(Vec<u8>, Vec<u8>)> = (0..300u64)
        .map(|i| {
            (
                format!("class{}/new{i:04}.bin", i % 10).into_bytes(),
                bytes(10_000 + i, 700 + i as usize * 3),
            )
        })
        .collect();
    write_tree(&new_src, &new);
    let o = run_ok([
        "append".as_ref(),
        ds.as_os_str(),
        new_src.as_os_str(),
        "--chunk-size".as_ref(),
        "16KiB".as_ref(),
        "--json".as_ref(),
    ]);
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["generation"], 1, "{s}");
    assert_eq!(s["files"], 300);

    // The old reader still reads every old sample, right.
    let want: BTreeMap<Vec<u8>, Vec<u8>> = old.iter().cloned().collect();
    for id in 0..reader.len() {
        let path = reader.path(id).unwrap().to_vec();
        assert_eq!(&reader.read(id).unwrap(), &want[&path]);
    }
    // A reader opening now sees the new generation.
    let now = granary::Dataset::open(&ds).unwrap();
    assert_eq!(now.len(), 1300);
    assert_eq!(now.snapshot().lineage().generation, 1);
    assert_eq!(
        now.snapshot().lineage().parent,
        reader.snapshot().content_digest()
    );
    // Lineage, and every sample's mode and mtime, old and new.
    assert_eq!(now.snapshot().version(), (2, 0));
    for id in [0, reader.len() - 1, reader.len(), now.len() - 1] {
        let path = now.path(id).unwrap();
        let src = if id < reader.len() { &src } else { &new_src };
        let m = std::fs::metadata(src.join(std::ffi::OsStr::from_bytes(&path))).unwrap();
        let a = now.attrs(id).unwrap().expect("attributes recorded");
        assert_eq!(a.mode, m.mode() & 0o7777);
        assert_eq!(a.mtime_ns, m.mtime() * 1_000_000_000 + m.mtime_nsec());
    }
    let v = verify_json(&ds);
    assert_eq!(v["samples"], 1300);
    let mut all = old.clone();
    all.extend(new.iter().cloned());
    assert_eq!(extracted(&ds, &tmp.path().join("out")), sorted(all.clone()));

    // The same files again: refused, naming them, and nothing changes.
    let before = listing(&ds);
    let o = run(["append".as_ref(), ds.as_os_str(), new_src.as_os_str()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("300 of the files to append are in the dataset already"),
        "{}",
        stderr(&o)
    );
    assert_eq!(listing(&ds), before);
    // A new class is refused too.
    let odd = tmp.path().join("odd");
    write_tree(&odd, &[(b"newclass/x".to_vec(), b"x".to_vec())]);
    let o = run(["append".as_ref(), ds.as_os_str(), odd.as_os_str()]);
    assert!(
        stderr(&o).contains("not classes of the dataset"),
        "{}",
        stderr(&o)
    );
    assert_eq!(listing(&ds), before);

    // The grown tree with --skip-existing: only the new file goes in (generation 2).
    write_tree(&new_src, &[(b"class3/late.bin".to_vec(), b"late".to_vec())]);
    let o = run_ok([
        "append".as_ref(),
        ds.as_os_str(),
        new_src.as_os_str(),
        "--skip-existing".as_ref(),
        "--json".as_ref(),
    ]);
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (s["files"].as_u64(), s["generation"].as_u64()),
        (Some(1), Some(2))
    );
    all.push((b"class3/late.bin".to_vec(), b"late".to_vec()));
    let v = verify_json(&ds);
    assert_eq!(v["samples"], 1301);
    // Its content equals a single pack of everything.
    let everything = tmp.path().join("everything");
    write_tree(&everything, &all);
    let single = tmp.path().join("single");
    let o = pack(&everything, &single, &ARGS);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(verify_json(&single)["samples_digest"], v["samples_digest"]);
}

/// Every entry of a dataset's namespace: path, whether a directory, size and attributes.
type Namespace = Vec<(Vec<u8>, bool, u64, Option<granary::FileAttrs>)>;

fn namespace(ds: &Path) -> Namespace {
    let d = granary::Dataset::open_checked(ds).unwrap();
    let s = d.snapshot();
    s.entries(0..s.entry_count())
        .unwrap()
        .into_iter()
        .map(|e| (e.path.clone(), e.is_dir(), e.size, e.attrs))
        .collect()
}

/// Packs `src` in `n` shards at once and merges them.
fn sharded(src: &Path, ds: &Path, n: u32, extra: &[&str]) {
    let children: Vec<_> = (0..n)
        .map(|i| {
            let mut args: Vec<std::ffi::OsString> = vec![
                "pack".into(),
                src.into(),
                "-o".into(),
                ds.into(),
                "--json".into(),
            ];
            args.extend(["--shard".into(), format!("{i}/{n}").into()]);
            args.extend(ARGS.iter().chain(extra).map(Into::into));
            spawn(args)
        })
        .collect();
    for c in children {
        wait_json(c);
    }
    run_ok(["merge".as_ref(), ds.as_os_str()]);
}

/// Pack, shards + merge, a file list and reindex record the same namespace for the same tree:
/// every file's size, mode and mtime, every directory (empty ones too) with its own.
#[test]
fn every_way_of_packing_records_the_same_namespace() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &tree(300));
    for (i, e) in walkdir::WalkDir::new(&src).into_iter().enumerate() {
        let e = e.unwrap();
        if e.file_type().is_file() && i % 7 == 0 {
            let mode = [0o600, 0o755, 0o640][i % 3];
            std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        }
    }
    for d in ["class3/empty", "zz/a/b"] {
        std::fs::create_dir_all(src.join(d)).unwrap();
    }
    std::fs::set_permissions(src.join("zz/a"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let single = tmp.path().join("single");
    assert!(pack(&src, &single, &ARGS).status.success());
    let want = namespace(&single);
    let dirs: Vec<&[u8]> = want.iter().filter(|e| e.1).map(|e| &e.0[..]).collect();
    assert!(dirs.contains(&&b"zz/a/b"[..]) && dirs.contains(&&b"class3/empty"[..]));
    let zz = want.iter().find(|e| e.0 == b"zz/a").unwrap();
    assert_eq!(zz.3.unwrap().mode, 0o700, "{zz:?}");
    assert!(want.iter().filter(|e| !e.1).all(|e| e.3.is_some()));
    let digest = |ds: &Path| verify_json(ds)["samples_digest"].clone();

    // Three shards and a merge: the same namespace, the same content.
    let merged = tmp.path().join("merged");
    sharded(&src, &merged, 3, &[]);
    assert_eq!(namespace(&merged), want);
    assert_eq!(digest(&merged), digest(&single));
    // Reindex of the merged dataset rebuilds its snapshot byte for byte.
    let snap = merged.join(granary_format::SNAPSHOT_FILE);
    let original = std::fs::read(&snap).unwrap();
    std::fs::remove_file(&snap).unwrap();
    run_ok(["reindex".as_ref(), merged.as_os_str()]);
    assert_eq!(std::fs::read(&snap).unwrap(), original);

    // A file list records the directories above its files (not the empty ones: it names
    // none), with their attributes.
    let list = tmp.path().join("list");
    let names: Vec<u8> = want
        .iter()
        .filter(|e| !e.1)
        .flat_map(|e| [&e.0[..], b"\n"].concat())
        .collect();
    std::fs::write(&list, names).unwrap();
    let listed = tmp.path().join("listed");
    let o = pack(
        &src,
        &listed,
        &[&ARGS[..], &["--files-from", list.to_str().unwrap()]].concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let ancestors: Namespace = want
        .iter()
        .filter(|e| ![&b"class3/empty"[..], b"zz", b"zz/a", b"zz/a/b"].contains(&&e.0[..]))
        .cloned()
        .collect();
    assert_eq!(namespace(&listed), ancestors);

    // More shards than the tree has files: shards without files still record the
    // directories they own (in an empty chunk).
    let small = tmp.path().join("small");
    write_tree(&small, &[(b"d/x".to_vec(), b"1".to_vec())]);
    for d in ["d/e1", "e2", "e3/f", "e4"] {
        std::fs::create_dir_all(small.join(d)).unwrap();
    }
    let one = tmp.path().join("one");
    assert!(pack(&small, &one, &ARGS).status.success());
    let many = tmp.path().join("many");
    sharded(&small, &many, 5, &[]);
    assert_eq!(namespace(&many), namespace(&one));
    assert_eq!(namespace(&one).len(), 7, "{:?}", namespace(&one));
}
