use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::ExitCode;

use granary::ExtractOptions;

use super::{human_bytes, open_dataset};

/// Restore the original files (byte-exact) under a directory.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  granary extract train.granary -o ./restored\n  granary extract train.granary -o ./dogs dog/\n\n\
Paths that would leave DIR (absolute, '..', through symbolic links) are refused, existing files are \
never overwritten, and damaged records are reported and not written. Exit status 1 if any sample \
could not be restored. Each file's and directory's mode and mtime are restored where the dataset records them (set-user-id and set-group-id bits are not), empty directories included."
)]
pub struct Args {
    /// Dataset directory (or its snapshot file), its URL (s3://, gs://, az://), or a view file
    /// (`granary view`: the view's samples only).
    pub dataset: PathBuf,
    /// Target directory (created if missing).
    #[arg(short, long, value_name = "DIR")]
    pub out: PathBuf,
    /// Only paths starting with PREFIX.
    pub prefix: Option<OsString>,
    /// Do not restore modes and mtimes: files get the umask's mode and the time of the
    /// extraction (empty directories are still created).
    #[arg(long)]
    pub no_metadata: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let ds = open_dataset(&a.dataset)?;
    let opts = ExtractOptions {
        out_dir: a.out.clone(),
        prefix: a.prefix.map(|p| p.as_bytes().to_vec()).unwrap_or_default(),
        metadata: !a.no_metadata,
    };
    let s = granary::extract(&ds, &opts)?;
    for (path, why) in &s.failed {
        eprintln!("granary: not extracted: {path}: {why}");
    }
    let dirs = if s.dirs > 0 {
        format!(" and {} directories", s.dirs)
    } else {
        String::new()
    };
    println!(
        "extracted {} files ({}){dirs} to {}",
        s.files,
        human_bytes(s.bytes),
        a.out.display()
    );
    if s.failed.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("granary: {} samples could not be extracted", s.failed.len());
        Ok(ExitCode::FAILURE)
    }
}
