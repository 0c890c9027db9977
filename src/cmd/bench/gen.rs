//! `granary bench gen`: a seeded ImageFolder-style tree.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::ValueEnum;
use granary_bench::gen::{Content, GenOptions, Sizes};

/// Generate a seeded ImageFolder-style tree (OUT/class_NNNN/NNNNNNNN.JPEG).
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  granary bench gen data/imagenet --files 20000 --sizes imagenet\n  \
granary bench gen data/tiny --files 1000000 --classes 1000 --sizes tiny\n  \
granary bench gen data/huge.granary --files 100000000 --sizes 64 --packed   # a dataset, no tree\n\n\
Sizes: imagenet = lognormal, mean ~110 KiB; tiny = lognormal, mean ~1 KiB; or a fixed byte count."
)]
pub(super) struct GenArgs {
    /// Output directory (must not exist or be empty).
    out: PathBuf,
    /// Number of files.
    #[arg(long, default_value_t = 10_000)]
    files: u64,
    /// Number of class directories.
    #[arg(long, default_value_t = 100)]
    classes: u64,
    /// Size distribution: imagenet, tiny, or a fixed number of bytes.
    #[arg(long, default_value = "imagenet", value_parser = Sizes::parse)]
    sizes: Sizes,
    /// File contents.
    #[arg(long, value_enum, default_value = "random")]
    content: ContentArg,
    /// Seed: the same seed gives the same tree.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the samples straight into a packed dataset at OUT (a directory, or an object
    /// store URL: s3://...) through the writer API, with no tree of files: datasets of
    /// 100 million samples and more can be made on one disk (`--files 100000000 --sizes 64`).
    #[arg(long)]
    packed: bool,
    /// With --packed: the target chunk size (as `granary pack --chunk-size`).
    #[arg(long, requires = "packed", value_parser = crate::cmd::pack::parse_size, default_value = "32MiB")]
    chunk_size: u64,
    /// With --packed and an object store OUT: the local staging directory (default: one per
    /// destination under the cache directory).
    #[arg(long, requires = "packed")]
    staging: Option<PathBuf>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, ValueEnum)]
pub(super) enum ContentArg {
    /// Random bytes behind a JPEG marker (incompressible, like real JPEGs).
    Random,
    /// Words from a small vocabulary (compressible).
    Text,
}

pub(super) fn run(g: GenArgs) -> anyhow::Result<ExitCode> {
    let opts = GenOptions {
        out: g.out.clone(),
        files: g.files,
        classes: g.classes,
        sizes: g.sizes,
        content: match g.content {
            ContentArg::Random => Content::Random,
            ContentArg::Text => Content::Text,
        },
        seed: g.seed,
        progress: std::io::stderr().is_terminal(),
    };
    if g.packed {
        return packed(&g, &opts);
    }
    let s = granary_bench::gen::generate(&opts)
        .with_context(|| format!("generating {}", g.out.display()))?;
    crate::cmd::output(g.json, &s, |s| {
        println!(
            "generated {} files in {} classes ({}) under {} in {:.2} s",
            s.files,
            s.classes,
            crate::cmd::human_bytes(s.bytes),
            s.out.display(),
            s.elapsed_s
        );
    })
}

/// `--packed`: the same samples (paths, bytes, class labels) written into a dataset.
fn packed(g: &GenArgs, opts: &GenOptions) -> anyhow::Result<ExitCode> {
    use granary_bench::gen::{file_bytes, file_path};
    use granary_packer::{Label, Writer, WriterOptions};
    let out = g.out.to_string_lossy().into_owned();
    let mut o = WriterOptions::new(&g.out);
    o.output.seed = g.seed;
    o.output.chunk_size = g.chunk_size;
    o.output.progress = opts.progress;
    o.store = crate::cmd::store_config().clone();
    crate::cmd::pack::to_object_store(&mut o.output, g.staging.as_deref())?;
    let t0 = std::time::Instant::now();
    let written = (|| {
        let mut w = Writer::create(o).with_context(|| format!("creating {out}"))?;
        for i in 0..opts.files {
            let path = file_path(opts, i);
            let key = path.to_string_lossy();
            let class = key.split('/').next().unwrap_or_default();
            w.write(
                key.as_bytes(),
                file_bytes(opts, i),
                Label::Name(class.as_bytes()),
            )
            .with_context(|| format!("writing sample {i} ({key}) to {out}"))?;
        }
        w.finish().with_context(|| format!("finishing {out}"))
    })();
    crate::cmd::pack::let_the_interruption_end_it();
    let s = written?;
    crate::cmd::output(g.json, &s, |s| {
        println!(
            "packed {} samples in {} classes ({}) into {out} in {:.2} s (dataset id {})",
            s.files,
            s.classes,
            crate::cmd::human_bytes(s.bytes_in),
            t0.elapsed().as_secs_f64(),
            s.dataset_id
        );
    })
}
