use std::path::PathBuf;
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
    #[command(flatten)]
    pub select: super::select::Criteria,
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
    let (ids, description) = a.select.select(&ds, super::select::Missing::Refuse)?.kept();
    let view = granary::write_view(&a.dataset, &ds, &a.output, ids, description.clone())?;
    let bytes = view.encode();
    let snap = ds.snapshot();
    let shape = Dataset::open_with(&a.output, super::store_config())?.shape()?;
    let chunks = (0..shape.chunks())
        .filter(|&c| !shape.chunk_samples(c).is_empty())
        .count();
    let (m, n) = (view.ids.len() as u64, snap.live_count());
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
