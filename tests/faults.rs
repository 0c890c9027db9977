//! Real faults, not simulated ones: a full file system (a small ext4 image, loop-mounted) under
//! a pack and under the local tier, and files that an unprivileged user cannot read. These
//! need root (mount, setpriv); elsewhere they say why they did not run, and with
//! `GRANARY_REQUIRE_FAULTS=1` (set by scripts/test.sh) they fail instead.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// Whether the faults can be injected here; `None` with the reason when not.
fn unavailable(tools: &[&str]) -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("not root".into());
    }
    for t in tools {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return Some(format!("{t} is not installed"));
        }
    }
    None
}

/// Returns true (and says so) if the test cannot run here; panics instead when required.
fn skip(tools: &[&str]) -> bool {
    let Some(why) = unavailable(tools) else {
        return false;
    };
    if std::env::var_os("GRANARY_REQUIRE_FAULTS").is_some_and(|v| v == "1") {
        panic!("GRANARY_REQUIRE_FAULTS=1 but faults cannot be injected here: {why}");
    }
    eprintln!("skipped: {why}");
    true
}

/// A small ext4 file system in an image file, loop-mounted for the test's lifetime.
struct SmallDisk {
    _dir: tempfile::TempDir,
    mnt: PathBuf,
}

impl SmallDisk {
    fn new(mib: u64) -> SmallDisk {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk.img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        std::fs::File::create(&img)
            .unwrap()
            .set_len(mib << 20)
            .unwrap();
        let ok = |c: &mut Command| {
            let o = c.output().unwrap();
            assert!(o.status.success(), "{c:?}: {}", stderr(&o));
        };
        ok(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0"])
            .arg(&img));
        ok(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&img)
            .arg(&mnt));
        SmallDisk { _dir: dir, mnt }
    }

    /// Fills the file system up to `leave` free bytes with a ballast file; returns its path.
    fn fill(&self, leave: u64) -> PathBuf {
        let free = rustix::fs::statvfs(&self.mnt).unwrap();
        let avail = free.f_bavail * free.f_frsize;
        let ballast = self.mnt.join("ballast");
        let f = std::fs::File::create(&ballast).unwrap();
        // Written, not sparse: the blocks must really be taken.
        let mut left = avail.saturating_sub(leave);
        let block = vec![0x5au8; 1 << 20];
        use std::io::Write;
        let mut w = std::io::BufWriter::new(f);
        while left > 0 {
            let n = left.min(block.len() as u64) as usize;
            w.write_all(&block[..n]).unwrap();
            left -= n as u64;
        }
        w.into_inner().unwrap().sync_all().unwrap();
        ballast
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let o = Command::new("umount").arg(&self.mnt).output();
        if !o.is_ok_and(|o| o.status.success()) {
            // Something still has it open: detach it now, it goes when they close.
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

fn json(o: &std::process::Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", stderr(o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn a_full_disk_fails_the_pack_cleanly_and_resume_finishes_once_space_is_freed() {
    if skip(&["mkfs.ext4", "mount", "umount"]) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    // 6 MiB of incompressible files, on the normal disk.
    let files = numbered_tree(48, 4, |_| 128 << 10);
    write_tree(&src, &files);
    let disk = SmallDisk::new(32);
    let ballast = disk.fill(3 << 20);
    let ds = disk.mnt.join("ds");
    let args = ["--chunk-size", "512KiB", "--compress", "none"];
    let o = pack(&src, &ds, &args);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("No space left on device"), "{err}");
    assert!(err.contains("--resume"), "{err}");
    assert!(!ds.exists(), "a failed pack published a dataset");
    // Space freed: the resumed pack keeps what was written and finishes.
    std::fs::remove_file(ballast).unwrap();
    let s = json(&pack(
        &src,
        &ds,
        &[&args[..], &["--resume", "--json"]].concat(),
    ));
    assert!(s["chunks_resumed"].as_u64().unwrap() > 0, "{s}");
    run_ok(["verify", ds.to_str().unwrap()]);
    let out = tmp.path().join("out");
    assert_eq!(extracted(&ds, &out), sorted(files));
}

#[test]
fn a_full_tier_disk_stops_admitting_and_keeps_serving() {
    if skip(&["mkfs.ext4", "mount", "umount"]) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let ds = tmp.path().join("ds");
    // 12 MiB of chunks; the tier's file system has room for two of them, though its quota
    // says 1 GiB. Admission is best effort (a busy tier drops offers), so it takes a few
    // epochs to reach the full disk.
    packed_tree(
        &src,
        &numbered_tree(96, 4, |_| 128 << 10),
        &ds,
        &["--chunk-size", "1MiB", "--compress", "none"],
    );
    let reference = json(&run(["read", ds.to_str().unwrap(), "--json"]));
    let disk = SmallDisk::new(32);
    disk.fill(5 << 19);
    let cache = disk.mnt.join("tier");
    let read = || {
        run([
            "read",
            ds.to_str().unwrap(),
            "--json",
            "--epochs",
            "6",
            "--cache-dir",
            cache.to_str().unwrap(),
            "--cache-size",
            "1GiB",
            "--policy",
            "lru",
        ])
    };
    let o = read();
    let err = stderr(&o);
    let epochs = json(&o);
    assert!(err.contains("could not store"), "{err}");
    assert!(err.contains("No space left on device"), "{err}");
    for e in epochs.as_array().unwrap() {
        // Every epoch complete and byte-identical to a read without the tier.
        assert_eq!(e["samples"], reference[0]["samples"], "{e}");
        assert_eq!(e["digest"], reference[0]["digest"], "{e}");
    }
    let failed: u64 = epochs
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["cache_admissions_failed"].as_u64().unwrap())
        .sum();
    assert!(failed >= 1, "{epochs}");
    // What the tier stored before the disk filled is served.
    let hit = epochs[5]["cache_byte_hit_ratio"].as_f64().unwrap();
    assert!(hit > 0.05, "{epochs}");
    // No temporary file is left behind, and the tier's own accounting agrees with its files.
    let tier_dir = std::fs::read_dir(&cache)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let names: Vec<String> = std::fs::read_dir(&tier_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n.contains(".tmp")), "{names:?}");
    let on_disk: u64 = names
        .iter()
        .filter(|n| n.ends_with(".gchunk"))
        .map(|n| std::fs::metadata(tier_dir.join(n)).unwrap().len())
        .sum();
    let stats = json(&run(["cache", "stats", cache.to_str().unwrap(), "--json"]));
    assert_eq!(
        stats[0]["bytes"].as_u64(),
        Some(on_disk),
        "{stats} vs {names:?}"
    );
}

