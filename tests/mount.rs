//! `granary mount`: the file-system methods called directly (no mount needed), then real FUSE
//! mounts through the CLI where this machine allows them (where it does not: skipped with the
//! reason printed, or failed when the run requires FUSE, `GRANARY_REQUIRE_FUSE=1` or `CI=true`).

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use granary_mount::{MountFs, Node, TieredReader, ROOT_INO};

/// The edge tree plus names that interleave a directory's files with a subdirectory in path
/// order (`c03/a` is a directory; `c03/a-0`, `c03/a.txt` sort between its entries' siblings),
/// and a file of 3 MiB (several FUSE reads).
fn mount_tree() -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut v = edge_tree();
    v.push((b"c03/a-0".to_vec(), b"dash".to_vec()));
    v.push((b"c03/a.txt".to_vec(), b"dot".to_vec()));
    v.push((b"c03/b".to_vec(), b"after".to_vec()));
    v.push((b"c05/big.bin".to_vec(), bytes(7, 3 << 20)));
    v
}

fn packed(tmp: &Path, files: &[(Vec<u8>, Vec<u8>)]) -> PathBuf {
    packed_tree(
        &tmp.join("src"),
        files,
        &tmp.join("ds"),
        &["--chunk-size", "20KiB"],
    )
}

fn mount_fs(ds: &Path, cache: Option<Arc<granary::LocalTier>>, fetch: bool) -> MountFs {
    let ds = Arc::new(granary::Dataset::open_checked(ds).unwrap());
    MountFs::new(TieredReader::new(ds, cache, fetch).unwrap(), 0, 0).unwrap()
}

/// Reads a whole file through `fs` in reads of `piece` bytes, as the kernel would.
fn read_file(fs: &MountFs, ino: u64, piece: u32) -> Result<Vec<u8>, i32> {
    let fh = fs.open(ino, false)?;
    let mut out = Vec::new();
    loop {
        let (data, range) = fs.read(fh, out.len() as u64, piece)?;
        if range.is_empty() {
            break;
        }
        out.extend_from_slice(&data[range]);
    }
    fs.release(fh);
    Ok(out)
}

/// The attributes a listing, a lookup and a stat must agree on.
fn shown(a: &fuser::FileAttr) -> (u64, u64, u16, std::time::SystemTime, fuser::FileType) {
    (a.ino.0, a.size, a.perm, a.mtime, a.kind)
}

/// Every file under directory `ino` as (path, bytes), through readdir, lookup and read. The
/// attributes readdir(plus) shows (from the listing pages, format 1.6) are the lookup's and
/// the stat's by inode (from the sample table and kind 8).
fn walk_fs(fs: &MountFs, ino: u64, prefix: &[u8], out: &mut Vec<(Vec<u8>, Vec<u8>)>) {
    let mut entries = Vec::new();
    // A small reply buffer: listings resume at the offsets given.
    let mut offset = 0;
    loop {
        let mut got = 0;
        fs.readdir(ino, offset, |a, name, next| {
            if name != b"." && name != b".." {
                assert_eq!(shown(a), shown(&fs.getattr(a.ino.0).unwrap()), "{name:?}");
            }
            entries.push((a.ino.0, a.kind, name.to_vec()));
            offset = next;
            got += 1;
            got == 3
        })
        .unwrap();
        if got == 0 {
            break;
        }
    }
    assert_eq!(&entries[0].2, b".");
    assert_eq!(&entries[1].2, b"..");
    for (child, kind, name) in &entries[2..] {
        let a = fs.lookup(ino, name).unwrap();
        assert_eq!(a.ino.0, *child, "lookup and readdir agree on {name:?}");
        assert_eq!(shown(&a), shown(&fs.getattr(*child).unwrap()), "{name:?}");
        let mut path = prefix.to_vec();
        if !path.is_empty() {
            path.push(b'/');
        }
        path.extend_from_slice(name);
        // Modes and mtimes as packed (format 1.2): the source's.
        let src = fs
            .dataset()
            .snapshot_path()
            .parent()
            .unwrap()
            .with_file_name("src");
        let m = std::fs::metadata(src.join(std::ffi::OsStr::from_bytes(&path))).unwrap();
        assert_eq!(a.perm as u32, m.mode() & 0o7777, "{path:?}");
        assert_eq!(a.mtime, m.modified().unwrap(), "{path:?}");
        if *kind == fuser::FileType::Directory {
            walk_fs(fs, *child, &path, out);
        } else {
            let data = read_file(fs, *child, 128 << 10).unwrap();
            assert_eq!(data.len() as u64, a.size);
            out.push((path, data));
        }
    }
}

#[test]
fn fs_methods_serve_the_tree_byte_for_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let files = mount_tree();
    let ds = packed(tmp.path(), &files);
    let fs = mount_fs(&ds, None, false);
    let mut got = Vec::new();
    walk_fs(&fs, ROOT_INO, b"", &mut got);
    assert_eq!(sorted(got), sorted(files.clone()));

    // Inodes: a file's is its sample id + 2, and map back.
    let dsr = fs.dataset().clone();
    let id = dsr.lookup(b"c03/a.txt").unwrap().unwrap();
    let c03 = fs.lookup(ROOT_INO, b"c03").unwrap().ino.0;
    let a = fs.lookup(c03, b"a.txt").unwrap();
    assert_eq!(a.ino.0, id + 2);
    assert_eq!(fs.tree().node(a.ino.0), Some(Node::File(id)));
    assert_eq!(a.size, 3);
    // `..` of a subdirectory is its parent; the root's is itself.
    assert_eq!(fs.lookup(c03, b"..").unwrap().ino.0, ROOT_INO);
    assert_eq!(fs.lookup(ROOT_INO, b"..").unwrap().ino.0, ROOT_INO);
    // nlink of a directory: 1, "not counted" (counting would list every directory looked up).
    assert_eq!(fs.getattr(c03).unwrap().nlink, 1);
    // Reads past the end are empty; a zero-byte file reads as empty.
    let fh = fs.open(a.ino.0, false).unwrap();
    let (_, r) = fs.read(fh, 100, 10).unwrap();
    assert!(r.is_empty());
    fs.release(fh);
    let c00 = fs.lookup(ROOT_INO, b"c00").unwrap().ino.0;
    let empty = fs.lookup(c00, b"empty").unwrap();
    assert_eq!(empty.size, 0);
    assert_eq!(read_file(&fs, empty.ino.0, 4096).unwrap(), b"");
}

