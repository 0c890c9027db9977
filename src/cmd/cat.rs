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
    /// Dataset directory (or its snapshot file), its URL (s3://, gs://, az://), or a view file
    /// (`granary view`: the view's samples only).
    pub dataset: PathBuf,
    /// Path of the sample, relative to the packed directory.
    #[arg(required_unless_present = "id", conflicts_with = "id")]
    pub path: Option<OsString>,
    /// Sample id instead of a path.
    #[arg(long)]
    pub id: Option<u64>,
    /// With --id, in a dataset whose samples have named fields: the field to write.
    #[arg(long, requires = "id")]
    pub field: Option<OsString>,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let ds = open_dataset(&a.dataset)?;
    if let Some(id) = a.id {
        // Through a view, only its samples: as PATH finds only the view's.
        if id >= ds.len() || !ds.selects(id) {
            bail!(
                "{}: no sample {id} there ({})",
                a.dataset.display(),
                match ds.view() {
                    Some(v) => format!("a view of {} samples of its dataset", v.ids.len()),
                    None => format!(
                        "out of range: {} samples, ids 0 to {}",
                        ds.len(),
                        ds.len().saturating_sub(1)
                    ),
                }
            );
        }
    }
    if ds.has_fields() {
        return cat_field(&ds, &a);
    }
    if a.field.is_some() {
        bail!("{}: the samples have no named fields", a.dataset.display());
    }
    let id = match (a.id, &a.path) {
        (Some(id), _) => id,
        (None, Some(p)) => match super::select::find(p.as_bytes(), |n| ds.lookup(n))? {
            Some(id) => id,
            None => bail!(
                "{}: no such path in {}",
                p.to_string_lossy(),
                a.dataset.display()
            ),
        },
        (None, None) => bail!("give a PATH or --id"),
    };
    let data = ds
        .read(id)
        .with_context(|| format!("reading sample {id}"))?;
    // What `ls` shows as the size (the namespace's) is what `cat` writes, or an error.
    let shown = ds.stat(id)?.size;
    if data.len() as u64 != shown {
        bail!(
            "{}: sample {id}'s record holds {} bytes, its namespace entry says {shown}: the \
             snapshot is damaged (`granary verify` checks every sample)",
            a.dataset.display(),
            data.len()
        );
    }
    write_out(&data)
}

/// `cat` in a dataset whose samples have named fields: the file KEY.FIELD (or --id N --field
/// FIELD), read alone and checked against its own CRC.
fn cat_field(ds: &granary::Dataset, a: &Args) -> anyhow::Result<ExitCode> {
    let (id, name) = match (a.id, &a.path) {
        (Some(id), _) => {
            let fields = field_names(ds, id)?;
            match &a.field {
                Some(f) => (id, f.as_bytes().to_vec()),
                None => bail!("sample {id} has the fields {fields}: choose one with --field"),
            }
        }
        (None, Some(p)) => {
            let raw = p.as_bytes();
            match super::select::find(raw, |n| ds.lookup_field(n))? {
                Some(x) => x,
                None => {
                    let hint = match ds.lookup(raw)? {
                        Some(id) => format!(
                            " (it is a sample with the fields {}: name one as KEY.FIELD)",
                            field_names(ds, id)?
                        ),
                        None => String::new(),
                    };
                    bail!(
                        "{}: no such file in {}{hint}",
                        p.to_string_lossy(),
                        a.dataset.display()
                    )
                }
            }
        }
        (None, None) => bail!("give a PATH or --id"),
    };
    let mut fields = ds
        .read_fields(id, Some(&[&name[..]]))
        .with_context(|| format!("reading sample {id}"))?;
    let Some((_, data)) = fields.pop() else {
        bail!(
            "sample {id} has no field {}",
            String::from_utf8_lossy(&name)
        );
    };
    write_out(&data)
}

/// The names of sample `id`'s fields, as a list for a message.
fn field_names(ds: &granary::Dataset, id: u64) -> anyhow::Result<String> {
    let names: Vec<_> = ds
        .fields(id)?
        .iter()
        .map(|f| String::from_utf8_lossy(f.name).into_owned())
        .collect();
    Ok(names.join(", "))
}

/// Writes a sample's bytes to stdout.
fn write_out(data: &[u8]) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    out.write_all(data)?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
