//! Datasets in an S3 object store, against a real server: `scripts/s3-server.sh` starts
//! SeaweedFS on 127.0.0.1 and writes the AWS_* variables these tests read (`scripts/test.sh`
//! does both). Without a server (GRANARY_TEST_S3 unset) each test prints why it is skipped,
//! unless GRANARY_REQUIRE_S3=1 (the CI), where that is a failure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;
use granary_store::object::ObjectUrl;

/// A fresh prefix in the test bucket plus private cache and staging directories, or `None`
/// (with the reason printed) when no server is configured.
struct S3 {
    url: String,
    home: tempfile::TempDir,
}

impl S3 {
    fn new(test: &str) -> Option<S3> {
        if std::env::var_os("GRANARY_TEST_S3").is_none() {
            if std::env::var("GRANARY_REQUIRE_S3").is_ok_and(|v| v == "1") {
                panic!("GRANARY_REQUIRE_S3=1 but no S3 server: source the env file of scripts/s3-server.sh");
            }
            eprintln!("skipping {test}: no S3 server (run scripts/s3-server.sh start DIR and source DIR/env)");
            return None;
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        Some(S3 {
            url: format!("s3://granary/tests/{test}-{}-{nanos}", std::process::id()),
            home: tempfile::tempdir().unwrap(),
        })
    }

    fn sub(&self, name: &str) -> String {
        format!("{}/{name}", self.url)
    }

    /// `granary` with this test's own snapshot cache and staging directories.
    fn cmd(&self) -> Command {
        let mut c = granary();
        c.env("XDG_CACHE_HOME", self.home.path().join("cache"));
        c.env_remove("GRANARY_SNAPSHOT_CACHE");
        c
    }

    /// `granary pack SRC -o URL --chunk-size 20KiB EXTRA...`, which must succeed.
    fn pack(&self, src: &Path, url: &str, extra: &[&str]) -> std::process::Output {
        let mut args = vec![
            "pack",
            src.to_str().unwrap(),
            "-o",
            url,
            "--chunk-size",
            "20KiB",
        ];
        args.extend_from_slice(extra);
        self.ok(&args)
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        self.cmd().args(args).output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> std::process::Output {
        let o = self.run(args);
        assert!(o.status.success(), "granary {args:?}: {}", stderr(&o));
        o
    }

    fn snapshots(&self) -> Vec<PathBuf> {
        let dir = self.home.path().join("cache/granary/snapshots");
        std::fs::read_dir(dir)
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    }

    fn staging(&self, url: &str) -> PathBuf {
        let name: String = url
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-._".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        self.home.path().join("cache/granary/uploads").join(name)
    }
}

fn digest_of(out: &str, after: &str) -> String {
    let at = out
        .find(after)
        .unwrap_or_else(|| panic!("no {after:?} in {out}"))
        + after.len();
    out[at..]
        .split_whitespace()
        .next()
        .unwrap()
        .trim_end_matches(',')
        .to_string()
}

/// Relative path and contents of each file of a test tree.
type Files = Vec<(Vec<u8>, Vec<u8>)>;

/// Replaces object `name` with `bytes` (through the local file `via`).
fn put_object(store: &ObjectUrl, name: &str, bytes: &[u8], via: &Path) {
    std::fs::write(via, bytes).unwrap();
    store.put_file(name, via, &|_| {}).unwrap();
}

fn src_tree(tmp: &Path) -> (PathBuf, Files) {
    let src = tmp.join("src");
    let files = edge_tree();
    write_tree(&src, &files);
    (src, files)
}

#[test]
fn pack_read_verify_cat_extract_round_trip() {
    let Some(s3) = S3::new("round-trip") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (src, files) = src_tree(tmp.path());
    let url = s3.sub("ds");
    let o = s3.pack(&src, &url, &["--json"]);
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["files"], files.len() as u64);
    assert!(summary["chunks"].as_u64().unwrap() > 5);
    assert!(!s3.staging(&url).exists(), "staging directory left behind");

    let v = stdout(&s3.ok(&["verify", &url]));
    assert!(v.contains(": OK"), "{v}");
    let want = digest_of(&v, "digest of a complete epoch: ");
    for extra in [&[][..], &["--shuffle", "chunkwise", "--workers", "2"][..]] {
        let mut args = vec!["read", url.as_str()];
        args.extend_from_slice(extra);
        let r = stdout(&s3.ok(&args));
        assert_eq!(digest_of(&r, "digest "), want, "read {extra:?}: {r}");
    }
    // The local tier in front of the store: epoch 2 comes from the tier, same digest.
    let tier = tmp.path().join("tier");
    let r = stdout(&s3.ok(&[
        "read",
        &url,
        "--epochs",
        "2",
        "--cache-dir",
        tier.to_str().unwrap(),
        "--cache-size",
        "10MiB",
    ]));
    assert_eq!(r.matches(&want).count(), 2, "{r}");

    let ls = stdout(&s3.ok(&["ls", &url]));
    assert_eq!(ls.lines().count(), files.len());
    let cat = s3.ok(&["cat", &url, "c01/large.bin"]);
    assert_eq!(cat.stdout, bytes(99, 300_000));
    let out = tmp.path().join("restored");
    s3.ok(&["extract", &url, "-o", out.to_str().unwrap()]);
    assert_eq!(read_tree(&out), sorted(files));

    // Every open after the first reuses the fetched snapshot.
    assert_eq!(s3.snapshots().len(), 1, "{:?}", s3.snapshots());

    // The same objects through plain HTTP (read-only URLs).
    if let Ok(http) = std::env::var("GRANARY_TEST_HTTP") {
        let path = url.strip_prefix("s3://granary").unwrap();
        let h = format!("{http}{path}");
        let r = stdout(&s3.ok(&["read", &h]));
        assert_eq!(digest_of(&r, "digest "), want, "read {h}: {r}");
        let o = s3.run(&["pack", src.to_str().unwrap(), "-o", &h]);
        assert!(stderr(&o).contains("read-only"), "{}", stderr(&o));
    }
}

#[test]
fn interrupted_upload_resumes() {
    let Some(s3) = S3::new("resume") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let files = numbered_tree(600, 6, |i| 20_000 + (i as usize * 7919) % 30_000);
    write_tree(&src, &files);
    let url = s3.sub("ds");
    let args = [
        "pack",
        src.to_str().unwrap(),
        "-o",
        &url,
        "--chunk-size",
        "96KiB",
        "--io-threads",
        "1",
    ];
    let staging = s3.staging(&url);
    let mut child = s3.cmd().args(args).spawn().unwrap();
    let t0 = Instant::now();
    let sent = |d: &Path| {
        std::fs::read_dir(d)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".sent"))
                    .count()
            })
            .unwrap_or(0)
    };
    while sent(&staging) < 5 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the pack finished before it could be killed"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no chunk uploaded in 60 s"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap(); // SIGKILL: nothing gets to clean up
    child.wait().unwrap();

    // Not a dataset yet, and the error says what to do.
    let o = s3.run(&["info", &url]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--resume"), "{}", stderr(&o));
    let o = s3.run(&args);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("interrupted upload"), "{}", stderr(&o));

    let mut resume = args.to_vec();
    resume.extend(["--resume", "--json"]);
    let o = s3.ok(&resume);
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        summary["chunks_resumed"].as_u64().unwrap() >= 5,
        "{summary}"
    );
    assert_eq!(summary["files"], files.len() as u64);
    assert!(stdout(&s3.ok(&["verify", &url])).contains(": OK"));
    let out = tmp.path().join("restored");
    s3.ok(&["extract", &url, "-o", out.to_str().unwrap()]);
    assert_eq!(read_tree(&out), sorted(files));
}

