use std::ffi::OsString;
use std::io::{BufWriter, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::ExitCode;

use super::open_dataset;

/// List the paths in a dataset, sorted (non-UTF-8 bytes shown as \xNN).
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  granary ls train.granary\n  granary ls train.granary n01440764/ --long\n\n\
--long columns: sample id, original size, stored size, compression, chunk, class, path."
)]
pub struct Args {
    /// Dataset directory (or its snapshot file).
    pub dataset: PathBuf,
    /// Only paths starting with PREFIX.
    pub prefix: Option<OsString>,
    /// Show id, sizes, compression, chunk and class.
    #[arg(short, long)]
    pub long: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let ds = open_dataset(&a.dataset)?;
    let prefix = a
        .prefix
        .as_ref()
        .map(|p| p.as_bytes().to_vec())
        .unwrap_or_default();
    let range = ds.snapshot().prefix_range(&prefix)?;
    let classes = ds.classes()?;
    let mut out = BufWriter::new(std::io::stdout().lock());
    for pos in range {
        let id = ds.snapshot().sorted_id(pos)?;
        let path = granary::escape_path(ds.path(id)?);
        if a.long {
            let s = ds.sample(id)?;
            let class = classes
                .get(s.entry.label as usize)
                .map(|c| granary::escape_path(c))
                .unwrap_or_else(|| "-".into());
            writeln!(
                out,
                "{:>9} {:>12} {:>12} {:<4} {:>6} {:<16} {path}",
                id,
                s.entry.orig_len,
                s.entry.stored_len,
                s.compression.name(),
                s.entry.chunk,
                class
            )?;
        } else {
            writeln!(out, "{path}")?;
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
