//! `granary bench remote`: what opening and reading a dataset in an object store costs when
//! its snapshot is read in blocks: bytes and GETs to open, to look up a path, to
//! `cat` a file, to find a directory and list it (paths, then sizes, modes and mtimes), and
//! for one chunk-wise epoch beyond the chunks themselves.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use granary::{Dataset, ReaderOptions, ShuffleMode};
use granary_bench::readbench::percentile;
use granary_format::SplitMix64;
use serde_json::json;

/// Cost of opening, looking up and streaming a dataset at a URL, from a cold snapshot cache.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  granary bench remote s3://bucket/huge.granary
  granary bench remote s3://bucket/huge.granary --world-size 64 --lookups 50 --json

Every measurement starts from an empty snapshot cache of its own (a temporary directory), as on
a node that has never opened the dataset. The paths looked up are drawn at random (--seed) and
read first through another cold cache, so that drawing them costs the measured cache nothing.
`cat` is a lookup plus the record's read (one ranged GET of the chunk). `dir` finds the
directory of each looked-up path (the run of the namespace under `DIR/`, as `granary ls URL
DIR/` and the mount's lookups do); `list` then lists the first --lists of them (every path
and sample id, as `granary ls` does), and `list-l` lists them again with each file's size,
mode and mtime (as `ls -l` on the mount shows them): its figures are what those cost beyond
the paths. The epoch is rank
--rank's share of a chunk-wise epoch at --world-size (--no-epoch skips it); its snapshot GETs
and bytes are the sample entries it fetched beyond the chunks.

Snapshots up to GRANARY_SNAPSHOT_WHOLE_MAX bytes (default 16 MiB) are fetched whole instead;
set it to 0 to measure paging on a small dataset.")]
pub struct RemoteArgs {
    /// The dataset (an object store URL).
    dataset: String,
    /// Paths to look up (and as many to `cat`).
    #[arg(long, default_value_t = 20)]
    lookups: u32,
    /// Directories to list (of those found by `dir`).
    #[arg(long, default_value_t = 2)]
    lists: u32,
    /// Distributed ranks of the epoch.
    #[arg(long, default_value_t = 1)]
    world_size: u32,
    /// The rank whose share is read.
    #[arg(long, default_value_t = 0)]
    rank: u32,
    /// Loader workers (threads).
    #[arg(long, default_value_t = 1)]
    workers: u32,
    /// Skip the epoch.
    #[arg(long)]
    no_epoch: bool,
    /// Seed of the paths drawn and of the epoch.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print JSON on stdout.
    #[arg(long)]
    json: bool,
}

/// GETs and bytes of the snapshot fetched so far.
fn fetched(ds: &Dataset) -> (u64, u64) {
    ds.snapshot_fetched().map_or((0, 0), |r| (r.reads, r.bytes))
}

