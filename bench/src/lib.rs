//! granary benchmarks: a seeded generator of ImageFolder-style trees, cold-cache helpers, and
//! side-by-side comparisons that print ratios measured in one run.
#![forbid(unsafe_code)]

pub mod cachesim;
pub mod cgroup;
pub mod cold;
pub mod compare;
pub mod gen;
pub mod hitbench;
pub mod packbench;
pub mod readbench;
pub mod report;
pub mod tierbench;
