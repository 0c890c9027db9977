use std::path::PathBuf;
use std::process::ExitCode;

/// Rebuild a lost or damaged snapshot from the chunk files' footers.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  granary reindex train.granary && granary verify train.granary\n  \
granary reindex s3://bucket/train            # a dataset in an object store, in place\n\n\
Every chunk is checked completely first; nothing is written if a chunk is missing or damaged, \
and the snapshot is written last (locally: a temporary file renamed into place; in an object \
store: one PUT). An intact snapshot is replaced only with --force. A chunk is missing when a \
later one is there, or when a snapshot still there (damaged or not) lists it; with no snapshot \
left, missing last chunks cannot be told from a dataset that ends earlier: the summary says how \
many chunks and samples it rebuilt from. The rebuilt snapshot starts a new lineage (generation \
0): views made before it are refused as stale and can be made again."
)]
pub struct Args {
    /// Dataset directory, or its URL (s3://, gs://, az://).
    pub dataset: PathBuf,
    /// Replace the snapshot even if it is intact (every checksum right).
    #[arg(long)]
    pub force: bool,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let s = granary_packer::reindex(&a.dataset, a.force, super::store_config())?;
    super::output(a.json, &s, |s| {
        println!(
            "rebuilt {} from {} chunks: {} samples, {} directories, dataset id {}; file modes \
             and mtimes {}",
            s.snapshot,
            s.chunks,
            s.samples,
            s.directories,
            s.dataset_id,
            if s.file_attributes {
                "restored"
            } else {
                "not restored (not every chunk records them: packed with --no-metadata, \
                 written by the Writer, or by granary before format 2.0)"
            }
        );
    })
}
