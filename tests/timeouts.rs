//! Bounded waits: an object store that accepts connections and never answers fails every
//! command within the timeouts' bound, with a warning while it waits and an error naming the
//! URL. No server is needed: the store is a local endpoint that never answers.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;

/// The timeouts the commands run with (seconds): connect, no answer, retries.
const TIMEOUTS: [(&str, &str); 3] = [
    ("GRANARY_CONNECT_TIMEOUT", "1"),
    ("GRANARY_REQUEST_TIMEOUT", "1"),
    ("GRANARY_RETRY_TIMEOUT", "2"),
];

/// The bound these timeouts promise (`Timeouts::bound`: retries + one more attempt + one
/// backoff pause) plus time to start a process and give up.
fn bound() -> Duration {
    let t = granary_store::object::Timeouts {
        connect: Duration::from_secs(1),
        request: Duration::from_secs(1),
        retry: Duration::from_secs(2),
    };
    t.bound() + Duration::from_secs(5)
}

/// Runs `granary args` against the silent endpoint; returns its exit code, stderr and time.
fn against(endpoint: &str, home: &Path, args: &[&str]) -> (Option<i32>, String, Duration) {
    let mut c = granary();
    c.args(args)
        .env("AWS_ENDPOINT_URL", endpoint)
        .env("AWS_ACCESS_KEY_ID", "granary-test")
        .env("AWS_SECRET_ACCESS_KEY", "granary-test")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ALLOW_HTTP", "true")
        .env("XDG_CACHE_HOME", home.join("cache"))
        .env_remove("GRANARY_SNAPSHOT_CACHE");
    for (k, v) in TIMEOUTS {
        c.env(k, v);
    }
    let t0 = Instant::now();
    let o = c.output().unwrap();
    (o.status.code(), stderr(&o), t0.elapsed())
}

#[test]
fn a_silent_store_fails_every_command_within_the_bound() {
    let silent = Relay::new(None);
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &numbered_tree(20, 2, |i| 100 + i as usize));
    let (src_s, out_s, mnt_s) = (
        src.to_str().unwrap().to_string(),
        tmp.path().join("out").to_str().unwrap().to_string(),
        tmp.path().join("mnt").to_str().unwrap().to_string(),
    );
    std::fs::create_dir_all(&mnt_s).unwrap();
    let ds = "s3://bucket/ds";
    let http = format!("{}/bucket/ds", silent.url());
    let cases: Vec<(Vec<&str>, &str, i32)> = vec![
        (vec!["info", ds], ds, 1),
        (vec!["info", &http], &http, 1),
        (vec!["ls", ds], ds, 1),
        (vec!["cat", ds, "c000/f0000"], ds, 1),
        (vec!["verify", ds], ds, 4),
        (vec!["read", ds], ds, 1),
        (vec!["plan", ds], ds, 1),
        (vec!["extract", ds, "-o", &out_s], ds, 1),
        (vec!["reindex", ds], ds, 1),
        (vec!["mount", ds, &mnt_s], ds, 1),
        (
            vec!["pack", &src_s, "-o", "s3://bucket/new"],
            "s3://bucket/new",
            1,
        ),
    ];
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = cases
            .iter()
            .map(|(args, _, _)| {
                let (endpoint, home) = (silent.url(), tmp.path());
                s.spawn(move || against(&endpoint, home, args))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((args, url, want), (code, err, took)) in cases.iter().zip(results) {
        assert_eq!(code, Some(*want), "granary {args:?}: {err}");
        assert!(
            took < bound(),
            "granary {args:?} took {took:?}, more than {:?}: {err}",
            bound()
        );
        assert!(
            err.contains(url) && err.contains("still waiting"),
            "granary {args:?}: the wait and the error must name {url}: {err}"
        );
    }
}

#[test]
fn timeouts_that_are_not_seconds_are_refused_before_anything_runs() {
    for (var, value) in [
        ("GRANARY_RETRY_TIMEOUT", "soon"),
        ("GRANARY_CONNECT_TIMEOUT", "0"),
        ("GRANARY_REQUEST_TIMEOUT", "-3"),
    ] {
        let o = granary()
            .args(["info", "s3://bucket/ds"])
            .env(var, value)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{var}={value}: {}", stderr(&o));
        assert!(stderr(&o).contains("seconds"), "{}", stderr(&o));
    }
    let o = run(["--retry-timeout", "0.5x", "info", "s3://bucket/ds"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}
