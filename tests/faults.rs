//! Real faults, not simulated ones: a full file system (a small ext4 image, loop-mounted) under
//! a pack and under the local tier; files that an unprivileged user cannot read; and a network
//! file system (JuiceFS over FUSE) failing under a reader: objects damaged, truncated or deleted
//! in its object store, and its client killed mid-epoch. These need root (mount, setpriv, FUSE)
//! and JuiceFS; elsewhere they say why they did not run, and with `GRANARY_REQUIRE_FAULTS=1`
//! (set by scripts/test.sh, which also installs JuiceFS) they fail instead.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

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

/// A JuiceFS file system on this machine: metadata in SQLite, data in a local-directory object
/// store (`bucket`), mounted through FUSE by a client this test started and can kill. The client
/// keeps no block cache and retries a failed object read once, so an error reaches the reader
/// in about a second rather than after JuiceFS's default ten retries.
struct JuiceFs {
    dir: tempfile::TempDir,
    mnt: PathBuf,
    client: Option<std::process::Child>,
}

impl JuiceFs {
    const NAME: &str = "granary-faults";

    fn new() -> JuiceFs {
        let dir = tempfile::tempdir().unwrap();
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let meta = format!("sqlite3://{}", dir.path().join("meta.db").display());
        let o = Command::new("juicefs")
            .args(["format", "--storage", "file", "--bucket"])
            .arg(format!("{}/", dir.path().join("bucket").display()))
            .args([&meta, Self::NAME])
            .output()
            .unwrap();
        assert!(o.status.success(), "juicefs format: {}", stderr(&o));
        let log = std::fs::File::create(dir.path().join("client.log")).unwrap();
        let client = Command::new("juicefs")
            .args(["mount", "--cache-size", "0", "--io-retries", "1"])
            .args(["--no-usage-report", "--metrics", "127.0.0.1:0", &meta])
            .arg(&mnt)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut fs = JuiceFs {
            dir,
            mnt,
            client: Some(client),
        };
        let start = std::time::Instant::now();
        while !fs.mounted() {
            let exited = fs.client.as_mut().unwrap().try_wait().unwrap();
            if exited.is_some() || start.elapsed() > std::time::Duration::from_secs(30) {
                panic!("juicefs mount did not come up: {}", fs.log());
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        fs
    }

    fn mounted(&self) -> bool {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mnt = self.mnt.to_str().unwrap();
        mounts.lines().any(|l| l.split(' ').nth(4) == Some(mnt))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("client.log")).unwrap_or_default()
    }

    /// The object-store files holding `file`'s data (`juicefs info` lists them).
    fn objects(&self, file: &Path) -> Vec<PathBuf> {
        let o = Command::new("juicefs")
            .arg("info")
            .arg(file)
            .output()
            .unwrap();
        assert!(o.status.success(), "juicefs info: {}", stderr(&o));
        let bucket = self.dir.path().join("bucket");
        let text = format!("{}{}", stdout(&o), stderr(&o));
        let objects: Vec<PathBuf> = text
            .split(|c: char| c == '|' || c.is_whitespace())
            .filter(|w| w.starts_with(&format!("{}/chunks/", Self::NAME)))
            .map(|w| bucket.join(w))
            .collect();
        assert!(!objects.is_empty(), "no objects for {file:?}: {text}");
        objects
    }

    /// SIGKILLs the client: the process this test started and the FUSE server it forked (its
    /// supervisor would otherwise start a new one). The mount stays, with nobody serving it.
    fn kill(&mut self) {
        let Some(mut client) = self.client.take() else {
            return;
        };
        let pid = client.id();
        let children: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|tasks| {
                tasks
                    .flatten()
                    .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
                    .flat_map(|s| {
                        s.split_whitespace()
                            .filter_map(|p| p.parse().ok())
                            .collect::<Vec<i32>>()
                    })
                    .collect()
            })
            .unwrap_or_default();
        client.kill().unwrap();
        client.wait().unwrap();
        for c in children {
            if let Some(c) = rustix::process::Pid::from_raw(c) {
                let _ = rustix::process::kill_process(c, rustix::process::Signal::KILL);
            }
        }
    }
}

impl Drop for JuiceFs {
    fn drop(&mut self) {
        self.kill();
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).output();
    }
}

/// Drops the page cache's copy of every file under `dir`, so the next read asks the file system.
fn evict(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let f = std::fs::File::open(e.unwrap().path()).unwrap();
        rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
    }
}

/// Runs granary and waits at most `secs` for it: a run that takes longer is a hang, and fails.
fn run_within(secs: u64, args: &[&str]) -> std::process::Output {
    let mut child = spawn(args);
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > std::time::Duration::from_secs(secs) {
            child.kill().unwrap();
            let o = child.wait_with_output().unwrap();
            panic!("granary {args:?} hung for {secs} s: {}", stderr(&o));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// `files` (~1.2 MiB: [`juicefs_tree`]) packed into 12 raw chunks and copied into the JuiceFS
/// mount; returns the dataset's path there.
fn dataset_on_juicefs(fs: &JuiceFs, tmp: &Path, files: &[(Vec<u8>, Vec<u8>)]) -> PathBuf {
    let local = tmp.join("ds");
    packed_tree(
        &tmp.join("src"),
        files,
        &local,
        &["--chunk-size", "100KiB", "--compress", "none"],
    );
    let ds = fs.mnt.join("ds");
    std::fs::create_dir(&ds).unwrap();
    for e in std::fs::read_dir(&local).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), ds.join(e.file_name())).unwrap();
    }
    ds
}

