//! Tiers shared by the nodes of one job, on loopback: each "node" is a `granary serve` process
//! with its own tier directory, and its ranks are `granary read --peers ...` processes. Checked:
//! every node computes the same ownership; after one epoch the job's tiers hold the dataset and
//! the next epoch reads nothing from origin; a dead peer (refusing connections) and a stopped
//! one (answering nothing: the timeout) cost origin reads, never a sample or a hang; a damaged
//! or foreign copy served by a peer is rejected; the server serves nothing but chunk copies of
//! the datasets it was started for, read-only.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A `granary serve` process (stopped on drop) and the tier directory it serves.
struct Node {
    server: Child,
    addr: String,
    tier: PathBuf,
}

impl Node {
    fn start(datasets: &[&Path], tier: PathBuf) -> Node {
        std::fs::create_dir_all(&tier).unwrap();
        let mut args = vec!["serve".to_string()];
        args.extend(datasets.iter().map(|d| d.to_str().unwrap().to_string()));
        args.extend([
            "--cache-dir".into(),
            tier.to_str().unwrap().into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
        ]);
        let mut server = granary()
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(server.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on http://")
            .unwrap_or_else(|| panic!("serve printed {line:?}"))
            .to_string();
        Node { server, addr, tier }
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
    spawn(args)
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

/// A GET (or other method) on the server; the status code and body.
fn http(addr: &str, method: &str, path: &str) -> (u16, Vec<u8>) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
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
        .map(|r| field(r, &["peers", "events", "rejected"]))
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
        assert!(field(r, &["peers", "events", "unreachable"]) >= 1, "{r}");
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
    let ds = packed_tree(
        &tmp.path().join("src"),
        &numbered_tree(30, 3, |i| 1_000 + i as usize),
        &tmp.path().join("ds"),
        &[],
    );
    let node = Node::start(&[&ds], tmp.path().join("tier"));
    // Fill the tier with one read.
    run_ok([
        "read",
        ds.to_str().unwrap(),
        "--cache-dir",
        node.tier.to_str().unwrap(),
        "--cache-size",
        "10MiB",
    ]);
    let id = granary::Dataset::open(&ds).unwrap().snapshot().dataset_id();
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let copy =
        std::fs::read(granary::LocalTier::tier_dir(&node.tier, &id).join("chunk-00000000.gchunk"))
            .unwrap();
    let path = format!("/{hex}/chunk-00000000.gchunk");
    assert_eq!(http(&node.addr, "GET", &path), (200, copy.clone()));
    assert_eq!(http(&node.addr, "HEAD", &path).0, 200);
    for p in [
        format!("/{hex}/index"),
        format!("/{hex}/lock"),
        format!("/{hex}/../{hex}/chunk-00000000.gchunk"),
        format!("/{hex}/chunk-00000009.gchunk"),
        format!("/{}/chunk-00000000.gchunk", "0".repeat(32)),
        "/".to_string(),
    ] {
        assert_eq!(http(&node.addr, "GET", &p).0, 404, "{p}");
    }
    for m in ["PUT", "DELETE", "POST"] {
        assert_eq!(http(&node.addr, m, &path).0, 405, "{m}");
    }
    // Nothing was changed by any of it.
    assert_eq!(
        std::fs::read(granary::LocalTier::tier_dir(&node.tier, &id).join("chunk-00000000.gchunk"))
            .unwrap(),
        copy
    );
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
            assert_eq!(field(&rep, &["peers", "events", "rejected"]), 0, "{rep}");
            from_peers += field(&rep, &["peers", "bytes_from_peers"]);
        }
    }
    assert!(from_peers > 5 << 20, "{from_peers} bytes from peers");
}
