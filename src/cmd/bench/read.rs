//! `granary bench read`: cold epoch throughput, granary vs a direct sequential read.

use std::path::PathBuf;
use std::process::ExitCode;

/// Cold epoch throughput of granary vs a direct sequential read of the same chunk files.
#[derive(clap::Args)]
#[command(
    after_help = "Example:\n  granary bench read data/img.granary --repeat 3\n\n\
Each run drops the page cache first. Sides: a direct O_DIRECT sequential read of every chunk file \
(the device's bandwidth through granary's engine), fio depth 32 (when installed; the faster of the \
two is the ceiling \"vs dev\" divides by), granary with no options (chunk-wise, --io auto: through \
the page cache for a dataset that fits in memory), granary chunk-wise with --io direct through \
io_uring and through pread, and a global-shuffle epoch for contrast."
)]
pub(super) struct ReadArgs {
    /// Dataset directory.
    dataset: PathBuf,
    /// Loader workers (threads).
    #[arg(long, default_value_t = 1)]
    workers: u32,
    /// Chunks per shuffle window (default: what the reader's default memory budget gives).
    #[arg(long)]
    window: Option<usize>,
    /// Reads in flight.
    #[arg(long, default_value_t = 8)]
    queue_depth: usize,
    /// Runs per side, interleaved; medians are reported.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(r: ReadArgs) -> anyhow::Result<ExitCode> {
    let opts = granary_bench::readbench::ReadBenchOptions {
        dataset: r.dataset.clone(),
        workers: r.workers,
        window_chunks: match r.window {
            Some(w) => w,
            None => granary::Dataset::open_with(&r.dataset, crate::cmd::store_config())?
                .window_for_memory(granary::DEFAULT_READER_MEMORY)?,
        },
        queue_depth: r.queue_depth,
        repeat: r.repeat,
    };
    let res = granary_bench::readbench::run(&opts).map_err(anyhow::Error::msg)?;
    let text = |res: &_| print!("{}", granary_bench::readbench::render(res));
    crate::cmd::output(r.json, &res, text)
}