fn juicefs_tree() -> Vec<(Vec<u8>, Vec<u8>)> {
    numbered_tree(96, 4, |i| 12_000 + 37 * i as usize)
}

#[test]
fn juicefs_objects_damaged_or_deleted_under_the_reader_are_errors_naming_the_chunk() {
    if skip(&["juicefs", "umount"]) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let fs = JuiceFs::new();
    let ds = dataset_on_juicefs(&fs, tmp.path(), &juicefs_tree());
    let d = ds.to_str().unwrap();
    let reference = json(&run([
        "read",
        tmp.path().join("ds").to_str().unwrap(),
        "--json",
    ]));
    evict(&ds);
    assert_eq!(
        json(&run_within(60, &["read", d, "--json"]))[0]["digest"],
        reference[0]["digest"]
    );

    let chunk = ds.join("chunk-00000005.gchunk");
    let objects = fs.objects(&chunk);
    let object = &objects[0];
    let good = std::fs::read(object).unwrap();
    let failed_read = |why: &str| {
        evict(&ds);
        let o = run_within(60, &["read", d, "--json"]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{why}: {err}");
        assert!(err.contains("chunk-00000005.gchunk"), "{why}: {err}");
        // No epoch is reported: a stream that stops is never a short epoch that looks whole.
        assert!(!stdout(&o).contains("digest"), "{why}: {}", stdout(&o));
        err
    };

    // Bytes changed in the object store: JuiceFS serves them; the record CRCs catch them.
    let mut bad = good.clone();
    for b in &mut bad[good.len() / 2..good.len() / 2 + 16] {
        *b ^= 0xa5;
    }
    std::fs::write(object, &bad).unwrap();
    let err = failed_read("damaged object");
    assert!(err.contains("checksum mismatch"), "{err}");
    let o = run_within(60, &["verify", d]);
    assert_ne!(o.status.code(), Some(0), "verify passed a damaged chunk");
    assert!(stdout(&o).contains("chunk-00000005") || stderr(&o).contains("chunk-00000005"));

    // The object cut short, then gone: JuiceFS answers EIO.
    std::fs::write(object, &good[..good.len() / 3]).unwrap();
    failed_read("truncated object");
    std::fs::remove_file(object).unwrap();
    let err = failed_read("deleted object");
    assert!(err.contains("Input/output error"), "{err}");

    // Repaired: the same dataset reads whole and right again (nothing wrong was kept).
    std::fs::write(object, &good).unwrap();
    evict(&ds);
    assert_eq!(
        json(&run_within(60, &["read", d, "--json"]))[0]["digest"],
        reference[0]["digest"]
    );
}

#[test]
fn juicefs_client_killed_mid_epoch_ends_the_stream_with_an_error_naming_the_chunk() {
    if skip(&["juicefs", "umount"]) {
        return;
    }
    use granary::{Dataset, PlanOptions, Shard, ShuffleMode, StreamOptions};
    let tmp = tempfile::tempdir().unwrap();
    let mut fs = JuiceFs::new();
    let files = juicefs_tree();
    let ds = dataset_on_juicefs(&fs, tmp.path(), &files);
    let by_path: std::collections::HashMap<Vec<u8>, Vec<u8>> = files.into_iter().collect();
    evict(&ds);
    let dataset = std::sync::Arc::new(Dataset::open(&ds).unwrap());
    let plan = PlanOptions {
        mode: ShuffleMode::Chunkwise,
        seed: 7,
        window_chunks: 1,
        ..Default::default()
    };
    // Reads ahead at most a few of the 12 chunks, so most of the epoch is still to be read.
    let io = StreamOptions {
        memory: 256 << 10,
        max_inflight_bytes: 128 << 10,
        ..Default::default()
    };
    let mut stream = dataset
        .stream_epoch(&plan, 0, Shard::WHOLE, None, &io)
        .unwrap();
    let check = |s: &granary::Sample| {
        let path = dataset.path(s.id).unwrap();
        assert_eq!(
            s.data(),
            &by_path[&path[..]][..],
            "sample {} served wrong bytes",
            s.id
        );
    };
    // Part of the first chunk's window, then the client dies.
    let mut delivered = 0;
    for s in stream.by_ref().take(5) {
        check(&s.unwrap());
        delivered += 1;
    }
    fs.kill();
    // The files cannot be opened any more; what the page cache holds of them goes this way.
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    // The rest of the epoch: samples already read are served (and are right); then an error
    // naming a chunk and the dead mount, within a bound (a hang fails the test).
    let (tx, rx) = std::sync::mpsc::channel();
    let rest = std::thread::spawn(move || {
        for s in stream {
            let end = s.is_err();
            tx.send(s).unwrap();
            if end {
                return;
            }
        }
    });
    let err = loop {
        match rx.recv_timeout(std::time::Duration::from_secs(60)) {
            Ok(Ok(s)) => {
                check(&s);
                delivered += 1;
            }
            Ok(Err(e)) => break e.to_string(),
            Err(e) => panic!("the epoch neither ended nor failed with its storage gone: {e}"),
        }
    };
    rest.join().unwrap();
    eprintln!(
        "{delivered} of {} samples delivered, then: {err}",
        by_path.len()
    );
    assert!(delivered < by_path.len(), "a whole epoch from a dead mount");
    assert!(err.contains(".gchunk"), "{err}");
    assert!(err.contains("Transport endpoint is not connected"), "{err}");
    // A new reader gets a clear error too, at once.
    let o = run_within(60, &["read", ds.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("Transport endpoint is not connected"),
        "{}",
        stderr(&o)
    );
}
