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
--long columns: sample id, original size, stored size, compression, chunk, class, path.\n\
A dataset whose samples have named fields (written with fields, or imported from WebDataset) \
lists each field as the file KEY.FIELD, as WebDataset names them."
)]
pub struct Args {
    /// Dataset directory (or its snapshot file), its URL (s3://, gs://, az://), or a view file
    /// (`granary view`: the view's samples only).
    pub dataset: PathBuf,
    /// Only paths starting with PREFIX.
    pub prefix: Option<OsString>,
    /// Show id, sizes, compression, chunk and class.
    #[arg(short, long)]
    pub long: bool,
}

/// Namespace positions fetched together by `ls` of a snapshot read in blocks.
const LS_BATCH: u64 = 1 << 16;

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let ds = open_dataset(&a.dataset)?;
    let prefix = a.prefix.as_ref().map_or(&[][..], |p| p.as_bytes());
    // With fields a sample is the files KEY.FIELD: the prefix selects keys
    // first, then the file names.
    let key_prefix = match ds.has_fields() {
        true => granary_format::split_field_path(prefix).map_or(prefix, |(k, _)| k),
        false => prefix,
    };
    if key_prefix.is_empty() {
        // Every path: fetched at once when the snapshot is read in blocks.
        ds.prefetch_namespace()?;
    }
    let range = ds.snapshot().prefix_range(key_prefix)?;
    let classes = ds.classes()?;
    let class = |label: u32| {
        classes
            .get(label as usize)
            .map(|c| granary::escape_path(c))
            .unwrap_or_else(|| "-".into())
    };
    let mut out = BufWriter::new(std::io::stdout().lock());
    let mut pos = range.start;
    while pos < range.end {
        let batch = ds.entries(pos..(pos + LS_BATCH).min(range.end))?;
        anyhow::ensure!(
            !batch.is_empty(),
            "position {pos} of the namespace is missing"
        );
        let first = pos;
        pos += batch.len() as u64;
        if a.long {
            let ids: Vec<u64> = batch.iter().filter_map(|e| e.id).collect();
            ds.prefetch_samples_at(&ids)?;
        }
        for (at, e) in (first..).zip(batch) {
            // Directories are not listed; through a view, only its samples are.
            let (Some(id), key) = (e.id.filter(|&id| ds.selects(id)), e.path) else {
                continue;
            };
            // What is shown beside a path is its own sample's (the id table leads back), and a
            // key shown as KEY.NAME files splits back into that key (SPEC.md §3, §7).
            if a.long && ds.snapshot().position(id)? != at {
                anyhow::bail!(
                    "{}: the namespace entry of {} is tagged sample {id}, whose id table entry \
                     is another position: the snapshot is damaged (`granary verify`)",
                    a.dataset.display(),
                    granary::escape_path(&key)
                );
            }
            if ds.has_fields() {
                if let Err(why) = granary_format::check_field_key(&key) {
                    anyhow::bail!(
                        "{}: key {}: {why}: the snapshot is damaged (`granary verify`)",
                        a.dataset.display(),
                        granary::escape_path(&key)
                    );
                }
                let s = ds.sample(id)?;
                for f in ds.fields(id)? {
                    let name = [&key[..], b".", f.name].concat();
                    if !name.starts_with(prefix) {
                        continue;
                    }
                    let path = granary::escape_path(&name);
                    if a.long {
                        let (c, len) = (class(s.entry.label), f.len);
                        let chunk = s.entry.chunk;
                        writeln!(
                            out,
                            "{id:>9} {len:>12} {len:>12} {:<4} {chunk:>6} {c:<16} {path}",
                            "none"
                        )?;
                    } else {
                        writeln!(out, "{path}")?;
                    }
                }
                continue;
            }
            let path = granary::escape_path(&key);
            if a.long {
                let s = ds.sample(id)?;
                writeln!(
                    out,
                    "{:>9} {:>12} {:>12} {:<4} {:>6} {:<16} {path}",
                    id,
                    e.size, // the namespace's: what `cat` and the mount hand out
                    s.entry.stored_len,
                    s.compression.name(),
                    s.entry.chunk,
                    class(s.entry.label)
                )?;
            } else {
                writeln!(out, "{path}")?;
            }
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