#[test]
fn deleted_corrupted_and_truncated_chunk_objects_are_errors() {
    let Some(s3) = S3::new("damage") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (src, _) = src_tree(tmp.path());
    let url = s3.sub("ds");
    s3.pack(&src, &url, &["--compress", "none"]);
    let store = ObjectUrl::parse(&url).unwrap();
    let local = tmp.path().join("chunk");

    // Corrupt a byte inside chunk 1's first record.
    let name = "chunk-00000001.gchunk";
    let mut b = store.get(name).unwrap().to_vec();
    let good = b.clone();
    b[64 + 3] ^= 0x55;
    put_object(&store, name, &b, &local);
    let v = s3.run(&["verify", &url]);
    assert!(!v.status.success());
    assert!(
        stdout(&v).contains(name) || stderr(&v).contains(name),
        "{}{}",
        stdout(&v),
        stderr(&v)
    );
    let r = s3.run(&["read", &url]);
    assert!(
        !r.status.success(),
        "a damaged record must fail the epoch: {}",
        stdout(&r)
    );
    assert!(stderr(&r).contains(name), "{}", stderr(&r));

    // Truncated: the object is shorter than the snapshot says.
    put_object(&store, name, &good[..good.len() - 100], &local);
    let r = s3.run(&["read", &url]);
    assert!(!r.status.success());
    assert!(stderr(&r).contains(name), "{}", stderr(&r));

    // Deleted.
    store.delete(name).unwrap();
    let r = s3.run(&["read", &url]);
    assert!(!r.status.success());
    let e = stderr(&r);
    assert!(e.contains(name) && e.contains("not found"), "{e}");
    let c = s3.run(&["cat", &url, "c01/large.bin"]);
    // Any sample outside chunk 1 still reads; one inside it fails naming it.
    if !c.status.success() {
        assert!(stderr(&c).contains(name), "{}", stderr(&c));
    }

    // Restored: reads again.
    put_object(&store, name, &good, &local);
    assert!(stdout(&s3.ok(&["verify", &url])).contains(": OK"));

    // An object the pack did not write is reported, not taken for part of the dataset.
    store.put_file("stray.txt", &local, &|_| {}).unwrap();
    let v = s3.ok(&["verify", &url]);
    let all = format!("{}{}", stdout(&v), stderr(&v));
    assert!(
        all.contains("stray.txt is not part of the dataset"),
        "{all}"
    );
}

