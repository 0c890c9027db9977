use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use granary::{
    labels_from_class_counts, shuffle_quality, EpochPlan, MixPlan, MixReader, Mixture, PlanOptions,
    Shard, ShuffleMode,
};
use serde_json::json;

use super::args::PlanArgs;

/// Show an epoch plan: every share's size and windows, coverage, and shuffle quality.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  granary plan train.granary --world-size 4 --workers 2
  granary plan train.granary --shuffle chunkwise --window 8 --json
  granary plan web.granary books.granary --weights 0.7,0.3 --world-size 8   # a mixture's shares
  granary plan s3://bucket/train.granary --world-size 64 --prices 0.0004,0.09  # the bill, per rank
  granary plan train.granary --bill --cache-dir /ssd/gcache --cache-size 200GiB   # tier vs origin

Shuffle quality is measured on labels over the whole epoch (all shares concatenated): mean length
of same-label runs, and the mean total-variation distance between the label histogram of each
block of 256 consecutive samples and the epoch's, next to the same numbers for a global shuffle.
The labels are drawn from each chunk's class counts in a seeded order (a few blocks of the
snapshot, not every sample's record entry): for a shuffled plan of a packed dataset they give
the figures the samples' own labels give.")]
pub struct Args {
    /// Dataset directory (or its snapshot file), its URL (s3://, gs://, az://), or a view file
    /// (`granary view`: the view's samples only). Several: a mixture (--weights); the plan
    /// then shows each source's share per epoch and per rank.
    #[arg(required_unless_present = "mixture", num_args = 1..)]
    pub datasets: Vec<PathBuf>,
    #[command(flatten)]
    pub mix: super::args::MixArgs,
    #[command(flatten)]
    pub plan: PlanArgs,
    /// Epoch number.
    #[arg(long, default_value_t = 0)]
    pub epoch: u64,
    /// The bill before the run: per rank, the requests and bytes the epoch will ask of the
    /// local tier (with --cache-dir: the chunks it holds now) and of origin, from the reader's
    /// own window planning, without reading.
    #[arg(long)]
    pub bill: bool,
    /// Origin's prices, to price the bill (implies --bill): PER_1000_REQUESTS,PER_GB (e.g.
    /// 0.0004,0.09), or @FILE with lines `per_1000_requests = ...` and `per_gb = ...`.
    #[arg(long, value_name = "PRICES")]
    pub prices: Option<String>,
    #[command(flatten)]
    pub tier: super::args::TierArgs,
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    if let Some(mix) = a.mix.open(&a.datasets)? {
        return plan_mixture(mix, &a);
    }
    let dataset = &a.datasets[0];
    if a.bill || a.prices.is_some() {
        return bill(&a, dataset);
    }
    let ds = super::open_dataset(dataset)?;
    let shape = ds.shape()?;
    let opts = a.plan.options(&ds)?;
    let shards = a.plan.shards();
    let build = |o: &PlanOptions, s: Shard| {
        EpochPlan::build(&shape, o, a.epoch, s, None).map_err(anyhow::Error::msg)
    };
    let mut shares = Vec::new();
    let mut all = Vec::new();
    for &shard in &shards {
        let p = build(&opts, shard)?;
        let chunk_reads: usize = p.windows.iter().map(|w| w.chunks.len()).sum();
        shares.push(json!({"rank": shard.rank, "worker": shard.worker, "samples": p.len(), "windows": p.windows.len(), "chunk_reads": chunk_reads}));
        all.extend_from_slice(&p.samples);
    }
    let mut distinct = all.clone();
    distinct.sort_unstable();
    distinct.dedup();
    let repeats = all.len() - distinct.len();
    let samples = shape.samples();
    let missing = samples as usize - distinct.len();
    let label = plan_labels(&ds, &shape, dataset)?;
    let q = shuffle_quality(&shape, &label, &all, 256);
    let global = PlanOptions {
        mode: ShuffleMode::Global,
        ..opts.clone()
    };
    let mut g = Vec::new();
    for &shard in &shards {
        g.extend(build(&global, shard)?.samples);
    }
    let gq = shuffle_quality(&shape, &label, &g, 256);
    // A view reads ranges of its chunks or whole chunks: what an epoch of it costs.
    let reads = granary::view_reads(&ds, granary::StreamOptions::default().range_gap)?;
    let v = json!({
        "epoch": a.epoch, "samples": samples, "delivered": all.len(), "repeats": repeats,
        "not_delivered": missing, "shares": shares, "quality": q, "global_quality": gq,
        "view_reads": reads,
    });
    super::output(a.json, &v, |_| {
        println!(
            "epoch {} of {} ({} samples, {} chunks), {:?} shuffle, window {} chunks",
            a.epoch,
            dataset.display(),
            samples,
            ds.chunk_count(),
            opts.mode,
            opts.window_chunks
        );
        for s in &shares {
            println!(
                "  rank {:>3} worker {:>2}: {:>9} samples, {:>5} windows, {:>6} chunk reads",
                s["rank"], s["worker"], s["samples"], s["windows"], s["chunk_reads"]
            );
        }
        println!(
            "  delivered {} samples: {} repeated (padding), {} not delivered (dropped remainder)",
            all.len(),
            repeats,
            missing
        );
        if let Some(r) = reads {
            println!(
                "  view: its samples hold {}; an epoch reads {} ({} chunks in ranges around them, \
                 {} whole)",
                super::human_bytes(r.delivered),
                super::human_bytes(r.read),
                r.chunks_in_ranges,
                r.chunks_whole
            );
        }
        println!("  shuffle quality          this plan   global shuffle");
        for (name, this, global) in [
            ("mean same-label run", q.mean_label_run, gq.mean_label_run),
            ("block label TV (256)", q.block_label_tv, gq.block_label_tv),
            (
                "same-chunk neighbours",
                q.same_chunk_pairs,
                gq.same_chunk_pairs,
            ),
        ] {
            println!("    {name:<21}  {this:>9.3}   {global:>14.3}");
        }
    })
}