/// Runs granary as user and group `nobody` (65534), from a copy of the binary they can run.
fn granary_as_nobody(bin_dir: &Path) -> Command {
    let bin = bin_dir.join("granary");
    if !bin.exists() {
        std::fs::copy(env!("CARGO_BIN_EXE_granary"), &bin).unwrap();
    }
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
    ])
    .arg(bin);
    c
}

#[test]
fn unreadable_files_for_an_unprivileged_user_are_named_or_skipped() {
    if skip(&["setpriv"]) {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let src = root.join("src");
    let files = numbered_tree(12, 3, |i| 100 + i as usize);
    write_tree(&src, &files);
    let open_all = |p: &Path| {
        for e in walkdir::WalkDir::new(p) {
            let e = e.unwrap();
            let mode = if e.file_type().is_dir() { 0o755 } else { 0o644 };
            std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        }
    };
    open_all(&src);
    // One file nobody may read, one directory nobody may list.
    std::fs::set_permissions(src.join("c0/f003"), std::fs::Permissions::from_mode(0o000)).unwrap();
    std::fs::set_permissions(src.join("c2"), std::fs::Permissions::from_mode(0o000)).unwrap();
    let out = root.join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).unwrap();

    let o = granary_as_nobody(root)
        .arg("pack")
        .arg(&src)
        .arg("-o")
        .arg(out.join("ds"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("Permission denied"), "{err}");
    assert!(err.contains("c2") || err.contains("c0/f003"), "{err}");
    assert!(!out.join("ds").exists());

    let o = granary_as_nobody(root)
        .arg("pack")
        .arg(&src)
        .arg("-o")
        .arg(out.join("ds2"))
        .args(["--skip-unreadable", "--json"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("c0/f003") && err.contains("c2"), "{err}");
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // Every file but the unreadable one and the unlisted directory's four.
    assert_eq!(s["files"], 12 - 1 - 4, "{s}");
    run_ok(["verify", out.join("ds2").to_str().unwrap()]);
    let got = extracted(&out.join("ds2"), &root.join("x"));
    let want: Vec<_> = files
        .into_iter()
        .filter(|(p, _)| p != b"c0/f003" && !p.starts_with(b"c2/"))
        .collect();
    assert_eq!(got, sorted(want));
    open_all(&src);
}
