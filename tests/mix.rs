//! Mixtures (`granary read A B C --weights ...`, [`granary::MixReader`]): every source in its
//! share of each epoch, each sample with its source and right bytes, every rank the same
//! count; resumed 2 -> 3 -> 2 ranks and across an appended generation with every sample of
//! the epoch exactly once; bad shares and states refused with a reason.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use granary::{
    Dataset, Interleave, MixReader, MixState, Mixture, ReaderOptions, Shard, Share, SourceSpec,
};

use crate::common::*;

/// A dataset's files: path -> bytes.
type Files = BTreeMap<Vec<u8>, Vec<u8>>;

/// Three datasets of 900, 360 and 150 files; returns their directories and each one's files.
fn three(root: &Path) -> Vec<(PathBuf, Files)> {
    [(900u64, "web"), (360, "books"), (150, "code")]
        .iter()
        .enumerate()
        .map(|(k, &(n, name))| {
            let files: Vec<(Vec<u8>, Vec<u8>)> = (0..n)
                .map(|i| {
                    let p = format!("{name}/c{}/f{i:04}", i % 3).into_bytes();
                    (p, bytes(i * 31 + k as u64, 100 + (i as usize * 37) % 900))
                })
                .collect();
            let src = root.join(format!("src-{name}"));
            write_tree(&src, &files);
            let ds = root.join(format!("{name}.granary"));
            let o = pack(&src, &ds, &["--chunk-size", "16KiB", "--seed", "3"]);
            assert!(o.status.success(), "{}", stderr(&o));
            (ds, files.into_iter().collect())
        })
        .collect()
}

fn reader(paths: &[PathBuf], shares: &[Share], memory: u64) -> MixReader {
    let specs: Vec<SourceSpec> = paths
        .iter()
        .zip(shares)
        .map(|(p, &share)| SourceSpec {
            location: p.clone(),
            share,
        })
        .collect();
    let mix = Mixture::open(&specs, None, |p| Dataset::open(p)).unwrap();
    let config = ReaderOptions {
        memory: Some(memory),
        ..Default::default()
    };
    MixReader::open(Arc::new(mix), &config).unwrap()
}

fn shard(rank: u32, world_size: u32) -> Shard {
    Shard {
        rank,
        world_size,
        worker: 0,
        num_workers: 1,
    }
}

/// What `shard` delivers of `epoch` (after `resume`), at most `stop` samples: (source, path),
/// each sample's bytes checked against its source's files.
fn read(
    r: &MixReader,
    epoch: u64,
    s: Shard,
    resume: Option<&MixState>,
    stop: usize,
    files: &[Files],
) -> Vec<(u32, Vec<u8>)> {
    let mut out = Vec::new();
    for x in r.stream(epoch, s, resume).unwrap().take(stop) {
        let x = x.unwrap();
        let ds = r.mixture().dataset(x.source as usize);
        let path = ds.path(x.id).unwrap();
        assert_eq!(x.data(), &files[x.source as usize][&path][..]);
        out.push((x.source, path));
    }
    out
}

/// A step k in `steps` after which, every rank of `from` stopping there (ranks go in
/// lockstep), what is left of every source of `epoch` divides by `to` (otherwise the equal cut
/// drops fewer than `to` samples of it, as for one dataset).
fn step_whose_rest_divides(
    r: &MixReader,
    epoch: u64,
    from: u32,
    to: u32,
    steps: std::ops::Range<u64>,
) -> u64 {
    let parts: Vec<u64> = r
        .plan(epoch, shard(0, from), None)
        .unwrap()
        .parts
        .iter()
        .map(|p| p.len() as u64)
        .collect();
    steps
        .into_iter()
        .find(|&k| {
            let after = Interleave::counts_after(&parts, k);
            parts
                .iter()
                .zip(&after)
                .all(|(c, a)| (u64::from(from) * (c - a)) % u64::from(to) == 0)
        })
        .expect("a step whose rest divides")
}

