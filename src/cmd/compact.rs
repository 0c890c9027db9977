use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use super::human_bytes;

/// Rewrite the chunks that keep deleted samples' records without them, reclaiming their bytes.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  granary compact train.granary                      # chunks at least 20 % dead
  granary compact train.granary --all --grace 0      # a takedown: every deleted byte, now

`granary delete` removes samples from the snapshot only; their records stay in the chunk files.
compact rewrites each chunk whose deleted records take at least --min-dead of its record bytes
(every chunk holding one with --all) as a new file, `chunk-NNNNNNNN.rR.gchunk` (revision R),
with the other records as they were stored (not recompressed, in the same order), and publishes
the next generation of the snapshot naming the new files. Sample ids do not move, so score
tables stay valid and an epoch checkpointed before resumes; a view is pinned to one generation
and is made again after it (`granary view`).

The replaced files stay for readers that opened an older generation: a compact run removes
those whose replacement was written more than --grace ago (default 24h; 0 removes them now, and
a reader still on an older generation then fails naming the missing chunk file). Run it again
later (from cron, say) to remove what was kept. Killed at any point, the dataset is the old
generation or the new one; files of a killed run are removed by the next. Holds the dataset's
lock: an append or delete meanwhile waits for it.")]
pub struct Args {
    /// Dataset directory, or its URL (s3://, gs://, az://).
    pub dataset: PathBuf,
    /// Rewrite a chunk when its deleted records take at least this share of its record bytes.
    #[arg(long, default_value_t = 0.2, value_name = "SHARE")]
    pub min_dead: f64,
    /// Rewrite every chunk that holds a deleted sample's record.
    #[arg(long)]
    pub all: bool,
    /// How long replaced chunk files stay for readers of older generations, from when their
    /// replacement was written (e.g. 24h, 30m, 0).
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
    pub grace: Duration,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let o = granary_packer::CompactOptions {
        min_dead: a.min_dead,
        all: a.all,
        grace: a.grace,
    };
    let s = granary_packer::compact(&a.dataset, &o, super::store_config())
        .with_context(|| format!("compacting {}", a.dataset.display()))?;
    super::output(a.json, &s, |s| {
        match s.generation {
            Some(g) => println!(
                "{}: rewrote {} chunks without {} deleted records ({}): generation {g}; read {}, \
                 wrote {}",
                a.dataset.display(),
                s.chunks_rewritten,
                s.records_removed,
                human_bytes(s.bytes_removed),
                human_bytes(s.bytes_read),
                human_bytes(s.bytes_written)
            ),
            None if s.chunks_left == 0 => println!(
                "{}: no chunk holds a deleted sample's record: nothing to rewrite",
                a.dataset.display()
            ),
            None => println!(
                "{}: no chunk to rewrite ({} chunks hold deleted records below --min-dead {})",
                a.dataset.display(),
                s.chunks_left,
                a.min_dead
            ),
        }
        if !s.files_removed.is_empty() {
            println!("removed {} replaced chunk files", s.files_removed.len());
        }
        if !s.files_waiting.is_empty() {
            println!(
                "kept {} replaced chunk files for readers of older generations until their \
                 grace period ({}) ends: run compact again then (or with --grace 0)",
                s.files_waiting.len(),
                humantime::format_duration(a.grace)
            );
        }
    })
}
