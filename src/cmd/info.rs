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
    let facts = Facts::of(&ds)?;
    match a.json {
        true => super::print_json(&facts.json(&ds))?,
        false => facts.text(&ds, &a.dataset, &mut std::io::stdout().lock())?,
    }
    Ok(ExitCode::SUCCESS)
}

/// What `info` reports beyond the snapshot's own accessors. Everything comes from the chunk
/// table (O(chunks)), so that a remote dataset's info reads a few blocks of its snapshot,
/// never its per-sample tables.
struct Facts {
    id: String,
    stored: u64,
    orig: u64,
    compressed: u64,
    chunk_bytes: u64,
    classes: Vec<String>,
    /// Field names and their type descriptors.
    fields: Vec<(String, String)>,
}

impl Facts {
    fn of(ds: &granary::Dataset) -> anyhow::Result<Facts> {
        let snap = ds.snapshot();
        let (mut stored, mut orig, mut compressed, mut chunk_bytes) = (0u64, 0u64, 0u64, 0u64);
        for c in snap.chunks() {
            stored += c.stored_bytes();
            orig += c.orig_bytes;
            compressed += c.compressed as u64;
            chunk_bytes += c.file_size;
        }
        let classes = ds
            .classes()?
            .into_iter()
            .map(granary::escape_path)
            .collect();
        let types = snap.field_types().map_err(|e| anyhow::anyhow!("{e}"))?;
        let fields = ds
            .field_names()?
            .iter()
            .zip(&types)
            .map(|(n, t)| (String::from_utf8_lossy(n).into_owned(), t.descriptor()))
            .collect();
        Ok(Facts {
            id: granary_packer::hex_id(&snap.dataset_id()),
            stored,
            orig,
            compressed,
            chunk_bytes,
            classes,
            fields,
        })
    }

    fn json(&self, ds: &granary::Dataset) -> serde_json::Value {
        let snap = ds.snapshot();
        let (major, minor) = snap.version();
        let lineage = snap.lineage();
        let field_types: serde_json::Map<String, serde_json::Value> = self
            .fields
            .iter()
            .map(|(n, t)| (n.clone(), t.clone().into()))
            .collect();
        json!({
            "format_version": format!("{major}.{minor}"),
            "generation": lineage.generation,
            "parent": lineage.has_parent().then(|| hex16(&lineage.parent)),
            "dataset_id": self.id,
            "content_digest": hex16(&snap.content_digest()),
            "samples": ds.len(),
            "chunks": ds.chunk_count(),
            "bytes_original": self.orig,
            "bytes_stored": self.stored,
            "bytes_chunks": self.chunk_bytes,
            "bytes_snapshot": snap.bytes().len(),
            "compressed_samples": self.compressed,
            "classes": self.classes,
            "file_attributes": snap.has_attrs(),
            "directories": snap.dir_count(),
            "fields": self.fields.iter().map(|f| &f.0).collect::<Vec<_>>(),
            "field_types": field_types,
            "view": ds.view().map(|v| json!({
                "file": v.file.display().to_string(),
                "description": v.description,
                "selected": v.ids.len(),
            })),
        })
    }

    fn text(
        &self,
        ds: &granary::Dataset,
        named: &std::path::Path,
        out: &mut impl Write,
    ) -> std::io::Result<()> {
        let snap = ds.snapshot();
        let (major, minor) = snap.version();
        match ds.view() {
            // What the user named is a view: say so first; the rest is its dataset's.
            Some(v) => {
                writeln!(out, "view           {}", named.display())?;
                writeln!(
                    out,
                    "selects        {} of the dataset's {} samples ({})",
                    v.ids.len(),
                    ds.len(),
                    v.description
                )?;
                writeln!(out, "of dataset     (below)")?;
            }
            None => writeln!(out, "dataset        {}", named.display())?,
        }
        writeln!(out, "format         {major}.{minor}")?;
        let lineage = snap.lineage();
        if lineage.generation > 0 {
            let parent = match lineage.has_parent() {
                true => format!(
                    "the snapshot with content digest {}",
                    hex16(&lineage.parent)
                ),
                false => "a snapshot upgraded from 1.x, whose digest is not recorded".into(),
            };
            writeln!(
                out,
                "generation     {} (appended to {parent})",
                lineage.generation
            )?;
        }
        writeln!(out, "dataset id     {}", self.id)?;
        writeln!(out, "content digest {}", hex16(&snap.content_digest()))?;
        let (samples, compressed) = (ds.len(), self.compressed);
        writeln!(out, "samples        {samples} ({compressed} compressed)")?;
        let chunks = human_bytes(self.chunk_bytes);
        writeln!(out, "chunks         {} ({chunks})", ds.chunk_count())?;
        if !self.fields.is_empty() {
            let typed: Vec<String> = self
                .fields
                .iter()
                .map(|(n, t)| format!("{n} ({t})"))
                .collect();
            writeln!(
                out,
                "fields         {}: {} (each sample's files KEY.FIELD)",
                self.fields.len(),
                typed.join(", ")
            )?;
        }
        let dirs = snap.dir_count();
        let metadata = match snap.has_attrs() {
            false => format!(
                "{dirs} directories; no modes or mtimes recorded (shown as 0444 files, 0555 \
                 directories)"
            ),
            true => format!("every file's and directory's mode and mtime ({dirs} directories)"),
        };
        writeln!(out, "metadata       {metadata}")?;
        writeln!(out, "original bytes {}", human_bytes(self.orig))?;
        writeln!(out, "stored bytes   {}", human_bytes(self.stored))?;
        let snapshot = human_bytes(snap.bytes().len() as u64);
        writeln!(out, "snapshot       {snapshot}")?;
        let shown: Vec<&str> = self.classes.iter().take(10).map(String::as_str).collect();
        let more = match self.classes.len() > 10 {
            true => format!(", ... ({} more)", self.classes.len() - 10),
            false => String::new(),
        };
        let n = self.classes.len();
        writeln!(out, "classes        {n}: {}{more}", shown.join(", "))
    }
}