#[test]
fn credentials_buckets_and_foreign_snapshots() {
    let Some(s3) = S3::new("errors") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (src, _) = src_tree(tmp.path());
    let (a, b) = (s3.sub("a"), s3.sub("b"));
    s3.pack(&src, &a, &[]);
    s3.pack(&src, &b, &[]);

    let e = |o: std::process::Output| {
        assert!(!o.status.success());
        stderr(&o)
    };
    let wrong = e(s3
        .cmd()
        .env("AWS_SECRET_ACCESS_KEY", "wrong")
        .args(["info", &a])
        .output()
        .unwrap());
    assert!(wrong.contains("credentials were rejected"), "{wrong}");
    let missing = e(s3
        .cmd()
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .args(["info", &a])
        .output()
        .unwrap());
    assert!(missing.contains("no S3 credentials"), "{missing}");
    let nobucket = e(s3.run(&["info", "s3://no-such-bucket-granary/x"]));
    assert!(
        nobucket.contains("bucket does not exist") || nobucket.contains("not found"),
        "{nobucket}"
    );
    let noprefix = e(s3.run(&["info", &s3.sub("nothing-here")]));
    assert!(noprefix.contains("not found"), "{noprefix}");
    let scheme = e(s3.run(&["info", "ftp://host/x"]));
    assert!(!scheme.is_empty());

    // Packing over a dataset needs --force.
    let again = e(s3.run(&["pack", src.to_str().unwrap(), "-o", &a]));
    assert!(again.contains("--force"), "{again}");

    // B's snapshot over A's chunks: every chunk is refused as another dataset's.
    s3.ok(&["info", &a]);
    let store_a = ObjectUrl::parse(&a).unwrap();
    let store_b = ObjectUrl::parse(&b).unwrap();
    let snap = tmp.path().join("snap");
    std::fs::write(&snap, store_b.get("snapshot.gsnap").unwrap()).unwrap();
    store_a.put_file("snapshot.gsnap", &snap, &|_| {}).unwrap();
    let foreign = e(s3.run(&["read", &a]));
    assert!(foreign.contains("another dataset"), "{foreign}");
    // The replaced snapshot was fetched anew (a second cached copy, keyed by its id and CRC).
    assert_eq!(s3.snapshots().len(), 2, "{:?}", s3.snapshots());
}

/// `verify` tells damage (exit 1) from not being able to look (exit 4): a missing bucket, a
/// missing prefix and rejected credentials are not damage, and a dataset that can be read
/// but holds a damaged chunk still is.
#[test]
fn verify_tells_damage_from_not_being_able_to_look() {
    let Some(s3) = S3::new("verify-exit") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (src, _) = src_tree(tmp.path());
    let url = s3.sub("ds");
    s3.pack(&src, &url, &[]);
    assert!(stdout(&s3.ok(&["verify", &url])).contains(": OK"));

    let cannot = |o: std::process::Output, what: &str| {
        assert_eq!(
            o.status.code(),
            Some(4),
            "{what}: {}{}",
            stdout(&o),
            stderr(&o)
        );
        assert!(
            stdout(&o).contains("CANNOT CHECK"),
            "{what}: {}",
            stdout(&o)
        );
        assert!(!stdout(&o).contains("DAMAGED"), "{what}: {}", stdout(&o));
    };
    cannot(
        s3.run(&["verify", "s3://no-such-bucket-granary/x"]),
        "no bucket",
    );
    cannot(s3.run(&["verify", &s3.sub("nothing-here")]), "no prefix");
    let wrong_key = |args: &[&str]| {
        s3.cmd()
            .env("AWS_SECRET_ACCESS_KEY", "wrong")
            .args(args)
            .output()
            .unwrap()
    };
    cannot(wrong_key(&["verify", &url]), "wrong credentials");
    let json: serde_json::Value =
        serde_json::from_slice(&wrong_key(&["verify", &url, "--json"]).stdout).unwrap();
    assert_eq!(json["clean"], false);
    assert_eq!(json["problems"].as_array().unwrap().len(), 0, "{json}");
    assert_eq!(json["unreadable"].as_array().unwrap().len(), 1, "{json}");

    // Real damage is still exit 1.
    let store = ObjectUrl::parse(&url).unwrap();
    let name = "chunk-00000001.gchunk";
    let mut b = store.get(name).unwrap().to_vec();
    b[64 + 3] ^= 0x55;
    let local = tmp.path().join("chunk");
    put_object(&store, name, &b, &local);
    let v = s3.run(&["verify", &url]);
    assert_eq!(v.status.code(), Some(1), "{}", stdout(&v));
    assert!(stdout(&v).contains("DAMAGED"), "{}", stdout(&v));
}

