use std::path::PathBuf;
use std::process::ExitCode;

/// Rebuild a lost or damaged snapshot from the chunk files' footers.
#[derive(clap::Args)]
#[command(
    after_help = "Example:\n  granary reindex train.granary && granary verify train.granary\n\n\
Every chunk is checked completely first; nothing is written if a chunk is missing or damaged."
)]
pub struct Args {
    /// Dataset directory.
    pub dataset: PathBuf,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let s = granary_packer::reindex(&a.dataset)?;
    if a.json {
        super::print_json(&s)?;
    } else {
        println!(
            "rebuilt {} from {} chunks: {} samples, dataset id {}",
            a.dataset.join(granary_format::SNAPSHOT_FILE).display(),
            s.chunks,
            s.samples,
            s.dataset_id
        );
    }
    Ok(ExitCode::SUCCESS)
}
