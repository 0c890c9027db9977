use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use granary::Dataset;
use serde_json::json;

use super::human_bytes;
use super::select::{Criteria, Missing, Selected};

/// Delete samples: publish the dataset's next generation without them, rewriting no chunk.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  granary delete train.granary --paths-from takedown.txt
  granary delete train.granary --ids-from ids.txt --strict
  granary delete train.granary --class dog --dry-run
  granary delete train.granary --view remove.gview     # a view of what to remove
  granary delete train.granary --paths-from takedown.txt --receipt request-42.receipt

A sample is selected when it matches every kind of criterion given, and any one value of each
kind. The new snapshot lists the selected samples as deleted and no longer holds their paths, so
ls, cat, read, extract, a mount, Python and mixtures of this generation never deliver, list or
find them. Sample ids do not move: score tables stay valid and a view made after the deletion
selects among the rest. The snapshot is replaced atomically (a reader that has the old one open
keeps reading it); chunk files are not rewritten, so the deleted records' bytes stay in them
(`granary info` shows how many) until `granary compact` rewrites them. A listed id or path the
dataset does not hold is reported and left out (with --strict: an error, nothing deleted); a
deletion that removes nothing new is refused. Views made before the deletion are refused as
stale; an epoch checkpointed before it resumes without the deleted samples. A process that
still has an older generation open (a running job, a mount) keeps serving it until it reopens
the dataset, and keeps the files it has open on disk until it closes them.")]
pub struct Args {
    /// Dataset directory, or its URL (s3://, gs://, az://).
    pub dataset: PathBuf,
    #[command(flatten)]
    pub select: Criteria,
    /// Select the samples of this view file (made of this generation of the dataset).
    #[arg(long, value_name = "FILE")]
    pub view: Option<PathBuf>,
    /// A listed id or path the dataset does not hold is an error (nothing is deleted).
    #[arg(long)]
    pub strict: bool,
    /// Show what would be deleted, and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Write a receipt of the deletion to FILE first (each sample's id, path, length, CRC-32
    /// and SHA-256): `granary verify DS --deleted FILE` then proves no chunk file holds their
    /// bytes (after `granary compact --all --grace 0`).
    #[arg(long, value_name = "FILE")]
    pub receipt: Option<std::path::PathBuf>,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let ds = super::open_dataset(&a.dataset)?;
    let sel = select(&ds, &a)?;
    if a.dry_run {
        return dry_run(&ds, &a, &sel);
    }
    if let Some(path) = &a.receipt {
        write_receipt(&ds, &a.dataset, path, &sel.ids)?;
    }
    drop(ds);
    let s = granary_packer::delete(&a.dataset, &sel.ids, super::store_config())
        .with_context(|| format!("deleting from {}", a.dataset.display()))?;
    let mut v = serde_json::to_value(&s)?;
    v["missing"] = json!(sel.missing);
    v["description"] = json!(sel.description);
    super::output(a.json, &v, |_| {
        println!(
            "{}: deleted {} samples ({} by {}) in {} chunks: generation {}, {} samples remain; \
             {} of deleted records stay in their chunk files until `granary compact`",
            a.dataset.display(),
            s.deleted,
            if s.already_deleted > 0 {
                format!(
                    "{} asked for were deleted already; selected",
                    s.already_deleted
                )
            } else {
                "selected".into()
            },
            sel.description,
            s.chunks_affected,
            s.generation,
            s.samples,
            human_bytes(s.dead_bytes)
        );
    })
}

/// The samples `a` selects of `ds` (listed lines it does not hold reported on stderr, or an
/// error with --strict); an error when it selects none.
fn select(ds: &Dataset, a: &Args) -> anyhow::Result<Selected> {
    if ds.view().is_some() {
        anyhow::bail!(
            "{} is a view: delete from the dataset itself (--view V selects a view's samples)",
            a.dataset.display()
        );
    }
    let extra = match &a.view {
        None => None,
        Some(v) => Some((view_ids(ds, v)?, format!("view {}", v.display()))),
    };
    if a.select.is_empty() && extra.is_none() {
        anyhow::bail!(
            "nothing to select by: give --class, --prefix, --glob, --ids-from, --paths-from or \
             --view"
        );
    }
    let missing = if a.strict {
        Missing::Refuse
    } else {
        Missing::Report
    };
    let sel = a.select.select_with(ds, missing, extra)?;
    for m in &sel.missing {
        eprintln!("granary delete: not in the dataset, left out: {m}");
    }
    if sel.ids.is_empty() {
        anyhow::bail!(
            "{}: {} selects no sample; nothing deleted",
            a.dataset.display(),
            sel.description
        );
    }
    Ok(sel)
}

/// What `a` would delete, said and changed nothing.
fn dry_run(ds: &Dataset, a: &Args, sel: &Selected) -> anyhow::Result<ExitCode> {
    let live: Vec<u64> = sel
        .ids
        .iter()
        .copied()
        .filter(|&id| ds.selects(id))
        .collect();
    let bytes: u64 = (live.iter())
        .map(|&id| ds.sample(id).map(|s| s.entry.stored_len))
        .sum::<granary::Result<u64>>()?;
    let already = sel.ids.len() - live.len();
    let v = json!({"dataset": a.dataset, "would_delete": live.len(), "bytes": bytes,
                   "already_deleted": already, "missing": sel.missing,
                   "description": sel.description});
    super::output(a.json, &v, |_| {
        println!(
            "{}: would delete {} samples ({}) selected by {}{}; nothing changed (--dry-run)",
            a.dataset.display(),
            live.len(),
            human_bytes(bytes),
            sel.description,
            match already {
                0 => String::new(),
                k => format!(" ({k} more selected were deleted already)"),
            }
        );
    })
}

/// Writes the receipt of deleting `ids` from `ds` (at `dataset`) to `path`, a new file outside
/// the dataset's directory.
fn write_receipt(ds: &Dataset, dataset: &Path, path: &Path, ids: &[u64]) -> anyhow::Result<()> {
    if std::fs::symlink_metadata(path).is_ok() {
        anyhow::bail!(
            "{} exists: a receipt is kept, never replaced; name a new file",
            path.display()
        );
    }
    let inside = std::fs::canonicalize(super::receipt::parent_of(path))
        .ok()
        .zip(std::fs::canonicalize(dataset).ok())
        .is_some_and(|(p, d)| p.starts_with(d));
    if inside {
        anyhow::bail!(
            "{}: a receipt goes outside the dataset's directory",
            path.display()
        );
    }
    let generation = ds.snapshot().lineage().generation + 1;
    super::receipt::write(path, &super::receipt::of(ds, ids, generation)?)
}

/// The ids of the view file `v`, which must be a view of `ds` as it is now.
fn view_ids(ds: &Dataset, v: &Path) -> anyhow::Result<Vec<u64>> {
    let vds = Dataset::open_with(v, super::store_config())?;
    let Some(view) = vds.view() else {
        anyhow::bail!("{}: not a view file", v.display());
    };
    let (a, b) = (vds.snapshot(), ds.snapshot());
    if (a.dataset_id(), a.content_digest()) != (b.dataset_id(), b.content_digest()) {
        anyhow::bail!(
            "{} is a view of another dataset (or generation) than {}",
            v.display(),
            ds.location()
        );
    }
    Ok(view.ids.to_vec())
}
