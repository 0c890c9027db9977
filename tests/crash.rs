//! The kill-and-race harness: every command that writes is run once to list the points where
//! it creates, writes, fsyncs, renames or removes what it publishes
//! (`granary_store::write::crash_point`, `GRANARY_CRASH_LOG`), then killed (SIGKILL, nothing
//! cleaned up) at each of those points in turn (`GRANARY_CRASH_AT`). After each kill what it
//! wrote is the old state or the new one, whole and verified; the same command run again
//! reaches the new state and leaves nothing behind (no temporary file, no build or old
//! directory). Then two copies are run at once: each ends in success or a clear refusal, and
//! the result is the new state, verified, with nothing left behind. Models: SQLite's crash
//! tests, ALICE and CrashMonkey.

use std::ffi::{OsStr, OsString};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common::*;

/// Arguments of a command played in directory `d`.
type Args = Box<dyn Fn(&Path) -> Vec<OsString>>;
/// What `d` holds now, as a label; `Err` when it is neither whole nor absent.
type State = Box<dyn Fn(&Path) -> Result<String, String>>;
/// Directories under `d`.
type Places = Box<dyn Fn(&Path) -> Vec<PathBuf>>;

/// One writing command, played in a fresh directory each time.
struct Case {
    name: &'static str,
    /// Prepares directory `d` (the old state) and returns the command's arguments.
    setup: Args,
    /// What `d` holds now, as a label (a dataset by its content digest); `Err` when it is
    /// neither whole nor absent (damage, a half-written file).
    state: State,
    /// The arguments that finish the command after a kill (the same command, told to resume
    /// or start over where it keeps work).
    recover: Args,
    /// Where what it wrote lives, searched for leftovers.
    places: Places,
}

fn os(args: &[&dyn AsRef<OsStr>]) -> Vec<OsString> {
    args.iter().map(|a| a.as_ref().to_os_string()).collect()
}

fn run_env(args: &[OsString], env: &[(&str, &OsStr)]) -> Output {
    let mut c = granary();
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("granary runs")
}

/// A dataset's state: absent ("none"), or its content digest when every check passes, or
/// "1.x" for an intact dataset of format 1.x.
fn dataset_state(ds: &Path) -> Result<String, String> {
    if !ds.join(granary_format::SNAPSHOT_FILE).exists() {
        return Ok("none".into());
    }
    let o = run(["verify".as_ref(), ds.as_os_str(), "--json".as_ref()]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .map_err(|e| format!("verify printed no report ({e}): {}", stderr(&o)))?;
    match o.status.code() {
        Some(0) => Ok(format!(
            "content {}",
            v["samples_digest"].as_str().unwrap_or("?")
        )),
        Some(3) => Ok("1.x".into()),
        _ => Err(format!("{}: not intact: {v}", ds.display())),
    }
}

/// Names under `places` (two levels down) that a finished command must not leave: temporary
/// files, build and moved-aside directories, crash logs aside.
fn leftovers(places: &[PathBuf]) -> Vec<String> {
    let mut found = Vec::new();
    let mut look = |p: &Path| {
        let Ok(rd) = std::fs::read_dir(p) else { return };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let stray = granary_store::write::temp_target(&name).is_some()
                || name.ends_with(".tmp")
                || name.ends_with(".partial")
                || name.contains(".old-");
            if stray {
                found.push(e.path().display().to_string());
            }
        }
    };
    for p in places {
        look(p);
        if let Ok(rd) = std::fs::read_dir(p) {
            for e in rd.flatten().filter(|e| e.path().is_dir()) {
                look(&e.path());
            }
        }
    }
    found
}

