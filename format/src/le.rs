//! Little-endian field access on byte slices whose bounds the caller has checked.

pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

pub(crate) fn id_at(b: &[u8], at: usize) -> [u8; 16] {
    let mut x = [0u8; 16];
    x.copy_from_slice(&b[at..at + 16]);
    x
}

/// Rounds `x` up to a multiple of 8.
pub(crate) fn align8(x: u64) -> u64 {
    (x + 7) & !7
}

/// The first `N` little-endian u64 words of `b`.
pub(crate) fn words<const N: usize>(b: &[u8]) -> [u64; N] {
    std::array::from_fn(|i| u64_at(b, 8 * i))
}

/// Appends `words` as little-endian u64s.
pub(crate) fn put_words(out: &mut Vec<u8>, words: &[u64]) {
    out.extend(words.iter().flat_map(|w| w.to_le_bytes()));
}