#[test]
fn reindex_rebuilds_a_lost_snapshot_in_the_store() {
    let Some(s3) = S3::new("reindex") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (src, _) = src_tree(tmp.path());
    let url = s3.sub("ds");
    // Rebuilt byte for byte from the chunks (which carry modes, mtimes and directories).
    s3.pack(&src, &url, &[]);
    let store = ObjectUrl::parse(&url).unwrap();
    let snap = granary_format::SNAPSHOT_FILE;
    let original = store.get(snap).unwrap().to_vec();
    let local = tmp.path().join("object");

    // An intact snapshot is never replaced without --force.
    let o = s3.run(&["reindex", &url]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("--force"), "{}", stderr(&o));
    s3.ok(&["reindex", &url, "--force"]);
    assert_eq!(store.get(snap).unwrap().to_vec(), original);

    // Lost: rebuilt byte for byte from the chunk objects, and the dataset reads again.
    store.delete(snap).unwrap();
    assert!(!s3.run(&["info", &url]).status.success());
    let o = stdout(&s3.ok(&["reindex", &url]));
    assert!(o.contains(&format!("{url}/{snap}")), "{o}");
    assert_eq!(store.get(snap).unwrap().to_vec(), original);
    assert!(stdout(&s3.ok(&["verify", &url])).contains(": OK"));

    // Damaged: rebuilt too.
    let mut bad = original.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0xFF;
    put_object(&store, snap, &bad, &local);
    s3.ok(&["reindex", &url]);
    assert_eq!(store.get(snap).unwrap().to_vec(), original);

    // A damaged chunk: nothing is written, the error names it.
    store.delete(snap).unwrap();
    let name = "chunk-00000001.gchunk";
    let mut b = store.get(name).unwrap().to_vec();
    b[64 + 3] ^= 0x55;
    put_object(&store, name, &b, &local);
    let o = s3.run(&["reindex", &url]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains(name), "{}", stderr(&o));
    assert!(
        store.size(snap).unwrap().is_none(),
        "a snapshot was written over damage"
    );
}

/// Polls `done` every 5 ms for up to a minute.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "waited a minute for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Sends SIGINT to the pack `child` once `uploading()` (a multipart upload is open); checks
/// that it exits with 130 saying it aborted one upload; returns its stderr.
fn interrupt_once_uploading(child: std::process::Child, uploading: impl FnMut() -> bool) -> String {
    wait_until("a multipart upload to start", uploading);
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(
        err.contains("interrupted (SIGINT): aborted 1 multipart upload"),
        "{err}"
    );
    err
}

#[test]
fn an_interrupted_upload_leaves_no_multipart_upload_open() {
    let Some(s3) = S3::new("multipart") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    // Two chunks of 20 MiB: each a multipart upload (parts of 16 MiB).
    write_tree(
        &src,
        &[
            (b"a/f1".to_vec(), bytes(1, 20 << 20)),
            (b"a/f2".to_vec(), bytes(2, 20 << 20)),
        ],
    );
    let url = s3.sub("ds");
    let store = ObjectUrl::parse(&url).unwrap();
    let open = || store.open_uploads().unwrap().expect("S3 lists its uploads");
    let upstream = std::env::var("AWS_ENDPOINT_URL").unwrap();
    // A slow link (10 MB/s), so that the signal arrives while a part is on its way.
    let relay = Relay::throttled(upstream.trim_start_matches("http://").to_string(), 10 << 20);
    let pack = |extra: &[&str]| {
        let mut c = s3.cmd();
        c.args([
            "pack",
            src.to_str().unwrap(),
            "-o",
            &url,
            "--chunk-size",
            "16MiB",
        ])
        .args(["--compress", "none"])
        .args(extra)
        .env("AWS_ENDPOINT_URL", relay.url())
        .stderr(std::process::Stdio::piped());
        c.spawn().unwrap()
    };

    // SIGINT mid-upload: the upload in progress is aborted before the exit, and it says so.
    let child = pack(&[]);
    let err = interrupt_once_uploading(child, || !open().is_empty());
    assert!(err.contains("--resume"), "{err}");
    assert_eq!(
        open(),
        vec![],
        "an upload is still open after the interrupted pack"
    );

    // SIGKILL leaves one open (nothing can abort it); --resume finds it, aborts it, finishes.
    let mut child = pack(&["--resume"]);
    wait_until("a multipart upload to start", || !open().is_empty());
    child.kill().unwrap();
    child.wait().unwrap();
    let left = open();
    assert_eq!(left.len(), 1, "{left:?}");
    let o = s3.ok(&[
        "pack",
        src.to_str().unwrap(),
        "-o",
        &url,
        "--chunk-size",
        "16MiB",
        "--compress",
        "none",
        "--resume",
    ]);
    let err = stderr(&o);
    assert!(
        err.contains("aborted 1 multipart upload(s) left open") && err.contains(&left[0].name),
        "{err}"
    );
    assert_eq!(open(), vec![]);
    assert!(stdout(&s3.ok(&["verify", &url])).contains(": OK"));
}

