//! `granary mount` and `granary umount`.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use granary_mount::{MountFs, MountOptions, TieredReader, FS_SOURCE_PREFIX, FS_TYPE, XATTR_PID};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

/// Mount a dataset read-only with its original tree, so unmodified code reads it.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  granary mount train.granary /mnt/train                 # returns once mounted
  granary mount train.granary /mnt/train --cache-dir /local/ssd/gcache --cache-size 200GiB
  granary umount /mnt/train

  # PyTorch, unchanged: torchvision.datasets.ImageFolder(\"/mnt/train\") over the mount
  # (granary.ChunkwiseSampler orders it so each chunk is read once, sequentially)

  # Slurm batch script: one mount per node for the job's lifetime (a step in the
  # background: Slurm ends a step's processes with the step), tier on the node's SSD
  srun --ntasks-per-node=1 --overlap granary mount /lustre/train.granary /tmp/train \\
       --cache-dir /local/$SLURM_JOB_ID --cache-size 300GiB --foreground &
  srun --ntasks-per-node=1 sh -c 'until mountpoint -q /tmp/train; do sleep 1; done'
  srun python train.py --data /tmp/train
  srun --ntasks-per-node=1 --overlap granary umount /tmp/train; wait

Reads are whole samples, CRC-checked: a damaged record is EIO, never wrong bytes. With a tier,
a file whose chunk the tier lacks has the whole chunk copied into the tier (one large read of
shared storage instead of one small read per file) and later files of that chunk come from the
tier. When the tier is full and would have to evict, a chunk is fetched only while reads
concentrate on it (granary.ChunkwiseSampler's order); under a random order those files are read
from shared storage one by one. The policy and quota decide what stays (`granary read --help`).

Statistics while mounted: getfattr -n user.granary.stats --only-values /mnt/train
Without --foreground the mount runs in the background, logging to --log; SIGINT or SIGTERM
unmount it cleanly. A normal user needs /dev/fuse access and fusermount3 (package fuse3).")]
pub struct Args {
    /// Dataset directory (or its snapshot file), its URL (s3://, gs://, az://), or a view file
    /// (`granary view`: the view's files only).
    pub dataset: PathBuf,
    /// Directory to mount it on.
    pub mountpoint: PathBuf,
    #[command(flatten)]
    pub tier: super::args::TierArgs,
    /// Only read from the tier, never copy chunks into it on first touch.
    #[arg(long)]
    pub no_fetch: bool,
    /// Stay in the foreground (logging to stderr) until unmounted or interrupted.
    #[arg(short, long)]
    pub foreground: bool,
    /// Log of the background mount (default: granary-mount.PID.log in the temp directory).
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// Threads serving requests.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Let other users read the mount (a normal user needs user_allow_other in
    /// /etc/fuse.conf).
    #[arg(long)]
    pub allow_other: bool,
}

/// Unmount a `granary mount`.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  granary umount /mnt/train\n  granary umount --lazy /mnt/train   \
# detach now; processes with open files finish first"
)]
pub struct UmountArgs {
    /// The mount point.
    pub mountpoint: PathBuf,
    /// Detach even while files are open (they stay readable until closed).
    #[arg(long)]
    pub lazy: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let mnt = std::fs::canonicalize(&a.mountpoint)
        .with_context(|| format!("mount point {}", a.mountpoint.display()))?;
    if !mnt.is_dir() {
        bail!("mount point {} is not a directory", mnt.display());
    }
    if mounted_type(&mnt)?.as_deref() == Some(FS_TYPE) {
        bail!(
            "{} is already a granary mount (`granary umount {}` first)",
            mnt.display(),
            mnt.display()
        );
    }
    if a.foreground {
        return foreground(a, &mnt);
    }
    background(&a, &mnt)
}

fn foreground(a: Args, mnt: &Path) -> anyhow::Result<ExitCode> {
    let t0 = Instant::now();
    let ds = Arc::new(super::open_dataset(&a.dataset)?);

    let cache = a.tier.open(&ds)?;
    let reader = TieredReader::new(ds.clone(), cache, !a.no_fetch)?;
    let uid = rustix::process::geteuid().as_raw();
    let gid = rustix::process::getegid().as_raw();
    let fs = Arc::new(
        MountFs::new(reader, uid, gid)
            .with_context(|| format!("cannot mount {}", a.dataset.display()))?,
    );
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [SIGINT, SIGTERM, SIGHUP] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let opts = MountOptions {
        threads: a.threads,
        allow_other: a.allow_other,
        fsname: format!("{FS_SOURCE_PREFIX}{}", ds.location()),
        ..MountOptions::default()
    };
    let files = ds.len();
    let ended = granary_mount::serve(fs.clone(), mnt, &opts, &stop, || {
        eprintln!(
            "granary: mounted {} ({files} files) at {} in {:.2} s (pid {}); \
             stop with Ctrl-C or `granary umount {}`",
            ds.location(),
            mnt.display(),
            t0.elapsed().as_secs_f64(),
            std::process::id(),
            mnt.display()
        );
    })
    .with_context(|| mount_hint(mnt))?;
    eprintln!(
        "granary: {} ({ended:?}); statistics: {}",
        mnt.display(),
        fs.stats_json()
    );
    Ok(ExitCode::SUCCESS)
}

