use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::ValueEnum;
use granary_packer::{CompressMode, LabelMode, Order, OutputOptions, PackOptions, PackSummary};

use super::human_bytes;

#[derive(Clone, Copy, ValueEnum)]
pub enum Labels {
    /// The first directory under SRC names the class (ImageFolder convention).
    ParentDir,
    /// No labels.
    None,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum From {
    /// A directory tree of files (one sample per file).
    Files,
    /// WebDataset tar shards: members KEY.FIELD grouped by key into samples with named fields
    /// (named fields), the label from the `.cls` field.
    Webdataset,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum OrderArg {
    /// Seeded random assignment of samples to chunks (mixes classes across chunks).
    Random,
    /// Sorted path order.
    Walk,
}

/// Pack a directory of files (or WebDataset tar shards) into a granary dataset (chunk files +
/// metadata snapshot).
#[derive(clap::Args)]
#[command(after_help = "Examples:
  granary pack ./imagenet/train -o /lustre/ds/train.granary
  granary pack --from webdataset 'shards/{000000..000123}.tar' -o laion.granary
  granary pack --from webdataset 's3://bucket/shards/{0000..0099}.tar' -o s3://bucket/laion.granary
  granary pack ./train -o train.granary --chunk-size 64MiB --compress zstd:9
  find ./train -name '*.jpg' -printf '%P\\0' > list; granary pack ./train --files-from list -o t.granary
  granary pack ./train -o train.granary --resume      # continue after Ctrl-C, kill or power loss

  granary pack ./train -o /lustre/train.granary --shard 0/4   # ... on 4 machines, shards 0..3,
  granary merge /lustre/train.granary                         # then once, when all have finished
  sbatch --array=0-15 --wrap 'granary pack ./train -o /lustre/t.granary --shard auto'

  granary pack ./train -o s3://bucket/datasets/train        # AWS_* variables configure the client
  AWS_ENDPOINT_URL=http://127.0.0.1:8333 AWS_ALLOW_HTTP=true granary pack ./train -o s3://b/train

The dataset appears under OUT only when complete (it is built in .OUT.partial next to it, locked
against a second pack of the same OUT). OUT may not be SRC, inside it, or contain it.
OUT may be an object store URL (s3://, gs://, az://): chunks are built in a local staging
directory (--staging), each uploaded as soon as it is written and then removed locally, and the
snapshot is uploaded last, so the prefix is a dataset only when complete. --resume continues an
interrupted upload from the same staging directory.
--shard I/N packs only shard I's share of the files (split by a hash of each path, so every
shard decides alone and the shares are balanced by count and bytes) into OUT/part-IIII-of-NNNN/
and chunks in OUT; `granary merge OUT` then writes the snapshot over all chunks without copying
them. Every shard must see the same files (same tree or same --files-from list) and settings.
Exit status 3: packed, but --skip-unreadable skipped some files (listed in the summary).
--from webdataset imports tar shards (local paths or URLs, with WebDataset's {000..123} and {a,b}
patterns; quote them from the shell): consecutive members with the same key (the path up to the
first dot of its file name) are one sample whose fields are the members' extensions (jpg, txt,
json, cls, ...); the label is the .cls field's number (or name). `granary extract` gives back the
members as the tars held them. Samples are mixed across chunks as a pack mixes files (the shards
are spilled to local disk next to OUT first); --resume continues an interrupted import.")]
pub struct Args {
    /// Directory to pack (only read, never modified); with --from webdataset, the tar shards.
    #[arg(required = true, num_args = 1.., value_name = "SRC")]
    pub src: Vec<PathBuf>,
    /// What SRC is.
    #[arg(long, value_enum, default_value = "files")]
    pub from: From,
    /// With --from webdataset: bytes of samples held in memory before the rest go to spill
    /// logs next to OUT [default: a sixteenth of RAM, at most 512MiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size_or_zero)]
    pub memory: Option<u64>,
    /// Output dataset directory, or an object store prefix (s3://bucket/prefix, gs://, az://).
    #[arg(short, long)]
    pub out: PathBuf,
    /// Local build directory of a pack to an object store (holds a few chunks at a time and
    /// the resume state) [default: ~/.cache/granary/uploads/<OUT as a file name>].
    #[arg(long, value_name = "DIR")]
    pub staging: Option<PathBuf>,
    /// Pack only shard I of N (0 <= I < N) as a part of OUT, for `granary merge`. `auto` takes
    /// I and N from a Slurm array job (SLURM_ARRAY_TASK_ID, _MIN, _STEP, _COUNT); `auto/N` takes
    /// I from SLURM_ARRAY_TASK_ID or a Kubernetes indexed job's JOB_COMPLETION_INDEX.
    #[arg(long, value_name = "I/N", value_parser = granary_packer::ShardSpec::parse)]
    pub shard: Option<granary_packer::ShardSpec>,
    #[command(flatten)]
    pub files: Files,
    /// How samples are labelled.
    #[arg(long, value_enum, default_value = "parent-dir")]
    pub labels: Labels,
    /// Layout order of samples across chunks.
    #[arg(long, value_enum, default_value = "random")]
    pub order: OrderArg,
    /// Replace OUT if it is a granary dataset (or an empty directory), and discard an
    /// interrupted pack. Anything else at OUT is refused: remove it yourself.
    #[arg(long)]
    pub force: bool,
    /// Continue an interrupted pack with the same settings, keeping every verified chunk. The
    /// source is scanned again: if files were modified, removed or added since, it refuses.
    #[arg(long)]
    pub resume: bool,
    #[command(flatten)]
    pub run: Run,
}

/// Which files pack and append take from SRC.
#[derive(clap::Args)]
pub struct Files {
    /// Pack the files named in LIST (paths relative to SRC, newline- or NUL-separated) instead
    /// of walking SRC.
    #[arg(long, value_name = "LIST")]
    pub files_from: Option<PathBuf>,
    /// Follow symbolic links (by default they are skipped with a warning).
    #[arg(long)]
    pub follow_links: bool,
}

/// How pack and append encode and write (shared by both).
#[derive(clap::Args)]
pub struct Run {
    /// Seed of the random layout order.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Record compression: auto (zstd where it saves >= 10 %, JPEG/PNG/... stored raw), none,
    /// zstd, or zstd:LEVEL.
    #[arg(long, default_value = "auto", value_parser = CompressMode::parse)]
    pub compress: CompressMode,
    /// Target chunk size, e.g. 32MiB, 64MB, 1GiB (a larger file gets a chunk of its own).
    #[arg(long, default_value = "32MiB", value_parser = parse_size)]
    pub chunk_size: u64,
    /// Most files in one chunk: bounds what a chunk of very small files costs the packer in
    /// memory (~250 bytes a file while it is read and written).
    #[arg(long, default_value_t = granary_packer::DEFAULT_CHUNK_FILES)]
    pub chunk_files: u64,
    /// Skip files that cannot be read (or change while read), list them, and exit with 3.
    #[arg(long)]
    pub skip_unreadable: bool,
    /// Threads that read, checksum and compress files (more than cores: reads block on
    /// storage, and more requests in flight is what a parallel file system needs).
    #[arg(long, default_value_t = granary_packer::DEFAULT_IO_THREADS)]
    pub io_threads: usize,
    /// Do not record each file's mode and mtime and the tree's directories (empty ones
    /// included): the mount and extract then show pack-time values (0444 files, the time of
    /// the pack).
    #[arg(long)]
    pub no_metadata: bool,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Never show progress bars (they are shown only when stderr is a terminal).
    #[arg(long, short)]
    pub quiet: bool,
}

impl Run {
    /// Where and how a write to `out` cuts its chunks, with these settings (a local `out`:
    /// [`to_object_store`] points it at a URL).
    pub fn output(&self, out: &Path) -> OutputOptions {
        let mut o = OutputOptions::new(out);
        o.seed = self.seed;
        o.compress = self.compress;
        o.chunk_size = self.chunk_size;
        o.chunk_files = self.chunk_files;
        o.progress = !self.quiet && std::io::stderr().is_terminal();
        o
    }