#[test]
fn a_signal_while_an_upload_starts_aborts_the_upload_it_opens() {
    let Some(s3) = S3::new("multipart-start") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &[(b"a/f1".to_vec(), bytes(1, 20 << 20))]);
    let url = s3.sub("ds");
    let store = ObjectUrl::parse(&url).unwrap();
    let open = || store.open_uploads().unwrap().expect("S3 lists its uploads");
    let upstream = std::env::var("AWS_ENDPOINT_URL").unwrap();
    // The server opens the upload at once; its id reaches the pack 3 s later, so the signal
    // arrives while the pack cannot yet know which upload to abort.
    let relay = Relay::holding(
        upstream.trim_start_matches("http://").to_string(),
        b"InitiateMultipartUploadResult",
        Duration::from_secs(3),
    );
    let mut c = s3.cmd();
    c.args(["pack", src.to_str().unwrap(), "-o", &url])
        .args(["--chunk-size", "16MiB", "--compress", "none"])
        .env("AWS_ENDPOINT_URL", relay.url())
        .stderr(std::process::Stdio::piped());
    let child = c.spawn().unwrap();
    interrupt_once_uploading(child, || !open().is_empty());
    assert_eq!(open(), vec![], "the upload being started is still open");
}

#[test]
fn webdataset_shards_in_the_store_import_into_the_store() {
    let Some(s3) = S3::new("wds-import") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let shards_url = s3.sub("shards");
    let store = ObjectUrl::parse(&shards_url).unwrap();
    let mut all = Vec::new();
    for s in 0..2u64 {
        let mut members = Vec::new();
        for i in 0..30u64 {
            for (ext, data) in [
                ("jpg", bytes(s * 100 + i, 20_000 + i as usize * 300)),
                ("cls", format!("{}", i % 3).into_bytes()),
            ] {
                members.push((format!("s{s}k{i:03}.{ext}").into_bytes(), data));
            }
        }
        all.extend(members.iter().cloned());
        put_object(
            &store,
            &format!("shard-{s}.tar"),
            &tar_bytes(&members),
            &tmp.path().join("t"),
        );
    }
    let out = s3.sub("ds");
    s3.ok(&[
        "pack",
        "--from",
        "webdataset",
        &format!("{shards_url}/shard-{{0..1}}.tar"),
        "-o",
        &out,
        "--chunk-size",
        "64KiB",
    ]);
    s3.ok(&["verify", &out]);
    let o = s3.ok(&["cat", &out, "s1k007.cls"]);
    assert_eq!(o.stdout, b"1");
    let x = tmp.path().join("x");
    s3.ok(&["extract", &out, "-o", x.to_str().unwrap()]);
    assert_eq!(read_tree(&x), sorted(all));
    // Written again over it, smaller (--force): the prefix keeps no chunk of the earlier
    // dataset that the new one does not name (the writer and pack publish alike).
    s3.ok(&[
        "pack",
        "--from",
        "webdataset",
        &format!("{shards_url}/shard-0.tar"),
        "-o",
        &out,
        "--chunk-size",
        "4MiB",
        "--force",
    ]);
    s3.ok(&["verify", &out]);
    let mut names: Vec<String> = ObjectUrl::parse(&out)
        .unwrap()
        .list()
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["chunk-00000000.gchunk", "snapshot.gsnap"],
        "objects left at {out}"
    );
    // A shard that is not there is named.
    let o = s3.run(&[
        "pack",
        "--from",
        "webdataset",
        &format!("{shards_url}/shard-9.tar"),
        "-o",
        tmp.path().join("no").to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("shard-9.tar"), "{}", stderr(&o));
}

/// Bytes a file takes on disk (a sparse file: only the blocks written).
fn allocated(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).unwrap().blocks() * 512
}

/// Offset and length of section `kind` of the snapshot `snap` (SPEC.md §5.4: the count at 96,
/// then 24-byte entries from 104).
fn section(snap: &[u8], kind: u32) -> (usize, usize) {
    let head = granary_format::SNAPSHOT_HEADER_LEN;
    let n = u32::from_le_bytes(snap[head..head + 4].try_into().unwrap()) as usize;
    (0..n)
        .map(|i| &snap[head + 8 + 24 * i..][..24])
        .find(|e| u32::from_le_bytes(e[0..4].try_into().unwrap()) == kind)
        .map(|e| {
            let at = u64::from_le_bytes(e[8..16].try_into().unwrap()) as usize;
            let len = u64::from_le_bytes(e[16..24].try_into().unwrap()) as usize;
            (at, len)
        })
        .unwrap()
}

