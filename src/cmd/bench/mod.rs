//! `granary bench`: generate data, compare granary with the alternatives on the same data.
//! One module per subcommand.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Subcommand;

mod cache;
mod compare;
mod gen;
mod hits;
mod pack;
mod plan;
mod read;
mod remote;

/// Benchmarks: generate data, compare granary with the alternatives on the same data.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: BenchCmd,
}

#[derive(Subcommand)]
enum BenchCmd {
    Gen(gen::GenArgs),
    Pack(pack::PackArgs),
    Read(read::ReadArgs),
    Compare(compare::CompareArgs),
    #[command(hide = true)]
    CompareSide(compare::CompareSideArgs),
    Cache(cache::CacheArgs),
    Hits(hits::HitsArgs),
    Plan(plan::PlanArgs),
    Remote(remote::RemoteArgs),
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let progress = std::io::stderr().is_terminal();
    match a.cmd {
        BenchCmd::Gen(g) => gen::run(g, progress),
        BenchCmd::Pack(p) => pack::run(p, progress),
        BenchCmd::Read(r) => read::run(r),
        BenchCmd::Compare(c) => compare::run(c),
        BenchCmd::CompareSide(c) => compare::run_side(c),
        BenchCmd::Cache(c) => cache::run(c),
        BenchCmd::Hits(h) => hits::run(h),
        BenchCmd::Plan(p) => plan::run(p),
        BenchCmd::Remote(r) => remote::run(r),
    }
}
