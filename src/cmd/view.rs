use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use granary::Dataset;
use serde_json::json;

/// Choose a subset of a dataset's samples, saved as a view file usable wherever the dataset is.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  granary view train.granary --class cat --class dog -o pets.gview\n  \
granary view train.granary --prefix train/part-0 --glob '**/*.jpg' -o part0-jpg.gview\n  \
granary view s3://bucket/train --ids-from keep.txt -o keep.gview\n  \
granary read pets.gview --world-size 8 --rank 3    # a view reads like a dataset\n\n\
A sample is selected when it matches every kind of criterion given, and any one value of each \
kind (--class a --class b: either class). The view file (a few bytes per selected sample) \
names the dataset (a path relative to the view file, or the URL) and is pinned to its id and \
its snapshot's content digest: after an append (or any other change) the view is refused, and \
must be made again. Epochs of a view are \
planned over its samples alone, chunk-wise as usual; nothing of the dataset is rewritten."
)]
pub struct Args {
    /// Dataset directory, or its URL (s3://, gs://, az://).
    pub dataset: PathBuf,
    /// Where to write the view file (conventionally NAME.gview).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Keep samples of this class (by name; repeatable, or comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub class: Vec<String>,
    /// Keep samples whose path starts with this prefix (repeatable).
    #[arg(long)]
    pub prefix: Vec<String>,
    /// Keep samples whose path matches this glob (`*` stays within a path component, `**`
    /// crosses them; repeatable).
    #[arg(long)]
    pub glob: Vec<String>,
    /// Keep the sample ids listed in this file (decimal, one per line).
    #[arg(long, value_name = "FILE")]
    pub ids_from: Option<PathBuf>,
    /// Keep the samples whose paths are listed in this file (one per line).
    #[arg(long, value_name = "FILE")]
    pub paths_from: Option<PathBuf>,
    /// Replace the output file if it exists.
    #[arg(long)]
    pub force: bool,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    if a.output.exists() && !a.force {
        anyhow::bail!("{} exists; pass --force to replace it", a.output.display());
    }
    let ds = super::open_dataset(&a.dataset)?;
    let (ids, description) = select(&ds, &a)?;
    let view = granary::write_view(&a.dataset, &ds, &a.output, ids, description.clone())?;
    let bytes = view.encode();
    let snap = ds.snapshot();
    let shape = Dataset::open_with(&a.output, super::store_config())?.shape()?;
    let chunks = (0..shape.chunks())
        .filter(|&c| !shape.chunk_samples(c).is_empty())
        .count();
    let (m, n) = (view.ids.len() as u64, snap.sample_count());
    let v = json!({
        "view": a.output, "dataset": view.location, "selected": m, "samples": n,
        "chunks_touched": chunks, "chunks": shape.chunks(), "bytes": bytes.len(),
        "description": description,
    });
    super::output(a.json, &v, |_| {
        println!(
            "{}: {m} of {n} samples ({:.1} %) in {chunks} of {} chunks, {} ({} bytes)",
            a.output.display(),
            100.0 * m as f64 / n.max(1) as f64,
            shape.chunks(),
            description,
            bytes.len()
        );
    })
}

/// The ids every kind of criterion given keeps (each kind a sorted list, intersected), and the
/// criteria in words.
fn select(ds: &Dataset, a: &Args) -> anyhow::Result<(Vec<u64>, String)> {
    let mut kinds: Vec<Vec<u64>> = Vec::new();
    let mut words = Vec::new();
    if !a.class.is_empty() {
        kinds.push(by_class(ds, &a.class)?);
        words.push(format!("class {}", a.class.join(", ")));
    }
    if !a.prefix.is_empty() {
        let mut ids = Vec::new();
        for p in &a.prefix {
            let r = ds.prefix_range(p.as_bytes())?;
            ids.extend(ds.entries(r)?.into_iter().filter_map(|e| e.id));
        }
        kinds.push(sorted(ids));
        words.push(format!("prefix {}", a.prefix.join(", ")));
    }
    if !a.glob.is_empty() {
        kinds.push(by_glob(ds, &a.glob)?);
        words.push(format!("glob {}", a.glob.join(", ")));
    }
    if let Some(f) = &a.ids_from {
        kinds.push(ids_from(ds, f)?);
        words.push(format!("ids in {}", f.display()));
    }
    if let Some(f) = &a.paths_from {
        kinds.push(paths_from(ds, f)?);
        words.push(format!("paths in {}", f.display()));
    }
    let Some(mut ids) = kinds.pop() else {
        anyhow::bail!(
            "nothing to select by: give --class, --prefix, --glob, --ids-from or --paths-from"
        );
    };
    for k in kinds {
        let keep: std::collections::HashSet<u64> = k.into_iter().collect();
        ids.retain(|i| keep.contains(i));
    }
    Ok((ids, words.join("; ")))
}

