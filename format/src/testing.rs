//! Support for the tests of granary's crates (the `test-support` feature, which their
//! dev-dependencies turn on; not part of the library's API).

use std::path::Path;

/// Test vectors become fuzz seeds: with `GRANARY_FUZZ_SEEDS=DIR` set, a test that builds a
/// valid file of some kind also writes it to `DIR/<target>/<name>` (scripts/fuzz.sh seeds its
/// corpora this way). Does nothing otherwise; a seed that cannot be written fails the test.
pub fn dump_fuzz_seed(target: &str, name: &str, bytes: &[u8]) {
    if let Some(dir) = std::env::var_os("GRANARY_FUZZ_SEEDS") {
        let dir = Path::new(&dir).join(target);
        std::fs::create_dir_all(&dir).expect("creating the seed directory");
        std::fs::write(dir.join(name), bytes).expect("writing a fuzz seed");
    }
}