#[test]
fn a_large_snapshot_is_read_in_checked_blocks() {
    let Some(s3) = S3::new("paged") else { return };
    let url = s3.sub("ds");
    s3.ok(&[
        "bench",
        "gen",
        &url,
        "--packed",
        "--files",
        "40000",
        "--sizes",
        "100",
        "--chunk-size",
        "512KiB",
    ]);
    let store = ObjectUrl::parse(&url).unwrap();
    let snap = store.get("snapshot.gsnap").unwrap().to_vec();
    // The record table (kind 6): 16 bytes a sample.
    let (samples_at, samples_len) = section(&snap, 6);
    assert_eq!(samples_len, 40000 * 16);
    // The whole snapshot, fetched and checked at once (below the paging threshold).
    let whole = s3.ok(&["verify", &url]);
    let want = digest_of(&stdout(&whole), "digest of a complete epoch: ");
    // Paged, each command in a fresh cache of its own.
    let paged = |args: &[&str]| {
        let home = tempfile::tempdir().unwrap();
        let o = s3
            .cmd()
            .env("XDG_CACHE_HOME", home.path())
            .env("GRANARY_SNAPSHOT_WHOLE_MAX", "0")
            .args(args)
            .output()
            .unwrap();
        let blocks: Vec<PathBuf> = std::fs::read_dir(home.path().join("granary/snapshots"))
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        (o, blocks, home)
    };
    // `cat` by path: a few blocks, far less than the snapshot (the section table's, the chunk
    // table's, the page index's, the page's, the id table's that must lead back to the entry,
    // the record's: 6 of 21 here).
    let (o, files, _home) = paged(&["cat", &url, "class_0007/00000107.JPEG"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(o.stdout.len(), 100);
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].extension().unwrap() == "gblocks", "{files:?}");
    let used = allocated(&files[0]);
    assert!(
        used * 3 < snap.len() as u64,
        "cat fetched {used} bytes of a {}-byte snapshot",
        snap.len()
    );
    // `ls` of a prefix, plain and --long: the same lines as from the whole snapshot, from a
    // part of it.
    for long in [false, true] {
        let mut args = vec!["ls", &url[..], "class_0007/0000"];
        if long {
            args.push("--long");
        }
        let want = stdout(&s3.ok(&args));
        assert!(want.lines().count() >= 2, "{want}");
        let (o, files, _home) = paged(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(stdout(&o), want);
        assert!(allocated(&files[0]) < snap.len() as u64);
    }
    // A chunk-wise epoch: the same digest, at most one snapshot GET per chunk.
    let (o, files, home) = paged(&["read", &url, "--shuffle", "chunkwise", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r[0]["digest"], want.as_str());
    let info = stdout(&s3.ok(&["info", &url, "--json"]));
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    let n_chunks = info["chunks"].as_u64().unwrap();
    assert!(n_chunks >= 5, "{n_chunks} chunks");
    let gets = r[0]["snapshot_gets"].as_u64().unwrap();
    assert!(
        gets >= 1 && gets <= n_chunks,
        "{gets} GETs for {n_chunks} chunks"
    );
    let fetched = r[0]["snapshot_bytes_fetched"].as_u64().unwrap();
    assert!(fetched <= samples_len as u64 + 2 * 65536, "{fetched}");
    assert!(allocated(&files[0]) < snap.len() as u64);
    // Another process on the node finds the blocks there: no GET.
    let reread = || {
        s3.cmd()
            .env("XDG_CACHE_HOME", home.path())
            .env("GRANARY_SNAPSHOT_WHOLE_MAX", "0")
            .args(["read", &url, "--shuffle", "chunkwise", "--json"])
            .output()
            .unwrap()
    };
    let o = reread();
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r[0]["digest"], want.as_str());
    assert_eq!(r[0]["snapshot_gets"], 0);

    // `bench remote` measures the same from cold caches of its own.
    let o = s3
        .cmd()
        .env("GRANARY_SNAPSHOT_WHOLE_MAX", "0")
        .args([
            "bench",
            "remote",
            &url,
            "--lookups",
            "3",
            "--world-size",
            "4",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let b: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(b["paged"], true);
    assert!(
        b["open"]["snapshot_bytes"].as_u64().unwrap() * 4 < snap.len() as u64,
        "{b}"
    );
    assert!(
        b["lookup"]["snapshot_gets_max"].as_f64().unwrap() <= 6.0,
        "{b}"
    );
    // A directory is found in the page index and a page or two, listed from consecutive
    // pages.
    assert!(
        b["dir"]["snapshot_gets_median"].as_f64().unwrap() <= 3.0,
        "{b}"
    );
    assert!(b["listed_paths"].as_u64().unwrap() > 0, "{b}");
    assert_eq!(b["epoch"]["samples"], 10000);
    assert!(
        b["epoch"]["snapshot_gets"].as_u64().unwrap() <= n_chunks,
        "{b}"
    );

    // A damaged byte in the record table: its block's CRC fails, naming the snapshot.
    let tmp = tempfile::tempdir().unwrap();
    let mut bad = snap.clone();
    bad[samples_at + samples_len / 2] ^= 0x40;
    put_object(&store, "snapshot.gsnap", &bad, &tmp.path().join("snap"));
    let (o, _, _h) = paged(&["read", &url, "--shuffle", "chunkwise"]);
    assert!(!o.status.success(), "a damaged block must fail the epoch");
    let e = stderr(&o);
    assert!(
        e.contains("snapshot.gsnap") && e.contains("checksum mismatch") && e.contains("block"),
        "{e}"
    );
    // A block damaged in the local cache is fetched again, not trusted.
    put_object(&store, "snapshot.gsnap", &snap, &tmp.path().join("snap"));
    let blocks = std::fs::read_dir(home.path().join("granary/snapshots"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "gblocks"))
        .unwrap();
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&blocks)
            .unwrap();
        f.write_all_at(&[0xEE; 64], (samples_at + 4096) as u64)
            .unwrap();
    }
    let o = reread();
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r[0]["digest"], want.as_str());
    let mut back = vec![0u8; 64];
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::open(&blocks).unwrap();
        f.read_exact_at(&mut back, (samples_at + 4096) as u64)
            .unwrap();
    }
    let at = samples_at + 4096;
    assert_eq!(
        back,
        snap[at..at + 64],
        "the damaged block is fetched again"
    );
}

