use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use granary_packer::{CompressMode, Existing, PackOptions};

/// Add new files to a dataset as new chunks, publishing its next snapshot generation.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  granary append train.granary ./new-images
  granary append train.granary ./train --skip-existing     # the tree grew: add what is new

Old chunks are never touched: the new snapshot lists every old chunk plus the new ones and
replaces the old snapshot atomically, so a reader that has the old one open keeps reading it
(every byte it refers to is still there) and sees the new files when it reopens. `granary info`
shows the generation. Labels follow the dataset: files must lie in its class directories (or
outside any, unlabelled; a dataset packed without labels gets none). A path the dataset has
already is refused, or left out with --skip-existing: samples are immutable, so changing one
means packing a new dataset.")]
pub struct Args {
    /// Dataset directory to append to.
    pub dataset: PathBuf,
    /// Directory holding the new files (paths inside it become the samples' paths).
    pub src: PathBuf,
    /// Leave out files whose path the dataset has already (instead of refusing).
    #[arg(long)]
    pub skip_existing: bool,
    /// Append the files named in LIST (relative to SRC) instead of walking SRC.
    #[arg(long, value_name = "LIST")]
    pub files_from: Option<PathBuf>,
    /// Follow symbolic links (by default they are skipped with a warning).
    #[arg(long)]
    pub follow_links: bool,
    /// Seed of the random layout order of the new files.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Record compression (see granary pack --help).
    #[arg(long, default_value = "auto", value_parser = CompressMode::parse)]
    pub compress: CompressMode,
    /// Target size of the new chunks.
    #[arg(long, default_value = "32MiB", value_parser = super::pack::parse_size)]
    pub chunk_size: u64,
    /// Continue an interrupted append (same source and settings), keeping its verified chunks.
    #[arg(long)]
    pub resume: bool,
    /// Discard an interrupted append and start over.
    #[arg(long)]
    pub force: bool,
    /// Skip files that cannot be read, list them, and exit with 3.
    #[arg(long)]
    pub skip_unreadable: bool,
    /// Threads that read, checksum and compress files.
    #[arg(long, default_value_t = granary_packer::DEFAULT_IO_THREADS)]
    pub io_threads: usize,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Never show progress bars.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    if a.dataset
        .to_str()
        .is_some_and(granary::remote::looks_like_url)
    {
        anyhow::bail!(
            "{}: append works on a dataset directory (local or on a shared file system)",
            a.dataset.display()
        );
    }
    let mut o = PackOptions::new(&a.src, &a.dataset);
    o.files_from = a.files_from;
    o.follow_links = a.follow_links;
    o.seed = a.seed;
    o.compress = a.compress;
    o.chunk_size = a.chunk_size;
    o.force = a.force;
    o.resume = a.resume;
    o.skip_unreadable = a.skip_unreadable;
    o.io_threads = a.io_threads;
    o.progress = !a.quiet && std::io::stderr().is_terminal();
    let existing = if a.skip_existing {
        Existing::Skip
    } else {
        Existing::Refuse
    };
    let s = granary_packer::append(&o, existing)
        .with_context(|| format!("appending {} to {}", a.src.display(), a.dataset.display()))?;
    super::pack::report(&a.src, &s, a.json)
}
