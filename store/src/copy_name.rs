//! How a chunk copy is named where the store keeps and serves it: by the chunk's id and
//! digest, so that a copy is found, and asked of a peer, only for the chunk with those bytes.
//! Shared by the tier, which keeps copies, and the peers, which ask for and serve them.

/// File name of the copy of chunk `id` with digest `digest` in a tier directory (and the name
/// a peer asks for it by): `chunk-NNNNNNNN-<32 hex digits>.gchunk`.
pub fn copy_file_name(id: u32, digest: &[u8; 16]) -> String {
    format!("chunk-{id:08}-{}.gchunk", granary_format::hex16(digest))
}

/// The chunk id and digest a tier copy's file name spells, exactly as [`copy_file_name`] does.
pub fn parse_copy_file_name(name: &str) -> Option<(u32, [u8; 16])> {
    let (id, digest) = name
        .strip_prefix("chunk-")?
        .strip_suffix(".gchunk")?
        .split_once('-')?;
    let id: u32 = id.parse().ok()?;
    let digest = digest.parse::<granary_format::DatasetId>().ok()?.0;
    (copy_file_name(id, &digest) == name).then_some((id, digest))
}
