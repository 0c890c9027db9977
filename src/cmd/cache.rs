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
    /// Remove from DIR's tier of DATASET every copy and hot chunk that holds records of its
    /// deleted samples, or that its current snapshot no longer lists (what a reader of it
    /// removes as it starts, done now: for an audit after `granary delete`).
    Purge {
        /// The dataset (its current generation decides what goes).
        dataset: PathBuf,
        /// The tier directory (as given to readers as --cache-dir).
        dir: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
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
        CacheCmd::Purge { dataset, dir, json } => {
            let ds = super::open_dataset(&dataset)?;
            let p = granary::purge_tier(&ds, &dir)?;
            super::output(json, &p, |p| {
                println!(
                    "{}: removed {} entries ({}) holding deleted samples' records or chunks of \
                     other generations; {} entries left",
                    p.tier.display(),
                    p.entries_removed,
                    human_bytes(p.bytes_freed),
                    p.entries_left
                );
            })?;
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
