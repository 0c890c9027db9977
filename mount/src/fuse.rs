//! The FUSE side (fuser, the kernel protocol in Rust, no libfuse): requests go to
//! [`MountFs`]'s methods, their results become replies. Mounting, serving and unmounting.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fuser::{
    Config, Errno, FileHandle, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, LockOwner,
    MountOption, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyXattr, Request, SessionACL,
};

use crate::fs::MountFs;

/// How long the kernel may cache attributes and entries: everything is immutable.
const TTL: Duration = Duration::from_secs(3600);

/// Open files and directories never change: the kernel may keep their pages across opens.
const KEEP: FopenFlags = FopenFlags::FOPEN_KEEP_CACHE;

/// The FUSE adapter.
struct Fuse(Arc<MountFs>);

/// Answers `$reply` with `$ok` given the value of `$result`, or with the errno it failed with.
macro_rules! answer {
    ($reply:ident, $result:expr, |$v:pat_param| $ok:expr) => {
        match $result {
            Ok($v) => $ok,
            Err(e) => $reply.error(Errno::from_i32(e)),
        }
    };
}

impl fuser::Filesystem for Fuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Listings carry attributes (no lookup per entry); both are best effort, on kernels
        // without them FUSE falls back to readdir and smaller readahead.
        let _ = config.add_capabilities(InitFlags::FUSE_DO_READDIRPLUS);
        let _ = config.set_max_readahead(1 << 20);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let r = self.0.lookup(parent.0, name.as_encoded_bytes());
        answer!(reply, r, |a| reply.entry(&TTL, &a, Generation(0)))
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        answer!(reply, self.0.getattr(ino.0), |a| reply.attr(&TTL, &a))
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let write = flags.acc_mode() != OpenAccMode::O_RDONLY;
        let r = self.0.open(ino.0, write);
        answer!(reply, r, |fh| reply.opened(FileHandle(fh), KEEP))
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let r = self.0.read(fh.0, offset, size);
        answer!(reply, r, |(data, range)| reply.data(&data[range]))
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.0.release(fh.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let r = self.0.opendir(ino.0);
        answer!(reply, r, |()| reply.opened(FileHandle(0), KEEP))
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = self.0.readdir(ino.0, offset, |a, name, next| {
            reply.add(a.ino, next, a.kind, OsStr::from_bytes(name))
        });
        answer!(reply, r, |()| reply.ok())
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let r = self.0.readdir(ino.0, offset, |a, name, next| {
            reply.add(a.ino, next, OsStr::from_bytes(name), &TTL, a, Generation(0))
        });
        answer!(reply, r, |()| reply.ok())
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let (bytes, files) = self.0.totals();
        reply.statfs(bytes.div_ceil(4096), 0, 0, files, 0, 4096, 255, 4096);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self.0.getxattr(ino.0, name.as_encoded_bytes()) {
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) if v.len() <= size as usize => reply.data(&v),
            Ok(_) => reply.error(Errno::ERANGE),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        if size == 0 {
            reply.size(0);
        } else {
            reply.data(&[]);
        }
    }

    /// A close of a read-only file: nothing to write back (answered without the log line
    /// FUSE's default gives each close).
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    /// No ioctl is a mount's: "not a terminal" (what `open()` from Python asks, TCGETS, gets
    /// from any regular file), answered without the log line FUSE's default gives each call.
    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        answer!(reply, self.0.getattr(ino.0), |_| reply.ok())
    }
}

/// How to mount.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// Threads serving requests.
    pub threads: usize,
    /// Let other users (and root) read the mount (`allow_other`; a normal user needs
    /// `user_allow_other` in /etc/fuse.conf).
    pub allow_other: bool,
    /// Source name shown in the mount table.
    pub fsname: String,
    /// How long an unmount waits for requests in progress before the process exits anyway
    /// (its exit ends the FUSE connection: readers get an error, never a hang). 3 s, so that
    /// a stopped mount is gone within the 5 s the documentation promises.
    pub grace: Duration,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            threads: 4,
            allow_other: false,
            fsname: "granary".into(),
            grace: Duration::from_secs(3),
        }
    }
}

