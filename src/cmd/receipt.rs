//! Deletion receipts: what `granary delete --receipt` records of each sample it deletes (id,
//! path, length, CRC-32 and a SHA-256 digest of its bytes), and the scan `granary verify
//! --deleted` makes of a dataset's chunk files for any record still holding those bytes.

use std::collections::HashMap;
use std::path::Path;

use granary::Dataset;
use serde::{Deserialize, Serialize};

/// A receipt: the dataset, the generation the deletion published, the samples deleted.
#[derive(Serialize, Deserialize)]
pub struct Receipt {
    pub receipt: String,
    pub dataset_id: String,
    pub generation: u64,
    pub samples: Vec<Gone>,
}

/// One deleted sample: what finds its bytes again.
#[derive(Serialize, Deserialize)]
pub struct Gone {
    pub id: u64,
    pub path: String,
    pub size: u64,
    pub crc32: u32,
    /// The first 16 bytes of SHA-256 over the sample's bytes, in hex.
    pub sha256_128: String,
}

const KIND: &str = "granary deletion receipt 1";

/// The receipt of deleting `ids` (samples of `ds` not deleted yet) by generation `generation`:
/// reads each sample once.
pub fn of(ds: &Dataset, ids: &[u64], generation: u64) -> anyhow::Result<Receipt> {
    let mut samples = Vec::with_capacity(ids.len());
    for &id in ids.iter().filter(|&&id| ds.selects(id)) {
        let data = ds.read(id)?;
        samples.push(Gone {
            id,
            path: granary::escape_path(&ds.path(id)?),
            size: data.len() as u64,
            crc32: granary_format::crc32(&data),
            sha256_128: granary_format::hex16(&granary_format::chunk_digest(&data)),
        });
    }
    Ok(Receipt {
        receipt: KIND.into(),
        dataset_id: granary_format::hex16(&ds.snapshot().dataset_id()),
        generation,
        samples,
    })
}

/// The directory `path` is in (`.` for a bare name).
pub fn parent_of(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Writes `r` to `path` whole (a temporary file renamed into place).
pub fn write(path: &Path, r: &Receipt) -> anyhow::Result<()> {
    let bytes = serde_json::to_vec_pretty(r)?;
    let durable = granary_store::write::Durability::FileAndDir;
    granary_store::write::write_atomic(path, durable, |f| std::io::Write::write_all(f, &bytes))
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))
}

/// Reads a receipt.
pub fn read(path: &Path) -> anyhow::Result<Receipt> {
    let bytes =
        std::fs::read(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    let r: Receipt = serde_json::from_slice(&bytes)
        .map_err(|e| anyhow::anyhow!("{}: not a deletion receipt: {e}", path.display()))?;
    if r.receipt != KIND {
        anyhow::bail!(
            "{}: not a deletion receipt ({:?})",
            path.display(),
            r.receipt
        );
    }
    Ok(r)
}

/// What a scan for deleted samples' bytes found.
#[derive(Default, Serialize)]
pub struct Scan {
    pub files: u64,
    pub records: u64,
    /// `FILE record N holds deleted sample ID (PATH)`, one per record found.
    pub found: Vec<String>,
    /// Files that look like chunk files but could not be decoded: not scanned.
    pub not_scanned: Vec<String>,
}

/// Scans every chunk file in `dir` (every revision, replaced ones included), record by record
/// (decoded), for the bytes of the samples of `r`: a record of the same length and CRC-32 is
/// compared by its SHA-256 digest.
pub fn scan(dir: &Path, r: &Receipt) -> anyhow::Result<Scan> {
    let mut want: HashMap<(u64, u32), Vec<&Gone>> = HashMap::new();
    for g in &r.samples {
        want.entry((g.size, g.crc32)).or_default().push(g);
    }
    let mut s = Scan::default();
    let rd =
        std::fs::read_dir(dir).map_err(|e| anyhow::anyhow!("listing {}: {e}", dir.display()))?;
    let mut names: Vec<String> = rd
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| granary_format::parse_chunk_file_name_at(n).is_some())
        .collect();
    names.sort();
    for name in names {
        let path = dir.join(&name);
        let Some((id, _)) = granary_format::parse_chunk_file_name_at(&name) else {
            continue;
        };
        // Opened by its own name, whichever revision it is.
        let read = granary_store::file::open_regular(&path, 0)
            .map_err(|e| granary_store::StoreError::io("opening", &path, e))
            .and_then(|f| granary_store::file::IoFile::unmapped(f, &path, false))
            .and_then(|f| granary_store::file::read_whole(&f));
        let bytes = match read {
            Ok(b) => b,
            Err(e) => {
                s.not_scanned.push(format!("{}: {e}", path.display()));
                continue;
            }
        };
        let header = granary_format::ChunkHeader::decode(&bytes);
        let check = header.and_then(|h| granary_format::check_chunk(&bytes, &h.dataset_id, id));
        let check = match check {
            Ok(c) => c,
            Err(e) => {
                s.not_scanned.push(format!("{}: {e}", path.display()));
                continue;
            }
        };
        s.files += 1;
        for (i, e) in check.footer.entries.iter().enumerate() {
            s.records += 1;
            let Some(gs) = want.get(&(e.orig_len, e.crc32)) else {
                continue;
            };
            let stored = &bytes[e.offset as usize..(e.offset + e.stored_len) as usize];
            let Ok(data) = granary_format::decode_record(e, stored) else {
                continue;
            };
            let digest = granary_format::hex16(&granary_format::chunk_digest(&data));
            for g in gs.iter().filter(|g| g.sha256_128 == digest) {
                s.found.push(format!(
                    "{} record {i} holds deleted sample {} ({})",
                    path.display(),
                    g.id,
                    g.path
                ));
            }
        }
    }
    Ok(s)
}
