//! What README shows runs as written: its command-line tour, in a directory of its own, with
//! this build's `granary` first on PATH (the Python tour runs in the Python tests).

use std::path::Path;
use std::process::Command;

/// The code of the first fenced block of kind `lang` after README's heading `heading`.
pub fn readme_block(heading: &str, lang: &str) -> String {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md is readable");
    let at = readme
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("README.md has no heading {heading:?}"));
    let rest = &readme[at..];
    let open = format!("```{lang}\n");
    let start = rest
        .find(&open)
        .unwrap_or_else(|| panic!("no ```{lang} block after {heading:?}"))
        + open.len();
    let len = rest[start..].find("```").expect("the block is closed");
    rest[start..start + len].to_string()
}

#[test]
fn readme_command_line_tour_runs_as_written() {
    let tour = readme_block("## A tour of the command line", "sh");
    assert!(
        tour.lines().filter(|l| l.starts_with("granary ")).count() >= 10,
        "the tour lost its commands:\n{tour}"
    );
    let dir = tempfile::tempdir().unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_granary")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &tour])
        .current_dir(dir.path())
        .env("PATH", path)
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "README's tour failed ({}):\n{tour}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Every step left what the next one reads: the restored tree equals the generated one
    // (diff -r above), and the view's epoch delivered its class alone.
    assert!(dir.path().join("three.gview").is_file());
    assert!(dir.path().join("first.jpg").metadata().unwrap().len() > 0);
}

// ---- Every `--help` example ------------------------------------------------------------

/// The text of `granary PATH --help`.
fn help_of(path: &[&str]) -> String {
    let o = crate::common::run(path.iter().copied().chain(["--help"]));
    assert!(o.status.success(), "granary {path:?} --help failed");
    String::from_utf8(o.stdout).unwrap()
}

/// The names under a help text's `Commands:` heading (`help` left out).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .map(String::from)
        .collect()
}

/// The example commands of a help text: the indented lines after `Examples:` (blank lines may
/// separate groups) up to the first unindented line, continuation lines joined, comment lines
/// and trailing comments kept as the shell sees them.
fn examples_in(help: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut joining = false;
    for line in help.lines().skip_while(|l| *l != "Examples:").skip(1) {
        if !line.is_empty() && !line.starts_with("  ") {
            break;
        }
        let text = line.trim();
        if text.is_empty() || (text.starts_with('#') && !joining) {
            continue;
        }
        let (body, more) = match text.strip_suffix('\\') {
            Some(b) => (b.trim_end(), true),
            None => (text, false),
        };
        if joining {
            let last = out.last_mut().unwrap();
            last.push(' ');
            last.push_str(body);
        } else {
            out.push(body.to_string());
        }
        joining = more;
    }
    out
}

/// Every `--help` that holds examples: (the subcommand path, its help text).
fn every_help() -> Vec<(Vec<String>, String)> {
    let mut out = Vec::new();
    let mut todo = vec![Vec::<String>::new()];
    while let Some(path) = todo.pop() {
        let help = help_of(&path.iter().map(String::as_str).collect::<Vec<_>>());
        for sub in subcommands(&help) {
            let mut p = path.clone();
            p.push(sub);
            todo.push(p);
        }
        out.push((path, help));
    }
    out.sort();
    out
}

/// Each `granary` invocation in an example line: its words up to a shell operator.
fn invocations(line: &str) -> Vec<Vec<String>> {
    let words: Vec<String> = line
        .split_whitespace()
        .map(|w| w.trim_matches(|c| c == '\'' || c == '"').to_string())
        .collect();
    let mut out = Vec::new();
    for (i, w) in words.iter().enumerate() {
        if w == "granary" {
            let args = words[i + 1..]
                .iter()
                .take_while(|w| !["|", "&&", ";", ">", "&", "#"].contains(&w.as_str()))
                .map(|w| w.trim_end_matches(';').to_string())
                .collect();
            out.push(args);
        }
    }
    out
}

