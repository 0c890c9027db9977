//! `granary bench`: generate data, compare granary with the alternatives on the same data.
//! One module per subcommand.

use std::process::ExitCode;

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

subcommands! {
    BenchCmd, dispatch,
    Gen(gen::GenArgs) => gen::run,
    Pack(pack::PackArgs) => pack::run,
    Read(read::ReadArgs) => read::run,
    Compare(compare::CompareArgs) => compare::run,
    #[command(hide = true)]
    CompareSide(compare::CompareSideArgs) => compare::run_side,
    Cache(cache::CacheArgs) => cache::run,
    Hits(hits::HitsArgs) => hits::run,
    Plan(plan::PlanArgs) => plan::run,
    Remote(remote::RemoteArgs) => remote::run,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    dispatch(a.cmd)
}