/// Runs `case` clean, then killed at each of its crash points, then two at once; returns
/// (crash points, concurrent runs).
fn exercise(case: &Case) -> (usize, usize) {
    let what = case.name;
    // Clean: the old and the new state, and the crash points passed on the way.
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    let args = (case.setup)(d);
    let old = (case.state)(d).unwrap_or_else(|e| panic!("{what}: old state: {e}"));
    let log = d.join("crash.log");
    let o = run_env(&args, &[("GRANARY_CRASH_LOG", log.as_os_str())]);
    assert!(o.status.success(), "{what}: {}", stderr(&o));
    let new = (case.state)(d).unwrap_or_else(|e| panic!("{what}: new state: {e}"));
    assert_ne!(old, new, "{what}: the command changed nothing");
    let points = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .count();
    assert!(points > 0, "{what}: no crash point passed");
    // Killed at each point.
    for k in 1..=points {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        let args = (case.setup)(d);
        let at = OsString::from(k.to_string());
        let o = run_env(&args, &[("GRANARY_CRASH_AT", &at)]);
        let killed = o.status.signal() == Some(9);
        assert!(
            killed || o.status.success(),
            "{what}, killed at point {k}: {}",
            stderr(&o)
        );
        let now = (case.state)(d).unwrap_or_else(|e| panic!("{what}, killed at point {k}: {e}"));
        assert!(
            now == old || now == new,
            "{what}, killed at point {k}: {now} is neither the old state ({old}) nor the new ({new})"
        );
        // Run again to finish: when the kill came before the new state, or left something a
        // run of the command clears (a build directory holding the replaced dataset).
        if now != new || !leftovers(&(case.places)(d)).is_empty() {
            let o = run((case.recover)(d));
            assert!(
                o.status.success(),
                "{what}, after a kill at point {k}: {}",
                stderr(&o)
            );
        }
        let now = (case.state)(d).unwrap_or_else(|e| panic!("{what}, recovered from {k}: {e}"));
        assert_eq!(now, new, "{what}, recovered from a kill at point {k}");
        let left = leftovers(&(case.places)(d));
        assert!(
            left.is_empty(),
            "{what}, recovered from a kill at point {k}: {left:?}"
        );
    }
    // Two at once.
    let runs = 3;
    for round in 0..runs {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        let args = (case.setup)(d);
        let children: Vec<_> = (0..2).map(|_| spawn(&args)).collect();
        let outs: Vec<Output> = children
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect();
        for o in &outs {
            let e = stderr(o);
            // The second finds the first's work done, or under way, and says so.
            let refused = [
                "another granary",
                "an interrupted pack exists",
                "already",
                "an intact snapshot is there",
                "holds no shard parts",
                "exists; pass --force to replace it",
                "in the dataset already",
            ]
            .iter()
            .any(|w| e.contains(w));
            assert!(
                o.status.success() || refused,
                "{what}, two at once, round {round}: {e}"
            );
        }
        assert!(
            outs.iter().any(|o| o.status.success()),
            "{what}: neither of two finished"
        );
        let now = (case.state)(d).unwrap_or_else(|e| panic!("{what}, two at once: {e}"));
        assert_eq!(now, new, "{what}, two at once, round {round}");
        let left = leftovers(&(case.places)(d));
        assert!(
            left.is_empty(),
            "{what}, two at once, round {round}: {left:?}"
        );
    }
    (points, runs * 2)
}

/// The shared inputs: two source trees, a dataset of the first, a tar shard, a sharded pack's
/// parts, a 1.x dataset.
struct World {
    _t: tempfile::TempDir,
    src: PathBuf,
    other: PathBuf,
    more: PathBuf,
    ds: PathBuf,
    parts: PathBuf,
    tar: PathBuf,
}