/// Flags of an invocation that its subcommand's help does not list.
fn unknown_flags(args: &[String], helps: &[(Vec<String>, String)]) -> Vec<String> {
    // The longest subcommand path the invocation starts with.
    let (_, help) = helps
        .iter()
        .filter(|(p, _)| args.len() >= p.len() && args[..p.len()] == p[..])
        .max_by_key(|(p, _)| p.len())
        .expect("the top-level help matches every invocation");
    args.iter()
        .filter(|a| a.starts_with('-') && a.len() > 1 && !a.starts_with("--=") && *a != "-")
        .map(|a| a.split('=').next().unwrap().to_string())
        .filter(|flag| {
            !help
                .split(|c: char| c.is_whitespace() || c == ',')
                .any(|w| w == flag)
        })
        .collect()
}

/// Examples that cannot run on one machine, and why; their flags are still checked.
const NOT_RUN: &[(&str, &str)] = &[
    ("srun ", "a Slurm job step"),
    ("sbatch ", "a Slurm job array"),
    ("--peers 10.0.0.", "the four nodes of a job"),
];

/// What an example names that this machine lacks, put here instead (stated, so the test says
/// what it ran): absolute paths of a cluster become paths in the example's own directory, a
/// node's address a loopback port, and benchmark sizes a test's.
const SUBSTITUTIONS: &[(&str, &str)] = &[
    (" /lustre/", " lustre/"),
    (" /local/ssd/", " local/ssd/"),
    (" /ssd/", " ssd/"),
    (" /mnt/train", " mnt/train"),
    (" /shared/", " shared/"),
    ("10.0.0.7:7070", "127.0.0.1:0"),
    ("--files 20000 ", "--files 200 "),
    ("--files 1000000 ", "--files 1000 "),
    ("--files 100000000 ", "--files 10000 "),
    ("--samples 1000000000 ", "--samples 1000000 "),
    ("--samples 100000000 ", "--samples 1000000 "),
    ("--chunks 100000 ", "--chunks 1000 "),
];

/// The directory every example starts from (a copy of it): the trees, datasets, views,
/// shards, mixture and id files the examples name.
fn fixture(dir: &Path) {
    use crate::common::*;
    let img = |n: u64, seed: u64| bytes(seed * 1_000_003 + n, 700 + (n as usize * 37) % 2000);
    let mut train = Vec::new();
    for (c, n) in [("cat", 20u64), ("dog", 20), ("n01440764", 10)] {
        for i in 1..=n {
            train.push((
                format!("{c}/{i:04}.jpg").into_bytes(),
                img(i, c.len() as u64),
            ));
        }
    }
    for i in 1..=5u64 {
        train.push((format!("train/part-0/{i:04}.jpg").into_bytes(), img(i, 9)));
    }
    write_tree(&dir.join("train"), &train);
    write_tree(&dir.join("imagenet/train"), &train);
    for (sub, seed) in [("new-files", 11u64), ("new-images", 12)] {
        let new: Vec<_> = (1..=4u64)
            .map(|i| (format!("cat/{sub}-{i}.jpg").into_bytes(), img(i, seed)))
            .collect();
        write_tree(&dir.join(sub), &new);
    }
    std::fs::create_dir_all(dir.join("shards")).unwrap();
    for s in 0..124u64 {
        let key = format!("{s:06}");
        let members = vec![
            (format!("{key}.jpg"), img(s, 13)),
            (format!("{key}.txt"), format!("caption {s}").into_bytes()),
            (format!("{key}.cls"), format!("{}", s % 3).into_bytes()),
        ];
        write_tar(&dir.join(format!("shards/{key}.tar")), &members);
    }
    let d = |p: &str| dir.join(p);
    run_ok([
        "pack".as_ref(),
        d("train").as_os_str(),
        "-o".as_ref(),
        d("train.granary").as_os_str(),
    ]);
    for (name, seed) in [
        ("web", 21u64),
        ("books", 22),
        ("code", 23),
        ("a", 24),
        ("b", 25),
    ] {
        let files: Vec<_> = (1..=12u64)
            .map(|i| (format!("{name}/{i:04}.bin").into_bytes(), img(i, seed)))
            .collect();
        write_tree(&d(&format!("src-{name}")), &files);
        let out = d(&format!("{name}.granary"));
        run_ok([
            "pack".as_ref(),
            d(&format!("src-{name}")).as_os_str(),
            "-o".as_ref(),
            out.as_os_str(),
        ]);
    }
    std::fs::create_dir_all(d("data")).unwrap();
    run_ok([
        "pack".as_ref(),
        d("train").as_os_str(),
        "-o".as_ref(),
        d("data/img.granary").as_os_str(),
    ]);
    run_ok([
        "view".as_ref(),
        d("train.granary").as_os_str(),
        "--class".as_ref(),
        "cat".as_ref(),
        "--class".as_ref(),
        "dog".as_ref(),
        "-o".as_ref(),
        d("pets.gview").as_os_str(),
    ]);
    run_ok([
        "read".as_ref(),
        d("train.granary").as_os_str(),
        "--cache-dir".as_ref(),
        d("local/ssd/granary-cache").as_os_str(),
        "--cache-size".as_ref(),
        "1GiB".as_ref(),
    ]);
    // The tier the read examples name, with the score table training's report() writes there
    // (importance sampling needs one).
    save_every_seventh_scores(&d("train.granary"), &d("ssd/gcache"));
    std::fs::write(
        d("blend.txt"),
        "web.granary 0.5\nbooks.granary 0.3\ncode.granary 0.2\n",
    )
    .unwrap();
    std::fs::write(d("keep.txt"), "0\n1\n2\n").unwrap();
    // What `granary delete --help` removes: listed paths and ids, a view.
    std::fs::write(d("takedown.txt"), "train/part-0/0001.jpg\n").unwrap();
    std::fs::write(d("ids.txt"), "3\n4\n").unwrap();
    // A receipt of another dataset's deletion: `verify --deleted` finds none of it here.
    let scratch = d("scratch.granary");
    copy_dir(&d("web.granary"), &scratch);
    run_ok([
        "delete".as_ref(),
        scratch.as_os_str(),
        "--prefix".as_ref(),
        "web/".as_ref(),
        "--receipt".as_ref(),
        d("takedown.receipt").as_os_str(),
    ]);
    std::fs::remove_dir_all(&scratch).unwrap();
    run_ok([
        "view".as_ref(),
        d("train.granary").as_os_str(),
        "--prefix".as_ref(),
        "train/".as_ref(),
        "-o".as_ref(),
        d("remove.gview").as_os_str(),
    ]);
    for p in ["lustre/ds", "ssd", "mnt/train", "shared"] {
        std::fs::create_dir_all(d(p)).unwrap();
    }
    std::fs::write(d("shared/job.secret"), "0123456789abcdef0123456789abcdef").unwrap();
}