/// A view of a dataset in the object store names it by URL and reads from the store: the
/// view's samples only, and `plan`'s prediction of the bytes is what the read fetches.
#[test]
fn a_view_of_a_dataset_in_the_store() {
    let Some(s3) = S3::new("view") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (src, files) = src_tree(tmp.path());
    let url = s3.sub("ds");
    s3.pack(&src, &url, &[]);
    let keep: Vec<&[u8]> = files.iter().map(|f| &f.0[..]).step_by(3).collect();
    let list = tmp.path().join("paths.txt");
    let text: Vec<u8> = keep.iter().flat_map(|p| [*p, b"\n"].concat()).collect();
    std::fs::write(&list, text).unwrap();
    let v = tmp.path().join("v.gview");
    let o = s3.ok(&[
        "view",
        &url,
        "-o",
        v.to_str().unwrap(),
        "--paths-from",
        list.to_str().unwrap(),
        "--json",
    ]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["dataset"], url.as_str());
    assert_eq!(j["selected"], keep.len() as u64);
    let r = s3.ok(&["read", v.to_str().unwrap(), "--json"]);
    let r: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!(r[0]["samples"], keep.len() as u64);
    let p = s3.ok(&["plan", v.to_str().unwrap(), "--json"]);
    let p: serde_json::Value = serde_json::from_slice(&p.stdout).unwrap();
    assert_eq!(p["view_reads"]["read"], r[0]["bytes_read"], "{p}");
    let ls = stdout(&s3.ok(&["ls", v.to_str().unwrap()]));
    let mut want: Vec<String> = keep.iter().map(|p| granary::escape_path(p)).collect();
    want.sort();
    assert_eq!(ls.lines().map(str::to_string).collect::<Vec<_>>(), want);
}

/// Where a reader waits: behind a slow link (512 KiB/s a connection) to the store, the consumer's waits land
/// on origin; the next epoch, served by the local tier, hardly waits on origin at all. The
/// parts always add up to the wait.
#[test]
fn waits_land_on_the_layer_that_is_slow() {
    let Some(s3) = S3::new("waits") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let files = numbered_tree(120, 3, |i| 20_000 + (i as usize % 7) * 1000);
    write_tree(&src, &files);
    let url = s3.sub("ds");
    s3.ok(&[
        "pack",
        src.to_str().unwrap(),
        "-o",
        &url,
        "--chunk-size",
        "256KiB",
    ]);
    let upstream = std::env::var("AWS_ENDPOINT_URL").unwrap();
    let relay = Relay::throttled(
        upstream.trim_start_matches("http://").to_string(),
        512 << 10,
    );
    let tier = tmp.path().join("tier");
    let o = s3
        .cmd()
        .args([
            "read",
            &url,
            "--json",
            "--epochs",
            "2",
            "--cache-size",
            "1GiB",
        ])
        .arg("--cache-dir")
        .arg(&tier)
        .env("AWS_ENDPOINT_URL", relay.url())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let w = |e: usize, k: &str| r[e]["waits"][k].as_f64().unwrap();
    for e in 0..2 {
        let parts: f64 = [
            "tier_s", "peers_s", "origin_s", "check_s", "plan_s", "other_s",
        ]
        .iter()
        .map(|k| w(e, k))
        .sum();
        assert!(
            (parts - w(e, "waited_s")).abs() <= 1e-6 + w(e, "waited_s") * 1e-6,
            "{r}"
        );
    }
    // 2.8 MB over 8 connections at 512 KiB/s each: most of the first epoch is waiting, on
    // origin.
    assert!(w(0, "waited_s") > 0.3, "{r}");
    assert!(w(0, "origin_s") > 0.8 * w(0, "waited_s"), "{r}");
    // The second epoch reads the tier.
    assert!(w(1, "origin_s") < 0.1 * w(0, "origin_s"), "{r}");
    let origin = layer(&r[1]["layers"], "origin");
    assert_eq!(origin["served_bytes"], 0, "{r}");
}