/// Each delivered sample's label for the shuffle-quality figures. Of a dataset: drawn from the
/// chunks' class counts (O(chunks) bytes of the snapshot, wherever it is), not read from every
/// sample's record entry; of a view (whose samples are a subset of each chunk's): the selected
/// samples' own labels.
fn plan_labels(
    ds: &granary::Dataset,
    shape: &granary::DatasetShape,
    name: &std::path::Path,
) -> anyhow::Result<Box<dyn Fn(u64) -> u32>> {
    let err = |e: granary::FormatError| anyhow::anyhow!("{}: {e}", name.display());
    if let Some(v) = ds.view() {
        let ids = v.ids.clone();
        let labels = ids
            .iter()
            .map(|&id| ds.snapshot().sample(id).map(|s| s.label))
            .collect::<Result<Vec<u32>, _>>()
            .map_err(err)?;
        return Ok(Box::new(move |id| {
            ids.binary_search(&id).map_or(u32::MAX, |k| labels[k])
        }));
    }
    let counts = (0..ds.chunk_count())
        .map(|c| ds.snapshot().class_counts(c))
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    let drawn = labels_from_class_counts(shape, &counts);
    Ok(Box::new(move |id| {
        drawn.get(id as usize).copied().unwrap_or(u32::MAX)
    }))
}

/// `plan --bill`: each rank's requests and bytes per layer, priced with --prices.
fn bill(a: &Args, dataset: &std::path::Path) -> anyhow::Result<ExitCode> {
    let ds = Arc::new(super::open_dataset(dataset)?);
    let prices = super::prices(a.prices.as_deref())?;
    let mut o = a.plan.reader_options();
    o.cache_dir = a.tier.cache_dir.clone();
    o.cache_size = a.tier.cache_size;
    o.policy = a.tier.policy;
    let setup = o.open(&ds)?.setup()?;
    let p = &a.plan;
    let b = granary::bill::predict(
        &ds,
        &setup,
        a.epoch,
        0..p.world_size,
        p.world_size,
        p.workers,
        prices,
    )?;
    super::output(a.json, &b, |b| {
        println!(
            "epoch {} of {}: what {} rank(s) x {} worker(s) will read, per rank (from the reader's \
             own window planning; nothing read)",
            a.epoch,
            dataset.display(),
            p.world_size,
            p.workers
        );
        let line = |l: &granary::bill::LayerBill| {
            let cost = l.cost.map(|c| format!(", cost {c:.6}")).unwrap_or_default();
            format!(
                "{} {} requests ({} GETs), {}{cost}",
                l.layer,
                l.requests,
                l.gets,
                super::human_bytes(l.bytes)
            )
        };
        for r in &b.ranks {
            let parts: Vec<String> = r.layers.iter().map(line).collect();
            println!("  rank {:>3}: {}", r.rank, parts.join("; "));
        }
        let parts: Vec<String> = b.total.iter().map(line).collect();
        println!("  all ranks: {}", parts.join("; "));
        if let Some(pr) = prices {
            println!(
                "  prices: {} per 1,000 requests, {} per GB (origin only; the tier is this node's disk)",
                pr.per_1000_requests, pr.per_gb
            );
        }
    })
}

/// `granary plan` of a mixture: each source's count per epoch and per rank and worker.
fn plan_mixture(mix: Mixture, a: &Args) -> anyhow::Result<ExitCode> {
    let config = a.plan.reader_options();
    config.check()?;
    anyhow::ensure!(
        !a.bill && a.prices.is_none(),
        "--bill/--prices: the bill of a mixture is not supported yet (bill each dataset on its own)"
    );
    let reader = MixReader::open(Arc::new(mix), &config)?;
    let mix = reader.mixture().clone();
    let sources = reader.plan_sources()?;
    let p = &a.plan;
    let total: u64 = (0..mix.len()).map(|i| mix.count(i)).sum();
    let mut shares = Vec::new();
    let mut delivered = vec![0u64; mix.len()];
    for shard in p.shards() {
        let plan = MixPlan::build(&sources, a.epoch, shard, None).map_err(anyhow::Error::msg)?;
        let per: Vec<usize> = plan.parts.iter().map(|x| x.len()).collect();
        let windows: Vec<usize> = plan.parts.iter().map(|x| x.windows.len()).collect();
        for (d, n) in delivered.iter_mut().zip(&per) {
            *d += *n as u64;
        }
        shares.push(
            json!({"rank": shard.rank, "worker": shard.worker, "samples": plan.len(),
                           "per_source": per, "windows_per_source": windows}),
        );
    }
    let listed: Vec<_> = (0..mix.len())
        .map(|i| {
            json!({"source": mix.name(i), "share": mix.share(i).to_string(),
                   "samples": mix.samples(i), "epoch_count": mix.count(i),
                   "fraction": mix.count(i) as f64 / total.max(1) as f64,
                   "delivered": delivered[i], "window": sources[i].options.window_chunks})
        })
        .collect();
    let v = json!({"epoch": a.epoch, "samples": total,
        "delivered": delivered.iter().sum::<u64>(), "sources": listed, "shares": shares});
    super::output(a.json, &v, |_| {
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
    })
}
