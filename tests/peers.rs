//! Tiers shared by the nodes of one job, on loopback: each "node" is a `granary serve` process
//! with its own tier directory, and its ranks are `granary read --peers ...` processes. Checked:
//! every node computes the same ownership; after one epoch the job's tiers hold the dataset and
//! the next epoch reads nothing from origin; a dead peer (refusing connections) and a stopped
//! one (answering nothing: the timeout) cost origin reads, never a sample or a hang; a damaged
//! or foreign copy served by a peer is rejected; the server serves nothing but chunk copies of
//! the datasets it was started for, read-only, and only to callers that hold the job's secret.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// The job's secret in these tests (servers and readers get it through GRANARY_PEER_SECRET).
const SECRET: &str = "test-job-secret-0123456789abcdef";

/// A `granary serve` process (stopped on drop) and the tier directory it serves; its stderr
/// goes to `log`.
struct Node {
    server: Child,
    addr: String,
    tier: PathBuf,
    log: PathBuf,
}

impl Node {
    fn start(datasets: &[&Path], tier: PathBuf) -> Node {
        Node::start_with(datasets, tier, &[("GRANARY_PEER_SECRET", SECRET)], &[])
    }

    fn start_with(datasets: &[&Path], tier: PathBuf, env: &[(&str, &str)], extra: &[&str]) -> Node {
        std::fs::create_dir_all(&tier).unwrap();
        let mut args = vec!["serve".to_string()];
        args.extend(datasets.iter().map(|d| d.to_str().unwrap().to_string()));
        args.extend([
            "--cache-dir".into(),
            tier.to_str().unwrap().into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
        ]);
        args.extend(extra.iter().map(|a| a.to_string()));
        let log = tier.with_extension("log");
        let mut server = granary()
            .args(&args)
            .env_remove("GRANARY_PEER_SECRET")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(server.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let Some(addr) = line
            .trim()
            .strip_prefix("listening on http://")
            .or_else(|| line.trim().strip_prefix("listening on https://"))
            .map(str::to_string)
        else {
            let _ = server.kill();
            let _ = server.wait();
            panic!("serve printed {line:?}");
        };
        Node {
            server,
            addr,
            tier,
            log,
        }
    }

    fn kill(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }

    fn signal(&self, sig: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.server.id() as i32).unwrap();
        rustix::process::kill_process(pid, sig).unwrap();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.signal_if_alive();
        self.kill();
    }
}

impl Node {
    /// A stopped server would not die of SIGKILL until continued; continue it first.
    fn signal_if_alive(&mut self) {
        if let Ok(None) = self.server.try_wait() {
            self.signal(rustix::process::Signal::CONT);
        }
    }
}

/// `granary read` of `ds`, epoch `epoch`, as rank `rank` of `world` (one rank per node), JSON.
fn rank_args(ds: &Path, rank: u32, world: usize, epoch: u64) -> Vec<String> {
    let ds = ds.to_str().unwrap();
    let (rank, world, epoch) = (rank.to_string(), world.to_string(), epoch.to_string());
    [
        "read",
        ds,
        "--json",
        "--rank",
        &rank,
        "--world-size",
        &world,
        "--first-epoch",
        &epoch,
    ]
    .map(String::from)
    .to_vec()
}

