//! Choosing samples by class, path prefix, glob, listed ids or listed paths: what `view` keeps
//! and what `delete` removes.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use granary::Dataset;

/// Criteria selecting samples. A sample is selected when it matches every kind given, and any
/// one value of each kind.
#[derive(clap::Args)]
pub struct Criteria {
    /// Select samples of this class (by name; repeatable, or comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub class: Vec<String>,
    /// Select samples whose path starts with this prefix (repeatable).
    #[arg(long)]
    pub prefix: Vec<String>,
    /// Select samples whose path matches this glob (`*` stays within a path component, `**`
    /// crosses them; repeatable).
    #[arg(long)]
    pub glob: Vec<String>,
    /// Select the sample ids listed in this file (decimal, one per line).
    #[arg(long, value_name = "FILE")]
    pub ids_from: Option<PathBuf>,
    /// Select the samples whose paths are listed in this file (one per line).
    #[arg(long, value_name = "FILE")]
    pub paths_from: Option<PathBuf>,
}

/// What a listed id or path the dataset does not hold does to a selection.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// An error naming the line.
    Refuse,
    /// Left out, and reported in [`Selected::missing`].
    Report,
}

/// A selection: the ids, the criteria in words, and the listed lines that named nothing.
pub struct Selected {
    pub ids: Vec<u64>,
    pub description: String,
    /// `FILE line N: why` of each listed id or path left out ([`Missing::Report`]).
    pub missing: Vec<String>,
}

impl Selected {
    pub fn kept(self) -> (Vec<u64>, String) {
        (self.ids, self.description)
    }
}

impl Criteria {
    /// True when no criterion is given.
    pub fn is_empty(&self) -> bool {
        self.class.is_empty()
            && self.prefix.is_empty()
            && self.glob.is_empty()
            && self.ids_from.is_none()
            && self.paths_from.is_none()
    }

    /// The ids every kind of criterion given selects (each kind a sorted list, intersected),
    /// rising, with the criteria in words; `extra`: one more kind, already resolved.
    pub fn select_with(
        &self,
        ds: &Dataset,
        missing: Missing,
        extra: Option<(Vec<u64>, String)>,
    ) -> anyhow::Result<Selected> {
        let mut kinds: Vec<Vec<u64>> = Vec::new();
        let mut words = Vec::new();
        let mut unmatched = Vec::new();
        if !self.class.is_empty() {
            kinds.push(by_class(ds, &self.class)?);
            words.push(format!("class {}", self.class.join(", ")));
        }
        if !self.prefix.is_empty() {
            let mut ids = Vec::new();
            for p in &self.prefix {
                let r = ds.prefix_range(p.as_bytes())?;
                ids.extend(ds.entries(r)?.into_iter().filter_map(|e| e.id));
            }
            kinds.push(sorted(ids));
            words.push(format!("prefix {}", self.prefix.join(", ")));
        }
        if !self.glob.is_empty() {
            kinds.push(by_glob(ds, &self.glob)?);
            words.push(format!("glob {}", self.glob.join(", ")));
        }
        if let Some(f) = &self.ids_from {
            kinds.push(ids_from(ds, f, missing, &mut unmatched)?);
            words.push(format!("ids in {}", f.display()));
        }
        if let Some(f) = &self.paths_from {
            kinds.push(paths_from(ds, f, missing, &mut unmatched)?);
            words.push(format!("paths in {}", f.display()));
        }
        if let Some((ids, w)) = extra {
            kinds.push(ids);
            words.push(w);
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
        Ok(Selected {
            ids,
            description: words.join("; "),
            missing: unmatched,
        })
    }

    /// [`Criteria::select_with`] without an extra kind.
    pub fn select(&self, ds: &Dataset, missing: Missing) -> anyhow::Result<Selected> {
        self.select_with(ds, missing, None)
    }
}

fn sorted(mut ids: Vec<u64>) -> Vec<u64> {
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Samples of the named classes: chunks whose class counts hold none of them are skipped
/// without reading their samples' entries; deleted samples are not selected.
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
            if ds.selects(id) && want.contains(&snap.sample(id)?.label) {
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

/// The sample ids the non-empty lines of `f` name, each found by `find`; a line that names
/// nothing is an error naming the line and why, or (`Missing::Report`) left out and
/// described in `unmatched`.
fn listed(
    f: &Path,
    missing: Missing,
    unmatched: &mut Vec<String>,
    find: impl Fn(&[u8]) -> anyhow::Result<Result<u64, String>>,
) -> anyhow::Result<Vec<u64>> {
    let data = std::fs::read(f).map_err(|e| anyhow::anyhow!("reading {}: {e}", f.display()))?;
    let lines = data.split(|&b| b == b'\n');
    let lines = lines.map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let mut ids = Vec::new();
    for (k, l) in lines.enumerate().filter(|(_, l)| !l.is_empty()) {
        match (find(l)?, missing) {
            (Ok(id), _) => ids.push(id),
            (Err(why), Missing::Refuse) => anyhow::bail!("{} line {}: {why}", f.display(), k + 1),
            (Err(why), Missing::Report) => {
                unmatched.push(format!("{} line {}: {why}", f.display(), k + 1))
            }
        }
    }
    Ok(sorted(ids))
}

fn ids_from(
    ds: &Dataset,
    f: &Path,
    missing: Missing,
    unmatched: &mut Vec<String>,
) -> anyhow::Result<Vec<u64>> {
    let n = ds.len();
    let snap = ds.snapshot();
    listed(f, missing, unmatched, |l| {
        let t = String::from_utf8_lossy(l);
        Ok(match t.trim().parse::<u64>() {
            Ok(id) if id >= n => Err(format!("sample {id} of a dataset of {n}")),
            Ok(id) => match snap.deleted_by(id) {
                Some(g) if missing == Missing::Refuse => {
                    Err(format!("sample {id} was deleted (by generation {g})"))
                }
                _ => Ok(id),
            },
            Err(_) => Err(format!("{t:?} is not a sample id")),
        })
    })
}

fn paths_from(
    ds: &Dataset,
    f: &Path,
    missing: Missing,
    unmatched: &mut Vec<String>,
) -> anyhow::Result<Vec<u64>> {
    listed(f, missing, unmatched, |l| {
        let none = || format!("no sample {}", String::from_utf8_lossy(l));
        Ok(find(l, |n| ds.lookup(n))?.ok_or_else(none))
    })
}

/// Finds the file named `raw` as `ls` shows names first (`p\\q` is the file `p\q`), then as
/// given (a name that is no escaped form, or names nothing unescaped).
pub fn find<T>(
    raw: &[u8],
    lookup: impl Fn(&[u8]) -> granary::Result<Option<T>>,
) -> granary::Result<Option<T>> {
    if let Some(u) = granary::unescape_path(raw).filter(|u| u != raw) {
        if let Some(x) = lookup(&u)? {
            return Ok(Some(x));
        }
    }
    lookup(raw)
}