/// The bill of an epoch read from the object store: `plan --prices` predicts the GETs and bytes
/// (and their cost) that `read --prices` then measures at origin.
#[test]
fn the_bill_of_an_epoch_from_the_store() {
    let Some(s3) = S3::new("bill") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(
        &src,
        &numbered_tree(300, 3, |i| 2_000 + (i as usize % 11) * 500),
    );
    let url = s3.sub("ds");
    s3.pack(&src, &url, &[]);
    let plan = s3.ok(&["plan", &url, "--json", "--prices", "0.0004,0.09"]);
    let plan: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
    let read = s3.ok(&["read", &url, "--json", "--prices", "0.0004,0.09"]);
    let read: serde_json::Value = serde_json::from_slice(&read.stdout).unwrap();
    let predicted = &plan["total"][0];
    let measured = &read[0]["bill"]["measured"][0];
    assert_eq!(predicted["layer"], "origin");
    assert!(predicted["gets"].as_u64().unwrap() > 10, "{plan}");
    for k in ["requests", "gets", "bytes", "cost"] {
        assert_eq!(predicted[k], measured[k], "{k}: {plan} vs {read}");
    }
    assert_eq!(measured["bytes"], read[0]["bytes_read"], "{read}");
}

#[test]
fn delete_and_compact_in_the_store_leave_no_deleted_byte_or_stale_snapshot() {
    let Some(s3) = S3::new("delete-compact") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let files: Files = (0..90u64)
        .map(|i| {
            let mut b = bytes(i, 900);
            if i % 9 == 0 {
                b.extend_from_slice(format!("MARKER-{i:03}-S3").as_bytes());
            }
            (format!("c{}/f{i:03}.bin", i % 2).into_bytes(), b)
        })
        .collect();
    write_tree(&src, &files);
    let url = s3.sub("ds");
    s3.pack(&src, &url, &["--compress", "none"]);
    let json = |args: &[&str]| -> serde_json::Value {
        serde_json::from_slice(&s3.ok(args).stdout).unwrap()
    };
    let before = json(&["verify", &url, "--json"]);
    assert_eq!(s3.snapshots().len(), 1);
    let list = tmp.path().join("gone.txt");
    let gone: String = (0..90)
        .filter(|i| i % 9 == 0)
        .map(|i| format!("c{}/f{i:03}.bin\n", i % 2))
        .collect();
    std::fs::write(&list, gone).unwrap();
    let receipt = tmp.path().join("r.json");
    let d = json(&[
        "delete",
        &url,
        "--paths-from",
        list.to_str().unwrap(),
        "--receipt",
        receipt.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(
        (d["deleted"].as_u64(), d["generation"].as_u64()),
        (Some(10), Some(1)),
        "{d}"
    );
    // A reader of the new generation: 80 samples; the node's cache holds its snapshot only.
    let r = json(&["read", &url, "--json"]);
    assert_eq!(r[0]["samples"].as_u64(), Some(80), "{r}");
    let cached = s3.snapshots();
    assert_eq!(cached.len(), 1, "{cached:?}");
    let c = json(&["compact", &url, "--all", "--grace", "0", "--json"]);
    assert_eq!(c["records_removed"].as_u64(), Some(10), "{c}");
    assert!(!c["files_removed"].as_array().unwrap().is_empty(), "{c}");
    let v = json(&["verify", &url, "--json"]);
    assert_eq!(v["samples"].as_u64(), Some(80));
    assert_ne!(v["digest"], before["digest"]);
    let r2 = json(&["read", &url, "--json"]);
    assert_eq!(
        r2[0]["digest"], r[0]["digest"],
        "compaction changed what an epoch delivers"
    );
    // No object of the prefix holds a marker; no replaced chunk object is left.
    let store = ObjectUrl::open(&url, &granary_store::StoreConfig::default()).unwrap();
    for (name, _) in store.list().unwrap() {
        let b = store.get(&name).unwrap();
        for i in (0..90).step_by(9) {
            let m = format!("MARKER-{i:03}-S3");
            assert!(
                !b.windows(m.len()).any(|w| w == m.as_bytes()),
                "{m} in {name}"
            );
        }
        if let Some((id, rev)) = granary_format::parse_chunk_file_name_at(&name) {
            let snap =
                granary_format::Snapshot::open(store.get("snapshot.gsnap").unwrap().to_vec())
                    .unwrap();
            assert_eq!(
                rev,
                snap.revision(id),
                "{name} is not the revision the snapshot names"
            );
        }
    }
}
