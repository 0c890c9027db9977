//! Mixtures on the command line: `granary read A B C --weights 0.5,0.3,0.2`, `--mixture FILE`,
//! and what `granary plan` shows of one.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use granary::{MixPlan, MixReader, Mixture, Shard, Share, SourceSpec};
use serde_json::json;

/// Several datasets read as one epoch: `read` and `plan`.
#[derive(clap::Args, Clone)]
pub struct MixArgs {
    /// Shares of the datasets given, one per dataset, comma-separated: weights (0.5,0.3,0.2:
    /// each epoch holds that share of every source's samples together, or of --epoch-size),
    /// or per source repeat=R (R times its samples: 0.5 is half of them, a different half
    /// every epoch) or choose=N (N samples). Several datasets without --weights: repeat=1 each.
    #[arg(long, value_name = "LIST")]
    pub weights: Option<String>,
    /// A mixture file: one dataset per line (path, URL or view file; relative to the file)
    /// with its share (0.5, weight=0.5, repeat=R or choose=N; none: repeat=1), and optionally
    /// a line `epoch-size N`; `#` starts a comment. Instead of datasets on the command line.
    #[arg(long, value_name = "FILE", conflicts_with = "weights")]
    pub mixture: Option<PathBuf>,
    /// Samples in each epoch of a weighted mixture (default: its sources' samples together).
    #[arg(long, value_name = "N")]
    pub epoch_size: Option<u64>,
}

impl MixArgs {
    /// The mixture these arguments and `datasets` describe, opened; `None` for one dataset
    /// read alone.
    pub fn open(&self, datasets: &[PathBuf]) -> anyhow::Result<Option<Mixture>> {
        let (specs, size) = match &self.mixture {
            Some(file) => {
                anyhow::ensure!(
                    datasets.is_empty(),
                    "give the datasets in the mixture file {} or on the command line, not both",
                    file.display()
                );
                let (specs, size) = SourceSpec::read_file(file)?;
                (specs, self.epoch_size.or(size))
            }
            None if datasets.len() == 1 && self.weights.is_none() => {
                anyhow::ensure!(
                    self.epoch_size.is_none(),
                    "--epoch-size goes with a weighted mixture (--weights or --mixture)"
                );
                return Ok(None);
            }
            None => (self.specs(datasets)?, self.epoch_size),
        };
        let open = |p: &Path| -> granary::Result<granary::Dataset> {
            super::open_dataset(p).map_err(|e| granary::ReadError::invalid(format!("{e:#}")))
        };
        Ok(Some(Mixture::open(&specs, size, open)?))
    }

    fn specs(&self, datasets: &[PathBuf]) -> anyhow::Result<Vec<SourceSpec>> {
        let shares: Vec<Share> = match &self.weights {
            None => vec![Share::Repeat(1.0); datasets.len()],
            Some(list) => list
                .split(',')
                .map(|s| s.trim().parse::<Share>().map_err(anyhow::Error::msg))
                .collect::<anyhow::Result<_>>()
                .with_context(|| format!("--weights {list}"))?,
        };
        anyhow::ensure!(
            shares.len() == datasets.len(),
            "--weights gives {} shares for {} datasets: give one per dataset",
            shares.len(),
            datasets.len()
        );
        Ok(datasets
            .iter()
            .zip(shares)
            .map(|(d, share)| SourceSpec {
                location: d.clone(),
                share,
            })
            .collect())
    }
}

/// `granary read` of a mixture.
pub fn read(
    mix: Mixture,
    config: &granary::ReaderConfig,
    a: &super::read::Args,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.prices.is_none(),
        "--prices: the bill of a mixture is not supported yet (bill each dataset on its own)"
    );
    let reader = MixReader::open(Arc::new(mix), config)?;
    let p = &a.plan;
    let mut reports = Vec::new();
    for epoch in a.first_epoch..a.first_epoch + a.epochs {
        reader.begin_epoch();
        let r = granary::read_mix_epoch(&reader, epoch, p.rank, p.world_size, p.workers)
            .with_context(|| format!("reading epoch {epoch}"))?;
        super::read::report_epoch(a, &r.report, None)?;
        if !a.json {
            for (i, s) in r.sources.iter().enumerate() {
                println!(
                    "  source {i} {} ({}): {} samples ({:.2} %), {:.1} MB, digest {}",
                    s.source,
                    s.share,
                    s.samples,
                    s.fraction * 100.0,
                    s.bytes as f64 / 1e6,
                    s.digest
                );
            }
        }
        reports.push(r);
    }
    if a.json {
        super::print_json(&reports)?;
    }
    Ok(())
}

/// `granary plan` of a mixture: each source's count per epoch and per rank and worker.
pub fn plan(
    mix: Mixture,
    config: &granary::ReaderConfig,
    a: &super::plan::Args,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        !a.bill && a.prices.is_none(),
        "--bill/--prices: the bill of a mixture is not supported yet (bill each dataset on its own)"
    );
    let reader = MixReader::open(Arc::new(mix), config)?;
    let mix = reader.mixture().clone();
    let sources = reader.plan_sources()?;
    let p = &a.plan;
    let total: u64 = (0..mix.len()).map(|i| mix.count(i)).sum();
    let mut shares = Vec::new();
    let mut delivered = vec![0u64; mix.len()];
    for rank in 0..p.world_size {
        for worker in 0..p.workers {
            let shard = Shard {
                rank,
                world_size: p.world_size,
                worker,
                num_workers: p.workers,
            };
            let plan =
                MixPlan::build(&sources, a.epoch, shard, None).map_err(anyhow::Error::msg)?;
            let per: Vec<usize> = plan.parts.iter().map(|x| x.len()).collect();
            let windows: Vec<usize> = plan.parts.iter().map(|x| x.windows.len()).collect();
            for (d, n) in delivered.iter_mut().zip(&per) {
                *d += *n as u64;
            }
            shares.push(
                json!({"rank": rank, "worker": worker, "samples": plan.len(),
                               "per_source": per, "windows_per_source": windows}),
            );
        }
    }
    let listed: Vec<_> = (0..mix.len())
        .map(|i| {
            json!({"source": mix.name(i), "share": mix.share(i).to_string(),
                   "samples": mix.samples(i), "epoch_count": mix.count(i),
                   "fraction": mix.count(i) as f64 / total.max(1) as f64,
                   "delivered": delivered[i], "window": sources[i].options.window_chunks})
        })
        .collect();
    if a.json {
        return super::print_json(&json!({"epoch": a.epoch, "samples": total,
            "delivered": delivered.iter().sum::<u64>(), "sources": listed, "shares": shares}));
    }
    println!(
        "epoch {} of a mixture of {} sources: {} samples, {} shuffle",
        a.epoch,
        mix.len(),
        total,
        p.shuffle
    );
    for (i, s) in listed.iter().enumerate() {
        println!(
            "  source {i} {} ({}): {} of its {} samples an epoch ({:.2} % of the epoch), {} \
             delivered by the shares below, window {} chunks",
            s["source"].as_str().unwrap_or(""),
            s["share"].as_str().unwrap_or(""),
            s["epoch_count"],
            s["samples"],
            s["fraction"].as_f64().unwrap_or(0.0) * 100.0,
            s["delivered"],
            s["window"]
        );
    }
    for s in &shares {
        println!(
            "  rank {:>3} worker {:>2}: {:>9} samples, per source {}",
            s["rank"], s["worker"], s["samples"], s["per_source"]
        );
    }
    Ok(())
}
