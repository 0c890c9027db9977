//! Views (`granary view`): a subset of a dataset chosen once and read like a dataset - every
//! selected sample exactly once on any ranks and workers, across a resume on another world
//! size - and refused against another dataset or generation, or when damaged.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use granary::{Dataset, EpochPlan, EpochState, PlanOptions, Shard, ShuffleMode, StreamOptions};

use crate::common::*;

/// 600 files in 5 class directories, `.jpg` and `.txt` alternating.
fn tree() -> Vec<(Vec<u8>, Vec<u8>)> {
    (0..600u64)
        .map(|i| {
            let ext = if i % 2 == 0 { "jpg" } else { "txt" };
            let path = format!("class{}/sub{}/f{i:04}.{ext}", i % 5, i % 3);
            (path.into_bytes(), bytes(i, 200 + (i as usize * 53) % 3000))
        })
        .collect()
}

fn view(ds: &Path, out: &Path, args: &[&str]) -> std::process::Output {
    let mut a: Vec<&std::ffi::OsStr> = vec![
        "view".as_ref(),
        ds.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ];
    a.extend(args.iter().map(std::ffi::OsStr::new));
    run(a)
}

/// Every sample `shard`'s stream of epoch `epoch` delivers (resumed after `resume`), checked
/// against the source bytes.
fn delivered(
    ds: &Arc<Dataset>,
    o: &PlanOptions,
    shard: Shard,
    resume: Option<&EpochState>,
    want: &BTreeMap<Vec<u8>, Vec<u8>>,
) -> Vec<u64> {
    let s = ds
        .stream_epoch(o, 0, shard, resume, &StreamOptions::default())
        .unwrap();
    let mut ids = Vec::new();
    for x in s {
        let x = x.unwrap();
        assert_eq!(
            x.data(),
            &want[&ds.path(x.id).unwrap()][..],
            "sample {}",
            x.id
        );
        ids.push(x.id);
    }
    ids
}

