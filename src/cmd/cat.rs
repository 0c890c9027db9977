use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};

use super::open_dataset;

/// Write one sample's original bytes to stdout (checked against its CRC first).
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  granary cat train.granary dog/0001.jpg > 0001.jpg\n  granary cat train.granary --id 42 | sha256sum\n\n\
A path with non-UTF-8 bytes can be given as `granary ls` shows it (\\xNN escapes)."
)]
pub struct Args {
    /// Dataset directory (or its snapshot file).
    pub dataset: PathBuf,
    /// Path of the sample, relative to the packed directory.
    #[arg(required_unless_present = "id", conflicts_with = "id")]
    pub path: Option<OsString>,
    /// Sample id instead of a path.
    #[arg(long)]
    pub id: Option<u64>,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let ds = open_dataset(&a.dataset)?;
    let id = match (a.id, &a.path) {
        (Some(id), _) => id,
        (None, Some(p)) => {
            let raw = p.as_bytes();
            let found = match ds.lookup(raw)? {
                Some(id) => Some(id),
                None => match granary::unescape_path(raw) {
                    Some(u) if u != raw => ds.lookup(&u)?,
                    _ => None,
                },
            };
            match found {
                Some(id) => id,
                None => bail!(
                    "{}: no such path in {}",
                    p.to_string_lossy(),
                    a.dataset.display()
                ),
            }
        }
        (None, None) => bail!("give a PATH or --id"),
    };
    let data = ds
        .read(id)
        .with_context(|| format!("reading sample {id}"))?;
    let mut out = std::io::stdout().lock();
    out.write_all(&data)?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
