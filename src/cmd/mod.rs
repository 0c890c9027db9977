//! One module per subcommand.

pub mod append;
pub mod args;
pub mod bench;
pub mod cache;
pub mod cat;
pub mod compact;
pub mod delete;
pub mod extract;
pub mod info;
pub mod ls;
pub mod merge;
pub mod mount;
pub mod pack;
pub mod plan;
pub mod read;
pub mod receipt;
pub mod reindex;
pub mod select;
pub mod serve;
pub mod upgrade;
pub mod verify;
pub mod view;

use std::io::Write;
use std::path::Path;

/// True when `e` comes from writing to a closed pipe (`granary ls | head`).
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The job's peer secret: from `file` if given, else from GRANARY_PEER_SECRET, else none.
pub fn job_secret(file: Option<&Path>) -> anyhow::Result<Option<granary_store::auth::Secret>> {
    Ok(match file {
        Some(f) => Some(granary_store::auth::Secret::from_file(f)?),
        None => granary_store::auth::Secret::from_env()?,
    })
}

/// The store configuration `main` resolved from the environment and the global options.
static STORE: std::sync::OnceLock<granary::StoreConfig> = std::sync::OnceLock::new();

/// Sets the store configuration every command uses (once, in `main`).
pub fn set_store_config(c: granary::StoreConfig) {
    let _ = STORE.set(c);
}

/// The store configuration every command uses.
pub fn store_config() -> &'static granary::StoreConfig {
    STORE.get_or_init(granary::StoreConfig::default)
}

/// Opens a dataset for the inspection commands: O(1) open plus every snapshot section CRC, so
/// that paths and offsets are trusted only when intact.
pub fn open_dataset(path: &Path) -> anyhow::Result<granary::Dataset> {
    granary::Dataset::open_checked_with(path, store_config()).map_err(|e| {
        // Damage is what verify and reindex help with; an object store that cannot be reached
        // or a wrong argument is not.
        let hint = match &e {
            // An older format is no damage: the error names `granary upgrade`; a stale view
            // says what changed and to make it again.
            e if e.to_string().contains("granary upgrade") => "",
            e if e.to_string().contains("a stale view") => "",
            // A directory without a snapshot: what is there says what to run.
            granary::ReadError::Store(s) if s.is_not_found() && path.is_dir() => {
                missing_snapshot(path)
            }
            // A view whose dataset is not where it says: moved away from it.
            granary::ReadError::Store(s) if s.is_not_found() && is_view_file(path) => {
                " (a view file names its dataset by a path relative to itself: move it back \
                 beside that path, or make the view again with `granary view`)"
            }
            // A damaged view is made again; its dataset needs nothing.
            _ if is_view_file(path) => " (a damaged view file: make it again with `granary view`)",
            granary::ReadError::Store(
                granary::StoreError::Format { .. } | granary::StoreError::Damaged { .. },
            ) => {
                " (run `granary verify` for a full report, `granary reindex` to rebuild a damaged \
                 snapshot: not one of a dataset with deletions, whose snapshot is their only \
                 record)"
            }
            _ => "",
        };
        anyhow::Error::new(e).context(format!("cannot use dataset {}{hint}", path.display()))
    })
}

/// Why a dataset directory has no snapshot, from what it holds: the parts of a sharded pack
/// not merged yet, or chunk files whose snapshot was lost.
fn missing_snapshot(dir: &Path) -> &'static str {
    let names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    if names
        .iter()
        .any(|n| n.starts_with("part-") && n.contains("-of-"))
    {
        " (it holds the shards of a sharded pack: `granary merge` makes the dataset once every \
         shard has finished)"
    } else if names
        .iter()
        .any(|n| granary_format::parse_chunk_file_name(n).is_some())
    {
        " (it holds chunk files but no snapshot: `granary reindex` rebuilds a lost snapshot)"
    } else {
        ""
    }
}

/// True if `path` is a local file that starts as a view file does.
fn is_view_file(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|()| granary_format::ViewFile::is_view(&head))
}

/// A command's report: `v` as JSON with `--json` (`json`), else `text` of it; success.
pub fn output<T: serde::Serialize>(
    json: bool,
    v: &T,
    text: impl FnOnce(&T),
) -> anyhow::Result<std::process::ExitCode> {
    match json {
        true => print_json(v)?,
        false => text(v),
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// Prints `v` as pretty JSON on stdout.
pub fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, v)?;
    writeln!(out)?;
    Ok(())
}

/// What a reader's consumer waited on, for `read`'s text output: "waited 1.20 s (origin 0.90,
/// check 0.20, other 0.10)", the parts above a millisecond.
pub fn waits_text(w: &granary::WaitReport) -> String {
    let parts: Vec<String> = w
        .parts()
        .iter()
        .filter(|(_, v)| *v >= 0.0005)
        .map(|(k, v)| format!("{k} {v:.3}"))
        .collect();
    format!("waited {:.3} s ({})", w.waited_s, parts.join(", "))
}

/// An epoch's figures in Prometheus' text exposition format (`read --metrics FILE`): the
/// consumer's waits by part, each layer's bytes and read wait, samples and seconds.
pub fn prometheus_text(
    epoch: u64,
    samples: u64,
    elapsed_s: f64,
    w: &granary::WaitReport,
    layers: &[granary::LayerReading],
) -> String {
    let by_layer = |v: fn(&granary::MeterReading) -> String| -> Vec<(String, String)> {
        let label = |l: &granary::LayerReading| format!("{{layer=\"{}\"}}", l.layer);
        layers.iter().map(|l| (label(l), v(&l.reading))).collect()
    };
    let waits = w
        .parts()
        .map(|(part, v)| (format!("{{part=\"{part}\"}}"), format!("{v:.6}")));
    let one = |value: String| vec![(String::new(), value)];
    let families = [
        (
            "granary_wait_seconds",
            "Seconds the readers' consumers waited for samples in the last epoch, by what the \
             reader was doing.",
            waits.to_vec(),
        ),
        (
            "granary_layer_bytes",
            "Bytes read through each layer of the store stack in the last epoch (nested: a \
             layer's include what the layers below it read).",
            by_layer(|m| m.bytes.to_string()),
        ),
        (
            "granary_layer_read_wait_seconds",
            "Seconds reads waited in each layer in the last epoch (summed over reads in flight).",
            by_layer(|m| format!("{:.6}", m.wait_s)),
        ),
        (
            "granary_epoch",
            "The last epoch read.",
            one(epoch.to_string()),
        ),
        (
            "granary_samples",
            "Samples the last epoch delivered.",
            one(samples.to_string()),
        ),
        (
            "granary_epoch_seconds",
            "Seconds the last epoch took.",
            one(format!("{elapsed_s:.6}")),
        ),
    ];
    // Each a gauge family: its help line, type line and samples (labels, value).
    let mut t = String::new();
    for (name, help, rows) in families {
        t.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
        for (labels, value) in rows {
            t.push_str(&format!("{name}{labels} {value}\n"));
        }
    }
    t
}

/// Origin's prices as `--prices` gives them (`granary plan`, `granary read`).
pub fn prices(spec: Option<&str>) -> anyhow::Result<Option<granary::bill::Prices>> {
    Ok(spec.map(granary::bill::Prices::parse).transpose()?)
}

/// Human-readable byte count.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut x = n as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{x:.2} {}", UNITS[u])
    }
}
