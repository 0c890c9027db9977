//! Helpers shared by the end-to-end tests: temp dirs, running the binary, making trees.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn granary() -> Command {
    Command::new(env!("CARGO_BIN_EXE_granary"))
}

/// Runs granary with `args`; returns the output.
pub fn run<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    granary().args(args).output().expect("granary runs")
}

/// Runs granary and asserts exit status `code`.
pub fn run_ok<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let o = run(args);
    assert!(
        o.status.success(),
        "granary failed: {}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Runs `granary pack SRC -o OUT EXTRA...`.
pub fn pack(src: &Path, out: &Path, extra: &[&str]) -> Output {
    let mut args: Vec<&OsStr> = vec![
        "pack".as_ref(),
        src.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ];
    args.extend(extra.iter().map(OsStr::new));
    run(args)
}

/// Runs `granary pack --from webdataset TAR -o OUT EXTRA...`, asserting success.
pub fn import_tar(tar: &Path, out: &Path, extra: &[&str]) -> Output {
    let mut args: Vec<&OsStr> = vec![
        "pack".as_ref(),
        "--from".as_ref(),
        "webdataset".as_ref(),
        tar.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ];
    args.extend(extra.iter().map(OsStr::new));
    run_ok(args)
}

/// Writes `files` under `src`, packs them to `out` with `extra` arguments (asserting success)
/// and returns `out`.
pub fn packed_tree(
    src: &Path,
    files: &[(Vec<u8>, Vec<u8>)],
    out: &Path,
    extra: &[&str],
) -> std::path::PathBuf {
    write_tree(src, files);
    let o = pack(src, out, extra);
    assert!(o.status.success(), "pack failed: {}", stderr(&o));
    out.to_path_buf()
}

/// Runs granary with `args` under a file size limit of `kib` KiB (`ulimit -f`, SIGXFSZ
/// ignored): writes past it fail with EFBIG, as a full disk fails them with ENOSPC.
pub fn run_with_file_size_limit<I, S>(kib: u64, args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    Command::new("sh")
        .arg("-c")
        .arg(format!("trap '' XFSZ; ulimit -f {kib}; exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_granary"))
        .args(args)
        .output()
        .expect("sh runs")
}

/// The settings of [`interrupted_pack`]: pass them again to resume it.
pub const INTERRUPTED_PACK_ARGS: [&str; 6] = [
    "--chunk-size",
    "48KiB",
    "--compress",
    "none",
    "--order",
    "walk",
];

/// Writes a tree of 200 small files and one large one under `dir/src` and packs it to
/// `dir/ds` under a file size limit, so that the pack fails (as on a full disk) after the
/// small files' chunks, at the large file's (sorted last with `--order walk`). Returns the tree.
pub fn interrupted_pack(dir: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let src = dir.join("src");
    let mut files = numbered_tree(200, 4, |_| 3000);
    files.push((b"z/big".to_vec(), bytes(7, 200_000)));
    write_tree(&src, &files);
    let (s, d) = (src.to_str().unwrap(), dir.join("ds"));
    let mut args = vec!["pack", s, "-o", d.to_str().unwrap()];
    args.extend(INTERRUPTED_PACK_ARGS);
    let o = run_with_file_size_limit(256, args);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("writing") && stderr(&o).contains(".gchunk"),
        "{}",
        stderr(&o)
    );
    files
}

/// Starts granary with `args` in the background, stdout and stderr captured.
pub fn spawn<I, S>(args: I) -> std::process::Child
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    granary()
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("granary starts")
}

