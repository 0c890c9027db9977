use std::path::PathBuf;
use std::process::ExitCode;

use super::human_bytes;

/// Check every section, chunk and record checksum of a dataset.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  granary verify train.granary\n  granary verify train.granary --json\n  \
granary verify train.granary --deleted takedown.receipt   # after delete --receipt and compact\n\n\
It also prints the digest a complete epoch of `granary read` must show (the sum over the ranks' \
digests): the snapshot's record checksums, keyed by sample id.\n\n\
Exit status: 0 when the dataset is intact, 1 when any damage is found (every problem is listed \
with its file, chunk, offset and sample path) or, with --deleted, a record of a deleted sample, 3 when it is a dataset of format 1.x with an \
intact snapshot (UPGRADE line: `granary upgrade DATASET` makes it readable), 4 when nothing was \
found damaged but something could not be looked at (a missing dataset or bucket, refused \
credentials or permissions, storage that did not answer: CANNOT CHECK lines), 2 on a usage \
error."
)]
pub struct Args {
    /// Dataset directory (or its snapshot file), its URL (s3://, gs://, az://), or a view file
    /// (its dataset is checked whole).
    pub dataset: PathBuf,
    /// Also scan every chunk file of the dataset's directory (replaced revisions included),
    /// record by record, for the bytes of the samples a deletion receipt lists
    /// (`granary delete --receipt`): each one found is a FOUND line and exit status 1.
    #[arg(long, value_name = "RECEIPT")]
    pub deleted: Option<PathBuf>,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Exit status of a verify that found no damage but could not look at everything.
pub const EXIT_CANNOT_CHECK: u8 = 4;

/// Exit status of a verify of an intact dataset of format 1.x (`granary upgrade` reads it).
pub const EXIT_NEEDS_UPGRADE: u8 = 3;

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let t = std::time::Instant::now();
    let r = granary::verify_with(&a.dataset, super::store_config());
    let scan = match &a.deleted {
        None => None,
        Some(f) => {
            if !a.dataset.is_dir() {
                anyhow::bail!(
                    "{}: --deleted scans a dataset directory (local or on a shared file system)",
                    a.dataset.display()
                );
            }
            Some(super::receipt::scan(&a.dataset, &super::receipt::read(f)?)?)
        }
    };
    if a.json {
        let mut v = r.to_json();
        if let Some(s) = &scan {
            v["deleted"] = serde_json::to_value(s)?;
        }
        super::print_json(&v)?;
    } else {
        if let Some(s) = &scan {
            for f in &s.found {
                println!("FOUND {f}");
            }
            for f in &s.not_scanned {
                println!("CANNOT CHECK {f}: not scanned for deleted samples");
            }
            println!(
                "deleted samples: {} of their records found in {} records of {} chunk files",
                s.found.len(),
                s.records,
                s.files
            );
        }
        if let Some(u) = &r.needs_upgrade {
            println!("UPGRADE {u}");
        }
        for p in &r.problems {
            println!("DAMAGED {}: {}", p.location, p.detail);
        }
        for p in &r.unreadable {
            println!("CANNOT CHECK {}: {}", p.location, p.detail);
        }
        for n in &r.notes {
            println!("note: {n}");
        }
        if let Some(d) = r.digest {
            println!("digest of a complete epoch: {d:016x} (what `granary read` prints when every sample arrives once, right)");
        }
        if let Some(d) = r.samples_digest {
            println!("samples digest: {d:016x} (paths, bytes and labels: the same for every dataset of the same files, however packed)");
        }
        let secs = t.elapsed().as_secs_f64();
        println!(
            "{}: {} samples, {} chunks, {} records and {} checked in {:.2} s: {}",
            a.dataset.display(),
            r.samples,
            r.chunks,
            r.records_checked,
            human_bytes(r.bytes_checked),
            secs,
            match (r.problems.len(), r.unreadable.len()) {
                (0, 0) if r.needs_upgrade.is_some() => "format 1.x: run granary upgrade".into(),
                (0, 0) => "OK".to_string(),
                (0, n) => format!("not checked: {n} could not be read"),
                (1, 0) => "1 problem".into(),
                (d, 0) => format!("{d} problems"),
                (1, n) => format!("1 problem, and {n} could not be read"),
                (d, n) => format!("{d} problems, and {n} could not be read"),
            }
        );
    }
    let found = scan.as_ref().is_some_and(|s| !s.found.is_empty());
    let unscanned = scan.as_ref().is_some_and(|s| !s.not_scanned.is_empty());
    Ok(if r.is_damaged() || found {
        ExitCode::FAILURE
    } else if r.needs_upgrade.is_some() {
        ExitCode::from(EXIT_NEEDS_UPGRADE)
    } else if !r.is_clean() || unscanned {
        ExitCode::from(EXIT_CANNOT_CHECK)
    } else {
        ExitCode::SUCCESS
    })
}