pub fn run(a: RemoteArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        granary_store::object::is_url(&a.dataset),
        "{}: bench remote measures datasets in object stores (s3://, gs://, az://, http(s)://)",
        a.dataset
    );
    // The paths to look up, drawn through a cache of their own.
    let (_probe_cache, probe) = open_cold(&a.dataset)?;
    let mut rng = SplitMix64::new(a.seed);
    let n = probe.len();
    anyhow::ensure!(n > 0, "{}: the dataset is empty", a.dataset);
    let paths: Vec<Vec<u8>> = (0..2 * a.lookups)
        .map(|_| Ok(probe.path(rng.next_u64() % n)?.to_vec()))
        .collect::<anyhow::Result<_>>()?;
    drop(probe);

    let t = Instant::now();
    let (_cache, ds) = open_cold(&a.dataset)?;
    let open_s = t.elapsed().as_secs_f64();
    let paged = ds.snapshot_fetched().is_some();
    let (open_gets, open_bytes) = fetched(&ds);
    let snapshot_len = ds.snapshot().bytes().len() as u64;

    // Lookups, then cats of other paths (each cold for its path), then the directories of the
    // looked-up paths found and listed.
    let (lookups, cats) = paths.split_at(a.lookups as usize);
    let measure = |count: usize, op: &dyn Fn(usize) -> anyhow::Result<()>| {
        let (mut ms, mut gets, mut bytes) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..count {
            let before = fetched(&ds);
            let t = Instant::now();
            op(i)?;
            ms.push(t.elapsed().as_secs_f64() * 1e3);
            let after = fetched(&ds);
            gets.push((after.0 - before.0) as f64);
            bytes.push((after.1 - before.1) as f64);
        }
        // Each figure's median and largest: `ms_median`, `ms_max` and so on.
        let mut v = json!({ "count": count });
        for (name, mut x) in [
            ("ms", ms),
            ("snapshot_gets", gets),
            ("snapshot_bytes", bytes),
        ] {
            x.sort_by(f64::total_cmp);
            v[format!("{name}_median")] = percentile(&x, 0.5).into();
            v[format!("{name}_max")] = percentile(&x, 1.0).into();
        }
        anyhow::Ok(v)
    };
    let find = |p: &[u8]| -> anyhow::Result<u64> {
        ds.lookup(p)?
            .with_context(|| format!("{} not found", granary::escape_path(p)))
    };
    let lookup = measure(lookups.len(), &|i| find(&lookups[i]).map(drop))?;
    let cat = measure(cats.len(), &|i| {
        ds.read(find(&cats[i])?).map(drop).map_err(Into::into)
    })?;
    let dirs: Vec<Vec<u8>> = lookups
        .iter()
        .filter_map(|p| p.iter().rposition(|&b| b == b'/').map(|i| p[..=i].to_vec()))
        .collect();
    let dir = measure(dirs.len(), &|i| {
        let r = ds.prefix_range(&dirs[i])?;
        anyhow::ensure!(
            !r.is_empty(),
            "{:?} has no files",
            granary::escape_path(&dirs[i])
        );
        Ok(())
    })?;
    // Lists directory `i`: paths and sample ids, and with `long` each file's size, mode and
    // mtime (all in the namespace entries).
    let listed = std::cell::Cell::new(0u64);
    let list_dir = |i: usize, long: bool| {
        let r = ds.prefix_range(&dirs[i])?;
        let mut pos = r.start;
        while pos < r.end {
            let batch = ds.entries(pos..(pos + (1 << 16)).min(r.end))?;
            anyhow::ensure!(
                !batch.is_empty(),
                "position {pos} of the namespace is missing"
            );
            pos += batch.len() as u64;
            if long {
                for e in &batch {
                    std::hint::black_box((e.size, e.attrs));
                }
            }
        }
        if !long {
            listed.set(listed.get() + r.end - r.start);
        }
        Ok(())
    };
    let lists = dirs.len().min(a.lists as usize);
    let list = measure(lists, &|i| list_dir(i, false))?;
    let list_l = measure(lists, &|i| list_dir(i, true))?;

    // One chunk-wise epoch (its own cold cache).
    let epoch = match a.no_epoch {
        true => serde_json::Value::Null,
        false => measure_epoch(&a)?,
    };
    let v = json!({
        "dataset": a.dataset,
        "samples": ds.len(),
        "chunks": ds.chunk_count(),
        "snapshot_bytes": snapshot_len,
        "paged": paged,
        "open": { "s": open_s, "snapshot_gets": open_gets, "snapshot_bytes": open_bytes },
        "lookup": lookup,
        "cat": cat,
        "dir": dir,
        "list": list,
        "list-l": list_l,
        "listed_paths": listed.get(),
        "epoch": epoch,
    });
    crate::cmd::output(a.json, &v, |v| print_text(&a, v))
}

