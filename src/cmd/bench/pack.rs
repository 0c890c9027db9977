//! `granary bench pack`: packing throughput, granary vs tar.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use granary_bench::packbench::{self, PackBenchOptions};
use granary_packer::{CompressMode, PackOptions};

/// Packing throughput of granary vs `tar -cf - SRC | cat >/dev/null` on the same tree, cold.
#[derive(clap::Args)]
#[command(
    after_help = "Example:\n  granary bench gen data/img --files 20000 && granary bench pack data/img -o data/img.granary\n\n\
Caches are dropped before each run (as root), else evicted with posix_fadvise; the report says which.\n\
Also measures snapshot open time (cold and warm) and path lookup time."
)]
pub(super) struct PackArgs {
    /// Tree to pack.
    src: PathBuf,
    /// Where the packed dataset is written, replaced on every run: a new path or an earlier
    /// dataset (anything else there, and the source or what holds it, is refused).
    #[arg(short, long)]
    out: PathBuf,
    /// Record compression for granary (see `granary pack --help`).
    #[arg(long, default_value = "auto", value_parser = CompressMode::parse)]
    compress: CompressMode,
    /// Target chunk size.
    #[arg(long, default_value = "32MiB", value_parser = super::super::pack::parse_size)]
    chunk_size: u64,
    /// Number of random path lookups to time.
    #[arg(long, default_value_t = 100_000)]
    lookups: u64,
    /// Runs per side, alternating tar and granary; medians are reported.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// granary reader threads (see `granary pack --help`).
    #[arg(long, default_value_t = granary_packer::DEFAULT_IO_THREADS)]
    io_threads: usize,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(p: PackArgs) -> anyhow::Result<ExitCode> {
    let mut template = PackOptions::new(&p.src, &p.out);
    template.output.compress = p.compress;
    template.output.chunk_size = p.chunk_size;
    template.output.progress = std::io::stderr().is_terminal();
    template.output.force = true;
    template.io_threads = p.io_threads;
    let opts = PackBenchOptions {
        src: p.src.clone(),
        out: p.out.clone(),
        template,
        lookups: p.lookups,
        repeat: p.repeat,
    };
    let r = packbench::run(&opts).map_err(anyhow::Error::msg)?;
    crate::cmd::output(p.json, &r, |r| print!("{}", packbench::render(r, &p.src)))
}