/// That read through `node`'s tier with the job's peers and the ownership of epoch 0.
fn read_rank(ds: &Path, node: &Node, peers: &str, rank: u32, epoch: u64, quota: u64) -> Child {
    let mut args = rank_args(ds, rank, peers.split(',').count(), epoch);
    let (tier, quota) = (node.tier.to_str().unwrap(), quota.to_string());
    args.extend(
        [
            "--ownership-epoch",
            "0",
            "--cache-dir",
            tier,
            "--cache-size",
            &quota,
            "--peers",
            peers,
            "--peer-timeout",
            "0.5",
        ]
        .map(String::from),
    );
    granary()
        .args(args)
        .env("GRANARY_PEER_SECRET", SECRET)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Rank `rank`'s digest of `epoch` without any tier: what every shared-tier read must match.
fn plain_digest(ds: &Path, rank: u32, world: usize, epoch: u64) -> String {
    let o = run_ok(rank_args(ds, rank, world, epoch));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v[0]["digest"].as_str().unwrap().to_string()
}

fn field(r: &serde_json::Value, path: &[&str]) -> u64 {
    let mut v = r;
    for p in path {
        v = &v[p];
    }
    v.as_u64().unwrap_or_else(|| panic!("{path:?} in {r}"))
}

/// Count `name` of layer `layer` in an epoch's report.
fn layer_field(r: &serde_json::Value, layer: &str, name: &str) -> u64 {
    field(crate::common::layer(&r["layers"], layer), &[name])
}

/// Waits for a reader, at most `secs`: a reader that hangs fails the test instead of it.
fn finish_within(mut child: Child, secs: u64, what: &str) -> serde_json::Value {
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            panic!("{what}: still running after {secs} s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_json(child)[0].clone()
}

/// 30 files of about 1 KB in 3 classes, packed under `tmp` with `extra` pack options.
fn small_dataset(tmp: &Path, extra: &[&str]) -> PathBuf {
    let files = numbered_tree(30, 3, |i| 1_000 + i as usize);
    packed_tree(&tmp.join("src"), &files, &tmp.join("ds"), extra)
}

/// One plain read of `ds` through the tier `dir` (10 MiB), which fills it.
fn fill_tier(ds: &Path, dir: &Path) {
    run_ok([
        "read",
        ds.to_str().unwrap(),
        "--cache-dir",
        dir.to_str().unwrap(),
        "--cache-size",
        "10MiB",
    ]);
}

/// A GET (or other method) on the server, signed with the job's secret; the status code and
/// body.
fn http(addr: &str, method: &str, path: &str) -> (u16, Vec<u8>) {
    let secret = granary_store::auth::Secret::new(SECRET.as_bytes(), "test").unwrap();
    let proof = secret.sign(method, path, None, granary_store::auth::unix_now());
    http_with(addr, method, path, Some(&proof))
}

/// A request with `proof` as its x-granary-auth header (none: no header).
fn http_with(addr: &str, method: &str, path: &str, proof: Option<&str>) -> (u16, Vec<u8>) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let auth = proof.map_or(String::new(), |p| format!("x-granary-auth: {p}\r\n"));
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let text = String::from_utf8_lossy(&out);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    let body = match out.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(i) => out[i + 4..].to_vec(),
        None => Vec::new(),
    };
    (status, body)
}

