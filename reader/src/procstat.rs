//! This process's resource use as the kernel reports it (`/proc/self`): CPU time, peak resident
//! set, bytes fetched from storage devices. Linux only; `None`/0 where not reported.

/// CPU time (user + system) of this process so far, from /proc/self/stat (USER_HZ = 100).
pub fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    let rest = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// `VmHWM` of `/proc/self/status`: this process's peak resident set size so far.
pub fn peak_rss_bytes() -> Option<u64> {
    field("/proc/self/status", "VmHWM:").map(|kb| kb * 1024)
}

/// `read_bytes` of `/proc/self/io`: bytes this process caused to be fetched from storage.
pub fn device_read_bytes() -> Option<u64> {
    field("/proc/self/io", "read_bytes:")
}

/// The number after `key` in `file` (a unit `kB` ignored).
fn field(file: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    let value = text.lines().find_map(|l| l.strip_prefix(key))?;
    value.trim().trim_end_matches("kB").trim().parse().ok()
}
