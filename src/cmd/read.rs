use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use granary::bill::LayerBill;
use granary::io::IoKind;
use granary::{EpochReport, MixReader, Mixture};

use super::args::{MixArgs, PeerArgs, PlanArgs, TierArgs};

/// Stream epochs of a dataset (a dry run of training I/O): throughput and a content digest.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  granary read train.granary                                # one chunkwise epoch
  granary read train.granary --epochs 3 --workers 2 --json
  granary read train.granary --rank 1 --world-size 4        # rank 1's share
  GRANARY_IO=pread granary read train.granary               # force the pread backend
  granary read train.granary --io direct --epochs 2         # never through the page cache
  granary read train.granary --epochs 3 --cache-dir /ssd/gcache --cache-size 20GiB --policy static
  granary read train.granary --cache-dir /ssd/gcache --cache-size 20GiB --policy importance
  granary read train.granary --cache-dir /ssd/gcache --cache-size 20GiB --policy importance --sampling importance --alpha 0.5
  granary read web.granary books.granary code.granary --weights 0.5,0.3,0.2   # a mixture
  granary read a.granary b.granary --weights repeat=2,choose=10000
  granary read --mixture blend.txt --epochs 3 --json

With --policy importance the tier keeps hot chunks of the samples that matter most, chosen by
the node's shared score table (written by the training loop's report(); or --scores FILE).

The digest covers content: a sum (mod 2^64) of a keyed hash of each delivered sample's id and the
CRC-32 of the bytes delivered, so it is order-independent and the digests of all ranks (and
workers) of an epoch add up to the digest `granary verify` prints exactly when every sample was
delivered once with the right bytes (with --pad or importance sampling, samples repeat).

A mixture reads one epoch over several datasets: each source gives its share of the epoch (its
weight's share of all their samples or of --epoch-size, or repeat=R / choose=N samples),
planned chunk-wise on its own with its own windows and read by its own stream, interleaved
evenly; every rank gets the same count of every source. Each source's digest is printed: with
repeat=1 (the default for several datasets) it equals that dataset's `granary verify` digest
when all ranks' digests are added up.")]
pub struct Args {
    /// Dataset directory (or its snapshot file), its URL (s3://, gs://, az://), or a view file
    /// (`granary view`: the view's samples only). Several: a mixture, one epoch over all of
    /// them (--weights).
    #[arg(required_unless_present = "mixture", num_args = 1..)]
    pub datasets: Vec<PathBuf>,
    #[command(flatten)]
    pub mix: MixArgs,
    #[command(flatten)]
    pub plan: PlanArgs,
    /// Number of epochs.
    #[arg(long, default_value_t = 1)]
    pub epochs: u64,
    /// First epoch number (plans differ per epoch).
    #[arg(long, default_value_t = 0)]
    pub first_epoch: u64,
    /// Page cache or O_DIRECT: auto (through the page cache where the data is resident, or
    /// kept resident because it fits the page-cache budget; O_DIRECT elsewhere), direct, or
    /// buffered.
    #[arg(long, default_value = "auto", value_parser = granary::IoMode::parse)]
    pub io: granary::IoMode,
    /// Page cache auto mode may fill with this dataset, e.g. 8GiB (default: half the node's
    /// memory, or of the memory cgroup's limit when lower). Also bounds the maps of resident
    /// chunks a process keeps from one epoch to the next (they show in its RSS as file pages;
    /// 0 keeps none).
    #[arg(long, value_parser = super::pack::parse_size_or_zero)]
    pub page_cache: Option<u64>,
    /// I/O backend: auto (io_uring when the reads bypass the page cache, else pread; where the
    /// kernel refuses io_uring - the sysctl kernel.io_uring_disabled, a container's seccomp
    /// filter, a small memlock limit - pread, with a warning saying why and `backend_fallback`
    /// in --json), uring (an error where it cannot run) or pread. `granary --version` tells
    /// whether this machine offers io_uring.
    #[arg(long, default_value = "auto", env = "GRANARY_IO", value_parser = IoKind::parse)]
    pub backend: IoKind,
    /// Reads in flight per worker.
    #[arg(long, default_value_t = 8)]
    pub queue_depth: usize,
    #[command(flatten)]
    pub tier: TierArgs,
    #[command(flatten)]
    pub peers: PeerArgs,
    /// Importance score table (written by ImportanceScores::save). By default the node's shared
    /// table next to the tier (fed by report() from training) when there is one. It chooses the
    /// samples --policy importance re-packs into hot chunks and drives --sampling importance.
    #[arg(long, value_name = "FILE")]
    pub scores: Option<PathBuf>,
    /// Which samples an epoch reads: uniform (each once) or importance (N draws with
    /// probability (1-alpha)/N + alpha x score share, favouring what the tier holds; every
    /// sample gets the loss weight 1/(N p)). Needs scores.
    #[arg(long, default_value_t = granary::SamplingKind::Uniform,
          value_parser = sampling_names())]
    pub sampling: granary::SamplingKind,
    /// Importance sampling mix, 0 (uniform draws) to below 1; every sample keeps at least
    /// probability (1-alpha)/N.
    #[arg(long, default_value_t = granary::DEFAULT_ALPHA)]
    pub alpha: f64,
    /// How much importance sampling favours samples the tier holds (1 = not at all). Keep 1 when
    /// ranks on different nodes must draw the same epoch: tiers differ between nodes.
    #[arg(long, default_value_t = granary::DEFAULT_CACHE_BOOST)]
    pub cache_boost: f64,
    /// Where chunks are read in ranges - around the samples hot chunks serve (--policy
    /// importance), or the samples of a view that keeps few of a chunk's - a gap shorter than
    /// this between two ranges is read, not skipped.
    #[arg(long, default_value = "64KiB", value_parser = super::pack::parse_size_or_zero)]
    pub range_gap: u64,
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Origin's prices (PER_1000_REQUESTS,PER_GB or @FILE, as `granary plan --prices`): each
    /// epoch's report gets `bill`, this rank's predicted requests, bytes and cost per layer
    /// (`granary plan --bill`'s figures, computed before the epoch) beside the measured ones.
    #[arg(long, value_name = "PRICES")]
    pub prices: Option<String>,
    /// After each epoch, write its figures (the consumer's waits by part, each layer's bytes
    /// and read waits, samples, seconds) to FILE in Prometheus' text format (for a node
    /// exporter's textfile collector), replacing it atomically.
    #[arg(long, value_name = "FILE")]
    pub metrics: Option<PathBuf>,
}