#[test]
fn four_nodes_share_their_tiers_survive_dead_stopped_and_lying_peers() {
    let tmp = tempfile::tempdir().unwrap();
    // ~6.6 MB in ~26 chunks; 600 samples split evenly over 4 ranks.
    let files = numbered_tree(600, 10, |i| 2_000 + (i as usize * 7_919) % 18_000);
    let ds = packed_tree(
        &tmp.path().join("src"),
        &files,
        &tmp.path().join("ds"),
        &["--chunk-size", "256KiB"],
    );
    let data: u64 = std::fs::read_dir(&ds)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("chunk-"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    // Each node's tier: 40 % of the dataset (its quarter fits, with room for uneven chunks).
    let quota = data * 4 / 10;
    let mut nodes: Vec<Node> = (0..4)
        .map(|i| Node::start(&[&ds], tmp.path().join(format!("tier{i}"))))
        .collect();
    let peers = nodes
        .iter()
        .map(|n| n.addr.clone())
        .collect::<Vec<_>>()
        .join(",");
    let epoch = |nodes: &[Node], ranks: &[u32], e: u64| -> Vec<serde_json::Value> {
        let children: Vec<Child> = ranks
            .iter()
            .map(|&r| read_rank(&ds, &nodes[r as usize], &peers, r, e, quota))
            .collect();
        let reports: Vec<serde_json::Value> = children
            .into_iter()
            .zip(ranks)
            .map(|(c, r)| finish_within(c, 120, &format!("rank {r}, epoch {e}")))
            .collect();
        for (r, rep) in ranks.iter().zip(&reports) {
            assert_eq!(
                rep["digest"].as_str().unwrap(),
                plain_digest(&ds, *r, 4, e),
                "rank {r}, epoch {e}: {rep}"
            );
            assert_eq!(field(rep, &["samples"]), 150, "{rep}");
        }
        reports
    };

    // Epoch 0 fills each node's tier with what its rank reads; every node computed the same
    // ownership.
    let first = epoch(&nodes, &[0, 1, 2, 3], 0);
    let fingerprint = first[0]["peers"]["ownership"].as_str().unwrap().to_string();
    for r in &first {
        assert_eq!(r["peers"]["ownership"].as_str(), Some(fingerprint.as_str()));
    }
    let held: Vec<u64> = nodes
        .iter()
        .map(|n| {
            let o = run_ok(["cache", "stats", n.tier.to_str().unwrap(), "--json"]);
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            field(&v[0], &["bytes"])
        })
        .collect();
    assert_eq!(
        held.iter().sum::<u64>(),
        data,
        "tiers hold {held:?} of {data}"
    );
    assert!(held.iter().all(|&b| b <= quota), "{held:?} > {quota}");

    // Epoch 1: every chunk comes from some node's tier, none from origin.
    let second = epoch(&nodes, &[0, 1, 2, 3], 1);
    let from = |rs: &[serde_json::Value], k: &str| -> u64 {
        rs.iter().map(|r| field(r, &["peers", k])).sum()
    };
    assert_eq!(from(&second, "bytes_from_origin"), 0, "{second:?}");
    assert!(from(&second, "bytes_from_peers") > data / 2, "{second:?}");

    // A peer that lies: node 1's copies damaged, one replaced by another dataset's chunk. Its
    // chunks are rejected and read from origin; every sample is right.
    let other = packed_tree(
        &tmp.path().join("src2"),
        &numbered_tree(40, 2, |i| 30_000 + i as usize),
        &tmp.path().join("ds2"),
        &["--chunk-size", "256KiB"],
    );
    let id = granary::Dataset::open(&ds).unwrap().snapshot().dataset_id();
    let tier1 = granary::LocalTier::tier_dir(&nodes[1].tier, &id);
    let mut copies: Vec<PathBuf> = std::fs::read_dir(&tier1)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("chunk-")
        })
        .collect();
    copies.sort();
    assert!(copies.len() >= 2, "{copies:?}");
    std::fs::copy(other.join("chunk-00000000.gchunk"), &copies[0]).unwrap();
    for c in &copies[1..] {
        let mut b = std::fs::read(c).unwrap();
        let at = b.len() / 2;
        b[at] ^= 0x40;
        std::fs::write(c, b).unwrap();
    }
    let lied = epoch(&nodes, &[0, 2, 3], 2);
    let rejected: u64 = lied
        .iter()
        .map(|r| layer_field(r, "peers", "rejected"))
        .sum();
    assert!(rejected > 0, "no copy rejected: {lied:?}");

    // A dead peer (connections refused) and a stopped one (connections accepted by the kernel,
    // never answered: the timeout). Their chunks come from origin; no rank hangs or loses a
    // sample.
    nodes[2].kill();
    nodes[3].signal(rustix::process::Signal::STOP);
    let t = Instant::now();
    let degraded = epoch(&nodes, &[0, 1], 3);
    for r in &degraded {
        let down: Vec<&str> = r["peers"]["down"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_str().unwrap())
            .collect();
        assert!(down.contains(&nodes[2].addr.as_str()), "{r}");
        assert!(layer_field(r, "peers", "unreachable") >= 1, "{r}");
    }
    eprintln!(
        "peers: ownership {fingerprint}; tiers after epoch 0 {held:?} B of {data}; epoch 1 from \
         peers {} B, origin 0; {rejected} lying copies rejected; epoch 3 with a dead and a \
         stopped peer read in {:.1} s",
        from(&second, "bytes_from_peers"),
        t.elapsed().as_secs_f64()
    );
}