fn sorted(mut ids: Vec<u64>) -> Vec<u64> {
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Samples of the named classes: chunks whose class counts hold none of them are skipped
/// without reading their samples' entries.
fn by_class(ds: &Dataset, names: &[String]) -> anyhow::Result<Vec<u64>> {
    let classes = ds.classes()?;
    let mut want = Vec::new();
    for n in names {
        match classes.iter().position(|c| *c == n.as_bytes()) {
            Some(l) => want.push(l as u32),
            None => anyhow::bail!(
                "no class {n:?} in the dataset ({} classes{})",
                classes.len(),
                if classes.is_empty() {
                    ""
                } else {
                    ": `granary info` lists them"
                }
            ),
        }
    }
    let snap = ds.snapshot();
    let mut ids = Vec::new();
    for c in 0..snap.chunk_count() {
        if !snap.class_counts(c)?.iter().any(|(l, _)| want.contains(l)) {
            continue;
        }
        for id in snap.chunk(c)?.samples() {
            if want.contains(&snap.sample(id)?.label) {
                ids.push(id);
            }
        }
    }
    Ok(sorted(ids))
}

fn by_glob(ds: &Dataset, patterns: &[String]) -> anyhow::Result<Vec<u64>> {
    let mut b = globset::GlobSetBuilder::new();
    for p in patterns {
        let g = globset::GlobBuilder::new(p)
            .literal_separator(true)
            .build()
            .map_err(|e| anyhow::anyhow!("--glob {p:?}: {e}"))?;
        b.add(g);
    }
    let set = b.build()?;
    ds.prefetch_namespace()?;
    let all = ds.entries(0..ds.entry_count())?;
    let ids = all
        .into_iter()
        .filter(|e| e.id.is_some() && set.is_match(std::ffi::OsStr::from_bytes(&e.path)))
        .filter_map(|e| e.id)
        .collect();
    Ok(sorted(ids))
}

/// The sample ids the non-empty lines of `f` name, each found by `find` (else the error names
/// the line and says why).
fn listed(
    f: &Path,
    find: impl Fn(&[u8]) -> anyhow::Result<Result<u64, String>>,
) -> anyhow::Result<Vec<u64>> {
    let data = std::fs::read(f).map_err(|e| anyhow::anyhow!("reading {}: {e}", f.display()))?;
    let lines = data.split(|&b| b == b'\n');
    let lines = lines.map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let mut ids = Vec::new();
    for (k, l) in lines.filter(|l| !l.is_empty()).enumerate() {
        match find(l)? {
            Ok(id) => ids.push(id),
            Err(why) => anyhow::bail!("{} line {}: {why}", f.display(), k + 1),
        }
    }
    Ok(sorted(ids))
}

fn ids_from(ds: &Dataset, f: &Path) -> anyhow::Result<Vec<u64>> {
    let n = ds.len();
    listed(f, |l| {
        let t = String::from_utf8_lossy(l);
        Ok(match t.trim().parse::<u64>() {
            Ok(id) if id < n => Ok(id),
            Ok(id) => Err(format!("sample {id} of a dataset of {n}")),
            Err(_) => Err(format!("{t:?} is not a sample id")),
        })
    })
}

fn paths_from(ds: &Dataset, f: &Path) -> anyhow::Result<Vec<u64>> {
    listed(f, |l| {
        let missing = || format!("no sample {}", String::from_utf8_lossy(l));
        Ok(ds.lookup(l)?.ok_or_else(missing))
    })
}
