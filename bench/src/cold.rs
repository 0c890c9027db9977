//! Making the page cache cold before a measured run.

use std::path::Path;

granary_format::named_enum! {
    /// How caches were made cold.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum ColdMethod ("cold method") {
        /// `sync; echo 3 > /proc/sys/vm/drop_caches` (needs root).
        DropCaches = "drop-caches",
        /// `posix_fadvise(POSIX_FADV_DONTNEED)` on every file of the given trees.
        Fadvise = "fadvise",
        /// Nothing could be done: the run may be warm.
        None = "none",
    }
}

granary_format::named_enum! {
    /// How `compare` makes caches cold before each epoch.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum ColdMode ("cold mode") {
        /// drop_caches where permitted, else fadvise.
        Auto = "auto",
        /// drop_caches only.
        Drop = "drop",
        /// posix_fadvise(DONTNEED) on every file only.
        Fadvise = "fadvise",
        /// Leave the caches alone (warm epochs).
        None = "none",
    }
}

/// Makes caches cold as `mode` asks; `None` for warm (mode none), else what worked.
pub fn make_cold_with(mode: ColdMode, trees: &[&Path]) -> Option<ColdMethod> {
    Some(match mode {
        ColdMode::None => return None,
        ColdMode::Auto | ColdMode::Drop if drop_caches() => ColdMethod::DropCaches,
        ColdMode::Drop => ColdMethod::None,
        ColdMode::Auto | ColdMode::Fadvise => fadvise_all(trees),
    })
}

/// Drops the page cache; where that is not permitted, evicts every file under `trees` with
/// `posix_fadvise(DONTNEED)`. Returns what worked.
pub fn make_cold(trees: &[&Path]) -> ColdMethod {
    make_cold_with(ColdMode::Auto, trees).expect("auto makes caches cold")
}

fn fadvise_all(trees: &[&Path]) -> ColdMethod {
    let mut any = false;
    for t in trees {
        for e in walkdir::WalkDir::new(t).into_iter().flatten() {
            if e.file_type().is_file() {
                if let Ok(f) = std::fs::File::open(e.path()) {
                    any |= rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).is_ok();
                }
            }
        }
    }
    if any {
        ColdMethod::Fadvise
    } else {
        ColdMethod::None
    }
}

/// `sync; echo 3 > /proc/sys/vm/drop_caches`: whether it was permitted.
fn drop_caches() -> bool {
    rustix::fs::sync();
    std::fs::write("/proc/sys/vm/drop_caches", b"3\n").is_ok()
}
