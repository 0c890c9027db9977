//! A memory cgroup of this process's own (a child of the one it runs in), to run a benchmark
//! side with less memory than the machine has: page cache included, so a dataset larger than
//! the limit cannot stay resident. cgroup v1 (`memory.limit_in_bytes`) and v2 (`memory.max`).
//! Needs write access to the cgroup tree (root, or a delegated subtree).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A memory cgroup, removed when dropped (after the processes in it have ended).
pub struct MemoryCgroup {
    dir: PathBuf,
    v2: bool,
}

static SERIAL: AtomicU64 = AtomicU64::new(0);

/// Where this process's memory cgroup is: (directory, v2?).
fn own_cgroup() -> Result<(PathBuf, bool), String> {
    let text = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("reading /proc/self/cgroup: {e}"))?;
    // A v1 memory controller wins where both hierarchies are mounted.
    let v1 = text.lines().find_map(|line| {
        let mut f = line.splitn(3, ':').skip(1);
        let (ctrl, path) = (f.next()?, f.next()?);
        let dir = Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
        let memory = ctrl.split(',').any(|c| c == "memory");
        (memory && dir.join("memory.limit_in_bytes").exists()).then_some((dir, false))
    });
    let v2 = || {
        text.lines().find_map(|line| {
            let path = line.strip_prefix("0::")?;
            let dir = Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
            dir.join("cgroup.controllers")
                .exists()
                .then_some((dir, true))
        })
    };
    v1.or_else(v2).ok_or_else(|| {
        "no memory cgroup controller found (neither v1 memory nor v2 with memory)".into()
    })
}

impl MemoryCgroup {
    /// A new child cgroup limited to `limit` bytes.
    pub fn create(limit: u64) -> Result<Self, String> {
        let (parent, v2) = own_cgroup()?;
        let name = format!(
            "granary-bench-{}-{}",
            std::process::id(),
            SERIAL.fetch_add(1, Ordering::Relaxed)
        );
        let dir = parent.join(name);
        std::fs::create_dir(&dir).map_err(|e| {
            format!(
                "creating the memory cgroup {}: {e} (the limited state needs root or a \
                 delegated cgroup)",
                dir.display()
            )
        })?;
        let cg = MemoryCgroup { dir, v2 };
        let file = cg.control("memory.max", "memory.limit_in_bytes");
        std::fs::write(&file, limit.to_string())
            .map_err(|e| format!("setting {}: {e}", file.display()))?;
        if v2 {
            // No swap: the limit is the memory the side has.
            let _ = std::fs::write(cg.dir.join("memory.swap.max"), "0");
        }
        Ok(cg)
    }

    /// The control file named `v2` in cgroup v2, `v1` in v1.
    fn control(&self, v2: &str, v1: &str) -> PathBuf {
        self.dir.join(if self.v2 { v2 } else { v1 })
    }

    /// Writing a process id here moves that process into the cgroup.
    pub fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// The most memory the cgroup used, page cache included.
    pub fn peak_bytes(&self) -> Option<u64> {
        std::fs::read_to_string(self.control("memory.peak", "memory.max_usage_in_bytes"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// True when the kernel's OOM killer killed a process of the cgroup.
    pub fn oom_killed(&self) -> bool {
        std::fs::read_to_string(self.control("memory.events", "memory.oom_control"))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("oom_kill "))
                    .and_then(|n| n.trim().parse::<u64>().ok())
            })
            .is_some_and(|n| n > 0)
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // The side's process has been waited for; its cgroup empties a moment later.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        eprintln!(
            "warning: could not remove the memory cgroup {}",
            self.dir.display()
        );
    }
}
