//! Reading one source file and encoding it as a record.

use std::cell::RefCell;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use granary_format::Compression;

/// How records are compressed. As data it is its name (`auto`, `none`, `zstd:LEVEL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompressMode {
    /// zstd where it saves at least 10 %; already-compressed formats (JPEG, PNG, ...) are
    /// recognised by their magic bytes and stored raw without trying.
    Auto,
    /// zstd at the given level for every record, except where it would not shrink it at all.
    Zstd(i32),
    /// Store every record raw.
    None,
}

impl CompressMode {
    /// Parses `auto`, `none`, `zstd` or `zstd:LEVEL`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(CompressMode::Auto),
            "none" => Ok(CompressMode::None),
            "zstd" => Ok(CompressMode::Zstd(DEFAULT_LEVEL)),
            _ => {
                let level = s
                    .strip_prefix("zstd:")
                    .and_then(|l| l.parse::<i32>().ok())
                    .filter(|l| zstd::compression_level_range().contains(l))
                    .ok_or_else(|| {
                        format!(
                            "unknown compression {s:?}: use auto, none, zstd or zstd:LEVEL \
                             (LEVEL in {:?})",
                            zstd::compression_level_range()
                        )
                    })?;
                Ok(CompressMode::Zstd(level))
            }
        }
    }
}

impl serde::Serialize for CompressMode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for CompressMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        CompressMode::parse(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl std::fmt::Display for CompressMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CompressMode::Auto => write!(f, "auto"),
            CompressMode::None => write!(f, "none"),
            CompressMode::Zstd(l) => write!(f, "zstd:{l}"),
        }
    }
}

/// zstd level used by `auto` and plain `zstd`.
pub const DEFAULT_LEVEL: i32 = 3;
/// Records smaller than this are never compressed (the frame overhead eats the gain).
const MIN_COMPRESS_LEN: usize = 64;

/// True when `data` starts like a format that is already compressed.
pub fn looks_compressed(data: &[u8]) -> bool {
    const MAGICS: &[&[u8]] = &[
        b"\xFF\xD8\xFF",         // JPEG
        b"\x89PNG\r\n\x1a\n",    // PNG
        b"GIF87a",               // GIF
        b"GIF89a",               // GIF
        b"\x28\xB5\x2F\xFD",     // zstd
        b"\x1F\x8B",             // gzip
        b"PK\x03\x04",           // zip, npz, docx
        b"\xFD7zXZ\x00",         // xz
        b"BZh",                  // bzip2
        b"7z\xBC\xAF\x27\x1C",   // 7z
        b"\x1A\x45\xDF\xA3",     // webm / mkv
        b"fLaC",                 // flac
        b"OggS",                 // ogg
        b"ID3",                  // mp3
        b"\x00\x00\x00\x0CjP  ", // JPEG 2000
        b"\xFF\x0A",             // JPEG XL
        b"\x04\x22\x4D\x18",     // lz4
    ];
    if MAGICS.iter().any(|m| data.starts_with(m)) {
        return true;
    }
    // RIFF containers (WebP, AVI, WAV is not compressed but rarely matters) and ISO media (mp4,
    // heic, avif): the brand sits at bytes 4..8 or 8..12.
    (data.len() >= 12 && &data[0..4] == b"RIFF" && &data[8..12] == b"WEBP")
        || (data.len() >= 8 && &data[4..8] == b"ftyp")
}

thread_local! {
    static COMPRESSOR: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { RefCell::new(None) };
}

fn compress(data: &[u8], level: i32) -> std::io::Result<Vec<u8>> {
    COMPRESSOR.with(|c| {
        let mut c = c.borrow_mut();
        if c.as_ref().is_none_or(|(l, _)| *l != level) {
            let mut z = zstd::bulk::Compressor::new(level)?;
            z.include_contentsize(true)?;
            z.include_checksum(false)?;
            *c = Some((level, z));
        }
        c.as_mut().expect("just set").1.compress(data)
    })
}

/// A source file encoded as a record, ready for the chunk writer.
pub(crate) struct Encoded {
    pub stored: Vec<u8>,
    pub compression: Compression,
    pub orig_len: u64,
    pub crc32: u32,
}

/// What encoding a record's bytes found: the CRC-32 of the original and, where compression
/// pays, the compressed bytes (otherwise the record is stored as it is, from wherever the
/// original is kept).
pub(crate) struct Encoding {
    pub crc32: u32,
    pub compressed: Option<Vec<u8>>,
}

/// Reads `path` into `buf`, which is exactly as long as the scan saw the file.
/// `expected_mtime_ns` is what the scan saw too: a file whose size or mtime differs now, or
/// changes while it is read, is an error (the dataset would silently differ from the source
/// otherwise). `buf` is the caller's, so that one allocation serves many files (a pack reads
/// a chunk's files into one buffer, reused for later chunks).
pub(crate) fn read_into(path: &Path, expected_mtime_ns: i64, buf: &mut [u8]) -> Result<(), String> {
    let expected_size = buf.len() as u64;
    let mut f = std::fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let before = f.metadata().map_err(|e| format!("cannot stat: {e}"))?;
    if before.len() != expected_size {
        return Err(format!(
            "size changed since the scan ({expected_size} bytes then, {} now)",
            before.len()
        ));
    }
    if crate::scan::mtime_ns(&before) != expected_mtime_ns {
        return Err("modified since the scan (its mtime changed)".into());
    }
    let mut read = 0usize;
    // Until the buffer is full, then one byte more: a file that grew shows it.
    let mut probe = [0u8; 1];
    loop {
        let into = match buf.get_mut(read..).filter(|b| !b.is_empty()) {
            Some(rest) => rest,
            None => &mut probe[..],
        };
        match f.read(into) {
            Ok(0) => break,
            Ok(n) => read += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("read error: {e}")),
        }
        if read > buf.len() {
            break;
        }
    }
    let after = f.metadata().map_err(|e| format!("cannot stat: {e}"))?;
    if read != buf.len()
        || after.len() != before.len()
        || after.mtime() != before.mtime()
        || after.mtime_nsec() != before.mtime_nsec()
    {
        let read = match read > buf.len() {
            true => "more".to_string(),
            false => read.to_string(),
        };
        return Err(format!(
            "changed while being read (expected {expected_size} bytes, read {read})",
        ));
    }
    Ok(())
}

