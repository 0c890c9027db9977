use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use granary::{LocalTier, TierPolicy};

use super::human_bytes;

/// Inspect or empty a local chunk tier (the directory given to readers as --cache-dir).
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  granary cache stats /local/ssd/granary-cache\n  granary cache clear /local/ssd/granary-cache\n\n\
The tier keeps one sub-directory per dataset id; stats lists each with its chunk copies, hot \
chunks (important samples re-packed by --policy importance) and bytes."
)]
pub struct Args {
    #[command(subcommand)]
    cmd: CacheCmd,
}

#[derive(Subcommand)]
enum CacheCmd {
    /// Entries and bytes of every dataset's tier under DIR.
    Stats {
        dir: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove every chunk copy and hot chunk under DIR (safe while readers run: taken under the lock).
    Clear { dir: PathBuf },
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    match a.cmd {
        CacheCmd::Stats { dir, json } => {
            let mut all = Vec::new();
            for id in LocalTier::list(&dir)? {
                all.push(LocalTier::open(&dir, id, u64::MAX, TierPolicy::Lru)?.stats()?);
            }
            if json {
                super::print_json(&all)?;
            } else if all.is_empty() {
                println!("{}: no cached datasets", dir.display());
            } else {
                for s in &all {
                    println!(
                        "{}: {} chunk copies, {} hot chunks ({} samples), {}",
                        s.dir.display(),
                        s.entries - s.hot_chunks,
                        s.hot_chunks,
                        s.hot_samples,
                        human_bytes(s.bytes)
                    );
                }
            }
        }
        CacheCmd::Clear { dir } => {
            let ids = LocalTier::list(&dir)?;
            for id in &ids {
                LocalTier::open(&dir, *id, u64::MAX, TierPolicy::Lru)?.clear()?;
            }
            println!(
                "cleared {} dataset tiers under {}",
                ids.len(),
                dir.display()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