/// A view mounts as the tree of its files: listings skip the files it leaves out (runs of
/// namespace positions split around them), lookups do not find them, reads serve the rest.
#[test]
fn a_view_mounts_as_its_files_only() {
    let tmp = tempfile::tempdir().unwrap();
    let files = mount_tree();
    let ds = packed(tmp.path(), &files);
    let full = granary::Dataset::open(&ds).unwrap();
    // Every other file of the dataset, in id order.
    let ids: String = (0..full.len())
        .step_by(2)
        .map(|i| format!("{i}\n"))
        .collect();
    std::fs::write(tmp.path().join("ids"), ids).unwrap();
    let view = tmp.path().join("half.gview");
    let o = run([
        "view".as_ref(),
        ds.as_os_str(),
        "-o".as_ref(),
        view.as_os_str(),
        "--ids-from".as_ref(),
        tmp.path().join("ids").as_os_str(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let fs = mount_fs(&view, None, false);
    let mut got = Vec::new();
    walk_fs(&fs, ROOT_INO, b"", &mut got);
    let want: Vec<(Vec<u8>, Vec<u8>)> = (0..full.len())
        .step_by(2)
        .map(|i| {
            let p = full.path(i).unwrap();
            let d = files.iter().find(|f| f.0 == p).unwrap().1.clone();
            (p, d)
        })
        .collect();
    // Its statistics count the view's samples, statfs their bytes.
    let stats: serde_json::Value = serde_json::from_str(&fs.stats_json()).unwrap();
    assert_eq!(stats["samples"], want.len() as u64);
    let stored: u64 = (0..full.len())
        .step_by(2)
        .map(|i| full.sample(i).unwrap().entry.stored_len)
        .sum();
    assert_eq!(fs.totals().0, stored);
    assert_eq!(sorted(got), sorted(want));
    // A file the view leaves out is not there.
    let left_out = full.path(1).unwrap();
    let (dir, name) = left_out.split_at(left_out.iter().rposition(|&b| b == b'/').unwrap());
    let d = fs.lookup(ROOT_INO, dir).unwrap().ino.0;
    assert_eq!(fs.lookup(d, &name[1..]).unwrap_err(), libc::ENOENT);
}

#[test]
fn a_mount_of_a_generation_with_deletions_shows_the_rest_and_copies_no_deleted_record() {
    let tmp = tempfile::tempdir().unwrap();
    let files = mount_tree();
    let ds = packed(tmp.path(), &files);
    let full = granary::Dataset::open(&ds).unwrap();
    let gone: Vec<u64> = (0..full.len()).filter(|i| i % 3 == 1).collect();
    let ids: String = gone.iter().map(|i| format!("{i}\n")).collect();
    std::fs::write(tmp.path().join("ids"), ids).unwrap();
    let o = run([
        "delete".as_ref(),
        ds.as_os_str(),
        "--ids-from".as_ref(),
        tmp.path().join("ids").as_os_str(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let d = Arc::new(granary::Dataset::open_checked(&ds).unwrap());
    let cache = Arc::new(
        granary::LocalTier::open(
            &tmp.path().join("tier"),
            d.snapshot().dataset_id(),
            u64::MAX,
            granary::TierPolicy::Static,
        )
        .unwrap(),
    );
    let fs = MountFs::new(
        TieredReader::new(d.clone(), Some(cache.clone()), true).unwrap(),
        0,
        0,
    )
    .unwrap();
    let mut got = Vec::new();
    walk_fs(&fs, ROOT_INO, b"", &mut got);
    let want: Vec<(Vec<u8>, Vec<u8>)> = (0..full.len())
        .filter(|i| gone.binary_search(i).is_err())
        .map(|i| {
            let p = full.path(i).unwrap();
            (
                p.clone(),
                files.iter().find(|f| f.0 == p).unwrap().1.clone(),
            )
        })
        .collect();
    assert_eq!(sorted(got), sorted(want));
    // A deleted sample's inode is not there either.
    assert_eq!(fs.getattr(gone[0] + 2).unwrap_err(), libc::ENOENT);
    // What the mount fetched into the tier holds no chunk keeping a deleted record.
    std::thread::sleep(Duration::from_millis(300));
    let held = cache.resident_chunks(d.snapshot().chunks()).unwrap();
    for c in d.dead_chunks().unwrap() {
        assert!(
            !held.contains(&c),
            "chunk {c} keeps deleted records and was copied"
        );
    }
}

/// Every entry under directory `ino`: readdir's attributes (from listing pages when the
/// snapshot has them) are the lookup's and the stat's by inode. Returns how many files.
fn listing_agrees_with_stat(fs: &MountFs, ino: u64) -> usize {
    let mut entries = Vec::new();
    fs.readdir(ino, 0, |a, name, _| {
        entries.push((*a, name.to_vec()));
        false
    })
    .unwrap();
    let mut files = 0;
    for (a, name) in &entries[2..] {
        assert_eq!(shown(a), shown(&fs.getattr(a.ino.0).unwrap()), "{name:?}");
        assert_eq!(shown(a), shown(&fs.lookup(ino, name).unwrap()), "{name:?}");
        files += match a.kind {
            fuser::FileType::Directory => listing_agrees_with_stat(fs, a.ino.0),
            _ => 1,
        };
    }
    files
}

#[test]
fn listings_show_what_stat_shows_with_and_without_metadata() {
    let tmp = tempfile::tempdir().unwrap();
    let files = mount_tree();
    let plain = packed_tree(
        &tmp.path().join("src"),
        &files,
        &tmp.path().join("plain"),
        &["--chunk-size", "20KiB", "--no-metadata"],
    );
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let upgraded = tmp.path().join("v1.2");
    copy_dir(&golden.join("v1.2/dataset"), &upgraded);
    run_ok(["upgrade".as_ref(), upgraded.as_os_str()]);
    for (ds, attrs) in [
        (packed(tmp.path(), &files), true),
        (plain, false),
        (upgraded, true),
    ] {
        let fs = mount_fs(&ds, None, false);
        let d = fs.dataset().clone();
        assert_eq!(d.snapshot().version(), (2, 0), "{ds:?}");
        assert_eq!(d.snapshot().has_attrs(), attrs, "{ds:?}");
        assert_eq!(listing_agrees_with_stat(&fs, ROOT_INO) as u64, d.len());
    }
}

#[test]
fn fs_methods_refuse_what_a_read_only_tree_cannot_do() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = packed(tmp.path(), &mount_tree());
    let fs = mount_fs(&ds, None, false);
    let c03 = fs.lookup(ROOT_INO, b"c03").unwrap().ino.0;
    let file = fs.lookup(c03, b"b").unwrap().ino.0;
    assert_eq!(fs.lookup(ROOT_INO, b"missing").unwrap_err(), libc::ENOENT);
    assert_eq!(fs.lookup(c03, b"a/b").unwrap_err(), libc::ENOENT);
    assert_eq!(fs.lookup(ROOT_INO, b"").unwrap_err(), libc::ENOENT);
    assert_eq!(fs.lookup(file, b"x").unwrap_err(), libc::ENOTDIR);
    assert_eq!(fs.opendir(file).unwrap_err(), libc::ENOTDIR);
    assert_eq!(fs.open(c03, false).unwrap_err(), libc::EISDIR);
    assert_eq!(fs.open(file, true).unwrap_err(), libc::EROFS);
    assert_eq!(fs.getattr(u64::MAX).unwrap_err(), libc::ENOENT);
    assert_eq!(fs.getattr(0).unwrap_err(), libc::ENOENT);
    assert_eq!(fs.read(12345, 0, 10).unwrap_err(), libc::EBADF);
    let fh = fs.open(file, false).unwrap();
    fs.release(fh);
    assert_eq!(fs.read(fh, 0, 10).unwrap_err(), libc::EBADF);
    assert_eq!(read_file(&fs, file, 4096).unwrap(), b"after");
    // Statistics and the serving pid as extended attributes of the root only.
    let stats: serde_json::Value =
        serde_json::from_slice(&fs.getxattr(ROOT_INO, b"user.granary.stats").unwrap()).unwrap();
    assert_eq!(stats["samples"], mount_tree().len() as u64);
    assert_eq!(stats["samples_from_origin"], 1);
    // The stack's one layer (no tier here): what the sample read opened and read.
    let layers = stats["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "{layers:?}");
    assert_eq!(layers[0]["layer"], "origin");
    assert!(layers[0]["opens"].as_u64().unwrap() >= 1, "{layers:?}");
    assert!(layers[0]["bytes"].as_u64().unwrap() >= 5, "{layers:?}");
    assert_eq!(layers[0]["errors"], 0);
    assert_eq!(
        fs.getxattr(ROOT_INO, b"user.granary.pid").unwrap(),
        std::process::id().to_string().as_bytes()
    );
    assert_eq!(
        fs.getxattr(file, b"user.granary.pid").unwrap_err(),
        libc::ENODATA
    );
    assert_eq!(
        fs.getxattr(ROOT_INO, b"user.other").unwrap_err(),
        libc::ENODATA
    );
}

/// Flips one byte inside the record of `path` in its chunk file; returns the chunk id.
fn damage_record(ds: &Path, path: &[u8]) -> u32 {
    let d = granary::Dataset::open(ds).unwrap();
    let info = d.sample(d.lookup(path).unwrap().unwrap()).unwrap();
    let chunk = d.chunk_path(info.entry.chunk);
    let mut bytes = std::fs::read(&chunk).unwrap();
    bytes[(info.entry.offset + info.entry.stored_len / 2) as usize] ^= 0x40;
    std::fs::write(&chunk, bytes).unwrap();
    info.entry.chunk
}

#[test]
fn a_damaged_record_is_eio_and_only_for_its_chunk() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = packed(tmp.path(), &mount_tree());
    let chunk = damage_record(&ds, b"c01/large.bin");
    let fs = mount_fs(&ds, None, false);
    let c01 = fs.lookup(ROOT_INO, b"c01").unwrap().ino.0;
    let large = fs.lookup(c01, b"large.bin").unwrap().ino.0;
    assert_eq!(read_file(&fs, large, 128 << 10).unwrap_err(), libc::EIO);
    // Every sample of other chunks reads fine.
    let d = fs.dataset().clone();
    let mut others = 0;
    for id in 0..d.len() {
        if d.sample(id).unwrap().entry.chunk != chunk {
            assert_eq!(
                read_file(&fs, id + 2, 1 << 20).unwrap(),
                d.read(id).unwrap()
            );
            others += 1;
        }
    }
    assert!(others > 100);
    assert_eq!(fs.reader().stats().read_errors, 1);
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn first_touch_fetches_chunks_into_the_tier_and_a_damaged_copy_is_never_served() {
    let tmp = tempfile::tempdir().unwrap();
    let files = mount_tree();
    let ds = packed(tmp.path(), &files);
    let id = granary::Dataset::open(&ds).unwrap().snapshot().dataset_id();
    let cache = Arc::new(
        granary::LocalTier::open(
            &tmp.path().join("tier"),
            id,
            u64::MAX,
            granary::TierPolicy::Static,
        )
        .unwrap(),
    );
    let fs = mount_fs(&ds, Some(cache.clone()), true);
    let d = fs.dataset().clone();
    let all = |fs: &MountFs| {
        for id in 0..d.len() {
            assert_eq!(read_file(fs, id + 2, 1 << 20).unwrap(), d.read(id).unwrap());
        }
    };
    // Each read waits for its chunk's fetch (the tier has room): nothing from the origin.
    all(&fs);
    let s = fs.reader().stats();
    assert_eq!(s.samples_from_origin, 0);
    assert_eq!(s.samples_from_tier, d.len());
    wait_for("every chunk in the tier", || {
        cache.resident_chunks(d.snapshot().chunks()).unwrap().len() as u64 == d.chunk_count()
    });
    let before = fs.reader().stats();
    all(&fs);
    let after = fs.reader().stats();
    assert_eq!(after.samples_from_tier - before.samples_from_tier, d.len());
    assert_eq!(after.samples_from_origin, before.samples_from_origin);
    assert_eq!(after.chunks_fetched, d.chunk_count());

    // A copy damaged in the tier: removed, and the right bytes come from the origin.
    let target = d.lookup(b"c01/large.bin").unwrap().unwrap();
    let e = d.sample(target).unwrap().entry;
    let copy = cache.lookup(&d.chunk(e.chunk).unwrap()).unwrap().unwrap();
    let mut b = std::fs::read(&copy).unwrap();
    b[(e.offset + 7) as usize] ^= 1;
    std::fs::write(&copy, b).unwrap();
    assert_eq!(
        read_file(&fs, target + 2, 1 << 20).unwrap(),
        d.read(target).unwrap()
    );
    assert_eq!(fs.reader().stats().tier_copies_discarded, 1);
    assert!(!cache
        .resident_chunks(d.snapshot().chunks())
        .unwrap()
        .contains(&e.chunk));

    // Without fetching the tier is only read: nothing new comes in.
    let tmp2 = tempfile::tempdir().unwrap();
    let empty = Arc::new(
        granary::LocalTier::open(tmp2.path(), id, u64::MAX, granary::TierPolicy::Lru).unwrap(),
    );
    let fs = mount_fs(&ds, Some(empty.clone()), false);
    all(&fs);
    std::thread::sleep(Duration::from_millis(200));
    assert!(empty
        .resident_chunks(d.snapshot().chunks())
        .unwrap()
        .is_empty());
    assert_eq!(fs.reader().stats().chunks_fetched, 0);
}

#[test]
fn a_tier_smaller_than_the_dataset_is_used_chunk_by_chunk_and_not_thrashed_at_random() {
    let tmp = tempfile::tempdir().unwrap();
    // ~2 KB files in 64 KiB chunks: ~32 samples per chunk, ~20 chunks; the tier holds 3.
    let files = numbered_tree(600, 6, |i| 1000 + (i as usize * 37) % 2000);
    let ds = packed_tree(
        &tmp.path().join("src"),
        &files,
        &tmp.path().join("ds"),
        &["--chunk-size", "64KiB"],
    );
    let d = Arc::new(granary::Dataset::open_checked(&ds).unwrap());
    let biggest = (0..d.chunk_count() as u32)
        .map(|c| d.chunk(c).unwrap().file_size)
        .max()
        .unwrap();
    let quota = 3 * biggest;
    let tier = |name: &str| {
        Arc::new(
            granary::LocalTier::open(
                &tmp.path().join(name),
                d.snapshot().dataset_id(),
                quota,
                granary::TierPolicy::Lru,
            )
            .unwrap(),
        )
    };
    let check = |fs: &MountFs, order: &[u64]| {
        for &id in order {
            assert_eq!(read_file(fs, id + 2, 1 << 20).unwrap(), d.read(id).unwrap());
        }
        fs.reader().stats()
    };
    // In chunk order (ids are in chunk order): each chunk fetched about once, most reads hit.
    let fs = MountFs::new(
        TieredReader::new(d.clone(), Some(tier("seq")), true).unwrap(),
        0,
        0,
    )
    .unwrap();
    let s = check(&fs, &(0..d.len()).collect::<Vec<_>>());
    assert!(s.chunks_fetched * 10 >= d.chunk_count() * 8, "{s:?}");
    assert!(
        s.bytes_fetched <= d.total_chunk_bytes().unwrap() * 11 / 10,
        "{s:?}"
    );
    assert!(s.samples_from_tier * 10 >= d.len() * 6, "{s:?}");
    // In a random order: no chunk read again and again for a sample or two.
    let mut order: Vec<u64> = (0..d.len()).collect();
    let mut rng = granary_format::SplitMix64::new(7);
    for i in (1..order.len()).rev() {
        order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    let fs = MountFs::new(
        TieredReader::new(d.clone(), Some(tier("rnd")), true).unwrap(),
        0,
        0,
    )
    .unwrap();
    let s = check(&fs, &order);
    assert!(
        s.bytes_fetched <= 2 * d.total_chunk_bytes().unwrap(),
        "random order fetched {} bytes of a {}-byte dataset: {s:?}",
        s.bytes_fetched,
        d.total_chunk_bytes().unwrap()
    );
}

// ---- Real mounts -----------------------------------------------------------------------

/// Why this machine cannot run FUSE mounts here, if it cannot.
pub(crate) fn no_fuse() -> Option<String> {
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse is missing".into());
    }
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .is_err()
    {
        return Some("/dev/fuse cannot be opened by this user".into());
    }
    let root = std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false);
    let fusermount = ["fusermount3", "fusermount"].iter().any(|b| {
        std::process::Command::new(b)
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !root && !fusermount {
        return Some("not root and no fusermount3".into());
    }
    None
}

/// Whether a test that needs FUSE runs (`Ok(true)`), is skipped (`Ok(false)`: `why` says
/// FUSE is not possible here) or fails (`Err`: it is not possible, but this run requires it,
/// through `GRANARY_REQUIRE_FUSE=1` or `CI=true`: a CI that passes because FUSE is missing
/// would hide a broken install step).
fn fuse_verdict(why: Option<String>, required: bool) -> Result<bool, String> {
    match (why, required) {
        (None, _) => Ok(true),
        (Some(why), true) => Err(format!(
            "GRANARY_REQUIRE_FUSE=1 (or CI=true) but FUSE mounts are not possible here: {why}"
        )),
        (Some(why), false) => {
            eprintln!("skipped: FUSE mounts are not possible here: {why}");
            Ok(false)
        }
    }
}

pub(crate) fn fuse_required() -> bool {
    std::env::var("GRANARY_REQUIRE_FUSE").is_ok_and(|v| v == "1")
        || std::env::var("CI").is_ok_and(|v| v == "true")
}

macro_rules! require_fuse {
    () => {
        match fuse_verdict(no_fuse(), fuse_required()) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => panic!("{e}"),
        }
    };
}

#[test]
fn a_run_that_requires_fuse_fails_without_it_instead_of_skipping() {
    assert_eq!(fuse_verdict(None, true), Ok(true));
    assert_eq!(fuse_verdict(None, false), Ok(true));
    assert_eq!(fuse_verdict(Some("no /dev/fuse".into()), false), Ok(false));
    let e = fuse_verdict(Some("no /dev/fuse".into()), true).unwrap_err();
    assert!(
        e.contains("GRANARY_REQUIRE_FUSE") && e.contains("no /dev/fuse"),
        "{e}"
    );
}

fn is_mounted(mnt: &Path) -> bool {
    let mnt = std::fs::canonicalize(mnt).unwrap();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(mnt.to_str().unwrap()))
}

/// Mounts `ds` at `mnt` in the background (the CLI returns once mounted); unmounted on drop.
struct Mounted(PathBuf);

impl Mounted {
    fn new(ds: &Path, mnt: &Path, extra: &[&str]) -> Mounted {
        std::fs::create_dir_all(mnt).unwrap();
        let log = mnt.with_extension("log");
        let mut args = vec![
            "mount".as_ref(),
            ds.as_os_str(),
            mnt.as_os_str(),
            "--log".as_ref(),
            log.as_os_str(),
        ];
        args.extend(extra.iter().map(std::ffi::OsStr::new));
        run_ok(args);
        assert!(is_mounted(mnt));
        Mounted(mnt.to_path_buf())
    }
}

impl Drop for Mounted {
    /// Unmounts if still mounted (also when a test failed half-way).
    fn drop(&mut self) {
        if self.0.exists() && is_mounted(&self.0) {
            let o = run(["umount".as_ref(), self.0.as_os_str()]);
            if !o.status.success() {
                let _ = run(["umount".as_ref(), "--lazy".as_ref(), self.0.as_os_str()]);
            }
        }
    }
}

/// `diff -r a b` finds no difference (contents, names, empty directories).
fn assert_diff_clean(a: &Path, b: &Path) {
    let diff = std::process::Command::new("diff")
        .arg("-r")
        .arg(a)
        .arg(b)
        .output()
        .unwrap();
    assert!(
        diff.status.success(),
        "{}",
        String::from_utf8_lossy(&diff.stdout)
    );
}

fn errno_of<T>(r: std::io::Result<T>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

#[test]
fn a_mounted_dataset_reads_like_its_source() {
    require_fuse!();
    let tmp = tempfile::tempdir().unwrap();
    let files = mount_tree();
    let ds = packed(tmp.path(), &files);
    let mnt = tmp.path().join("mnt");
    let m = Mounted::new(&ds, &mnt, &[]);
    // `diff -r` against the source, and our own byte-for-byte walk.
    assert_diff_clean(&tmp.path().join("src"), &mnt);
    assert_eq!(read_tree(&mnt), sorted(files.clone()));
    let names: Vec<Vec<u8>> = std::fs::read_dir(mnt.join("c02"))
        .unwrap()
        .map(|e| e.unwrap().file_name().as_bytes().to_vec())
        .collect();
    assert!(names.contains(&b"\xff\xfe-latin1-\xe9.jpg".to_vec()));

    let meta = std::fs::metadata(mnt.join("c01/large.bin")).unwrap();
    assert_eq!(meta.len(), 300_000);
    let orig = std::fs::metadata(tmp.path().join("src/c01/large.bin")).unwrap();
    assert_eq!(meta.mode() & 0o7777, orig.mode() & 0o7777);
    assert_eq!(meta.modified().unwrap(), orig.modified().unwrap());
    assert_eq!(
        errno_of(std::fs::metadata(mnt.join("nope"))),
        Some(libc::ENOENT)
    );
    assert_eq!(
        errno_of(std::fs::File::open(mnt.join("c01/nope"))),
        Some(libc::ENOENT)
    );
    assert_eq!(
        errno_of(std::fs::File::create(mnt.join("new"))),
        Some(libc::EROFS)
    );
    assert_eq!(
        errno_of(
            std::fs::OpenOptions::new()
                .write(true)
                .open(mnt.join("c03/b"))
        ),
        Some(libc::EROFS)
    );
    assert_eq!(
        errno_of(std::fs::create_dir(mnt.join("d"))),
        Some(libc::EROFS)
    );
    assert_eq!(
        errno_of(std::fs::remove_file(mnt.join("c03/b"))),
        Some(libc::EROFS)
    );

    // Several processes read every file at once; all agree with the source.
    let expect = std::process::Command::new("sh")
        .current_dir(tmp.path().join("src"))
        .args([
            "-c",
            "find . -type f -print0 | sort -z | xargs -0 sha256sum",
        ])
        .output()
        .unwrap();
    let readers: Vec<_> = (0..4)
        .map(|_| {
            std::process::Command::new("sh")
                .current_dir(&mnt)
                .args([
                    "-c",
                    "find . -type f -print0 | sort -z | xargs -0 sha256sum",
                ])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for r in readers {
        let o = r.wait_with_output().unwrap();
        assert!(o.status.success());
        assert_eq!(o.stdout, expect.stdout);
    }
    drop(m);
    assert!(!is_mounted(&mnt));
}

#[test]
fn a_mounted_damaged_chunk_gives_eio_and_the_mount_keeps_serving() {
    require_fuse!();
    let tmp = tempfile::tempdir().unwrap();
    let files = mount_tree();
    let ds = packed(tmp.path(), &files);
    let chunk = damage_record(&ds, b"c01/large.bin");
    let mnt = tmp.path().join("mnt");
    let _m = Mounted::new(&ds, &mnt, &[]);
    assert_eq!(
        errno_of(std::fs::read(mnt.join("c01/large.bin"))),
        Some(libc::EIO)
    );
    let d = granary::Dataset::open(&ds).unwrap();
    for (path, data) in &files {
        let id = d.lookup(path).unwrap().unwrap();
        if d.sample(id).unwrap().entry.chunk != chunk {
            let p = mnt.join(std::ffi::OsStr::from_bytes(path));
            assert_eq!(&std::fs::read(p).unwrap(), data);
        }
    }
}

#[test]
fn stopping_or_unmounting_while_files_are_read_does_not_hang() {
    require_fuse!();
    let tmp = tempfile::tempdir().unwrap();
    let ds = packed(tmp.path(), &mount_tree());
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();

    // SIGTERM to a foreground mount while a file is held open and read in a loop.
    let _guard = Mounted(mnt.clone());
    let mut server = granary()
        .args([
            "mount".as_ref(),
            ds.as_os_str(),
            mnt.as_os_str(),
            "--foreground".as_ref(),
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the mount", || is_mounted(&mnt));
    let file = mnt.join("c05/big.bin");
    let (tx, rx) = std::sync::mpsc::channel();
    let (finished_tx, finished) = std::sync::mpsc::channel();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done2 = done.clone();
    let reader = std::thread::spawn(move || {
        use std::io::{Read, Seek};
        let mut f = std::fs::File::open(&file).unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let _ = tx.send(());
        // Reads until told to stop (pages may come from the page cache even after the
        // connection is gone) or until a read fails; either way it returns.
        while !done2.load(std::sync::atomic::Ordering::Relaxed) {
            if f.seek(std::io::SeekFrom::Start(0))
                .and_then(|_| f.read(&mut buf))
                .is_err()
            {
                break;
            }
        }
        let _ = finished_tx.send(());
    });
    rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = server.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the mount did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = t0.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut server.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{status}: {err}");
    // docs/mount.md: a signal detaches the mount and the process exits within 5 s, even with
    // a file held open and read.
    assert!(
        took < Duration::from_secs(5),
        "the mount exited {took:?} after SIGTERM, the documented bound is 5 s: {err}"
    );
    assert!(!is_mounted(&mnt));
    // The reader is never stuck: it returns once told to stop (or on its read error).
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    finished
        .recv_timeout(Duration::from_secs(30))
        .expect("a reader of the stopped mount returns");
    reader.join().unwrap();

    // `granary umount --lazy` while a file is open: detached at once; the open file stays
    // readable until closed, then the serving process exits.
    let m = Mounted::new(&ds, &mnt, &[]);
    let pid: u32 = {
        let mut buf = [0u8; 32];
        let n = rustix::fs::getxattr(&mnt, "user.granary.pid", &mut buf[..]).unwrap();
        std::str::from_utf8(&buf[..n]).unwrap().parse().unwrap()
    };
    let held = std::fs::File::open(mnt.join("c01/large.bin")).unwrap();
    run_ok(["umount".as_ref(), "--lazy".as_ref(), mnt.as_os_str()]);
    assert!(!is_mounted(&mnt));
    let mut data = Vec::new();
    std::io::Read::read_to_end(&mut &held, &mut data).unwrap();
    assert_eq!(data.len(), 300_000);
    drop(held);
    wait_for("the mount process to exit", || {
        !Path::new(&format!("/proc/{pid}")).exists()
    });
    drop(m);
}

/// The S3 test server's endpoint (`host:port`), or `None` (with the reason printed) when no
/// server is configured; a failure when the run requires one (`GRANARY_REQUIRE_S3=1`).
fn s3_endpoint() -> Option<String> {
    let Some(ep) = std::env::var("AWS_ENDPOINT_URL")
        .ok()
        .filter(|_| std::env::var_os("GRANARY_TEST_S3").is_some())
    else {
        assert!(
            !std::env::var("GRANARY_REQUIRE_S3").is_ok_and(|v| v == "1"),
            "GRANARY_REQUIRE_S3=1 but no S3 server: source the env file of scripts/s3-server.sh"
        );
        eprintln!("skipped: no S3 server (scripts/s3-server.sh)");
        return None;
    };
    Some(
        ep.trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string(),
    )
}

#[test]
fn a_read_through_the_mount_of_a_store_gone_silent_is_eio_within_the_bound() {
    require_fuse!();
    let Some(upstream) = s3_endpoint() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let files = numbered_tree(40, 2, |i| 20_000 + i as usize);
    write_tree(&src, &files);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let url = format!("s3://granary/tests/silent-mount-{nanos}");
    let o = granary()
        .args([
            "pack",
            src.to_str().unwrap(),
            "-o",
            &url,
            "--chunk-size",
            "64KiB",
        ])
        .env("XDG_CACHE_HOME", tmp.path().join("cache"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));

    // The mount reaches the store through a relay that can go silent.
    let relay = Relay::new(Some(upstream));
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let _guard = Mounted(mnt.clone());
    let o = granary()
        .args(["mount", &url, mnt.to_str().unwrap()])
        .arg("--log")
        .arg(tmp.path().join("mount.log"))
        .env("AWS_ENDPOINT_URL", relay.url())
        .env("XDG_CACHE_HOME", tmp.path().join("cache"))
        .env("GRANARY_CONNECT_TIMEOUT", "1")
        .env("GRANARY_REQUEST_TIMEOUT", "1")
        .env("GRANARY_RETRY_TIMEOUT", "3")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let (first, last) = (&files[0], &files[files.len() - 1]);
    let path = |f: &(Vec<u8>, Vec<u8>)| mnt.join(std::ffi::OsStr::from_bytes(&f.0));
    assert_eq!(std::fs::read(path(first)).unwrap(), first.1);

    relay.go_silent();
    // One operation gives up about 3.3 s in (attempts at 0, 1.1 and 2.3 s, each failing after
    // 1 s without an answer); within `Timeouts::bound` (7 s here). The kernel asks again after
    // a failed read (readahead, then the read): both must not wait, so one read of the file
    // must end well before two operations could.
    let t = granary_store::object::Timeouts {
        connect: Duration::from_secs(1),
        request: Duration::from_secs(1),
        retry: Duration::from_secs(3),
    };
    for attempt in 0..2 {
        let t0 = Instant::now();
        let r = std::fs::read(path(last));
        let took = t0.elapsed();
        assert_eq!(errno_of(r), Some(libc::EIO), "attempt {attempt}");
        assert!(
            took < t.retry + t.request + Duration::from_secs(1) && took < t.bound(),
            "attempt {attempt}: EIO after {took:?}: the store was waited on more than once"
        );
    }
    let log = std::fs::read_to_string(tmp.path().join("mount.log")).unwrap();
    assert!(
        log.contains(&url) && log.contains("still waiting"),
        "the mount's log must name the store it waits on: {log}"
    );
}

#[test]
fn the_mount_shows_packed_modes_mtimes_and_empty_directories() {
    use std::os::unix::fs::PermissionsExt;
    require_fuse!();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(
        &src,
        &[
            (b"bin/run.sh".to_vec(), b"#!/bin/sh\necho run\n".to_vec()),
            (b"data/x".to_vec(), b"x".to_vec()),
        ],
    );
    std::fs::create_dir_all(src.join("valid")).unwrap();
    std::fs::create_dir_all(src.join("data/empty")).unwrap();
    std::fs::set_permissions(
        src.join("bin/run.sh"),
        std::fs::Permissions::from_mode(0o750),
    )
    .unwrap();
    std::fs::set_permissions(src.join("valid"), std::fs::Permissions::from_mode(0o711)).unwrap();
    let ds = tmp.path().join("ds");
    assert!(pack(&src, &ds, &[]).status.success());
    let mnt = tmp.path().join("mnt");
    let m = Mounted::new(&ds, &mnt, &[]);
    // `diff -r` finds the same tree, empty directories included.
    assert_diff_clean(&src, &mnt);
    for p in ["bin/run.sh", "data/x", "valid", "data/empty", "data", "bin"] {
        let (a, b) = (
            std::fs::metadata(src.join(p)).unwrap(),
            std::fs::metadata(mnt.join(p)).unwrap(),
        );
        assert_eq!(a.mode() & 0o7777, b.mode() & 0o7777, "{p}");
        assert_eq!(a.modified().unwrap(), b.modified().unwrap(), "{p}");
        assert_eq!(a.is_dir(), b.is_dir(), "{p}");
    }
    assert_eq!(std::fs::read_dir(mnt.join("valid")).unwrap().count(), 0);
    let run = std::process::Command::new(mnt.join("bin/run.sh"))
        .output()
        .unwrap();
    assert_eq!(run.stdout, b"run\n", "executables run from the mount");
    drop(m);
}

/// A dataset of samples with named fields (format 1.3), imported from a WebDataset shard whose
/// keys lie in two directories: the members as (path, bytes).
/// Files as (path, bytes).
type Files = Vec<(Vec<u8>, Vec<u8>)>;

fn field_dataset(tmp: &Path) -> (PathBuf, Files) {
    let mut members = Vec::new();
    for i in 0..40u64 {
        let key = format!("{}/s{i:03}", if i % 2 == 0 { "even" } else { "odd" });
        members.push((
            format!("{key}.jpg").into_bytes(),
            bytes(i, 2000 + i as usize * 100),
        ));
        members.push((
            format!("{key}.txt").into_bytes(),
            format!("caption {i}").into_bytes(),
        ));
        if i % 4 == 0 {
            members.push((format!("{key}.seg.png").into_bytes(), bytes(100 + i, 700)));
        }
    }
    let tar_path = tmp.join("shard.tar");
    write_tar(&tar_path, &members);
    let ds = tmp.join("fields.granary");
    import_tar(&tar_path, &ds, &["--chunk-size", "16KiB"]);
    (ds, members)
}

/// Every file under directory `ino` through readdir, lookup and read (no attribute checks).
fn walk_plain(fs: &MountFs, ino: u64, prefix: &[u8], out: &mut Vec<(Vec<u8>, Vec<u8>)>) {
    let mut entries = Vec::new();
    fs.readdir(ino, 2, |a, name, _| {
        entries.push((a.ino.0, a.kind, a.size, name.to_vec()));
        false
    })
    .unwrap();
    for (child, kind, size, name) in entries {
        assert_eq!(fs.lookup(ino, &name).unwrap().ino.0, child, "{name:?}");
        let mut path = prefix.to_vec();
        if !path.is_empty() {
            path.push(b'/');
        }
        path.extend_from_slice(&name);
        if kind == fuser::FileType::Directory {
            walk_plain(fs, child, &path, out);
        } else {
            let data = read_file(fs, child, 1000).unwrap();
            assert_eq!(data.len() as u64, size, "{path:?}");
            out.push((path, data));
        }
    }
}

#[test]
fn samples_with_fields_are_mounted_as_key_dot_field_files() {
    let tmp = tempfile::tempdir().unwrap();
    let (ds, members) = field_dataset(tmp.path());
    let fs = mount_fs(&ds, None, false);
    let mut got = Vec::new();
    walk_plain(&fs, ROOT_INO, b"", &mut got);
    assert_eq!(sorted(got), sorted(members.clone()));
    let even = fs.lookup(ROOT_INO, b"even").unwrap().ino.0;
    assert_eq!(
        fs.lookup(even, b"s000").err(),
        Some(libc::ENOENT),
        "a key alone is no file"
    );
    assert_eq!(fs.lookup(even, b"s000.seg.png").unwrap().size, 700);
    assert_eq!(fs.lookup(even, b"s002.seg.png").err(), Some(libc::ENOENT));
    require_fuse!();
    let mnt = tmp.path().join("mnt");
    let _m = Mounted::new(&ds, &mnt, &[]);
    assert_eq!(read_tree(&mnt), sorted(members));
}

/// The names `readdir` lists in directory `ino` (without `.` and `..`), or its error.
fn listed(fs: &MountFs, ino: u64) -> Result<Vec<Vec<u8>>, i32> {
    let mut names = Vec::new();
    fs.readdir(ino, 2, |_, name, _| {
        names.push(name.to_vec());
        false
    })?;
    Ok(names)
}

#[test]
fn the_tree_is_made_as_it_is_visited_and_a_bad_name_fails_only_its_directory() {
    let tmp = tempfile::tempdir().unwrap();
    // A name that is both a file and a directory cannot be written at all: the writer
    // refuses the second key as it is written.
    let bad = tmp.path().join("bad");
    let mut w = granary_packer::Writer::create(granary_packer::WriterOptions::new(&bad)).unwrap();
    w.write(b"a/b", vec![1], granary_packer::Label::None)
        .unwrap();
    let e = w
        .write(b"a/b/c", vec![1], granary_packer::Label::None)
        .unwrap_err()
        .to_string();
    assert!(e.contains(r#""a/b/c" lies under "a/b""#), "{e}");
    w.finish().unwrap();
    let out = tmp.path().join("ds");
    let mut w = granary_packer::Writer::create(granary_packer::WriterOptions::new(&out)).unwrap();
    // A name in `a` no file system takes (over 255 bytes); `d` mixes files and a
    // subdirectory where they sort ('-' < '.' < '/').
    let long = format!("a/{}", "x".repeat(300));
    for key in [
        "a/b",
        "a/b.txt",
        &long,
        "d/e/f/g.bin",
        "d/e-1",
        "d/e.txt",
        "d/e/h",
        "z",
    ] {
        let data = key.as_bytes().to_vec();
        w.write(key.as_bytes(), data, granary_packer::Label::None)
            .unwrap();
    }
    w.finish().unwrap();
    let fs = mount_fs(&out, None, false);
    assert_eq!(fs.tree().dir_count(), 1, "mounting visits only the root");
    // A path walk makes known only the directories it passes.
    let d = fs.lookup(ROOT_INO, b"d").unwrap().ino.0;
    let e = fs.lookup(d, b"e").unwrap().ino.0;
    let f = fs.lookup(e, b"f").unwrap().ino.0;
    let g = fs.lookup(f, b"g.bin").unwrap();
    assert_eq!(read_file(&fs, g.ino.0, 4096).unwrap(), b"d/e/f/g.bin");
    assert_eq!(fs.tree().dir_count(), 4);
    assert_eq!(fs.lookup(e, b"nothing").unwrap_err(), libc::ENOENT);
    assert_eq!(fs.lookup(d, b"e.tx").unwrap_err(), libc::ENOENT);
    // Listings in path order; a subdirectory listed and looked up is the same inode.
    assert_eq!(listed(&fs, d).unwrap(), [&b"e"[..], b"e-1", b"e.txt"]);
    assert_eq!(listed(&fs, e).unwrap(), [&b"f"[..], b"h"]);
    assert_eq!(fs.lookup(d, b"e").unwrap().ino.0, e);
    assert_eq!(listed(&fs, ROOT_INO).unwrap(), [&b"a"[..], b"d", b"z"]);
    // `a` cannot be listed (EIO); everything else still serves.
    let a = fs.lookup(ROOT_INO, b"a").unwrap().ino.0;
    assert_eq!(listed(&fs, a).unwrap_err(), libc::EIO);
    let z = fs.lookup(ROOT_INO, b"z").unwrap();
    assert_eq!(read_file(&fs, z.ino.0, 4096).unwrap(), b"z");
    assert_eq!(fs.tree().dir_count(), 5);
}