#[test]
fn a_view_reads_its_samples_exactly_once_on_any_shards_and_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let files = tree();
    write_tree(&src, &files);
    let want: BTreeMap<Vec<u8>, Vec<u8>> = files.iter().cloned().collect();
    let ds_path = tmp.path().join("ds");
    assert!(
        pack(&src, &ds_path, &["--chunk-size", "32KiB", "--seed", "5"])
            .status
            .success()
    );
    let v = tmp.path().join("views/pets.gview");
    std::fs::create_dir_all(v.parent().unwrap()).unwrap();
    let o = view(
        &ds_path,
        &v,
        &["--class", "class1,class3", "--glob", "**/*.jpg", "--json"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // The view names its dataset relative to itself.
    assert_eq!(j["dataset"], "../ds");
    let full = Dataset::open(&ds_path).unwrap();
    let expect: Vec<u64> = (0..full.len())
        .filter(|&id| {
            let p = String::from_utf8(full.path(id).unwrap()).unwrap();
            (p.starts_with("class1/") || p.starts_with("class3/")) && p.ends_with(".jpg")
        })
        .collect();
    assert_eq!(j["selected"], expect.len() as u64);
    assert_eq!(expect.len(), 120);
    let ds = Arc::new(Dataset::open(&v).unwrap());
    assert_eq!(&ds.view().unwrap().ids[..], &expect[..]);
    for mode in [
        ShuffleMode::Chunkwise,
        ShuffleMode::Global,
        ShuffleMode::Sequential,
    ] {
        let o = PlanOptions {
            mode,
            seed: 9,
            window_chunks: 3,
            ..PlanOptions::default()
        };
        for (world, workers) in [(1, 1), (3, 2)] {
            let mut got = Vec::new();
            for rank in 0..world {
                for worker in 0..workers {
                    let s = Shard {
                        rank,
                        world_size: world,
                        worker,
                        num_workers: workers,
                    };
                    got.extend(delivered(&ds, &o, s, None, &want));
                }
            }
            got.sort_unstable();
            assert_eq!(got, expect, "{mode:?} on {world} x {workers}");
        }
        // Two ranks read part of the epoch; three ranks finish it: each sample once.
        let two = |rank| Shard {
            rank,
            world_size: 2,
            worker: 0,
            num_workers: 1,
        };
        let plans: Vec<EpochPlan> = (0..2)
            .map(|r| EpochPlan::build(&ds.shape().unwrap(), &o, 0, two(r), None).unwrap())
            .collect();
        let consumed = vec![17u64, 40];
        let mut got: Vec<u64> = plans
            .iter()
            .zip(&consumed)
            .flat_map(|(p, &n)| p.samples[..n as usize].to_vec())
            .collect();
        let st = EpochState {
            epoch: 0,
            world_size: 2,
            num_workers: 1,
            consumed,
            column: None,
            then: None,
            chunks: None,
        };
        for rank in 0..3 {
            let s = Shard {
                rank,
                world_size: 3,
                worker: 0,
                num_workers: 1,
            };
            got.extend(delivered(&ds, &o, s, Some(&st), &want));
        }
        got.sort_unstable();
        assert_eq!(got, expect, "{mode:?}: resumed 2 -> 3 ranks");
    }
    // The command line reads and plans a view as it does a dataset.
    let r = run_ok(["read".as_ref(), v.as_os_str(), "--json".as_ref()]);
    let r: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!(r[0]["samples"], 120);
    let delivered: u64 = expect
        .iter()
        .map(|&i| full.sample(i).unwrap().entry.stored_len)
        .sum();
    assert_eq!(r[0]["bytes"], delivered);
    let p = run_ok([
        "plan".as_ref(),
        v.as_os_str(),
        "--world-size".as_ref(),
        "4".as_ref(),
        "--json".as_ref(),
    ]);
    let p: serde_json::Value = serde_json::from_slice(&p.stdout).unwrap();
    // The plan says what the epoch reads, as the read then measures.
    assert_eq!(p["view_reads"]["read"], r[0]["bytes_read"], "{p}");
    assert_eq!(p["view_reads"]["delivered"], delivered);
    assert_eq!(
        (
            p["samples"].clone(),
            p["delivered"].clone(),
            p["repeats"].clone()
        ),
        (120.into(), 120.into(), 0.into())
    );
    // ls, cat and extract see the view's samples only (the mount: tests/mount.rs).
    let mut paths: Vec<Vec<u8>> = expect.iter().map(|&i| full.path(i).unwrap()).collect();
    paths.sort();
    let ls = run_ok(["ls".as_ref(), v.as_os_str()]);
    let listed: Vec<Vec<u8>> = ls
        .stdout
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    assert_eq!(listed, paths);
    let one = String::from_utf8(paths[0].clone()).unwrap();
    let c = run_ok(["cat", v.to_str().unwrap(), &one]);
    assert_eq!(c.stdout, want[&paths[0]]);
    let other = String::from_utf8(full.path(0).unwrap()).unwrap();
    assert!(!expect.contains(&0));
    assert!(!run(["cat", v.to_str().unwrap(), &other]).status.success());
    let out = tmp.path().join("extracted");
    let got = extracted(&v, &out);
    assert_eq!(
        got,
        paths
            .iter()
            .map(|p| (p.clone(), want[p].clone()))
            .collect::<Vec<_>>()
    );
    // Other criteria: a prefix, ids and paths from files, intersected.
    let ids = tmp.path().join("ids.txt");
    std::fs::write(&ids, "0\n1\n2\n3\n4\n5\n599\n").unwrap();
    let v2 = tmp.path().join("few.gview");
    let o = view(
        &ds_path,
        &v2,
        &[
            "--ids-from",
            ids.to_str().unwrap(),
            "--prefix",
            "class0/",
            "--json",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let few = Dataset::open(&v2).unwrap();
    let paths: Vec<String> = few
        .view()
        .unwrap()
        .ids
        .iter()
        .map(|&i| String::from_utf8(few.path(i).unwrap()).unwrap())
        .collect();
    assert!(
        !paths.is_empty() && paths.iter().all(|p| p.starts_with("class0/")),
        "{paths:?}"
    );
    let list = tmp.path().join("paths.txt");
    std::fs::write(
        &list,
        format!("{}\n{}\n", paths[0], "class2/sub0/f0012.jpg"),
    )
    .unwrap();
    let v3 = tmp.path().join("two.gview");
    assert!(
        view(&ds_path, &v3, &["--paths-from", list.to_str().unwrap()])
            .status
            .success()
    );
    assert_eq!(Dataset::open(&v3).unwrap().view().unwrap().ids.len(), 2);
}

#[test]
fn views_are_refused_against_another_dataset_or_generation_and_when_damaged() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &tree());
    let ds = tmp.path().join("ds");
    assert!(pack(&src, &ds, &["--chunk-size", "32KiB"]).status.success());
    let v = tmp.path().join("v.gview");
    assert!(view(&ds, &v, &["--class", "class2"]).status.success());
    let good = std::fs::read(&v).unwrap();
    // Bad criteria: each named, nothing written.
    let other = tmp.path().join("other.gview");
    for (args, says) in [
        (&["--class", "nope"][..], "no class \"nope\""),
        (&[][..], "nothing to select by"),
        (&["--glob", "*.png"][..], "selects no sample"),
        (&["--ids-from", "/nonexistent/ids"][..], "reading"),
    ] {
        let o = view(&ds, &other, args);
        assert!(
            !o.status.success() && stderr(&o).contains(says),
            "{args:?}: {}",
            stderr(&o)
        );
        assert!(!other.exists());
    }
    assert!(stderr(&view(&ds, &v, &["--class", "class1"])).contains("--force"));
    // A damaged view file: every cut and a flipped byte refused by name.
    for cut in [0, 7, 30, good.len() / 2, good.len() - 1] {
        std::fs::write(&v, &good[..cut]).unwrap();
        assert!(Dataset::open(&v).is_err(), "cut at {cut}");
    }
    let mut bad = good.clone();
    bad[good.len() / 2] ^= 0x04;
    std::fs::write(&v, &bad).unwrap();
    let o = run(["read".as_ref(), v.as_os_str()]);
    assert!(
        !o.status.success() && stderr(&o).contains("view file"),
        "{}",
        stderr(&o)
    );
    // Another generation of the dataset: its ids may name other samples.
    std::fs::write(&v, &good).unwrap();
    assert!(Dataset::open(&v).is_ok());
    let more = tmp.path().join("more");
    write_tree(&more, &[(b"class2/new.jpg".to_vec(), b"new".to_vec())]);
    run_ok(["append".as_ref(), ds.as_os_str(), more.as_os_str()]);
    let err = Dataset::open(&v).unwrap_err().to_string();
    assert!(
        err.contains("a stale view")
            && err.contains("generation 1")
            && err.contains("make the view again"),
        "{err}"
    );
    // The commands say it is stale (not damaged), and verify counts it as a problem (exit 1).
    let o = run(["read".as_ref(), v.as_os_str()]);
    assert!(!stderr(&o).contains("damaged"), "{}", stderr(&o));
    assert!(stderr(&o).contains("a stale view"), "{}", stderr(&o));
    assert_eq!(
        run(["verify".as_ref(), v.as_os_str()]).status.code(),
        Some(1)
    );
    // Another dataset at the same place.
    std::fs::remove_dir_all(&ds).unwrap();
    assert!(pack(&src, &ds, &["--chunk-size", "32KiB"]).status.success());
    let err = Dataset::open(&v).unwrap_err().to_string();
    assert!(err.contains("make the view again"), "{err}");
}

/// A view keeping a few large records of each chunk reads ranges around them (not the chunks),
/// delivers the right bytes, and `plan` predicts the bytes the read then counts.
#[test]
fn a_sparse_view_reads_ranges_around_its_records() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let files: Vec<(Vec<u8>, Vec<u8>)> = (0..60u64)
        .map(|i| (format!("d/f{i:03}.bin").into_bytes(), bytes(i, 80 << 10)))
        .collect();
    write_tree(&src, &files);
    let want: BTreeMap<Vec<u8>, Vec<u8>> = files.iter().cloned().collect();
    let ds_path = tmp.path().join("ds");
    assert!(pack(&src, &ds_path, &["--chunk-size", "1MiB"])
        .status
        .success());
    let ids = tmp.path().join("ids.txt");
    std::fs::write(
        &ids,
        (0..60)
            .step_by(7)
            .map(|i| format!("{i}\n"))
            .collect::<String>(),
    )
    .unwrap();
    let v = tmp.path().join("sparse.gview");
    assert!(view(&ds_path, &v, &["--ids-from", ids.to_str().unwrap()])
        .status
        .success());
    let ds = Arc::new(Dataset::open(&v).unwrap());
    let o = PlanOptions::default();
    let mut got = delivered(&ds, &o, Shard::WHOLE, None, &want);
    got.sort_unstable();
    assert_eq!(got, (0..60).step_by(7).collect::<Vec<u64>>());
    let r = run_ok(["read".as_ref(), v.as_os_str(), "--json".as_ref()]);
    let r: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    let (read, delivered) = (
        r[0]["bytes_read"].as_u64().unwrap(),
        r[0]["bytes"].as_u64().unwrap(),
    );
    // Nine records of 80 KiB, and a header per chunk: not the 4.7 MiB of chunks.
    assert!(read < delivered + 64 * 8, "{read} read for {delivered}");
    let p = run_ok(["plan".as_ref(), v.as_os_str(), "--json".as_ref()]);
    let p: serde_json::Value = serde_json::from_slice(&p.stdout).unwrap();
    assert_eq!(p["view_reads"]["read"], read, "{p}");
    assert!(p["view_reads"]["chunks_in_ranges"].as_u64().unwrap() > 0);
}

/// A view file moved away from its dataset (it names it by a relative path) says so, not that
/// it is damaged.
#[test]
fn a_view_moved_away_from_its_dataset_says_why_it_cannot_be_read() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = packed_tree(
        &tmp.path().join("src"),
        &tree(),
        &tmp.path().join("ds"),
        &[],
    );
    let v = tmp.path().join("v.gview");
    let o = view(&ds, &v, &["--class", "class1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let moved = tmp.path().join("sub");
    std::fs::create_dir_all(&moved).unwrap();
    std::fs::copy(&v, moved.join("v.gview")).unwrap();
    let o = run(["read".as_ref(), moved.join("v.gview").as_os_str()]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("names its dataset by a path relative to itself")
            && !stderr(&o).contains("damaged"),
        "{}",
        stderr(&o)
    );
}