fn mount_hint(mnt: &Path) -> String {
    let mut m = format!("mounting {}", mnt.display());
    if !Path::new("/dev/fuse").exists() {
        m.push_str(" (/dev/fuse is missing: this machine or container has no FUSE)");
    } else if !rustix::process::geteuid().is_root() {
        m.push_str(" (as a normal user, FUSE needs fusermount3 from the fuse3 package)");
    }
    m
}

/// Starts `granary mount ... --foreground` as a background process with its output in the
/// log, and returns once the mount is there (or with the log's tail if it failed).
fn background(a: &Args, mnt: &Path) -> anyhow::Result<ExitCode> {
    let log = match &a.log {
        Some(p) => p.clone(),
        None => std::env::temp_dir().join(format!("granary-mount.{}.log", std::process::id())),
    };
    let out = std::fs::File::create(&log)
        .with_context(|| format!("creating the mount's log {}", log.display()))?;
    let exe = std::env::current_exe().context("finding the granary executable")?;
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    args.push("--foreground".into());
    let mut child = Command::new(exe)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        // Its own process group: the terminal's Ctrl-C does not reach it.
        .process_group(0)
        .spawn()
        .context("starting the mount process")?;
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            bail!(
                "the mount process exited ({status}) without mounting:\n{}",
                text.trim_end()
            );
        }
        if mounted_type(mnt)?.as_deref() == Some(FS_TYPE) {
            eprintln!(
                "granary: mounted {} at {} in {:.2} s (pid {}, log {}); unmount with \
                 `granary umount {}`",
                a.dataset.display(),
                mnt.display(),
                t0.elapsed().as_secs_f64(),
                child.id(),
                log.display(),
                mnt.display()
            );
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn umount(a: UmountArgs) -> anyhow::Result<ExitCode> {
    let mnt = std::fs::canonicalize(&a.mountpoint)
        .with_context(|| format!("mount point {}", a.mountpoint.display()))?;
    match mounted_type(&mnt)? {
        Some(t) if t == FS_TYPE => {}
        Some(t) => bail!("{} is a {t} mount, not a granary mount", mnt.display()),
        None => bail!("nothing is mounted at {}", mnt.display()),
    }
    // The serving process, to wait for its exit (the tier is consistent at every moment;
    // waiting makes `umount` return after the mount's final statistics are logged).
    let pid = read_pid(&mnt);
    granary_mount::unmount(&mnt, a.lazy)?;
    // After a lazy unmount the process serves open files until they are closed: no wait.
    if let (Some(pid), false) = (pid, a.lazy) {
        let proc = PathBuf::from(format!("/proc/{pid}"));
        let t0 = Instant::now();
        while proc.exists() && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    eprintln!("granary: unmounted {}", mnt.display());
    Ok(ExitCode::SUCCESS)
}

/// The pid serving a granary mount (from its root's `user.granary.pid`).
fn read_pid(mnt: &Path) -> Option<u32> {
    let mut buf = [0u8; 32];
    let n = rustix::fs::getxattr(mnt, XATTR_PID, &mut buf[..]).ok()?;
    std::str::from_utf8(&buf[..n]).ok()?.parse().ok()
}

/// The file-system type mounted at `mnt` (canonical), from /proc/self/mountinfo;
/// [`FS_TYPE`] for a granary mount.
pub fn mounted_type(mnt: &Path) -> anyhow::Result<Option<String>> {
    let info = std::fs::read("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    let target = mnt.as_os_str().as_encoded_bytes();
    // The last entry for a mount point is the one on top. Mounted directly (as root) the type
    // is plain `fuse`; the source name tells a granary mount.
    let on_top = info.split(|&b| b == b'\n').rev().find_map(|line| {
        let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
        let sep = fields.iter().position(|f| *f == b"-")?;
        fields.get(4).filter(|f| unescape_mountinfo(f) == target)?;
        let kind = fields.get(sep + 1).copied().unwrap_or_default();
        let source = fields.get(sep + 2).copied().unwrap_or_default();
        let ours = kind.starts_with(b"fuse") && source.starts_with(FS_SOURCE_PREFIX.as_bytes());
        Some(match ours {
            true => FS_TYPE.to_string(),
            false => String::from_utf8_lossy(kind).into_owned(),
        })
    });
    Ok(on_top)
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape_mountinfo(f: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(f.len());
    let mut i = 0;
    while i < f.len() {
        let octal = f
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .map(|d| d.iter().fold(0u32, |v, c| v * 8 + (c - b'0') as u32))
            .filter(|&v| v <= 0xff);
        if let (b'\\', Some(v)) = (f[i], octal) {
            out.push(v as u8);
            i += 4;
        } else {
            out.push(f[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mountinfo(b"/mnt/a\\040b"), b"/mnt/a b");
        assert_eq!(unescape_mountinfo(b"/x\\134y"), b"/x\\y");
        assert_eq!(unescape_mountinfo(b"/trail\\04"), b"/trail\\04");
    }
}