#[test]
fn the_server_serves_only_chunk_copies_of_its_datasets_read_only() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = small_dataset(tmp.path(), &[]);
    let node = Node::start(&[&ds], tmp.path().join("tier"));
    fill_tier(&ds, &node.tier);
    let d = granary::Dataset::open(&ds).unwrap();
    let id = d.snapshot().dataset_id();
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let name = granary::copy_file_name(0, &d.chunk(0).unwrap().digest);
    let tier = granary::LocalTier::tier_dir(&node.tier, &id);
    let copy = std::fs::read(tier.join(&name)).unwrap();
    let path = format!("/{hex}/{name}");
    assert_eq!(http(&node.addr, "GET", &path), (200, copy.clone()));
    assert_eq!(http(&node.addr, "HEAD", &path).0, 200);
    for p in [
        format!("/{hex}/index"),
        format!("/{hex}/lock"),
        format!("/{hex}/../{hex}/{name}"),
        format!("/{hex}/chunk-00000000.gchunk"),
        // Another digest (another generation's chunk 0), another chunk id, another dataset.
        format!("/{hex}/{}", granary::copy_file_name(0, &[7; 16])),
        format!(
            "/{hex}/{}",
            granary::copy_file_name(9, &d.chunk(0).unwrap().digest)
        ),
        format!("/{}/{name}", "0".repeat(32)),
        "/".to_string(),
    ] {
        assert_eq!(http(&node.addr, "GET", &p).0, 404, "{p}");
    }
    for m in ["PUT", "DELETE", "POST"] {
        assert_eq!(http(&node.addr, m, &path).0, 405, "{m}");
    }
    // Nothing was changed by any of it.
    assert_eq!(std::fs::read(tier.join(&name)).unwrap(), copy);
}

#[test]
fn chunks_larger_than_one_read_piece_come_whole_from_their_owner() {
    // 3 chunks of ~5 MiB: the engine reads each in several pieces (4 MiB at most), which the
    // peer's copy fills back to back.
    let tmp = tempfile::tempdir().unwrap();
    let files = numbered_tree(30, 3, |i| 500_000 + i as usize * 1_000);
    let ds = packed_tree(
        &tmp.path().join("src"),
        &files,
        &tmp.path().join("ds"),
        &["--chunk-size", "5MiB", "--compress", "none"],
    );
    let nodes: Vec<Node> = (0..2)
        .map(|i| Node::start(&[&ds], tmp.path().join(format!("tier{i}"))))
        .collect();
    let peers = format!("{},{}", nodes[0].addr, nodes[1].addr);
    let mut from_peers = 0;
    for e in 0..4 {
        for r in 0..2u32 {
            let child = read_rank(&ds, &nodes[r as usize], &peers, r, e, 64 << 20);
            let rep = finish_within(child, 120, &format!("rank {r}, epoch {e}"));
            assert_eq!(
                rep["digest"].as_str().unwrap(),
                plain_digest(&ds, r, 2, e),
                "{rep}"
            );
            assert_eq!(layer_field(&rep, "peers", "rejected"), 0, "{rep}");
            from_peers += field(&rep, &["peers", "bytes_from_peers"]);
        }
    }
    assert!(from_peers > 5 << 20, "{from_peers} bytes from peers");
}