/// File-system type in the mount table: `fuse.granary` when mounted through fusermount3;
/// mounted directly (as root) the type is `fuse` and the source starts with
/// [`FS_SOURCE_PREFIX`].
pub const FS_TYPE: &str = "fuse.granary";
/// Start of a granary mount's source name in the mount table (`granary:DATASET`).
pub const FS_SOURCE_PREFIX: &str = "granary:";

/// Why [`serve`] returned.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The file system was unmounted from outside (`granary umount`, `umount`, `fusermount -u`).
    Unmounted,
    /// `stop` was set (a signal): unmounted here.
    Stopped,
    /// Unmounted here, but requests were still in progress after the grace period.
    Abandoned,
}

/// Mounts `fs` at `mountpoint` read-only and serves it until it is unmounted or `stop` is
/// set; then unmounts (lazily: a process with a file open keeps its view until it closes it)
/// and stops the fetcher.
pub fn serve(
    fs: Arc<MountFs>,
    mountpoint: &Path,
    opts: &MountOptions,
    stop: &AtomicBool,
    on_mounted: impl FnOnce(),
) -> io::Result<Ended> {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::RO,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoAtime,
        MountOption::DefaultPermissions,
        MountOption::FSName(opts.fsname.clone()),
        MountOption::Subtype("granary".into()),
    ];
    if opts.allow_other {
        config.acl = SessionACL::All;
    }
    config.n_threads = Some(opts.threads.max(1));
    config.clone_fd = true;
    let session = fuser::spawn_mount(Fuse(fs.clone()), mountpoint, &config)?;
    on_mounted();
    let result = loop {
        if session.guard.is_finished() {
            session.join()?;
            break Ended::Unmounted;
        }
        if stop.load(Relaxed) {
            // Detached at once (a process with a file open keeps it until it closes it);
            // then the session is joined in a helper: a reader holding a file open, or a
            // request stuck in storage, must not hold the process past the grace period.
            if let Err(e) = unmount(mountpoint, true) {
                log::warn!("mount: {e}");
            }
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = tx.send(session.join());
            });
            let t0 = Instant::now();
            let Ok(r) = rx.recv_timeout(opts.grace) else {
                log::warn!(
                    "mount: requests still in progress {:.1} s after unmounting; \
                     exiting anyway",
                    t0.elapsed().as_secs_f64()
                );
                break Ended::Abandoned;
            };
            r?;
            break Ended::Stopped;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    fs.reader().shutdown();
    Ok(result)
}

/// Unmounts the FUSE mount at `mnt`; `lazy` detaches it even while files are open. As root
/// with the system call, else through `fusermount3 -u` (or `fusermount`).
pub fn unmount(mnt: &Path, lazy: bool) -> io::Result<()> {
    use rustix::mount::UnmountFlags;
    if rustix::process::geteuid().is_root() {
        let flags = if lazy {
            UnmountFlags::DETACH
        } else {
            UnmountFlags::empty()
        };
        return rustix::mount::unmount(mnt, flags).map_err(|e| {
            let hint = if e == rustix::io::Errno::BUSY {
                " (a process has a file open or its working directory there: close it, or \
                 unmount lazily with `granary umount --lazy`)"
            } else {
                ""
            };
            io::Error::new(e.kind(), format!("unmounting {}: {e}{hint}", mnt.display()))
        });
    }
    let mut last = None;
    for bin in ["fusermount3", "fusermount"] {
        let mut c = std::process::Command::new(bin);
        c.arg("-u").args(lazy.then_some("-z"));
        match c.arg(mnt).status() {
            Ok(s) if s.success() => return Ok(()),
            Ok(s) => {
                return Err(io::Error::other(format!(
                    "{bin} -u {} failed ({s})",
                    mnt.display()
                )))
            }
            Err(e) => last = Some(e),
        }
    }
    Err(io::Error::other(format!(
        "unmounting {} as a normal user needs fusermount3 (package fuse3): {}",
        mnt.display(),
        last.map(|e| e.to_string()).unwrap_or_default()
    )))
}