    /// Options for packing `src` into `out` with these files and settings.
    pub fn options(&self, files: &Files, src: &Path, out: &Path) -> PackOptions {
        let mut o = PackOptions::new(src, out);
        o.output = self.output(out);
        o.files_from = files.files_from.clone();
        o.follow_links = files.follow_links;
        o.skip_unreadable = self.skip_unreadable;
        o.io_threads = self.io_threads;
        o.no_metadata = self.no_metadata;
        o
    }
}

/// Parses a byte size with an optional unit: B, K/KB, KiB, M/MB, MiB, G/GB, GiB.
pub fn parse_size(s: &str) -> Result<u64, String> {
    match parse_size_or_zero(s)? {
        0 => Err(format!("size {:?} out of range", s.trim())),
        n => Ok(n),
    }
}

/// Like [`parse_size`], zero allowed.
pub fn parse_size_or_zero(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size like 32MiB"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        "t" | "tb" => 1_000_000_000_000,
        "tib" => 1 << 40,
        u => {
            return Err(format!(
                "unknown size unit {u:?} (use B, KiB, MiB, GiB, KB, MB, GB)"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} out of range"))
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    if a.from == From::Webdataset {
        return import_webdataset(a);
    }
    if a.memory.is_some() {
        anyhow::bail!(
            "--memory is for --from webdataset (a pack of files holds at most three chunks)"
        );
    }
    let [src] = &a.src[..] else {
        anyhow::bail!(
            "pack takes one source directory (several sources are for --from webdataset)"
        );
    };
    let src = src.clone();
    let mut o = a.run.options(&a.files, &src, &a.out);
    o.labels = match a.labels {
        Labels::ParentDir => LabelMode::ParentDir,
        Labels::None => LabelMode::None,
    };
    o.order = match a.order {
        OrderArg::Random => Order::Random,
        OrderArg::Walk => Order::Walk,
    };
    o.output.force = a.force;
    o.output.resume = a.resume;
    o.output.shard = a.shard;
    to_object_store(&mut o.output, a.staging.as_deref())?;
    let s = granary_packer::pack(&o);
    let_the_interruption_end_it();
    let s = s.with_context(|| format!("packing {}", src.display()))?;
    report(&src, &s, a.run.json)
}

/// `pack --from webdataset`: the shards through the writer.
fn import_webdataset(a: Args) -> anyhow::Result<ExitCode> {
    if a.shard.is_some() || a.files.files_from.is_some() || a.run.skip_unreadable {
        anyhow::bail!(
            "--from webdataset takes neither --shard, --files-from nor --skip-unreadable \
             (a damaged shard stops the import; fix or leave it out, then --resume)"
        );
    }
    let sources: Vec<String> = a
        .src
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let mut o = granary_packer::WriterOptions::new(&a.out);
    o.output = a.run.output(&a.out);
    o.output.force = a.force;
    o.output.resume = a.resume;
    if let Some(m) = a.memory {
        o.memory = m;
    }
    o.store = super::store_config().clone();
    to_object_store(&mut o.output, a.staging.as_deref())?;
    let show = o.output.progress;
    let imported = granary_packer::import_webdataset(&sources, o, &|i, n, shard| {
        if show {
            eprintln!("granary: reading shard {}/{n}: {shard}", i + 1);
        }
    });
    let_the_interruption_end_it();
    let (s, counts) = imported.with_context(|| format!("importing {}", sources.join(" ")))?;
    if !a.run.json {
        eprintln!(
            "granary: {} shards, {} tar members -> {} samples",
            counts.shards, counts.members, s.files
        );
    }
    report(Path::new(&sources[0]), &s, a.run.json)
}

/// Set when the thread of [`abort_uploads_on_signal`] takes a signal: it ends the process.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// If a signal is being handled, waits (up to two minutes) for its thread to abort the
/// uploads, say so and exit with the signal's status, rather than exit first with the error
/// the interruption caused ("not uploaded: the pack was interrupted").
pub(crate) fn let_the_interruption_end_it() {
    let t0 = std::time::Instant::now();
    while INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst)
        && t0.elapsed() < std::time::Duration::from_secs(120)
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// On SIGINT or SIGTERM during a pack to an object store: aborts the multipart uploads in
/// progress (the server drops their parts; left open, they are billed until a lifecycle rule
/// removes them), says so, and exits with 128 + the signal's number. The work in `staging` is
/// kept for `--resume`.
fn abort_uploads_on_signal(staging: &Path) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    use std::sync::atomic::Ordering::SeqCst;
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .context("installing signal handlers")?;
    let staging = staging.to_path_buf();
    std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            INTERRUPTED.store(true, SeqCst);
            let name = if sig == SIGINT { "SIGINT" } else { "SIGTERM" };
            let aborted = granary_store::object::abort_open_uploads();
            let ok: Vec<&str> = aborted
                .iter()
                .filter(|(_, r)| r.is_ok())
                .map(|(u, _)| u.as_str())
                .collect();
            eprintln!(
                "\ngranary: interrupted ({name}): aborted {} multipart upload(s) in progress{}{}",
                ok.len(),
                if ok.is_empty() { "" } else { ": " },
                ok.join(", ")
            );
            for (url, r) in &aborted {
                if let Err(e) = r {
                    eprintln!("granary: warning: could not abort the upload of {url}: {e}");
                }
            }
            eprintln!(
                "granary: the work so far is kept in {}: run the same command with --resume to \
                 continue (it also aborts any upload still open under the prefix)",
                staging.display()
            );
            std::process::exit(128 + sig);
        }
    });
    Ok(())
}