/// Waits for a child started by [`spawn`], asserts success, and parses its stdout as JSON.
pub fn wait_json(child: std::process::Child) -> serde_json::Value {
    let o = child.wait_with_output().expect("granary runs");
    assert!(o.status.success(), "granary failed: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).expect("JSON on stdout")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A deterministic pseudo-random byte string.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// `n` files `c{i % classes}/f{i:03}` of pseudo-random bytes, file `i` being `size(i)` long.
pub fn numbered_tree(n: u64, classes: u64, size: impl Fn(u64) -> usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    (0..n)
        .map(|i| {
            (
                format!("c{}/f{i:03}", i % classes).into_bytes(),
                bytes(i, size(i)),
            )
        })
        .collect()
}

/// Writes `files` (relative raw paths → contents) under `root`.
pub fn write_tree(root: &Path, files: &[(Vec<u8>, Vec<u8>)]) {
    for (rel, data) in files {
        let p = root.join(OsStr::from_bytes(rel));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, data).unwrap();
    }
}

/// A tree exercising the edge cases: many classes, zero-byte, large, compressible, non-UTF-8
/// names, deep paths, a file outside any class directory.
pub fn edge_tree() -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut v = Vec::new();
    for c in 0..12u64 {
        for i in 0..15u64 {
            let len = ((c * 7919 + i * 104_729) % 9000) as usize;
            let data = if i % 3 == 0 {
                format!("class {c} sample {i} ")
                    .repeat(len / 20 + 1)
                    .into_bytes()
            } else {
                bytes(c * 100 + i, len)
            };
            v.push((format!("c{c:02}/s{i:03}.bin").into_bytes(), data));
        }
    }
    v.push((b"c00/empty".to_vec(), Vec::new()));
    v.push((b"c01/large.bin".to_vec(), bytes(99, 300_000)));
    v.push((
        b"c02/\xff\xfe-latin1-\xe9.jpg".to_vec(),
        b"\xff\xd8\xff\xe0jpeg-ish".to_vec(),
    ));
    v.push((b"c03/a/b/c/d/e/f/g/h/deep.txt".to_vec(), b"deep".to_vec()));
    v.push((b"c04/sp ace & quote'.txt".to_vec(), b"odd name".to_vec()));
    v.push((b"rootfile.txt".to_vec(), b"no class".to_vec()));
    v
}

/// Every regular file under `root`: relative raw path → contents, sorted.
pub fn read_tree(root: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut v: Vec<(Vec<u8>, Vec<u8>)> = walk(root)
        .into_iter()
        .map(|p| {
            let rel = p
                .strip_prefix(root)
                .unwrap()
                .as_os_str()
                .as_bytes()
                .to_vec();
            (rel, std::fs::read(&p).unwrap())
        })
        .collect();
    v.sort();
    v
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let ft = e.file_type().unwrap();
        if ft.is_dir() {
            out.extend(walk(&e.path()));
        } else if ft.is_file() {
            out.push(e.path());
        }
    }
    out
}

pub fn sorted(mut v: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<(Vec<u8>, Vec<u8>)> {
    v.sort();
    v
}

/// Recomputes every CRC of a snapshot after a deliberate edit, as a hostile author would
/// ([`granary_format::testing::reseal_snapshot`]).
pub fn reseal_snapshot(b: &mut [u8]) {
    assert!(
        granary_format::testing::reseal_snapshot(b),
        "not a 2.0 snapshot"
    );
}

/// Copies the files of directory `from` (not its subdirectories) into a new directory `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let t = e.file_type().unwrap();
        if t.is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        } else if t.is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        }
    }
}