#[test]
fn the_server_answers_only_requests_signed_with_the_jobs_secret() {
    use granary_store::auth::{unix_now, Secret};
    let tmp = tempfile::tempdir().unwrap();
    let ds = small_dataset(tmp.path(), &["--chunk-size", "4KiB"]);
    // No secret and no --insecure: it does not start.
    let o = granary()
        .args(["serve", ds.to_str().unwrap(), "--cache-dir"])
        .arg(tmp.path().join("t0"))
        .args(["--listen", "127.0.0.1:0"])
        .env_remove("GRANARY_PEER_SECRET")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("no secret") && stderr(&o).contains("--insecure"),
        "{}",
        stderr(&o)
    );

    let node = Node::start(&[&ds], tmp.path().join("tier"));
    fill_tier(&ds, &node.tier);
    let id = granary::Dataset::open(&ds).unwrap().snapshot().dataset_id();
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let held = std::fs::read_dir(granary::LocalTier::tier_dir(&node.tier, &id))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("chunk-"))
        .expect("the tier holds a chunk");
    let path = format!("/{hex}/{held}");
    let job = Secret::new(SECRET.as_bytes(), "test").unwrap();
    let other = Secret::new(b"not-the-job-secret-at-all", "test").unwrap();
    let now = unix_now();
    assert_eq!(http_with(&node.addr, "GET", &path, None).0, 401, "no proof");
    let forged = other.sign("GET", &path, None, now);
    assert_eq!(
        http_with(&node.addr, "GET", &path, Some(&forged)).0,
        403,
        "another secret"
    );
    let elsewhere = job.sign("GET", "/x/chunk-00000001.gchunk", None, now);
    assert_eq!(
        http_with(&node.addr, "GET", &path, Some(&elsewhere)).0,
        403,
        "another path"
    );
    let stale = job.sign("GET", &path, None, now - 600);
    assert_eq!(
        http_with(&node.addr, "GET", &path, Some(&stale)).0,
        403,
        "ten minutes old"
    );
    assert_eq!(
        http_with(&node.addr, "GET", &path, Some("v1 garbage")).0,
        403
    );
    let good = job.sign("GET", &path, None, now);
    assert_eq!(http_with(&node.addr, "GET", &path, Some(&good)).0, 200);
    assert_eq!(
        http_with(&node.addr, "GET", &path, Some(&good)).0,
        403,
        "a replay"
    );
    // Refusals are logged with the caller's address.
    let log = std::fs::read_to_string(&node.log).unwrap();
    assert!(
        log.contains(&format!("refused GET {path} from 127.0.0.1:")) && log.contains("replayed"),
        "{log}"
    );

    // A reader with the wrong secret: refused by its peer, so it reads from origin, with every
    // sample right and a warning that names the refusal.
    let peers = format!("{},{}", node.addr, "127.0.0.1:9");
    // Epoch 1 with the ownership of epoch 0: some of rank 1's chunks are node 0's.
    let mut args = rank_args(&ds, 1, 2, 1);
    args.extend(["--ownership-epoch", "0"].map(String::from));
    let tier1 = tmp.path().join("tier1");
    args.extend(
        [
            "--cache-dir",
            tier1.to_str().unwrap(),
            "--cache-size",
            "10MiB",
            "--peers",
            &peers,
        ]
        .map(String::from),
    );
    let o = granary()
        .args(&args)
        .env("GRANARY_PEER_SECRET", "not-the-job-secret-at-all")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["digest"].as_str().unwrap(), plain_digest(&ds, 1, 2, 1));
    assert!(
        stderr(&o).contains("403") && stderr(&o).contains("does not hold the job's secret"),
        "{}",
        stderr(&o)
    );

    // --insecure answers anyone.
    let open = Node::start_with(&[&ds], node.tier.clone(), &[], &["--insecure"]);
    assert_eq!(http_with(&open.addr, "GET", &path, None).0, 200);
}

