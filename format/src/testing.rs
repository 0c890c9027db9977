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

/// Recomputes every CRC of a snapshot (the body's blocks, the block CRC table's, the
/// header's) after an edit, as a hostile author would, so the edit passes the checksum checks
/// and reaches the structural ones. Does nothing (returns false) when the header's body end or
/// block size cannot describe `b`.
pub fn reseal_snapshot(b: &mut [u8]) -> bool {
    let head = crate::SNAPSHOT_HEADER_LEN;
    if b.len() < head {
        return false;
    }
    let body_end = u64::from_le_bytes(b[40..48].try_into().expect("8 bytes"));
    let shift = b[10];
    if !crate::BLOCK_SHIFTS.contains(&shift) || body_end < head as u64 || body_end > b.len() as u64
    {
        return false;
    }
    let body_end = body_end as usize;
    let crcs: Vec<u8> = b[head..body_end]
        .chunks(1 << shift)
        .flat_map(|c| crc32fast::hash(c).to_le_bytes())
        .collect();
    let Some(table) = b.get_mut(body_end..body_end + crcs.len()) else {
        return false;
    };
    table.copy_from_slice(&crcs);
    let digest = crate::ContentDigest::of_file(&b[..body_end + crcs.len()]);
    b[56..72].copy_from_slice(&digest);
    let crc = crc32fast::hash(&crcs);
    b[88..92].copy_from_slice(&crc.to_le_bytes());
    let crc = crc32fast::hash(&b[0..92]);
    b[92..96].copy_from_slice(&crc.to_le_bytes());
    true
}
