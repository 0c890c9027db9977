use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use granary_packer::Existing;

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
    #[command(flatten)]
    pub files: super::pack::Files,
    /// Continue an interrupted append (same source and settings), keeping its verified chunks.
    #[arg(long)]
    pub resume: bool,
    /// Discard an interrupted append and start over.
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub run: super::pack::Run,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    if a.dataset
        .to_str()
        .is_some_and(granary_store::object::looks_like_url)
    {
        anyhow::bail!(
            "{}: append works on a dataset directory (local or on a shared file system)",
            a.dataset.display()
        );
    }
    let mut o = a.run.options(&a.files, &a.src, &a.dataset);
    o.output.force = a.force;
    o.output.resume = a.resume;
    let existing = if a.skip_existing {
        Existing::Skip
    } else {
        Existing::Refuse
    };
    let s = granary_packer::append(&o, existing)
        .with_context(|| format!("appending {} to {}", a.src.display(), a.dataset.display()))?;
    super::pack::report(&a.src, &s, a.run.json)
}
