//! The tier under load, with processes dying in it: several `granary read` processes stream
//! epochs through one local tier (chunk copies under `--policy lru`, hot chunks re-packed by
//! `--policy importance` from a score table) while a chaos loop SIGKILLs a random one every few
//! hundred milliseconds and starts another in its place — readers and admitters die wherever
//! they are: mid-read, mid-admission, holding the tier's lock, between a copy and its index.
//!
//! Checked throughout, not just at the end:
//! - the quota: a sampler takes the tier's lock (so it sees a state between two changes, the
//!   state the next writer finds) every few milliseconds and sums every data file, temporary
//!   ones included; the sum never exceeds the quota;
//! - temporary files: never more than one at a time (the writer holding the lock, or the one
//!   a killed writer left, which the next lock holder removes), none at the end;
//! - bytes: every epoch a process completes has exactly the dataset's sample count and the
//!   digest of a read without the tier (a keyed sum over every sample's id and the CRC of the
//!   bytes delivered); any reader that exits on its own with an error fails the run;
//! - afterwards `granary cache stats` agrees with the files, and a last reader through the
//!   tier reads every sample right.
//!
//! `GRANARY_CHAOS_SECONDS` (default 20) sets the duration, `GRANARY_CHAOS_READERS` (default 4)
//! how many readers run at once, `GRANARY_CHAOS_SEED` the seed of the kills.
//! `scripts/chaos.sh [SECONDS]` runs it long and prints its figures.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v}: not a number"))
        })
        .unwrap_or(default)
}

/// What the sampler saw of the tier's directory, each time under its lock.
#[derive(Default, Debug)]
struct Samples {
    count: u64,
    max_bytes: u64,
    max_temps: usize,
    /// Samples that found a temporary file: a writer killed mid-write left it.
    with_temps: u64,
    over_quota: Vec<String>,
}

/// Bytes of the tier's data files (chunk copies, hot chunks, and temporary files of either) and
/// the number of temporary files of any kind, listed under the tier's lock.
fn tier_usage(dir: &Path) -> (u64, usize, Vec<String>) {
    let mut bytes = 0;
    let mut temps = 0;
    let mut names = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let temp = name
            .rsplit_once(".tmp")
            .is_some_and(|(_, pid)| pid.bytes().all(|b| b.is_ascii_digit()));
        // The score table is written under its own lock by whoever reports losses.
        if temp && !name.starts_with("scores.") {
            temps += 1;
        }
        if name.starts_with("chunk-") || name.starts_with("hot-") {
            if let Ok(m) = e.metadata() {
                bytes += m.len();
                names.push(format!("{name}:{}", m.len()));
            }
        }
    }
    (bytes, temps, names)
}

struct Reader {
    child: Child,
    log: PathBuf,
    lines: Arc<Mutex<Vec<String>>>,
    reader: std::thread::JoinHandle<()>,
}

