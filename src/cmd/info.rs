use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use granary_format::hex16;
use serde_json::json;

use super::{human_bytes, open_dataset};

/// Show a dataset's format version, id, counts, sizes and classes.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  granary info train.granary\n  granary info train.granary --json | jq .samples"
)]
pub struct Args {
    /// Dataset directory (or its snapshot file).
    pub dataset: PathBuf,
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let ds = open_dataset(&a.dataset)?;
    let snap = ds.snapshot();
    let (major, minor) = snap.version();
    // Everything below comes from the chunk table (O(chunks)), so that a remote dataset's
    // info reads a few blocks of its snapshot, never its per-sample tables.
    let (mut stored, mut orig, mut compressed, mut chunk_bytes) = (0u64, 0u64, 0u64, 0u64);
    for c in snap.chunks() {
        stored += c.stored_bytes();
        orig += c.orig_bytes;
        compressed += c.compressed as u64;
        chunk_bytes += c.file_size;
    }
    let classes: Vec<String> = ds
        .classes()?
        .into_iter()
        .map(granary::escape_path)
        .collect();
    let id = granary_packer::hex_id(&snap.dataset_id());
    // The samples' fields and their types.
    let types = snap.field_types().map_err(|e| anyhow::anyhow!("{e}"))?;
    let fields: Vec<String> = ds
        .field_names()?
        .iter()
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect();
    let typed: Vec<String> = fields
        .iter()
        .zip(&types)
        .map(|(n, t)| format!("{n} ({})", t.descriptor()))
        .collect();
    let field_types: serde_json::Map<String, serde_json::Value> = fields
        .iter()
        .zip(&types)
        .map(|(n, t)| (n.clone(), t.descriptor().into()))
        .collect();
    let lineage = snap.lineage();
    let mut out = std::io::stdout().lock();
    if a.json {
        let v = json!({
            "format_version": format!("{major}.{minor}"),
            "generation": ds.snapshot().lineage().generation,
            "parent": lineage.has_parent().then(|| hex16(&lineage.parent)),
            "dataset_id": id,
            "content_digest": hex16(&snap.content_digest()),
            "samples": ds.len(),
            "chunks": ds.chunk_count(),
            "bytes_original": orig,
            "bytes_stored": stored,
            "bytes_chunks": chunk_bytes,
            "bytes_snapshot": snap.bytes().len(),
            "compressed_samples": compressed,
            "classes": classes,
            "file_attributes": snap.has_attrs(),
            "directories": snap.dir_count(),
            "fields": fields,
            "field_types": field_types,
            "view": ds.view().map(|v| json!({
                "file": v.file.display().to_string(),
                "description": v.description,
                "selected": v.ids.len(),
            })),
        });
        super::print_json(&v)?;
        return Ok(ExitCode::SUCCESS);
    }
    match ds.view() {
        // What the user named is a view: say so first; the rest is its dataset's.
        Some(v) => {
            writeln!(out, "view           {}", a.dataset.display())?;
            writeln!(
                out,
                "selects        {} of the dataset's {} samples ({})",
                v.ids.len(),
                ds.len(),
                v.description
            )?;
            writeln!(out, "of dataset     (below)")?;
        }
        None => writeln!(out, "dataset        {}", a.dataset.display())?,
    }
    writeln!(out, "format         {major}.{minor}")?;
    if lineage.generation > 0 {
        let parent = if lineage.has_parent() {
            format!(
                "the snapshot with content digest {}",
                hex16(&lineage.parent)
            )
        } else {
            "a snapshot upgraded from 1.x, whose digest is not recorded".to_string()
        };
        writeln!(
            out,
            "generation     {} (appended to {parent})",
            lineage.generation
        )?;
    }
    writeln!(out, "dataset id     {id}")?;
    writeln!(out, "content digest {}", hex16(&snap.content_digest()))?;
    writeln!(
        out,
        "samples        {} ({} compressed)",
        ds.len(),
        compressed
    )?;
    writeln!(
        out,
        "chunks         {} ({})",
        ds.chunk_count(),
        human_bytes(chunk_bytes)
    )?;
    if !fields.is_empty() {
        writeln!(
            out,
            "fields         {}: {} (each sample's files KEY.FIELD)",
            fields.len(),
            typed.join(", ")
        )?;
    }
    writeln!(
        out,
        "metadata       {}",
        match snap.has_attrs() {
            false => format!(
                "{} directories; no modes or mtimes recorded (shown as 0444 files, 0555 \
                 directories)",
                snap.dir_count()
            ),
            true => format!(
                "every file's and directory's mode and mtime ({} directories)",
                snap.dir_count()
            ),
        }
    )?;
    writeln!(out, "original bytes {}", human_bytes(orig))?;
    writeln!(out, "stored bytes   {}", human_bytes(stored))?;
    writeln!(
        out,
        "snapshot       {}",
        human_bytes(snap.bytes().len() as u64)
    )?;
    let shown: Vec<&str> = classes.iter().take(10).map(String::as_str).collect();
    let more = if classes.len() > 10 {
        format!(", ... ({} more)", classes.len() - 10)
    } else {
        String::new()
    };
    writeln!(
        out,
        "classes        {}: {}{more}",
        classes.len(),
        shown.join(", ")
    )?;
    Ok(ExitCode::SUCCESS)
}
