//! The path hash: which shard packs a file (docs/internals.md), and seeds keyed by path.

/// FNV-1a, 64-bit, over the raw path bytes (offset basis 0xcbf29ce484222325,
/// prime 0x100000001b3). Stable across versions: shard assignments depend on it.
pub fn path_hash(path: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in path {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    #[test]
    fn known_vectors() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(super::path_hash(b""), 0xcbf29ce484222325);
        assert_eq!(super::path_hash(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(super::path_hash(b"foobar"), 0x85944171f73967e8);
    }
}
