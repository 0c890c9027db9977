//! `granary bench gen`: a seeded ImageFolder-style tree.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::ValueEnum;
use granary_bench::gen::{Content, GenOptions, Sizes};

/// Generate a seeded ImageFolder-style tree (OUT/class_NNNN/NNNNNNNN.JPEG).
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  granary bench gen data/imagenet --files 20000 --sizes imagenet\n  \
granary bench gen data/tiny --files 1000000 --classes 1000 --sizes tiny\n\n\
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

pub(super) fn run(g: GenArgs, progress: bool) -> anyhow::Result<ExitCode> {
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
        progress,
    };
    let s = granary_bench::gen::generate(&opts)
        .with_context(|| format!("generating {}", g.out.display()))?;
    if g.json {
        super::super::print_json(&s)?;
    } else {
        println!(
            "generated {} files in {} classes ({}) under {} in {:.2} s",
            s.files,
            s.classes,
            super::super::human_bytes(s.bytes),
            s.out.display(),
            s.elapsed_s
        );
    }
    Ok(ExitCode::SUCCESS)
}