/// Extracts the dataset `ds` to `out` with the binary and returns the tree it wrote.
pub fn extracted(ds: &Path, out: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    run_ok([
        "extract".as_ref(),
        ds.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    read_tree(out)
}

/// SIGKILLs `child` once `ready()` holds (or it has exited, or 30 s have passed), and reaps it.
pub fn kill_when(mut child: std::process::Child, ready: impl Fn() -> bool) {
    let start = std::time::Instant::now();
    while !ready()
        && start.elapsed() < std::time::Duration::from_secs(30)
        && child.try_wait().unwrap().is_none()
    {
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
}

/// A TCP endpoint on 127.0.0.1 that forwards to `upstream` until [`Relay::go_silent`]; from
/// then on it accepts connections and reads requests, old and new, but never answers: a store
/// that hangs. Its threads end with their connections.
pub struct Relay {
    pub addr: std::net::SocketAddr,
    silent: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// How a relay treats what passes: at most `rate` bytes per second per connection and
/// direction (0: no limit); a reply whose bytes contain `marker` held for `hold` before it is
/// passed on (a slow answer to one kind of request).
#[derive(Clone, Copy, Default)]
struct Link {
    rate: u64,
    marker: &'static [u8],
    hold: std::time::Duration,
}

impl Relay {
    /// Forwards to `upstream` at most `rate` bytes per second per connection and direction
    /// (a slow link, so that a test can act while a transfer is in progress).
    pub fn throttled(upstream: String, rate: u64) -> Relay {
        Relay::start(
            Some(upstream),
            Link {
                rate,
                ..Link::default()
            },
        )
    }

    /// Forwards to `upstream`, but holds each reply that contains `marker` for `hold` (the
    /// server has acted on the request; the client does not know yet).
    pub fn holding(upstream: String, marker: &'static [u8], hold: std::time::Duration) -> Relay {
        Relay::start(
            Some(upstream),
            Link {
                marker,
                hold,
                ..Link::default()
            },
        )
    }

    /// Forwards to `upstream` (`host:port`); `None`: silent from the start.
    pub fn new(upstream: Option<String>) -> Relay {
        Relay::start(upstream, Link::default())
    }

    fn start(upstream: Option<String>, link: Link) -> Relay {
        use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let silent = std::sync::Arc::new(AtomicBool::new(upstream.is_none()));
        let flag = silent.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let up = match (&upstream, flag.load(Relaxed)) {
                    (Some(u), false) => std::net::TcpStream::connect(u).ok(),
                    _ => None,
                };
                let (c2, f1, f2) = (client.try_clone().unwrap(), flag.clone(), flag.clone());
                match up {
                    Some(up) => {
                        let u2 = up.try_clone().unwrap();
                        std::thread::spawn(move || relay_pipe(client, Some(up), &f1, link));
                        std::thread::spawn(move || relay_pipe(u2, Some(c2), &f2, link));
                    }
                    None => {
                        std::thread::spawn(move || relay_pipe(client, None, &f1, link));
                    }
                }
            }
        });
        Relay { addr, silent }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn go_silent(&self) {
        self.silent
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Copies `from` to `to` until either ends, as `link` says; once `silent`, reads and drops.
fn relay_pipe(
    mut from: std::net::TcpStream,
    mut to: Option<std::net::TcpStream>,
    silent: &std::sync::atomic::AtomicBool,
    link: Link,
) {
    use std::io::{Read, Write};
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if silent.load(std::sync::atomic::Ordering::Relaxed) {
            continue;
        }
        if let Some(t) = to.as_mut() {
            if !link.marker.is_empty()
                && buf[..n]
                    .windows(link.marker.len())
                    .any(|w| w == link.marker)
            {
                std::thread::sleep(link.hold);
            }
            if t.write_all(&buf[..n]).is_err() {
                break;
            }
            if link.rate > 0 {
                std::thread::sleep(std::time::Duration::from_secs_f64(
                    n as f64 / link.rate as f64,
                ));
            }
        }
    }
    if let Some(t) = to {
        let _ = t.shutdown(std::net::Shutdown::Both);
    }
}

/// Gives file or directory `p` permission bits `mode` and modification time `mtime_ns`
/// (nanoseconds since the epoch, not negative).
pub fn set_attrs(p: &Path, mode: u32, mtime_ns: i64) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    let d = std::time::Duration::from_nanos(mtime_ns.unsigned_abs());
    let t = match mtime_ns < 0 {
        true => std::time::UNIX_EPOCH - d,
        false => std::time::UNIX_EPOCH + d,
    };
    std::fs::File::open(p)
        .unwrap()
        .set_times(std::fs::FileTimes::new().set_modified(t))
        .unwrap();
}

/// A tar archive (GNU headers, mode 0644) of `members` (path, bytes), in order: what
/// WebDataset shards are.
pub fn tar_bytes<N: AsRef<[u8]>>(members: &[(N, Vec<u8>)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, OsStr::from_bytes(name.as_ref()), &data[..])
            .unwrap();
    }
    b.into_inner().unwrap()
}

/// Writes [`tar_bytes`] of `members` to `path`.
pub fn write_tar<N: AsRef<[u8]>>(path: &Path, members: &[(N, Vec<u8>)]) {
    std::fs::write(path, tar_bytes(members)).unwrap();
}

/// The entry of layer `name` in `layers`, a report's list of layers (`read --json`'s `layers`,
/// a bill's `total`).
pub fn layer<'a>(layers: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    let list = layers
        .as_array()
        .unwrap_or_else(|| panic!("a list of layers: {layers}"));
    list.iter()
        .find(|l| l["layer"] == name)
        .unwrap_or_else(|| panic!("no layer {name} in {layers}"))
}

/// Writes dataset `ds`'s score table into tier directory `cache` as training's report() leaves
/// it there: every seventh sample matters far more (50 against 1). Returns the dataset and
/// its tier handle.
pub fn save_every_seventh_scores(
    ds: &Path,
    cache: &Path,
) -> (granary::Dataset, granary::LocalTier) {
    let dataset = granary::Dataset::open(ds).unwrap();
    let tier = granary::LocalTier::open(
        cache,
        dataset.snapshot().dataset_id(),
        1 << 30,
        granary::TierPolicy::Importance,
    )
    .unwrap();
    let mut scores = granary::ImportanceScores::new(dataset.len(), 0.8);
    let losses: Vec<(u64, f32)> = (0..dataset.len())
        .map(|i| (i, if i % 7 == 0 { 50.0 } else { 1.0 }))
        .collect();
    scores.apply(&losses);
    scores.save(&tier.scores_path()).unwrap();
    (dataset, tier)
}