/// Rank `a.rank`'s share of one chunk-wise epoch, from a cold snapshot cache of its own.
fn measure_epoch(a: &RemoteArgs) -> anyhow::Result<serde_json::Value> {
    let t = Instant::now();
    let (_cache, ds) = open_cold(&a.dataset)?;
    let ds = Arc::new(ds);
    let open_s = t.elapsed().as_secs_f64();
    let reader = ReaderOptions {
        shuffle: ShuffleMode::Chunkwise,
        seed: a.seed,
        rank: a.rank,
        world_size: a.world_size,
        ..ReaderOptions::default()
    }
    .open(&ds)?;
    reader.begin_epoch();
    let setup = reader.setup()?;
    let r = granary::measure_epoch(&ds, &setup, 0, a.rank, a.world_size, a.workers)?;
    Ok(json!({
        "rank": a.rank, "world_size": a.world_size, "workers": a.workers,
        "open_s": open_s,
        "samples": r.samples,
        "first_sample_s": r.first_sample_s,
        "elapsed_s": r.elapsed_s,
        "samples_per_s": r.samples_per_s,
        "bytes_read": r.bytes_read,
        "snapshot_gets": r.snapshot_gets,
        "snapshot_bytes_fetched": r.snapshot_bytes_fetched,
        "peak_rss_bytes": r.peak_rss_bytes,
    }))
}

/// The human-readable report of `v` (what `--json` prints).
fn print_text(a: &RemoteArgs, v: &serde_json::Value) {
    let mb = |x: &serde_json::Value| x.as_f64().unwrap_or(0.0) / 1e6;
    let f = |x: &serde_json::Value| x.as_f64().unwrap_or(0.0);
    println!(
        "{}: {} samples, {} chunks, snapshot {:.1} MB ({})",
        a.dataset,
        v["samples"],
        v["chunks"],
        mb(&v["snapshot_bytes"]),
        match v["paged"].as_bool() {
            Some(true) => "read in blocks",
            _ => "fetched whole",
        }
    );
    let open = &v["open"];
    println!(
        "open:    {:.3} s, {} GETs, {:.3} MB",
        f(&open["s"]),
        open["snapshot_gets"],
        mb(&open["snapshot_bytes"])
    );
    let epoch = &v["epoch"];
    for name in ["lookup", "cat", "dir", "list", "list-l"] {
        let m = &v[name];
        println!(
            "{name:<7}: {:>6.1} ms median ({:.1} max), {} snapshot GETs median ({} max), {:.3} MB median",
            f(&m["ms_median"]),
            f(&m["ms_max"]),
            m["snapshot_gets_median"],
            m["snapshot_gets_max"],
            mb(&m["snapshot_bytes_median"])
        );
    }
    println!("(listed {} paths in all)", v["listed_paths"]);
    if !epoch.is_null() {
        println!(
            "epoch (rank {} of {}, chunk-wise): {} samples, first after {:.3} s, all in {:.2} s; \
             snapshot beyond the chunks: {} GETs, {:.2} MB; peak RSS {:.0} MB",
            a.rank,
            a.world_size,
            epoch["samples"],
            f(&epoch["first_sample_s"]),
            f(&epoch["elapsed_s"]),
            epoch["snapshot_gets"],
            mb(&epoch["snapshot_bytes_fetched"]),
            mb(&epoch["peak_rss_bytes"])
        );
    }
}

/// The dataset at `url` opened with an empty snapshot cache of its own (a temporary directory,
/// removed when the first value is dropped).
fn open_cold(url: &str) -> anyhow::Result<(tempfile::TempDir, Dataset)> {
    let cache = tempfile::tempdir().context("creating a temporary snapshot cache")?;
    let cfg = granary::StoreConfig {
        snapshot_cache: cache.path().to_path_buf(),
        ..crate::cmd::store_config().clone()
    };
    let ds = Dataset::open_with(url, &cfg).with_context(|| format!("opening {url}"))?;
    Ok((cache, ds))
}