/// curl signing its requests to the S3 test server (objects granary does not write itself).
const CURL: &str =
    "curl -sSf --aws-sigv4 aws:amz:us-east-1:s3 --user \"$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY\"";

/// How one example runs: the script (prelude, the example, what ends what it started), or why
/// it does not run here.
fn script_for(example: &str, s3_prefix: &str) -> Result<String, String> {
    if let Some((_, why)) = NOT_RUN.iter().find(|(m, _)| example.contains(m)) {
        return Err(why.to_string());
    }
    let mut line = example.to_string();
    for (from, to) in SUBSTITUTIONS {
        line = line.replace(from, to);
    }
    let mut pre = Vec::new();
    let mut post = Vec::new();
    if line.contains("s3://") {
        if std::env::var_os("GRANARY_TEST_S3").is_none() {
            if std::env::var("GRANARY_REQUIRE_S3").is_ok_and(|v| v == "1") {
                panic!("GRANARY_REQUIRE_S3=1 but no S3 server for the example {example:?}");
            }
            return Err("an S3 server (scripts/s3-server.sh)".into());
        }
        let endpoint = std::env::var("AWS_ENDPOINT_URL").unwrap();
        line = line
            .replace("http://127.0.0.1:8333", &endpoint)
            .replace("s3://bucket/", &format!("s3://{s3_prefix}/"))
            .replace("s3://b/", &format!("s3://{s3_prefix}/"));
        for inv in invocations(&line) {
            let mut after_o = false;
            for a in &inv {
                if a.starts_with("s3://") && !after_o && !a.contains('{') {
                    pre.push(format!("granary pack ./train -o {a} > /dev/null"));
                } else if a.starts_with("s3://") && a.contains("{0000..0099}") {
                    // WebDataset shards in the bucket: the fixture's first hundred.
                    let key = a.trim_start_matches("s3://").replace("{0000..0099}", "$i");
                    pre.push(format!(
                        "for i in $(seq -f %04g 0 99); do {CURL} -T shards/00$i.tar \
                         \"$AWS_ENDPOINT_URL/{key}\"; done"
                    ));
                }
                after_o = a == "-o";
            }
        }
    }
    if line.contains("granary mount ") || line.contains("granary umount ") {
        match crate::mount::no_fuse() {
            None => {}
            Some(why) if crate::mount::fuse_required() => {
                panic!("FUSE required (GRANARY_REQUIRE_FUSE or CI) but not possible: {why}")
            }
            Some(why) => return Err(format!("FUSE ({why})")),
        }
        if line.contains("granary umount ") {
            pre.push("granary mount train.granary mnt/train".to_string());
        } else {
            post.push("ls mnt/train > /dev/null; granary umount mnt/train".to_string());
        }
    }
    // reindex is for a dataset whose snapshot was lost: it refuses to replace an intact one.
    for inv in invocations(&line).iter().filter(|i| i[0] == "reindex") {
        pre.push(match inv[1].strip_prefix("s3://") {
            Some(key) => format!("{CURL} -X DELETE \"$AWS_ENDPOINT_URL/{key}/snapshot.gsnap\""),
            None => format!("rm {}/snapshot.gsnap", inv[1]),
        });
    }
    if let Some(inv) = invocations(&line).iter().find(|i| i[0] == "merge") {
        pre.push(format!(
            "for i in 0 1 2 3; do granary pack ./train -o {} --shard $i/4 > /dev/null; done",
            inv[1]
        ));
    }
    // What an example writes with -o does not exist before it (the fixture may hold it).
    for inv in invocations(&line) {
        if let Some(at) = inv.iter().position(|a| a == "-o") {
            if inv[0] != "merge" && !inv[at + 1].starts_with("s3://") {
                pre.push(format!("rm -rf -- {}", inv[at + 1]));
            }
        }
    }
    let body = if line.starts_with("granary serve ") {
        // A server runs until stopped: it passes once it says where it listens.
        format!(
            "({line}) > serve.out 2>&1 & pid=$!\n\
             for i in $(seq 100); do grep -q 'listening on' serve.out && break; sleep 0.1; done\n\
             cat serve.out; grep -q 'listening on' serve.out; kill $pid; wait $pid || true"
        )
    } else {
        line
    };
    Ok([pre, vec![body], post].concat().join("\n"))
}