/// `--sampling`'s names, listed in `--help`.
fn sampling_names() -> impl clap::builder::TypedValueParser<Value = granary::SamplingKind> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(["uniform", "importance"])
        .try_map(|s| s.parse::<granary::SamplingKind>())
}

impl Args {
    /// The library's reader options these arguments give, checked by it (flags left out stay
    /// at the library's defaults: see the test below).
    fn options(&self) -> anyhow::Result<granary::ReaderOptions> {
        let mut o = granary::ReaderOptions {
            io: self.io,
            page_cache: self.page_cache,
            backend: self.backend,
            queue_depth: self.queue_depth,
            range_gap: self.range_gap,
            cache_dir: self.tier.cache_dir.clone(),
            cache_size: self.tier.cache_size,
            policy: self.tier.policy,
            scores: self.scores.clone(),
            lenient_scores: false,
            sampling: self.sampling,
            alpha: self.alpha,
            cache_boost: self.cache_boost,
            ..self.plan.reader_options()
        };
        self.peers.apply(&mut o, self.first_epoch)?;
        o.check()?;
        Ok(o)
    }
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    if let Some(path) = &a.metrics {
        // Refused before anything is read.
        granary_store::write::check_report_target(path)?;
    }
    if let Some(mix) = a.mix.open(&a.datasets)? {
        read_mixture(mix, &a.options()?, &a)?;
        return Ok(ExitCode::SUCCESS);
    }
    let ds = Arc::new(super::open_dataset(&a.datasets[0])?);
    let reader = a.options()?.open(&ds)?;
    let prices = super::prices(a.prices.as_deref())?;
    let mut reports = Vec::new();
    let mut bills = Vec::new();
    for epoch in a.first_epoch..a.first_epoch + a.epochs {
        reader.begin_epoch();
        // Scores are re-read every epoch: training processes keep reporting into them.
        let setup = reader.setup()?;
        let p = &a.plan;
        // The bill is predicted before the epoch: what the tier holds then.
        let predicted = prices
            .map(|pr| {
                let ranks = p.rank..p.rank + 1;
                granary::bill::predict(&ds, &setup, epoch, ranks, p.world_size, p.workers, Some(pr))
            })
            .transpose()?;
        let r = granary::measure_epoch(&ds, &setup, epoch, p.rank, p.world_size, p.workers)
            .with_context(|| format!("reading epoch {epoch}"))?;
        let bill = predicted.map(|b| (b.total, granary::bill::measured(&r.layers, prices)));
        report_epoch(&a, &r, bill.as_ref())?;
        if let Some((predicted, measured)) = bill {
            bills.push(serde_json::json!({"predicted": predicted, "measured": measured}));
        }
        reports.push(r);
    }
    if a.json {
        if bills.is_empty() {
            super::print_json(&reports)?;
        } else {
            let mut out = Vec::new();
            for (r, b) in reports.iter().zip(bills) {
                let mut v = serde_json::to_value(r)?;
                v["bill"] = b;
                out.push(v);
            }
            super::print_json(&out)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What `read` does with an epoch's report (a dataset's or a mixture's): its metrics file, and
/// its text unless `--json`.
pub(super) fn report_epoch(a: &Args, r: &EpochReport, bill: Option<&Bill>) -> anyhow::Result<()> {
    if let Some(path) = &a.metrics {
        let text = super::prometheus_text(r.epoch, r.samples, r.elapsed_s, &r.waits, &r.layers);
        // Whole (a textfile collector never reads half a file), as every file granary writes.
        granary_store::write::publish_report(path, text.as_bytes())
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    }
    if !a.json {
        print_epoch(r, bill);
    }
    Ok(())
}

/// An epoch's bill: the predicted and the measured figures per layer.
type Bill = (Vec<LayerBill>, Vec<LayerBill>);

/// One epoch's text report; with `bill`, the predicted and measured figures per layer.
fn print_epoch(r: &EpochReport, bill: Option<&Bill>) {
    let hits = match (r.cache_sample_hit_ratio, r.cache_byte_hit_ratio) {
        (Some(s), Some(b)) => format!(
            ", cache hits {:.1} % of samples, {:.1} % of bytes",
            s * 100.0,
            b * 100.0
        ),
        _ => String::new(),
    };
    let device = r
        .device_read_bytes
        .map(|b| format!(", {:.1} MB from the device", b as f64 / 1e6))
        .unwrap_or_default();
    let o = granary::layer_reading(&r.layers, "origin");
    let rss = r
        .peak_rss_bytes
        .map(|b| format!(", process peak RSS {:.0} MB", b as f64 / 1e6))
        .unwrap_or_default();
    // Page cache the process keeps mapped for its next epochs: in its RSS, not memory of its own.
    let rss = match r.kept_map_bytes {
        0 => rss,
        k => format!(
            "{rss} (of which {:.0} MB maps of resident chunks kept for the next epoch)",
            k as f64 / 1e6
        ),
    };
    let peers = r
        .peers
        .as_ref()
        .map(|p| peers_text(p, &granary::layer_reading(&r.layers, "peers")))
        .unwrap_or_default();
    let snap = match (r.snapshot_gets, r.snapshot_bytes_fetched) {
        (Some(g), Some(b)) => format!(
            "; snapshot blocks: {g} GETs, {:.2} MB fetched",
            b as f64 / 1e6
        ),
        _ => String::new(),
    };
    println!(
        "epoch {:>3}: {} samples, {:.1} MB in {:.2} s: {:.0} samples/s, {:.1} MB/s, cpu {:.2} s, digest {} ({}; files: {} buffered, {} found resident, {} direct{device}){hits}; memory: peak buffers {:.0} MB per reader{rss}{peers}{snap}; {}",
        r.epoch, r.samples, r.bytes as f64 / 1e6, r.elapsed_s, r.samples_per_s, r.mb_per_s, r.cpu_s, r.digest, r.backend, o.opened_buffered, o.opened_resident, o.opened_direct, r.peak_buffer_bytes as f64 / 1e6, super::waits_text(&r.waits)
    );
    let Some((predicted, measured)) = bill else {
        return;
    };
    let cost = |c: Option<f64>| c.map(|c| format!(", cost {c:.6}")).unwrap_or_default();
    println!("  bill (this rank):");
    // By layer name: a stack may lack a layer the prediction lists (a tier a global epoch
    // does not use), and the other way round.
    let mut names: Vec<&str> = predicted.iter().map(|l| l.layer).collect();
    for l in measured.iter() {
        if !names.contains(&l.layer) {
            names.push(l.layer);
        }
    }
    let side = |bills: &[LayerBill], name: &str| {
        let l = bills
            .iter()
            .find(|l| l.layer == name)
            .cloned()
            .unwrap_or_default();
        format!(
            "{} requests, {}{}",
            l.requests,
            super::human_bytes(l.bytes),
            cost(l.cost)
        )
    };
    for name in names {
        println!(
            "  {name}: predicted {}; measured {}",
            side(predicted, name),
            side(measured, name)
        );
    }
}

/// The shared tiers' part of an epoch's text report (`events`: the peers layer's reading).
fn peers_text(p: &granary::PeerReport, events: &granary::MeterReading) -> String {
    let down = if p.down.is_empty() {
        String::new()
    } else {
        format!(", down: {}", p.down.join(" "))
    };
    format!(
        "; node {} (ownership {}): {:.1} MB from its tier, {:.1} MB from peers, \
         {:.1} MB from origin ({} chunks missing at their owner, {} rejected, \
         {} unreachable{down})",
        p.node,
        p.ownership,
        p.bytes_from_local_tier as f64 / 1e6,
        p.bytes_from_peers as f64 / 1e6,
        p.bytes_from_origin as f64 / 1e6,
        events.missing_at_owner,
        events.rejected,
        events.unreachable
    )
}

/// `granary read` of a mixture.
fn read_mixture(mix: Mixture, config: &granary::ReaderOptions, a: &Args) -> anyhow::Result<()> {
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
        report_epoch(a, &r.report, None)?;
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

#[cfg(test)]
mod tests {
    /// Every reader option `granary read` leaves at its default is the library's default (its
    /// memory budget given explicitly): the command line states no default of its own that
    /// could drift from `ReaderOptions::default()`.
    #[test]
    fn the_flags_defaults_are_the_librarys() {
        use clap::Parser;
        let env = [
            "GRANARY_IO",
            "GRANARY_PEERS",
            "GRANARY_PEER_SECRET",
            "GRANARY_PEER_CA",
        ];
        if env.iter().any(|v| std::env::var_os(v).is_some()) {
            return; // the flags' variables would set options here
        }
        let cli = crate::Cli::try_parse_from(["granary", "read", "ds"]).unwrap();
        let crate::Command::Read(a) = cli.cmd else {
            panic!("not read")
        };
        let mut got = a.options().unwrap();
        assert_eq!(got.memory, Some(granary::DEFAULT_READER_MEMORY));
        got.memory = None;
        let want = granary::ReaderOptions::default();
        assert_eq!(format!("{got:?}"), format!("{want:?}"));
    }

    /// Every reader option is a flag of `granary read` (its name with dashes, or the flag named
    /// here): an option cannot be added to the library and Python alone.
    #[test]
    fn every_reader_option_is_a_flag() {
        use clap::CommandFactory;
        let cli = crate::Cli::command();
        let read = cli.find_subcommand("read").unwrap();
        let flags: Vec<&str> = read.get_arguments().filter_map(|a| a.get_long()).collect();
        let options = serde_json::to_value(granary::ReaderOptions::default()).unwrap();
        for name in options.as_object().unwrap().keys() {
            let flag = match name.as_str() {
                "drop_last" => "pad".to_string(),
                "peer_secret" => "peer-secret-file".to_string(),
                n => n.replace('_', "-"),
            };
            assert!(
                flags.contains(&flag.as_str()),
                "reader option {name}: no --{flag}"
            );
        }
    }
}