fn counted(v: impl IntoIterator<Item = (u32, Vec<u8>)>) -> BTreeMap<(u32, Vec<u8>), u32> {
    let mut m = BTreeMap::new();
    for x in v {
        *m.entry(x).or_insert(0) += 1;
    }
    m
}

#[test]
fn a_mixture_reads_each_sources_share_with_its_bytes_and_digest() {
    let tmp = tempfile::tempdir().unwrap();
    let sets = three(tmp.path());
    let paths: Vec<PathBuf> = sets.iter().map(|s| s.0.clone()).collect();
    let p: Vec<&std::ffi::OsStr> = paths.iter().map(|p| p.as_os_str()).collect();
    // Weights: 1410 samples an epoch, 705 / 423 / 282, split over 2 ranks x 2 workers.
    let mut args = vec!["read".as_ref(), p[0], p[1], p[2]];
    args.extend(
        [
            "--weights",
            "0.5,0.3,0.2",
            "--json",
            "--world-size",
            "2",
            "--workers",
            "2",
        ]
        .map(std::ffi::OsStr::new),
    );
    let mut per_rank = Vec::new();
    for rank in ["0", "1"] {
        let mut a = args.clone();
        a.extend(["--rank", rank].map(std::ffi::OsStr::new));
        let j: serde_json::Value = serde_json::from_slice(&run_ok(&a).stdout).unwrap();
        let got: Vec<u64> = j[0]["sources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["samples"].as_u64().unwrap())
            .collect();
        per_rank.push(got);
    }
    assert_eq!(
        per_rank[0], per_rank[1],
        "every rank the same count of every source"
    );
    assert_eq!(
        per_rank[0],
        vec![352, 211, 141],
        "half of 705 / 423 / 282, cut per rank"
    );
    // Repeat 1 each (several datasets, no weights): each source's digests over the ranks add
    // up to its `granary verify` digest: every sample once, right bytes.
    let mut sums = [0u64; 3];
    for rank in ["0", "1"] {
        let mut a = vec!["read".as_ref(), p[0], p[1], p[2]];
        a.extend(
            [
                "--json",
                "--world-size",
                "2",
                "--workers",
                "2",
                "--shuffle",
                "global",
                "--rank",
                rank,
            ]
            .map(std::ffi::OsStr::new),
        );
        let j: serde_json::Value = serde_json::from_slice(&run_ok(&a).stdout).unwrap();
        for (i, s) in j[0]["sources"].as_array().unwrap().iter().enumerate() {
            let d = u64::from_str_radix(s["digest"].as_str().unwrap(), 16).unwrap();
            sums[i] = sums[i].wrapping_add(d);
        }
    }
    for (i, ds) in paths.iter().enumerate() {
        let v = stdout(&run_ok(["verify".as_ref(), ds.as_os_str()]));
        assert!(v.contains(&format!("{:016x}", sums[i])), "source {i}: {v}");
    }
    // Through the library: samples carry their source and their bytes, repeat/choose counts.
    let files: Vec<_> = sets.iter().map(|s| s.1.clone()).collect();
    let r = reader(
        &paths,
        &[Share::Repeat(0.5), Share::Repeat(2.0), Share::Choose(100)],
        8 << 20,
    );
    let got = counted(read(&r, 1, Shard::WHOLE, None, usize::MAX, &files));
    let per_source = |i: u32| -> (usize, u32) {
        let mine: Vec<u32> = got
            .iter()
            .filter(|(k, _)| k.0 == i)
            .map(|(_, &c)| c)
            .collect();
        (mine.len(), mine.iter().sum())
    };
    assert_eq!(per_source(0), (450, 450), "half of web, each sample once");
    assert_eq!(per_source(1), (360, 720), "books twice");
    assert_eq!(per_source(2), (100, 100), "100 of code");
    // Each source reads with the budget it has alone (its window is the one it gets alone),
    // the shard's streams sharing a pool of that budget per source.
    assert_eq!(r.memory(), 3 * (8 << 20));
    for (i, s) in r.plan_sources().unwrap().iter().enumerate() {
        let alone = Dataset::open(&paths[i]).unwrap().window_for_memory(8 << 20);
        assert_eq!(s.options.window_chunks, alone.unwrap(), "source {i}");
    }
    // The plan shows each source's share per epoch and per rank.
    let mut a = vec!["plan".as_ref(), p[0], p[1], p[2]];
    a.extend(["--weights", "5,3,2", "--world-size", "3", "--json"].map(std::ffi::OsStr::new));
    let j: serde_json::Value = serde_json::from_slice(&run_ok(&a).stdout).unwrap();
    let counts: Vec<u64> = j["sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["epoch_count"].as_u64().unwrap())
        .collect();
    assert_eq!(counts, vec![705, 423, 282]);
    for s in j["shares"].as_array().unwrap() {
        assert_eq!(s["per_source"], serde_json::json!([235, 141, 94]), "{s}");
    }
}

/// A checkpoint at 2 ranks resumed at 3 (epoch 0), one at 3 resumed at 2 (epoch 1), and one
/// taken before a source gained a generation: each epoch's samples exactly once.
#[test]
fn a_mixture_resumes_exactly_across_world_sizes_and_generations() {
    let tmp = tempfile::tempdir().unwrap();
    let sets = three(tmp.path());
    let paths: Vec<PathBuf> = sets.iter().map(|s| s.0.clone()).collect();
    let files: Vec<_> = sets.iter().map(|s| s.1.clone()).collect();
    let shares = [Share::Weight(0.5), Share::Weight(0.3), Share::Weight(0.2)];
    let r = reader(&paths, &shares, 4 << 20);
    for (epoch, from, to) in [(0u64, 2u32, 3u32), (1, 3, 2)] {
        let whole = counted(
            (0..from).flat_map(|k| read(&r, epoch, shard(k, from), None, usize::MAX, &files)),
        );
        // Every rank stops after the same step k.
        let k = step_whose_rest_divides(&r, epoch, from, to, 100..400);
        let mut got = Vec::new();
        let mut st = r.state(epoch, from, 1).unwrap();
        for rank in 0..from {
            got.extend(read(&r, epoch, shard(rank, from), None, k as usize, &files));
            st.consumed[rank as usize] = k;
        }
        for rank in 0..to {
            got.extend(read(
                &r,
                epoch,
                shard(rank, to),
                Some(&st),
                usize::MAX,
                &files,
            ));
        }
        assert_eq!(
            counted(got),
            whole,
            "epoch {epoch}: {from} -> {to} ranks after {k} steps"
        );
    }
    // A checkpoint of epoch 2; then books gains a generation and the weights change. The
    // resumed epoch is the one checkpointed (old weights, old samples); the next one has the
    // new samples and weights.
    let whole = counted(read(&r, 2, Shard::WHOLE, None, usize::MAX, &files));
    let mut st = r.state(2, 1, 1).unwrap();
    let first = read(&r, 2, Shard::WHOLE, None, 300, &files);
    st.consumed[0] = 300;
    let more: Vec<(Vec<u8>, Vec<u8>)> = (0..40u64)
        .map(|i| {
            (
                format!("books/c0/new{i:03}").into_bytes(),
                bytes(9000 + i, 300),
            )
        })
        .collect();
    let add = tmp.path().join("src-new");
    write_tree(&add, &more);
    run_ok(["append".as_ref(), paths[1].as_os_str(), add.as_os_str()]);
    let mut files2 = files.clone();
    files2[1].extend(more.iter().cloned());
    let r2 = reader(
        &paths,
        &[Share::Weight(0.2), Share::Weight(0.6), Share::Weight(0.2)],
        4 << 20,
    );
    let rest = read(&r2, 2, Shard::WHOLE, Some(&st), usize::MAX, &files2);
    assert_eq!(
        counted(first.into_iter().chain(rest)),
        whole,
        "the checkpointed epoch"
    );
    let next = counted(read(&r2, 3, Shard::WHOLE, None, usize::MAX, &files2));
    let books: u32 = next.iter().filter(|(k, _)| k.0 == 1).map(|(_, c)| c).sum();
    assert_eq!(
        books, 870,
        "0.6 of 900 + 400 + 150, the new generation included"
    );
    assert!(next
        .keys()
        .any(|k| k.0 == 1 && k.1.starts_with(b"books/c0/new")));
    // A state of another mixture is refused.
    let mut other = st.clone();
    other.sources.swap(0, 2);
    let e = r2
        .stream(2, Shard::WHOLE, Some(&other))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("source 0 was dataset"), "{e}");
}

#[test]
fn bad_mixtures_are_refused_with_a_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let sets = three(tmp.path());
    let p: Vec<&std::ffi::OsStr> = sets.iter().map(|s| s.0.as_os_str()).collect();
    let fails = |args: &[&std::ffi::OsStr], want: &str| {
        let o = run(args);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    };
    let w = |s: &'static str| std::ffi::OsStr::new(s);
    fails(
        &[w("read"), p[0], p[1], w("--weights"), w("0.5,-0.5")],
        "weight=-0.5 is not a positive number",
    );
    fails(
        &[w("read"), p[0], p[1], w("--weights"), w("0.5,nan")],
        "weight=NaN is not a positive number",
    );
    fails(
        &[w("read"), p[0], p[1], w("--weights"), w("0,1")],
        "weight=0 is not a positive number",
    );
    fails(
        &[w("read"), p[0], p[1], w("--weights"), w("0.5")],
        "1 shares for 2 datasets",
    );
    fails(
        &[w("read"), p[0], p[1], w("--weights"), w("0.5,repeat=1")],
        "every source a weight, or none",
    );
    fails(
        &[w("read"), p[0], p[1], w("--weights"), w("0.5,lots")],
        "not a number",
    );
    fails(&[w("read"), p[0], p[0]], "the same samples of one dataset");
    fails(
        &[w("read"), p[0], w("--epoch-size"), w("10")],
        "--epoch-size goes with a weighted mixture",
    );
    fails(
        &[w("read"), p[0], p[1], w("--locality"), w("0.5")],
        "not supported for mixtures yet",
    );
    fails(
        &[w("read"), p[0], p[1], w("--prices"), w("1,1")],
        "the bill of a mixture",
    );
    fails(
        &[w("plan"), p[0], p[1], w("--bill")],
        "the bill of a mixture",
    );
    let file = tmp.path().join("blend.txt");
    std::fs::write(
        &file,
        "web.granary weight=0.7\n# books\nbooks.granary sometimes=3\n",
    )
    .unwrap();
    fails(
        &[w("read"), w("--mixture"), file.as_os_str()],
        "blend.txt:3: unknown share",
    );
    std::fs::write(&file, "# nothing\n").unwrap();
    fails(
        &[w("read"), w("--mixture"), file.as_os_str()],
        "names no source",
    );
    // A good file, relative to its directory, with an epoch size.
    std::fs::write(
        &file,
        "web.granary weight=0.7\nbooks.granary 0.3  # comment\nepoch-size 1000\n",
    )
    .unwrap();
    let j: serde_json::Value = serde_json::from_slice(
        &run_ok([w("read"), w("--mixture"), file.as_os_str(), w("--json")]).stdout,
    )
    .unwrap();
    let counts: Vec<u64> = j[0]["sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["samples"].as_u64().unwrap())
        .collect();
    assert_eq!(counts, vec![700, 300]);
}

/// Views are sources like datasets: two views of one dataset (disjoint prefixes) and another
/// dataset, each sample from its own view, the same view twice refused.
#[test]
fn views_are_sources_of_a_mixture() {
    let tmp = tempfile::tempdir().unwrap();
    let sets = three(tmp.path());
    let files: Vec<Files> = vec![sets[0].1.clone(), sets[0].1.clone(), sets[1].1.clone()];
    let mut paths = Vec::new();
    for prefix in ["web/c0/", "web/c1/"] {
        let v = tmp.path().join(format!("{}.gview", &prefix[4..6]));
        run_ok([
            "view".as_ref(),
            sets[0].0.as_os_str(),
            "-o".as_ref(),
            v.as_os_str(),
            "--prefix".as_ref(),
            std::ffi::OsStr::new(prefix),
        ]);
        paths.push(v);
    }
    paths.push(sets[1].0.clone());
    let shares = [Share::Repeat(1.0), Share::Choose(50), Share::Repeat(0.5)];
    let r = reader(&paths, &shares, 4 << 20);
    let got = counted(read(&r, 0, Shard::WHOLE, None, usize::MAX, &files));
    let of = |s: u32| got.keys().filter(|k| k.0 == s).collect::<Vec<_>>();
    assert_eq!(of(0).len(), 300);
    assert!(of(0).iter().all(|k| k.1.starts_with(b"web/c0/")));
    assert_eq!(of(1).len(), 50);
    assert!(of(1).iter().all(|k| k.1.starts_with(b"web/c1/")));
    assert_eq!(of(2).len(), 180);
    assert!(got.values().all(|&c| c == 1));
    let p: Vec<&std::ffi::OsStr> = paths.iter().map(|p| p.as_os_str()).collect();
    let o = run(["read".as_ref(), p[0], p[0]]);
    assert!(
        stderr(&o).contains("the same samples of one dataset"),
        "{}",
        stderr(&o)
    );
}

/// Importance sampling per source: each source draws its epoch count by the score table next
/// to its own tier, favouring its high-score samples, with loss weights 1/(N p).
#[test]
fn importance_sampling_works_per_source() {
    let tmp = tempfile::tempdir().unwrap();
    let sets = three(tmp.path());
    let paths: Vec<PathBuf> = sets[..2].iter().map(|s| s.0.clone()).collect();
    let tier = tmp.path().join("tier");
    // Each source's table: its samples under c0/ score 100 times the others.
    for p in &paths {
        let ds = Dataset::open(p).unwrap();
        let t = granary::LocalTier::open(
            &tier,
            ds.snapshot().dataset_id(),
            64 << 20,
            granary::TierPolicy::Static,
        )
        .unwrap();
        // Scores set directly (as report() leaves them after training): c0 100, others 1.
        let mut s = granary::ImportanceScores::new(ds.len(), 0.0);
        let scores: Vec<(u64, f32)> = (0..ds.len())
            .map(|i| {
                let c0 = ds.path(i).unwrap().windows(3).any(|w| w == b"/c0");
                (i, if c0 { 100.0 } else { 1.0 })
            })
            .collect();
        s.apply(&scores);
        s.save(&t.scores_path()).unwrap();
    }
    let specs: Vec<SourceSpec> = paths
        .iter()
        .zip([Share::Weight(0.6), Share::Weight(0.4)])
        .map(|(p, share)| SourceSpec {
            location: p.clone(),
            share,
        })
        .collect();
    let mix = Mixture::open(&specs, None, |p| Dataset::open(p)).unwrap();
    let config = ReaderOptions {
        memory: Some(4 << 20),
        cache_dir: Some(tier.clone()),
        cache_size: Some(128 << 20),
        policy: granary::TierPolicy::Static,
        sampling: granary::SamplingKind::Importance,
        alpha: 0.8,
        cache_boost: 1.0,
        ..Default::default()
    };
    let r = MixReader::open(Arc::new(mix), &config).unwrap();
    let mut per = [0u64; 2];
    let mut c0 = [0u64; 2];
    let mut weights = Vec::new();
    for x in r.stream(0, Shard::WHOLE, None).unwrap() {
        let x = x.unwrap();
        let s = x.source as usize;
        per[s] += 1;
        let path = r.mixture().dataset(s).path(x.id).unwrap();
        if path.windows(3).any(|w| w == b"/c0") {
            c0[s] += 1;
        }
        weights.push(x.weight);
    }
    // 1260 samples an epoch: 756 / 504 draws; c0 holds a third of each source's samples but
    // draws most of its samples.
    assert_eq!(per, [756, 504]);
    for s in 0..2 {
        assert!(
            c0[s] as f64 > 0.6 * per[s] as f64,
            "source {s}: {c0:?} of {per:?}"
        );
    }
    assert!(
        weights.iter().any(|&w| w < 0.5) && weights.iter().any(|&w| w > 1.5),
        "{weights:?}"
    );
    // One score file for every source is refused.
    let mut one = config.clone();
    one.scores = Some(tmp.path().join("s.bin"));
    let mix = Mixture::open(&specs, None, |p| Dataset::open(p)).unwrap();
    let e = MixReader::open(Arc::new(mix), &one)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("score tables next to their tiers"), "{e}");
}

