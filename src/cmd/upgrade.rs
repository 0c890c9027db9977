use std::path::PathBuf;
use std::process::ExitCode;

/// Rewrite a format 1.x dataset's snapshot as format 2.0 (chunks are kept as they are).
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  granary upgrade train.granary && granary verify train.granary\n  \
granary upgrade s3://bucket/train            # a dataset in an object store, in place\n\n\
granary reads format 2.0 only; datasets written by granary 0.1.0 (format 1.0 to 1.6) are \
refused until upgraded. The new snapshot is built from the old one with every fact it \
recorded (paths, labels, fields, generations, modes, mtimes, directories) and checked \
completely before anything is written; the old snapshot is then kept as snapshot-1.x.gsnap and \
the new one takes its place in one step. Running it again after an interruption is safe; on a \
2.0 dataset it does nothing. A damaged 1.x snapshot is refused: `granary reindex --force` \
rebuilds one from the chunks."
)]
pub struct Args {
    /// Dataset directory, or its URL (s3://, gs://, az://).
    pub dataset: PathBuf,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let s = granary_packer::upgrade(&a.dataset, super::store_config())?;
    super::output(a.json, &s, |s| {
        if !s.upgraded {
            println!("{}: format 2.0 already, nothing to do", a.dataset.display());
        } else {
            println!(
                "upgraded {} from format {} to 2.0: {} samples in {} chunks, {} directories{}; \
                 snapshot {} -> {} bytes; the old snapshot is kept as {}",
                a.dataset.display(),
                s.from,
                s.samples,
                s.chunks,
                s.directories,
                if s.file_attributes {
                    ", file modes and mtimes"
                } else {
                    ""
                },
                s.old_bytes,
                s.new_bytes,
                s.kept
            );
        }
    })
}
