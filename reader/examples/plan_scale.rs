//! What one rank's epoch plan costs at a given dataset size, without any files: builds the
//! dataset shape (chunk sample counts) and rank 0's plan, and prints time and peak RSS.
//!
//!   cargo run --release -p granary-reader --example plan_scale -- SAMPLES [PER_CHUNK] [WORLD]
//!   cargo run --release -p granary-reader --example plan_scale -- 100000000 300 64

use std::time::Instant;

use granary::plan::{DatasetShape, EpochPlan, PlanOptions, Shard};

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| {
            a.replace('_', "")
                .parse()
                .expect("numbers: SAMPLES [PER_CHUNK] [WORLD]")
        })
        .collect();
    let samples = *args.first().expect("SAMPLES [PER_CHUNK] [WORLD]");
    let per_chunk = args.get(1).copied().unwrap_or(300).max(1);
    let world = args.get(2).copied().unwrap_or(64).max(1) as u32;
    let rss0 = granary::procstat::peak_rss_bytes().unwrap_or(0);
    let t = Instant::now();
    let chunks = samples.div_ceil(per_chunk);
    let shape =
        DatasetShape::from_counts((0..chunks).map(|c| per_chunk.min(samples - c * per_chunk)));
    let shape_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let o = PlanOptions {
        window_chunks: 4,
        ..PlanOptions::default()
    };
    let shard = Shard {
        rank: 0,
        world_size: world,
        worker: 0,
        num_workers: 1,
    };
    let plan = EpochPlan::build(&shape, &o, 0, shard, None).expect("plan");
    let plan_s = t.elapsed().as_secs_f64();
    let rss = granary::procstat::peak_rss_bytes().unwrap_or(0);
    println!(
        "{samples} samples in {chunks} chunks, world {world}: shape {shape_s:.2} s, rank 0's plan ({} samples, {} windows) {plan_s:.2} s; peak RSS {:.0} MB (start {:.0} MB)",
        plan.len(),
        plan.windows.len(),
        rss as f64 / 1e6,
        rss0 as f64 / 1e6
    );
}