/// A view as a mixture's source, through two resumes: checkpointed at 2 ranks, resumed at 3,
/// checkpointed again there (`then`) and resumed at 3 once more; every sample of the epoch
/// exactly once, with its bytes.
#[test]
fn a_view_in_a_mixture_resumes_twice_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let sets = three(tmp.path());
    let v = tmp.path().join("c0.gview");
    run_ok([
        "view".as_ref(),
        sets[0].0.as_os_str(),
        "-o".as_ref(),
        v.as_os_str(),
        "--prefix".as_ref(),
        std::ffi::OsStr::new("web/c0/"),
    ]);
    let paths = vec![v, sets[1].0.clone()];
    let files: Vec<Files> = vec![sets[0].1.clone(), sets[1].1.clone()];
    let r = reader(&paths, &[Share::Repeat(1.0), Share::Repeat(1.0)], 4 << 20);
    let whole = counted((0..2).flat_map(|k| read(&r, 0, shard(k, 2), None, usize::MAX, &files)));
    let k = step_whose_rest_divides(&r, 0, 2, 3, 50..200);
    let mut got = Vec::new();
    let mut st = r.state(0, 2, 1).unwrap();
    for rank in 0..2 {
        got.extend(read(&r, 0, shard(rank, 2), None, k as usize, &files));
        st.consumed[rank as usize] = k;
    }
    // Resumed at 3 ranks, each reads 37 samples, and the epoch is checkpointed there.
    for rank in 0..3 {
        got.extend(read(&r, 0, shard(rank, 3), Some(&st), 37, &files));
    }
    st.then = Some(granary::Continued {
        world_size: 3,
        num_workers: 1,
        consumed: vec![37; 3],
    });
    for rank in 0..3 {
        // The plan's first window names the chunks its samples are in (a view's samples are
        // dataset ids, not positions in the view).
        let plan = r.plan(0, shard(rank, 3), Some(&st)).unwrap();
        for (i, part) in plan.parts.iter().enumerate() {
            let Some(w) = part.windows.first() else {
                continue;
            };
            let ds = r.mixture().dataset(i);
            let mut cs: Vec<u32> = part.samples[w.range.clone()]
                .iter()
                .map(|&id| ds.sample(id).unwrap().entry.chunk)
                .collect();
            cs.sort_unstable();
            cs.dedup();
            assert_eq!(w.chunks, cs, "rank {rank}, source {i}");
        }
        got.extend(read(&r, 0, shard(rank, 3), Some(&st), usize::MAX, &files));
    }
    assert_eq!(counted(got), whole);
}