fn world() -> World {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    let src = root.join("src");
    write_tree(
        &src,
        &numbered_tree(30, 3, |i| 700 + (i as usize * 97) % 900),
    );
    let other = root.join("other");
    write_tree(
        &other,
        &numbered_tree(24, 2, |i| 300 + (i as usize * 31) % 500),
    );
    let more = root.join("more");
    write_tree(
        &more,
        &[
            (b"c0/appended-1".to_vec(), bytes(1, 900)),
            (b"c1/appended-2".to_vec(), bytes(2, 1200)),
        ],
    );
    let ds = root.join("ds");
    assert!(pack(&src, &ds, &["--chunk-size", "8KiB"]).status.success());
    let parts = root.join("parts");
    for s in ["0/2", "1/2"] {
        let o = pack(&src, &parts, &["--chunk-size", "8KiB", "--shard", s]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let members: Vec<(String, Vec<u8>)> = (0..12)
        .flat_map(|i| {
            [
                (format!("s{i:03}.txt"), format!("caption {i}").into_bytes()),
                (format!("s{i:03}.bin"), bytes(i, 600)),
            ]
        })
        .collect();
    let tar = root.join("shard-000.tar");
    write_tar(&tar, &members);
    World {
        _t: t,
        src,
        other,
        more,
        ds,
        parts,
        tar,
    }
}

/// A pack into `d/out` with `args`: after a kill, resumed where it kept work, replaced where
/// it published already.
fn packing(name: &'static str, args: impl Fn(&Path) -> Vec<OsString> + Clone + 'static) -> Case {
    let again = args.clone();
    Case {
        name,
        setup: Box::new(args),
        state: Box::new(|d| dataset_state(&d.join("out"))),
        recover: Box::new(move |d| {
            let flag = if d.join("out").exists() {
                "--force"
            } else {
                "--resume"
            };
            [again(d), os(&[&flag])].concat()
        }),
        places: Box::new(|d| vec![d.to_path_buf(), d.join("out")]),
    }
}

fn cases(w: &World) -> Vec<Case> {
    let ds_state = |d: &Path| dataset_state(&d.join("out"));
    let out_places = |d: &Path| vec![d.to_path_buf(), d.join("out")];
    let (src, other, more, ds, parts, tar) = (
        w.src.clone(),
        w.other.clone(),
        w.more.clone(),
        w.ds.clone(),
        w.parts.clone(),
        w.tar.clone(),
    );
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v1.6/dataset");
    let mut v = Vec::new();
    {
        let src = src.clone();
        let args = move |d: &Path| {
            os(&[
                &"pack",
                &src,
                &"-o",
                &d.join("out"),
                &"--chunk-size",
                &"8KiB",
            ])
        };
        v.push(packing("pack", args));
    }
    {
        let (ds, other) = (ds.clone(), other.clone());
        let other2 = other.clone();
        let args = move |d: &Path| {
            copy_dir(&ds, &d.join("out"));
            os(&[
                &"pack",
                &other,
                &"-o",
                &d.join("out"),
                &"--chunk-size",
                &"8KiB",
                &"--force",
            ])
        };
        v.push(Case {
            name: "pack --force over a dataset",
            setup: Box::new(args),
            state: Box::new(ds_state),
            recover: Box::new(move |d| {
                os(&[
                    &"pack",
                    &other2,
                    &"-o",
                    &d.join("out"),
                    &"--chunk-size",
                    &"8KiB",
                    &"--force",
                ])
            }),
            places: Box::new(out_places),
        });
    }
    {
        let (ds, more) = (ds.clone(), more.clone());
        let more2 = more.clone();
        v.push(Case {
            name: "append",
            setup: Box::new(move |d| {
                copy_dir(&ds, &d.join("out"));
                os(&[&"append", &d.join("out"), &more])
            }),
            state: Box::new(ds_state),
            // Resumed; once published, the files are the dataset's: skipped.
            recover: Box::new(move |d| {
                os(&[
                    &"append",
                    &d.join("out"),
                    &more2,
                    &"--resume",
                    &"--skip-existing",
                ])
            }),
            places: Box::new(out_places),
        });
    }
    {
        let ds = ds.clone();
        let args = |d: &Path| {
            let ids = d.join("ids.txt");
            os(&[&"delete", &d.join("out"), &"--ids-from", &ids])
        };
        v.push(Case {
            name: "delete",
            setup: Box::new(move |d| {
                copy_dir(&ds, &d.join("out"));
                std::fs::write(d.join("ids.txt"), "0\n2\n5\n").unwrap();
                args(d)
            }),
            state: Box::new(ds_state),
            recover: Box::new(args),
            places: Box::new(out_places),
        });
    }
    {
        let ds = ds.clone();
        let args = |d: &Path| os(&[&"compact", &d.join("out"), &"--all", &"--grace", &"0"]);
        // Compaction leaves the content as it was: the state is the generation with it.
        let state = |d: &Path| {
            let content = dataset_state(&d.join("out"))?;
            let o = run([
                "info".as_ref(),
                d.join("out").as_os_str(),
                "--json".as_ref(),
            ]);
            let v: serde_json::Value =
                serde_json::from_slice(&o.stdout).map_err(|e| format!("info: {e}"))?;
            Ok(format!("{content}, generation {}", v["generation"]))
        };
        v.push(Case {
            name: "compact",
            setup: Box::new(move |d| {
                copy_dir(&ds, &d.join("out"));
                std::fs::write(d.join("ids.txt"), "0\n2\n5\n").unwrap();
                let ids = d.join("ids.txt");
                let o = run(os(&[&"delete", &d.join("out"), &"--ids-from", &ids]));
                assert!(o.status.success(), "{}", stderr(&o));
                args(d)
            }),
            state: Box::new(state),
            recover: Box::new(args),
            places: Box::new(out_places),
        });
    }
    // Commands that rewrite a copy of a dataset in place, run again as they are.
    let mut in_place = |name: &'static str, template: &Path, lose_snapshot: bool| {
        let template = template.to_path_buf();
        v.push(Case {
            name,
            setup: Box::new(move |d| {
                copy_dir(&template, &d.join("out"));
                if lose_snapshot {
                    std::fs::remove_file(d.join("out").join(granary_format::SNAPSHOT_FILE))
                        .unwrap();
                }
                os(&[&name, &d.join("out")])
            }),
            state: Box::new(ds_state),
            recover: Box::new(move |d| os(&[&name, &d.join("out")])),
            places: Box::new(out_places),
        });
    };
    in_place("reindex", &ds, true);
    in_place("upgrade", &golden, false);
    in_place("merge", &parts, false);
    {
        let tar = tar.clone();
        let args = move |d: &Path| {
            os(&[
                &"pack",
                &tar,
                &"--from",
                &"webdataset",
                &"-o",
                &d.join("out"),
                &"--chunk-size",
                &"4KiB",
            ])
        };
        v.push(packing("pack --from webdataset (the Writer)", args));
    }
    {
        let ds = ds.clone();
        let ds2 = ds.clone();
        let view = |d: &Path| d.join("c1.gview");
        v.push(Case {
            name: "view",
            setup: Box::new(move |d| os(&[&"view", &ds, &"-o", &view(d), &"--class", &"c1"])),
            state: Box::new(move |d| {
                if !view(d).exists() {
                    return Ok("none".into());
                }
                let o = run(["info".as_ref(), view(d).as_os_str(), "--json".as_ref()]);
                let v: serde_json::Value = serde_json::from_slice(&o.stdout)
                    .map_err(|_| format!("the view does not open: {}", stderr(&o)))?;
                Ok(format!("view of {}", v["view"]["selected"]))
            }),
            recover: Box::new(move |d| {
                os(&[
                    &"view",
                    &ds2,
                    &"-o",
                    &view(d),
                    &"--class",
                    &"c1",
                    &"--force",
                ])
            }),
            places: Box::new(|d| vec![d.to_path_buf()]),
        });
    }
    {
        let ds = ds.clone();
        let ds2 = ds.clone();
        let m = |d: &Path| d.join("m.prom");
        v.push(Case {
            name: "read --metrics",
            setup: Box::new(move |d| {
                std::fs::write(m(d), "old\n").unwrap();
                os(&[&"read", &ds, &"--metrics", &m(d)])
            }),
            state: Box::new(move |d| {
                let text = std::fs::read_to_string(m(d)).map_err(|e| e.to_string())?;
                match text.as_str() {
                    "old\n" => Ok("old".into()),
                    t if t.ends_with('\n') && t.contains("granary_epoch_seconds ") => {
                        Ok("new".into())
                    }
                    t => Err(format!("a metrics file neither old nor whole: {t:?}")),
                }
            }),
            recover: Box::new(move |d| os(&[&"read", &ds2, &"--metrics", &m(d)])),
            places: Box::new(|d| vec![d.to_path_buf()]),
        });
    }
    {
        let ds = ds.clone();
        let tier = |d: &Path| d.join("tier");
        let args = move |d: &Path| {
            os(&[
                &"read",
                &ds,
                &"--cache-dir",
                &tier(d),
                &"--cache-size",
                &"40KiB",
                &"--policy",
                &"lru",
                &"--json",
            ])
        };
        let again = args.clone();
        v.push(Case {
            name: "read --cache-dir (tier admission)",
            setup: Box::new(args),
            state: Box::new(move |d| {
                if !tier(d).exists() {
                    return Ok("no tier".into());
                }
                let o = run([
                    "cache".as_ref(),
                    "stats".as_ref(),
                    tier(d).as_os_str(),
                    "--json".as_ref(),
                ]);
                let v: serde_json::Value = serde_json::from_slice(&o.stdout)
                    .map_err(|_| format!("cache stats failed: {}", stderr(&o)))?;
                let used = v[0]["bytes"].as_u64().unwrap_or(0);
                if used > 40 << 10 {
                    return Err(format!("the tier holds {used} bytes, over its quota"));
                }
                Ok(if used > 0 { "tier in use" } else { "no tier" }.into())
            }),
            recover: Box::new(again),
            places: Box::new(move |d| vec![tier(d)]),
        });
    }
    v
}

#[test]
fn every_writing_command_killed_at_each_point_or_run_twice_ends_old_or_new() {
    let w = world();
    let mut report = Vec::new();
    for case in cases(&w) {
        let (points, concurrent) = exercise(&case);
        report.push(format!(
            "{}: {points} crash points, {concurrent} concurrent runs",
            case.name
        ));
    }
    eprintln!("crash harness: {}", report.join("; "));
}