/// Prints what a pack or an append did; exit status 3 if files were skipped.
pub fn report(src: &Path, s: &PackSummary, json: bool) -> anyhow::Result<ExitCode> {
    for w in &s.warnings {
        eprintln!("granary: warning: {w}");
    }
    if json {
        super::print_json(s)?;
    } else {
        match (&s.shard, s.generation) {
            _ if s.action == "unchanged" => {
                println!(
                    "nothing new in {}: {} unchanged (generation {})",
                    src.display(),
                    s.out.display(),
                    s.generation
                );
                return Ok(ExitCode::SUCCESS);
            }
            (Some(sh), _) => println!(
                "packed shard {sh} of {} -> {}",
                src.display(),
                s.out.display()
            ),
            (None, 0) => println!("packed {} -> {}", src.display(), s.out.display()),
            (None, g) => println!(
                "appended {} -> {} (generation {g})",
                src.display(),
                s.out.display()
            ),
        }
        println!(
            "  files      {} ({} classes, {} compressed)",
            s.files, s.classes, s.compressed_records
        );
        println!(
            "  bytes      {} in, {} out (ratio {:.3})",
            human_bytes(s.bytes_in),
            human_bytes(s.bytes_out),
            s.ratio
        );
        println!(
            "  chunks     {} ({} kept from an interrupted run)",
            s.chunks, s.chunks_resumed
        );
        println!(
            "  elapsed    {:.2} s (scan {:.2} s): {:.0} files/s, {:.1} MB/s",
            s.elapsed_s, s.scan_s, s.files_per_s, s.mb_per_s
        );
        println!("  dataset id {}", s.dataset_id);
    }
    if !s.skipped.is_empty() {
        eprintln!("granary: {} files were skipped:", s.skipped.len());
        for k in &s.skipped {
            eprintln!("  {}: {}", granary::escape_path(&k.path), k.reason);
        }
        return Ok(ExitCode::from(3));
    }
    Ok(ExitCode::SUCCESS)
}

/// Points a write at its `out` when that is an object store URL, built in `staging` (or the
/// default staging directory of that destination), with its uploads aborted on a signal; a
/// local `out` leaves `o` as it is.
pub(crate) fn to_object_store(o: &mut OutputOptions, staging: Option<&Path>) -> anyhow::Result<()> {
    if let Some(s) = staging {
        o.staging = Some(s.to_path_buf());
    }
    if let Some(staging) = o.resolve_destination(super::store_config())? {
        abort_uploads_on_signal(staging)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes() {
        assert_eq!(super::parse_size("32MiB"), Ok(32 << 20));
        assert_eq!(super::parse_size("64MB"), Ok(64_000_000));
        assert_eq!(super::parse_size("100"), Ok(100));
        assert!(super::parse_size("0").is_err());
        assert!(super::parse_size("12XB").is_err());
        assert!(super::parse_size("MiB").is_err());
    }
}
