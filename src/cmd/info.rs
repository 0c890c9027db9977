use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use granary_format::hex16;
use serde_json::{json, Value};

use super::{human_bytes, open_dataset};

/// Show a dataset's format version, id, counts, sizes and classes.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  granary info train.granary\n  granary info train.granary --json | jq .samples"
)]
pub struct Args {
    /// Dataset directory (or its snapshot file), its URL (s3://, gs://, az://), or a view file
    /// (what it selects, then its dataset).
    pub dataset: PathBuf,
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let ds = open_dataset(&a.dataset)?;
    let facts = facts(&ds)?;
    match a.json {
        true => super::print_json(&facts)?,
        false => text(&facts, &a.dataset, &mut std::io::stdout().lock())?,
    }
    Ok(ExitCode::SUCCESS)
}

/// What `info --json` prints. The sizes come from the chunk table (O(chunks)), so that a
/// remote dataset's info reads a few blocks of its snapshot, never its per-sample tables.
fn facts(ds: &granary::Dataset) -> anyhow::Result<Value> {
    let snap = ds.snapshot();
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
    let types = snap.field_types().map_err(|e| anyhow::anyhow!("{e}"))?;
    let names = ds.field_names()?;
    let names: Vec<String> = names
        .iter()
        .map(|n| String::from_utf8_lossy(n).into())
        .collect();
    let field_types: serde_json::Map<String, Value> = (names.iter().cloned())
        .zip(types.iter().map(|t| t.descriptor().into()))
        .collect();
    let (major, minor) = snap.version();
    let lineage = snap.lineage();
    Ok(json!({
        "format_version": format!("{major}.{minor}"),
        "generation": lineage.generation,
        "parent": lineage.has_parent().then(|| hex16(&lineage.parent)),
        "dataset_id": granary_packer::hex_id(&snap.dataset_id()),
        "content_digest": hex16(&snap.content_digest()),
        "samples": snap.live_count(),
        "deleted": (!snap.deleted().is_empty()).then(|| -> anyhow::Result<Value> {
            let dead = snap.dead_records()?;
            Ok(json!({
                "samples": snap.deleted().len(),
                "bytes": dead.iter().map(|d| d.2).sum::<u64>(),
                "chunks": dead.iter().map(|d| json!({"chunk": d.0, "samples": d.1, "bytes": d.2}))
                    .collect::<Vec<_>>(),
            }))
        }).transpose()?,
        "chunks": ds.chunk_count(),
        "bytes_original": orig,
        "bytes_stored": stored,
        "bytes_chunks": chunk_bytes,
        "bytes_snapshot": snap.bytes().len(),
        "compressed_samples": compressed,
        "classes": classes,
        "file_attributes": snap.has_attrs(),
        "directories": snap.dir_count(),
        "fields": names,
        "field_types": field_types,
        "view": ds.view().map(|v| json!({
            "file": v.file.display().to_string(),
            "description": v.description,
            "selected": v.ids.len(),
        })),
    }))
}

/// The text of `info` of the dataset `named`, from its [`facts`].
fn text(v: &Value, named: &Path, out: &mut impl Write) -> std::io::Result<()> {
    let str_of = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let bytes = |k: &str| human_bytes(v[k].as_u64().unwrap_or_default());
    match v["view"].as_object() {
        // What the user named is a view: say so first; the rest is its dataset's.
        Some(view) => {
            writeln!(out, "view           {}", named.display())?;
            writeln!(
                out,
                "selects        {} of the dataset's {} samples ({})",
                view["selected"],
                v["samples"],
                str_of(&view["description"])
            )?;
            writeln!(out, "of dataset     (below)")?;
        }
        None => writeln!(out, "dataset        {}", named.display())?,
    }
    writeln!(out, "format         {}", str_of(&v["format_version"]))?;
    if v["generation"].as_u64() > Some(0) {
        let parent = match v["parent"].as_str() {
            Some(p) => format!("the snapshot with content digest {p}"),
            None => "a snapshot upgraded from 1.x, whose digest is not recorded".into(),
        };
        let generation = &v["generation"];
        writeln!(out, "generation     {generation} (extends {parent})")?;
    }
    writeln!(out, "dataset id     {}", str_of(&v["dataset_id"]))?;
    writeln!(out, "content digest {}", str_of(&v["content_digest"]))?;
    let (samples, compressed) = (&v["samples"], &v["compressed_samples"]);
    writeln!(out, "samples        {samples} ({compressed} compressed)")?;
    if let Some(d) = v["deleted"].as_object() {
        let chunks = d["chunks"].as_array().map_or(0, Vec::len);
        match chunks {
            0 => writeln!(
                out,
                "deleted        {} samples; compaction removed all their records",
                d["samples"]
            )?,
            _ => writeln!(
                out,
                "deleted        {} samples; their records, {}, stay in {chunks} chunk files \
                 until `granary compact` (info --json lists them)",
                d["samples"],
                human_bytes(d["bytes"].as_u64().unwrap_or_default())
            )?,
        }
    }
    let chunks = bytes("bytes_chunks");
    writeln!(out, "chunks         {} ({chunks})", v["chunks"])?;
    let fields = v["fields"].as_array().map_or(&[][..], |f| f);
    if !fields.is_empty() {
        let typed: Vec<String> = fields
            .iter()
            .map(|n| format!("{} ({})", str_of(n), str_of(&v["field_types"][str_of(n)])))
            .collect();
        writeln!(
            out,
            "fields         {}: {} (each sample's files KEY.FIELD)",
            fields.len(),
            typed.join(", ")
        )?;
    }
    let dirs = &v["directories"];
    let metadata = match v["file_attributes"].as_bool() == Some(true) {
        false => format!(
            "{dirs} directories; no modes or mtimes recorded (shown as 0444 files, 0555 \
             directories)"
        ),
        true => format!("every file's and directory's mode and mtime ({dirs} directories)"),
    };
    writeln!(out, "metadata       {metadata}")?;
    writeln!(out, "original bytes {}", bytes("bytes_original"))?;
    writeln!(out, "stored bytes   {}", bytes("bytes_stored"))?;
    writeln!(out, "snapshot       {}", bytes("bytes_snapshot"))?;
    let classes: Vec<String> = v["classes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(str_of)
        .collect();
    let more = match classes.len() > 10 {
        true => format!(", ... ({} more)", classes.len() - 10),
        false => String::new(),
    };
    let shown = classes[..classes.len().min(10)].join(", ");
    writeln!(out, "classes        {}: {shown}{more}", classes.len())
}
