use std::path::PathBuf;
use std::process::ExitCode;

/// Merge the parts of a sharded pack (`granary pack --shard I/N`) into one dataset.
#[derive(clap::Args)]
#[command(after_help = "Example:
  for i in 0 1 2 3; do granary pack ./train -o /lustre/train.granary --shard $i/4 & done; wait
  granary merge /lustre/train.granary && granary verify /lustre/train.granary

Every part is checked first: all N present and finished, undamaged, from one pack (same input
listing and settings), each chunk file there with its recorded size, dataset id and chunk id, no
path twice. Nothing is changed if a check fails. Then ids a shorter shard left unused get empty
chunks, the snapshot is written (atomically) and the part directories are removed. Chunk data is
never copied. Rerunning on a merged dataset does nothing.")]
pub struct Args {
    /// Dataset directory the shards wrote into.
    pub dataset: PathBuf,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let s = granary_packer::merge(&a.dataset)?;
    super::output(a.json, &s, |s| {
        if !s.merged {
            println!(
                "{} is merged already: {} samples in {} chunks, dataset id {}",
                a.dataset.display(),
                s.files,
                s.chunks,
                s.dataset_id
            );
        } else {
            println!(
                "merged {} parts -> {}: {} samples in {} chunks ({} empty), snapshot {} bytes, {:.2} s, dataset id {}",
                s.parts,
                a.dataset.display(),
                s.files,
                s.chunks,
                s.filler_chunks,
                s.snapshot_bytes,
                s.elapsed_s,
                s.dataset_id
            );
        }
    })
}
