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

/// The four bytes at `fix` that, xor-ed into a `len`-byte message together with `0x01` at
/// `flip`, leave its CRC-32 as it was. CRC-32 is affine in its input, so the change a flip
/// makes is cancelled by solving 32 linear equations over GF(2) in the 32 bits at `fix`.
pub fn crc_preserving_fix(len: usize, flip: usize, fix: usize) -> [u8; 4] {
    let zero = crate::crc32(&vec![0u8; len]);
    let change = |set: &[(usize, u8)]| {
        let mut v = vec![0u8; len];
        for &(i, b) in set {
            v[i] ^= b;
        }
        crate::crc32(&v) ^ zero
    };
    // Gaussian elimination: each pivot is (column value, which fix bits make it).
    let mut pivots: Vec<(u32, u32)> = Vec::new();
    for k in 0..32usize {
        let (mut v, mut m) = (change(&[(fix + k / 8, 1 << (k % 8))]), 1u32 << k);
        for &(pv, pm) in &pivots {
            if v ^ pv < v {
                v ^= pv;
                m ^= pm;
            }
        }
        if v != 0 {
            pivots.push((v, m));
            pivots.sort_by_key(|p| std::cmp::Reverse(p.0));
        }
    }
    let (mut t, mut m) = (change(&[(flip, 1)]), 0u32);
    for &(pv, pm) in &pivots {
        if t ^ pv < t {
            t ^= pv;
            m ^= pm;
        }
    }
    assert_eq!(t, 0, "four consecutive bytes always cancel a CRC-32 change");
    m.to_le_bytes()
}