#[test]
fn every_help_example_runs() {
    let helps = every_help();
    let examples: Vec<(String, String)> = helps
        .iter()
        .flat_map(|(path, help)| {
            examples_in(help)
                .into_iter()
                .map(move |e| (path.join(" "), e))
        })
        .collect();
    assert!(examples.len() >= 60, "examples lost: {examples:#?}");
    let base = tempfile::tempdir().unwrap();
    let fix = base.path().join("fixture");
    fixture(&fix);
    let bin = Path::new(env!("CARGO_BIN_EXE_granary")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let (mut ran, mut failures, mut not_run) = (0, Vec::new(), Vec::new());
    for (k, (from, example)) in examples.iter().enumerate() {
        for inv in invocations(example) {
            let unknown = unknown_flags(&inv, &helps);
            if !unknown.is_empty() {
                failures.push(format!(
                    "`granary {from} --help`: {example}\n  unknown flags {unknown:?}"
                ));
            }
        }
        let prefix = format!("granary/tests/examples-{}-{nanos}-{k}", std::process::id());
        let script = match script_for(example, &prefix) {
            Ok(s) => s,
            Err(why) => {
                not_run.push(format!("{example}  [needs {why}]"));
                continue;
            }
        };
        let dir = base.path().join(format!("ex{k}"));
        let cp = Command::new("cp")
            .arg("-a")
            .arg(&fix)
            .arg(&dir)
            .status()
            .unwrap();
        assert!(cp.success());
        let out = Command::new("bash")
            .args(["-euo", "pipefail", "-c", &script])
            .current_dir(&dir)
            .env("PATH", &path)
            .output()
            .expect("bash runs");
        if out.status.success() {
            ran += 1;
            let _ = std::fs::remove_dir_all(&dir);
        } else {
            failures.push(format!(
                "`granary {from} --help`: {example}\n  ran:\n{script}\n  stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    eprintln!(
        "{ran} of {} --help examples ran; not run here (flags checked):\n  {}",
        examples.len(),
        not_run.join("\n  ")
    );
    assert!(
        failures.is_empty(),
        "{} examples failed:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