/// Runs openssl (a test prerequisite, like the S3 server): a CA, and a certificate for
/// 127.0.0.1 signed by it. Returns (CA, certificate, key) paths.
fn test_certificates(dir: &Path, name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let p = |f: &str| dir.join(format!("{name}-{f}"));
    let ext = p("ext");
    std::fs::write(
        &ext,
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    let steps: [Vec<String>; 3] = [
        [
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([
            format!("/CN={name}-ca"),
            "-keyout".into(),
            p("ca.key").display().to_string(),
            "-out".into(),
            p("ca.pem").display().to_string(),
        ])
        .collect(),
        [
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([
            p("node.key").display().to_string(),
            "-out".into(),
            p("node.csr").display().to_string(),
        ])
        .collect(),
        ["x509", "-req", "-days", "2", "-CAcreateserial", "-in"]
            .iter()
            .map(|s| s.to_string())
            .chain(
                [
                    p("node.csr"),
                    "-CA".into(),
                    p("ca.pem"),
                    "-CAkey".into(),
                    p("ca.key"),
                    "-out".into(),
                    p("node.pem"),
                    "-extfile".into(),
                    ext.clone(),
                ]
                .iter()
                .map(|x| x.display().to_string()),
            )
            .collect(),
    ];
    for args in steps {
        let o = std::process::Command::new("openssl")
            .args(&args)
            .output()
            .expect("openssl (a test prerequisite) runs");
        assert!(o.status.success(), "openssl {args:?}: {}", stderr(&o));
    }
    (p("ca.pem"), p("node.pem"), p("node.key"))
}

#[test]
fn peers_over_tls_read_only_from_servers_their_ca_signed() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = small_dataset(tmp.path(), &["--chunk-size", "4KiB"]);
    let (ca, cert, key) = test_certificates(tmp.path(), "job");
    let (other_ca, _, _) = test_certificates(tmp.path(), "other");
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let node = Node::start_with(
        &[&ds],
        tmp.path().join("tier"),
        &[("GRANARY_PEER_SECRET", SECRET)],
        &["--tls-cert", cert, "--tls-key", key],
    );
    // Rank 0 (node 0) reads epoch 0: its tier then holds every chunk it owns.
    let peers = format!("{},127.0.0.1:9", node.addr);
    finish_within(read_rank(&ds, &node, &peers, 0, 0, 10 << 20), 60, "rank 0");
    // Rank 1 of 2 in epoch 1 with the ownership of epoch 0: some chunks are node 0's.
    let read = |ca: Option<&Path>, tier: &str| {
        let mut args = rank_args(&ds, 1, 2, 1);
        let tier = tmp.path().join(tier);
        args.extend(
            [
                "--ownership-epoch",
                "0",
                "--cache-dir",
                tier.to_str().unwrap(),
                "--cache-size",
                "10MiB",
                "--peers",
                &peers,
            ]
            .map(String::from),
        );
        if let Some(ca) = ca {
            args.extend(["--peer-ca".to_string(), ca.display().to_string()]);
        }
        let o = granary()
            .args(&args)
            .env("GRANARY_PEER_SECRET", SECRET)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v[0]["digest"].as_str().unwrap(), plain_digest(&ds, 1, 2, 1));
        (field(&v[0], &["peers", "bytes_from_peers"]), stderr(&o))
    };
    // The job's CA: the chunks come from the peer, over TLS.
    let (from_peers, _) = read(Some(&ca), "t1");
    assert!(from_peers > 0, "nothing came from the TLS peer");
    // Another CA: the server's certificate is refused, the chunks come from origin.
    let (from_peers, err) = read(Some(&other_ca), "t2");
    assert_eq!(from_peers, 0);
    assert!(err.contains("failed"), "{err}");
    // Plain HTTP to a TLS server: no answer it can use, origin again.
    let (from_peers, _) = read(None, "t3");
    assert_eq!(from_peers, 0);
    let log = std::fs::read_to_string(&node.log).unwrap();
    assert!(
        log.contains("https://") && log.contains("TLS handshake"),
        "{log}"
    );
}

/// The bill with peers: chunks another node keeps are predicted from the peers, this node's
/// own (absent from its tier) from origin; together what the bill without peers says. Epoch 1:
/// in epoch 0, whose plan decides ownership, each node reads only what it keeps.
#[test]
fn the_bill_counts_chunks_other_nodes_keep_as_the_peers() {
    let tmp = tempfile::tempdir().unwrap();
    let files = numbered_tree(200, 4, |i| 3_000 + i as usize * 7);
    let ds = packed_tree(
        &tmp.path().join("src"),
        &files,
        &tmp.path().join("ds"),
        &["--chunk-size", "32KiB"],
    );
    let ds = std::sync::Arc::new(granary::Dataset::open(&ds).unwrap());
    let config = |peers: bool| granary::ReaderOptions {
        rank: 0,
        world_size: 2,
        cache_dir: Some(tmp.path().join("tier")),
        cache_size: Some(64 << 20),
        policy: granary::TierPolicy::Static,
        peers: peers.then(|| vec!["127.0.0.1:9".into(), "127.0.0.1:10".into()]),
        node: peers.then_some(0),
        peer_timeout: 1.0,
        ownership_epoch: Some(0),
        ..Default::default()
    };
    let predict = |peers: bool| {
        let reader = config(peers).open(&ds).unwrap();
        let setup = reader.setup().unwrap();
        let b = granary::bill::predict(&ds, &setup, 1, 0..1, 2, 1, None).unwrap();
        (b.total, reader.peers().map(|p| p.ownership().clone()))
    };
    let (alone, _) = predict(false);
    let (shared, ownership) = predict(true);
    let layer = |b: &[granary::bill::LayerBill], name: &str| {
        b.iter()
            .find(|l| l.layer == name)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(
        shared.iter().map(|l| l.layer).collect::<Vec<_>>(),
        ["tier", "peers", "origin"]
    );
    let (p, o) = (layer(&shared, "peers"), layer(&shared, "origin"));
    assert!(p.requests > 0 && o.requests > 0, "{shared:?}");
    assert_eq!(p.requests + o.requests, layer(&alone, "origin").requests);
    assert_eq!(p.bytes + o.bytes, layer(&alone, "origin").bytes);
    // The peers' share is the chunks node 1 keeps among those rank 0 reads.
    let own = ownership.unwrap();
    let plan = config(false).open(&ds).unwrap().setup().unwrap();
    let shard = granary::Shard {
        rank: 0,
        world_size: 2,
        worker: 0,
        num_workers: 1,
    };
    let ep = plan.plan(&ds, 1, shard, None).unwrap();
    let read: u64 = ep
        .windows
        .iter()
        .flat_map(|w| w.chunks.iter())
        .filter(|&&c| own.owner(c) == Some(1))
        .count() as u64;
    assert_eq!(p.requests, read, "{shared:?}");
}

/// Whether any file under `dir` holds `marker`.
fn any_file_holds(dir: &Path, marker: &[u8]) -> bool {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return false;
    };
    rd.flatten().any(|e| {
        let p = e.path();
        match p.is_dir() {
            true => any_file_holds(&p, marker),
            false => std::fs::read(&p).is_ok_and(|b| b.windows(marker.len()).any(|w| w == marker)),
        }
    })
}

#[test]
fn after_a_takedown_no_tier_of_the_job_holds_a_deleted_byte() {
    let tmp = tempfile::tempdir().unwrap();
    // Every sixth file carries a marker found nowhere else.
    let files: Vec<(Vec<u8>, Vec<u8>)> = (0..60u64)
        .map(|i| {
            let mut b = bytes(i, 1500);
            if i % 6 == 0 {
                b.extend_from_slice(format!("PEER-MARKER-{i:03}").as_bytes());
            }
            (format!("c{}/f{i:03}.bin", i % 3).into_bytes(), b)
        })
        .collect();
    let ds = packed_tree(
        &tmp.path().join("src"),
        &files,
        &tmp.path().join("ds"),
        &["--chunk-size", "8KiB", "--compress", "none"],
    );
    let nodes = [
        Node::start(&[&ds], tmp.path().join("tier-a")),
        Node::start(&[&ds], tmp.path().join("tier-b")),
    ];
    let peers = format!("{},{}", nodes[0].addr, nodes[1].addr);
    // An epoch through the job's tiers: each node's tier takes copies (its own chunks, and
    // what it read from the other).
    let ranks: Vec<Child> = (0..2)
        .map(|r| read_rank(&ds, &nodes[r], &peers, r as u32, 0, 64 << 20))
        .collect();
    for (r, c) in ranks.into_iter().enumerate() {
        finish_within(c, 60, &format!("rank {r}"));
    }
    let marker = |i: u64| format!("PEER-MARKER-{i:03}").into_bytes();
    let held = (0..60)
        .step_by(6)
        .any(|i| nodes.iter().any(|n| any_file_holds(&n.tier, &marker(i))));
    assert!(held, "the tiers hold copies of the marked samples");
    // The takedown: delete, compact now, purge every node's tier.
    let gone: String = (0..60)
        .step_by(6)
        .map(|i| format!("c{}/f{i:03}.bin\n", i % 3))
        .collect();
    std::fs::write(tmp.path().join("gone.txt"), gone).unwrap();
    let list = tmp.path().join("gone.txt");
    run_ok([
        "delete".as_ref(),
        ds.as_os_str(),
        "--paths-from".as_ref(),
        list.as_os_str(),
    ]);
    run_ok([
        "compact".as_ref(),
        ds.as_os_str(),
        "--all".as_ref(),
        "--grace".as_ref(),
        "0".as_ref(),
    ]);
    for n in &nodes {
        run_ok([
            "cache".as_ref(),
            "purge".as_ref(),
            ds.as_os_str(),
            n.tier.as_os_str(),
        ]);
    }
    for i in (0..60).step_by(6) {
        for place in [&ds, &nodes[0].tier, &nodes[1].tier] {
            assert!(
                !any_file_holds(place, &marker(i)),
                "marker {i} left in {}",
                place.display()
            );
        }
    }
}