/// Encodes the bytes of one record where they are: their CRC-32, and the compressed bytes if
/// `mode` compresses them.
pub(crate) fn encode_in_place(data: &[u8], mode: CompressMode) -> Result<Encoding, String> {
    let crc32 = crc32fast::hash(data);
    let orig_len = data.len() as u64;
    let level = match mode {
        CompressMode::None => None,
        CompressMode::Zstd(l) => Some(l),
        CompressMode::Auto if looks_compressed(data) => None,
        CompressMode::Auto => Some(DEFAULT_LEVEL),
    };
    let mut compressed = None;
    if let Some(level) = level.filter(|_| data.len() >= MIN_COMPRESS_LEN) {
        let z = compress(data, level).map_err(|e| format!("zstd failed: {e}"))?;
        // auto keeps zstd only where it saves at least 10 %; explicit zstd wherever it helps.
        let keep = match mode {
            CompressMode::Auto => z.len() as u64 * 10 <= orig_len * 9,
            _ => (z.len() as u64) < orig_len,
        };
        compressed = keep.then_some(z);
    }
    Ok(Encoding { crc32, compressed })
}

/// Encodes the bytes of one record (CRC-32 of the original, compressed as `mode` says).
pub(crate) fn encode_bytes(data: Vec<u8>, mode: CompressMode) -> Result<Encoded, String> {
    let e = encode_in_place(&data, mode)?;
    let orig_len = data.len() as u64;
    let (stored, compression) = match e.compressed {
        Some(z) => (z, Compression::Zstd),
        None => (data, Compression::None),
    };
    Ok(Encoded {
        stored,
        compression,
        orig_len,
        crc32: e.crc32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_modes() {
        assert_eq!(CompressMode::parse("auto"), Ok(CompressMode::Auto));
        assert_eq!(CompressMode::parse("zstd"), Ok(CompressMode::Zstd(3)));
        assert_eq!(CompressMode::parse("zstd:19"), Ok(CompressMode::Zstd(19)));
        assert!(CompressMode::parse("zstd:999").is_err());
        assert!(CompressMode::parse("gzip").is_err());
    }

    fn mtime(p: &Path) -> i64 {
        crate::scan::mtime_ns(&std::fs::metadata(p).unwrap())
    }

    /// What a pack does with one file: read it into a buffer of the scan's size, encode it.
    fn read_and_encode(p: &Path, size: u64, t: i64, mode: CompressMode) -> Result<Encoded, String> {
        let mut buf = vec![0u8; size as usize];
        read_into(p, t, &mut buf)?;
        encode_bytes(buf, mode)
    }

    #[test]
    fn changed_or_vanished_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"hello world").unwrap();
        let t = mtime(&p);
        let e = read_and_encode(&p, 11, t, CompressMode::Auto).unwrap();
        assert_eq!((e.orig_len, e.compression), (11, Compression::None));
        let err = read_and_encode(&p, 5, t, CompressMode::Auto).err().unwrap();
        assert!(err.contains("size changed since the scan"), "{err}");
        let err = read_and_encode(&p, 11, t - 1, CompressMode::Auto)
            .err()
            .unwrap();
        assert!(err.contains("modified since the scan"), "{err}");
        std::fs::remove_file(&p).unwrap();
        let err = read_and_encode(&p, 11, t, CompressMode::Auto)
            .err()
            .unwrap();
        assert!(err.contains("cannot open"), "{err}");
    }

    #[test]
    fn auto_keeps_zstd_only_where_it_pays() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, "abc ".repeat(1000)).unwrap();
        let e = read_and_encode(&p, 4000, mtime(&p), CompressMode::Auto).unwrap();
        assert_eq!(e.compression, Compression::Zstd);
        assert!(e.stored.len() < 400);
        let jpeg = [&b"\xFF\xD8\xFF\xE0"[..], &[0u8; 4000]].concat();
        std::fs::write(&p, &jpeg).unwrap();
        let e = read_and_encode(&p, 4004, mtime(&p), CompressMode::Auto).unwrap();
        assert_eq!(
            e.compression,
            Compression::None,
            "JPEG is stored raw without trying"
        );
        let e = read_and_encode(&p, 4004, mtime(&p), CompressMode::Zstd(3)).unwrap();
        assert_eq!(e.compression, Compression::Zstd);
        let e = read_and_encode(&p, 4004, mtime(&p), CompressMode::None).unwrap();
        assert_eq!(e.compression, Compression::None);
    }

    #[test]
    fn magic_sniffing() {
        assert!(looks_compressed(b"\xFF\xD8\xFF\xE0rest"));
        assert!(looks_compressed(b"\x89PNG\r\n\x1a\nIHDR"));
        assert!(looks_compressed(b"RIFF\0\0\0\0WEBPVP8 "));
        assert!(!looks_compressed(b"hello world"));
    }
}
