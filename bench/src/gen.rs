//! Seeded synthetic ImageFolder-style trees: `OUT/class_NNNN/NNNNNNNN.EXT`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use granary_packer::SplitMix64;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rayon::prelude::*;
use serde::Serialize;

/// File size distribution.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sizes {
    /// Lognormal, mean ~110 KiB (sigma 0.7), clamped to 1 KiB..8 MiB: like ImageNet JPEGs.
    Imagenet,
    /// Lognormal, mean ~1 KiB (sigma 0.5), clamped to 16 B..64 KiB.
    Tiny,
    /// Every file has exactly this many bytes.
    Fixed(u64),
}

impl Sizes {
    /// Parses `imagenet`, `tiny` or a byte count.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "imagenet" => Ok(Sizes::Imagenet),
            "tiny" => Ok(Sizes::Tiny),
            n => n.parse::<u64>().map(Sizes::Fixed).map_err(|_| {
                format!("unknown size distribution {s:?}: use imagenet, tiny or a byte count")
            }),
        }
    }

    fn sample(&self, r: &mut SplitMix64) -> u64 {
        let (mean, sigma, lo, hi): (f64, f64, u64, u64) = match *self {
            Sizes::Fixed(n) => return n,
            Sizes::Imagenet => (110.0 * 1024.0, 0.7, 1024, 8 << 20),
            Sizes::Tiny => (1024.0, 0.5, 16, 64 << 10),
        };
        // Box-Muller normal; lognormal with the requested mean: mu = ln(mean) - sigma^2 / 2.
        let u1 = ((r.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (r.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        let x = (mean.ln() - sigma * sigma / 2.0 + sigma * z).exp();
        (x as u64).clamp(lo, hi)
    }
}

/// File contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Content {
    /// Random bytes behind a JPEG marker, named `.JPEG`: incompressible, like real JPEGs.
    Random,
    /// Words from a small vocabulary, named `.txt`: compressible.
    Text,
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenOptions {
    pub out: PathBuf,
    pub files: u64,
    pub classes: u64,
    pub sizes: Sizes,
    pub content: Content,
    pub seed: u64,
    pub progress: bool,
}

/// What was generated.
#[derive(Clone, Debug, Serialize)]
pub struct GenSummary {
    pub out: PathBuf,
    pub files: u64,
    pub classes: u64,
    pub bytes: u64,
    pub elapsed_s: f64,
}

/// Relative path of file `i`.
pub fn file_path(opts: &GenOptions, i: u64) -> PathBuf {
    let ext = match opts.content {
        Content::Random => "JPEG",
        Content::Text => "txt",
    };
    PathBuf::from(format!("class_{:04}", i % opts.classes))
        .join(format!("{:08}.{ext}", i / opts.classes))
}

/// Contents of file `i` (deterministic in seed and index).
pub fn file_bytes(opts: &GenOptions, i: u64) -> Vec<u8> {
    let mut r = SplitMix64::new(opts.seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    r.next_u64();
    let size = opts.sizes.sample(&mut r) as usize;
    let mut v = Vec::with_capacity(size);
    match opts.content {
        Content::Random => {
            v.extend_from_slice(b"\xFF\xD8\xFF\xE0");
            while v.len() < size {
                v.extend_from_slice(&r.next_u64().to_le_bytes());
            }
        }
        Content::Text => {
            const WORDS: [&str; 16] = [
                "granary", "chunk", "sample", "epoch", "shuffle", "tensor", "loss", "batch",
                "storage", "lustre", "reader", "packer", "label", "class", "image", "model",
            ];
            while v.len() < size {
                v.extend_from_slice(WORDS[(r.next_u64() % 16) as usize].as_bytes());
                v.push(if r.next_u64().is_multiple_of(12) {
                    b'\n'
                } else {
                    b' '
                });
            }
        }
    }
    v.truncate(size);
    v
}

/// Generates the tree. Fails if `out` exists and is not empty.
pub fn generate(opts: &GenOptions) -> std::io::Result<GenSummary> {
    let t = Instant::now();
    if opts.classes == 0 {
        return Err(std::io::Error::other("--classes must be at least 1"));
    }
    if opts.out.exists() && std::fs::read_dir(&opts.out)?.next().is_some() {
        return Err(std::io::Error::other(format!(
            "{} exists and is not empty",
            opts.out.display()
        )));
    }
    for c in 0..opts.classes.min(opts.files.max(1)) {
        std::fs::create_dir_all(opts.out.join(format!("class_{c:04}")))?;
    }
    let target = if opts.progress {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let pb = ProgressBar::with_draw_target(Some(opts.files), target);
    let template = "{spinner} generating [{bar:30}] {pos}/{len} files {per_sec} ETA {eta}";
    let style = ProgressStyle::with_template(template).expect("static template");
    pb.set_style(style.progress_chars("=> "));
    pb.enable_steady_tick(Duration::from_millis(200));
    let bytes: u64 = (0..opts.files)
        .into_par_iter()
        .map(|i| -> std::io::Result<u64> {
            let data = file_bytes(opts, i);
            std::fs::write(opts.out.join(file_path(opts, i)), &data)?;
            pb.inc(1);
            Ok(data.len() as u64)
        })
        .try_reduce(|| 0, |a, b| Ok(a + b))?;
    pb.finish_and_clear();
    Ok(GenSummary {
        out: opts.out.clone(),
        files: opts.files,
        classes: opts.classes.min(opts.files),
        bytes,
        elapsed_s: t.elapsed().as_secs_f64(),
    })
}