#[test]
fn readers_killed_at_random_through_one_tier_never_break_its_quota_or_its_bytes() {
    let seconds = env_u64("GRANARY_CHAOS_SECONDS", 20);
    let readers = env_u64("GRANARY_CHAOS_READERS", 4) as usize;
    let seed = env_u64("GRANARY_CHAOS_SEED", 1);
    let mut rng = granary_format::SplitMix64::new(seed);

    let tmp = tempfile::tempdir().unwrap();
    // ~9 MiB in ~36 chunks of ≤ 256 KiB; the tier holds 30 % of it: constant eviction.
    let files = numbered_tree(720, 12, |i| 2_000 + (i as usize * 7_919) % 24_000);
    let ds = packed_tree(
        &tmp.path().join("src"),
        &files,
        &tmp.path().join("ds"),
        &["--chunk-size", "256KiB", "--compress", "none"],
    );
    let dataset = granary::Dataset::open(&ds).unwrap();
    let n = dataset.len();
    let data_bytes: u64 = files.iter().map(|(_, d)| d.len() as u64).sum();
    let quota = data_bytes * 3 / 10;
    let root = tmp.path().join("tier");
    let tier = granary::LocalTier::open(
        &root,
        dataset.snapshot().dataset_id(),
        quota,
        granary::TierPolicy::Lru,
    )
    .unwrap();
    let tier_dir = tier.dir().to_path_buf();
    // Scores for the importance readers: every fifth sample matters much more.
    let scores_path = tmp.path().join("scores");
    let mut scores = granary::ImportanceScores::new(n, 0.8);
    let w: Vec<(u64, f32)> = (0..n)
        .map(|i| (i, if i % 5 == 0 { 40.0 } else { 1.0 }))
        .collect();
    scores.apply(&w);
    scores.save(&scores_path).unwrap();

    // The reference: one epoch without the tier.
    let o = run_ok(["read", ds.to_str().unwrap(), "--json"]);
    let reference: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let digest = reference[0]["digest"].as_str().unwrap().to_string();
    assert_eq!(reference[0]["samples"].as_u64(), Some(n));

    // The sampler: the tier's state under its lock, as often as it can get it.
    let stop = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(Mutex::new(Samples::default()));
    let sampler = {
        let (stop, samples, dir) = (stop.clone(), samples.clone(), tier_dir.clone());
        std::thread::spawn(move || {
            let lock = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(dir.join("lock"))
                .unwrap();
            while !stop.load(Ordering::Relaxed) {
                rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).unwrap();
                let (bytes, temps, names) = tier_usage(&dir);
                rustix::fs::flock(&lock, rustix::fs::FlockOperation::Unlock).unwrap();
                let mut s = samples.lock().unwrap();
                s.count += 1;
                s.max_bytes = s.max_bytes.max(bytes);
                s.max_temps = s.max_temps.max(temps);
                s.with_temps += u64::from(temps > 0);
                if bytes > quota && s.over_quota.len() < 5 {
                    s.over_quota.push(format!("{bytes} bytes: {names:?}"));
                }
                drop(s);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };

    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let mut started = 0u64;
    let mut start_reader = |rng: &mut granary_format::SplitMix64| -> Reader {
        started += 1;
        let log = logs.join(format!("reader-{started}.err"));
        let mut args: Vec<String> = [
            "read",
            ds.to_str().unwrap(),
            "--epochs",
            "100000",
            "--cache-dir",
            root.to_str().unwrap(),
            "--cache-size",
            &quota.to_string(),
            "--memory",
            "4MiB",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(["--first-epoch".into(), rng.below(1000).to_string()]);
        args.extend(["--workers".into(), (1 + rng.below(2)).to_string()]);
        // Half the readers keep chunk copies by recency, half re-pack hot chunks by importance
        // (and read the rest of their source chunks in ranges): both kinds of admission.
        if rng.below(2) == 0 {
            args.extend(["--policy".into(), "lru".into()]);
        } else {
            args.extend(["--policy".into(), "importance".into()]);
            args.extend(["--scores".into(), scores_path.to_str().unwrap().into()]);
        }
        let io = ["auto", "buffered", "direct"][rng.below(3) as usize];
        args.extend(["--io".into(), io.into()]);
        let mut child = granary()
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let reader = {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for l in BufReader::new(out).lines() {
                    let Ok(l) = l else { break };
                    lines.lock().unwrap().push(l);
                }
            })
        };
        Reader {
            child,
            log,
            lines,
            reader,
        }
    };

    // Every line a reader printed is an epoch it completed: whole and right, or the run fails.
    let mut epochs = 0u64;
    let mut delivered = 0u64;
    let mut check_lines = |r: Reader| {
        r.reader.join().unwrap();
        for l in r.lines.lock().unwrap().iter() {
            let words: Vec<&str> = l.split_whitespace().collect();
            let after = |w: &str| {
                let i = words.iter().position(|x| x.trim_end_matches(':') == w);
                i.and_then(|i| words.get(i + 1).copied())
            };
            let count = words.get(2).and_then(|c| c.parse::<u64>().ok());
            assert_eq!(words.first(), Some(&"epoch"), "{}: {l}", r.log.display());
            assert_eq!(count, Some(n), "a short epoch ({}): {l}", r.log.display());
            let d = after("digest").map(|d| d.trim_end_matches(','));
            assert_eq!(
                d,
                Some(digest.as_str()),
                "wrong bytes ({}): {l}",
                r.log.display()
            );
            epochs += 1;
            delivered += n;
        }
    };

    let mut running: Vec<Reader> = (0..readers).map(|_| start_reader(&mut rng)).collect();
    let begin = Instant::now();
    let mut kills = 0u64;
    while begin.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(Duration::from_millis(50 + rng.below(350)));
        // A reader that stopped by itself failed: its epochs run until it is killed.
        for r in running.iter_mut() {
            if let Some(status) = r.child.try_wait().unwrap() {
                panic!(
                    "a reader exited by itself ({status}): {}",
                    std::fs::read_to_string(&r.log).unwrap()
                );
            }
        }
        let victim = rng.below(running.len() as u64) as usize;
        let mut r = running.swap_remove(victim);
        r.child.kill().unwrap(); // SIGKILL
        r.child.wait().unwrap();
        kills += 1;
        check_lines(r);
        running.push(start_reader(&mut rng));
    }
    for mut r in running.drain(..) {
        r.child.kill().unwrap();
        r.child.wait().unwrap();
        check_lines(r);
    }
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let samples = samples.lock().unwrap();

    // Afterwards: `cache stats` (which takes the lock and so clears what the killed left)
    // agrees with the files, within the quota, with no temporary file.
    let stats = run_ok(["cache", "stats", root.to_str().unwrap(), "--json"]);
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    let (bytes, temps, names) = tier_usage(&tier_dir);
    let data_files = names.len() as u64;
    assert_eq!(temps, 0, "{names:?}");
    assert_eq!(
        stats[0]["bytes"].as_u64(),
        Some(bytes),
        "{stats} vs {names:?}"
    );
    assert_eq!(
        stats[0]["entries"].as_u64(),
        Some(data_files),
        "{stats} vs {names:?}"
    );
    assert!(bytes <= quota, "{stats}");
    let hot = stats[0]["hot_chunks"].as_u64().unwrap();
    // A last reader through what the chaos left: every sample, right.
    let o = run_ok([
        "read",
        ds.to_str().unwrap(),
        "--json",
        "--epochs",
        "2",
        "--cache-dir",
        root.to_str().unwrap(),
        "--cache-size",
        &quota.to_string(),
        "--policy",
        "lru",
    ]);
    let last: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for e in last.as_array().unwrap() {
        assert_eq!(e["samples"].as_u64(), Some(n), "{e}");
        assert_eq!(e["digest"].as_str(), Some(digest.as_str()), "{e}");
    }
    let warnings: HashMap<String, u64> = std::fs::read_dir(&logs)
        .unwrap()
        .flatten()
        .flat_map(|e| {
            std::fs::read_to_string(e.path())
                .unwrap()
                .lines()
                .map(|l| l.chars().take(60).collect::<String>())
                .collect::<Vec<_>>()
        })
        .fold(HashMap::new(), |mut m, l| {
            *m.entry(l).or_default() += 1;
            m
        });

    eprintln!(
        "chaos: {seconds} s, {readers} readers at a time, seed {seed}: {started} processes \
         started, {kills} killed (SIGKILL) mid-run; {epochs} epochs completed, {delivered} samples \
         delivered in them, 0 wrong, 0 short; quota {quota} B, tier sampled {} times under its \
         lock: at most {} B ({:.1} % of the quota), at most {} temporary file(s) ({} samples found one a killed writer \
         left); at the end \
         {data_files} entries ({hot} hot chunks), {bytes} B, cache stats consistent; reader \
         stderr lines (first 60 chars): {warnings:?}",
        samples.count,
        samples.max_bytes,
        100.0 * samples.max_bytes as f64 / quota as f64,
        samples.max_temps,
        samples.with_temps,
    );
    assert!(
        samples.over_quota.is_empty(),
        "quota {quota} exceeded: {:?}",
        samples.over_quota
    );
    assert!(
        samples.max_temps <= 1,
        "{} temporary files",
        samples.max_temps
    );
    assert!(
        samples.count > 10,
        "the tier was sampled {} times",
        samples.count
    );
    assert!(epochs > 0, "no reader completed an epoch in {seconds} s");
}
