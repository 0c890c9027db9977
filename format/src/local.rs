//! One framing for granary's node-local files (the tier's content list, `hot.map` and score
//! table, the packer's plan, shard part files, upload markers, writer state) and view files:
//! magic, body version, reserved word, body length, body, CRC-32 of all before it. Layout and
//! the kinds: docs/internals.md, "Node-local files". Files are replaced whole
//! (granary-store's `write` module).

use std::io::{self, Read, Write};

use crate::error::{bail, check_crc, invalid, FormatError, Result};

/// Bytes before the body.
pub const LOCAL_HEADER_LEN: usize = 24;
/// Bytes after the body (its CRC).
pub const LOCAL_TRAILER_LEN: usize = 4;

/// A kind of node-local file: its magic, the body version this build writes and reads, and a
/// name for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalKind {
    pub magic: [u8; 8],
    pub version: u32,
    pub what: &'static str,
}

/// Declares each kind, and [`LOCAL_KINDS`], every kind.
macro_rules! kinds {
    ($($(#[$doc:meta])* $name:ident = ($magic:literal, $version:literal, $what:literal);)+) => {
        $(
            $(#[$doc])*
            pub const $name: LocalKind =
                LocalKind { magic: *$magic, version: $version, what: $what };
        )+
        /// Every kind, for tools that identify a file by its magic.
        pub const LOCAL_KINDS: [LocalKind; [$(stringify!($name)),+].len()] = [$($name),+];
    };
}

kinds! {
    /// The tier's content list (`index`): text lines, see docs/internals.md.
    TIER_INDEX = (b"GRNYTIDX", 2, "tier content list");
    /// The tier's `hot.map`: which samples its hot chunks hold.
    HOT_MAP = (b"GRNYHOTM", 2, "hot chunk map");
    /// A score table (per-sample importance).
    SCORE_TABLE = (b"GRNYSCOR", 2, "score table");
    /// The packer's plan (`pack-plan.bin` in its work directory).
    PACK_PLAN = (b"GRNYPLAN", 5, "pack plan");
    /// A finished shard's part file.
    SHARD_PART = (b"GRNYPART", 4, "part file");
    /// The marker of a chunk uploaded to an object store.
    UPLOAD_MARKER = (b"GRNYSENT", 4, "upload marker");
    /// The state of a dataset writer (`writer.state` in its spill directory).
    WRITER_STATE = (b"GRNYWRST", 1, "writer state");
    /// The field types a dataset writer was told (`field.types` in its spill directory).
    FIELD_TYPES = (b"GRNYTYPS", 1, "writer field types");
    /// A view: a subset of a dataset's samples (`granary view`), pinned to the dataset's id
    /// and generation. Not node-local (it travels with a job's configuration), but framed the
    /// same way.
    VIEW_FILE = (b"GRNYVIEW", 1, "view file");
}

impl LocalKind {
    fn header(&self, body_len: u64) -> [u8; LOCAL_HEADER_LEN] {
        let mut h = [0u8; LOCAL_HEADER_LEN];
        h[0..8].copy_from_slice(&self.magic);
        h[8..12].copy_from_slice(&self.version.to_le_bytes());
        h[16..24].copy_from_slice(&body_len.to_le_bytes());
        h
    }

    /// Checks a header against this kind and a file of `file_len` bytes; returns the body
    /// length.
    fn check_header(&self, h: &[u8; LOCAL_HEADER_LEN], file_len: u64) -> Result<u64> {
        if h[0..8] != self.magic {
            return Err(FormatError::bad_magic(self.what, &self.magic, &h[0..8]));
        }
        let version = crate::le::u32_at(h, 8);
        if version != self.version {
            bail!(
                self.what,
                "version {version}; this granary reads version {}",
                self.version
            );
        }
        if h[12..16] != [0; 4] {
            bail!(self.what, "reserved field is not zero");
        }
        let body_len = crate::le::u64_at(h, 16);
        let framed = body_len.checked_add((LOCAL_HEADER_LEN + LOCAL_TRAILER_LEN) as u64);
        if framed != Some(file_len) {
            bail!(
                self.what,
                "header says a body of {body_len} bytes, but the file has {file_len}"
            );
        }
        Ok(body_len)
    }

    /// `body` framed: header, body, CRC.
    pub fn frame(&self, body: &[u8]) -> Vec<u8> {
        let mut b = Vec::with_capacity(LOCAL_HEADER_LEN + body.len() + LOCAL_TRAILER_LEN);
        b.extend_from_slice(&self.header(body.len() as u64));
        b.extend_from_slice(body);
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// The body of a framed file, after checking magic, version, length and CRC.
    pub fn unframe<'a>(&self, bytes: &'a [u8]) -> Result<&'a [u8]> {
        let need = (LOCAL_HEADER_LEN + LOCAL_TRAILER_LEN) as u64;
        let header: &[u8; LOCAL_HEADER_LEN] = bytes
            .get(..LOCAL_HEADER_LEN)
            .and_then(|h| h.try_into().ok())
            .ok_or_else(|| FormatError::truncated(self.what, need, bytes.len() as u64))?;
        let body_len = self.check_header(header, bytes.len() as u64)? as usize;
        let (covered, crc) = bytes.split_at(LOCAL_HEADER_LEN + body_len);
        check_crc(self.what, crate::le::u32_at(crc, 0), covered)?;
        Ok(&covered[LOCAL_HEADER_LEN..])
    }
}

/// Writes one framed file as a stream whose body length is known up front (a pack plan of
/// millions of files is never encoded in memory). [`LocalWriter::finish`] fails unless exactly
/// that many body bytes were written.
pub struct LocalWriter<W: Write> {
    inner: W,
    crc: crc32fast::Hasher,
    declared: u64,
    written: u64,
    what: &'static str,
}

impl<W: Write> LocalWriter<W> {
    pub fn new(mut inner: W, kind: &LocalKind, body_len: u64) -> io::Result<Self> {
        let h = kind.header(body_len);
        inner.write_all(&h)?;
        let mut crc = crc32fast::Hasher::new();
        crc.update(&h);
        Ok(LocalWriter {
            inner,
            crc,
            declared: body_len,
            written: 0,
            what: kind.what,
        })
    }

    /// Writes the CRC; returns the inner writer (flushed).
    pub fn finish(mut self) -> io::Result<W> {
        if self.written != self.declared {
            return Err(io::Error::other(format!(
                "{}: wrote {} body bytes, declared {}",
                self.what, self.written, self.declared
            )));
        }
        let crc = self.crc.clone().finalize();
        self.inner.write_all(&crc.to_le_bytes())?;
        self.inner.flush()?;
        Ok(self.inner)
    }
}

impl<W: Write> Write for LocalWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Reads the body of one framed file as a stream: the header is checked when it is opened,
/// the CRC by [`LocalReader::finish`], which the caller must reach before trusting anything
/// read. [`LocalReader::left`] says how many body bytes remain, so that no count read from
/// the body is trusted before the bytes it needs are known to be there.
pub struct LocalReader<R: Read> {
    inner: R,
    crc: crc32fast::Hasher,
    left: u64,
    what: &'static str,
}

impl<R: Read> LocalReader<R> {
    /// Opens a framed stream of `file_len` bytes in all.
    pub fn new(mut inner: R, kind: &LocalKind, file_len: u64) -> Result<Self> {
        let mut h = [0u8; LOCAL_HEADER_LEN];
        inner.read_exact(&mut h).map_err(|_| {
            FormatError::truncated(
                kind.what,
                (LOCAL_HEADER_LEN + LOCAL_TRAILER_LEN) as u64,
                file_len,
            )
        })?;
        let left = kind.check_header(&h, file_len)?;
        let mut crc = crc32fast::Hasher::new();
        crc.update(&h);
        Ok(LocalReader {
            inner,
            crc,
            left,
            what: kind.what,
        })
    }

    /// Body bytes not read yet.
    pub fn left(&self) -> u64 {
        self.left
    }

    /// Fills `buf` from the body; an error if the body has fewer bytes left.
    pub fn read_body(&mut self, buf: &mut [u8]) -> Result<()> {
        if buf.len() as u64 > self.left {
            bail!(self.what, "a field runs past the body");
        }
        self.inner
            .read_exact(buf)
            .map_err(|e| invalid!(self.what, "reading: {e}"))?;
        self.crc.update(buf);
        self.left -= buf.len() as u64;
        Ok(())
    }

    /// Checks that the whole body was read and that the CRC matches.
    pub fn finish(mut self) -> Result<()> {
        if self.left != 0 {
            bail!(self.what, "{} bytes after the last field", self.left);
        }
        let mut crc = [0u8; 4];
        self.inner
            .read_exact(&mut crc)
            .map_err(|e| invalid!(self.what, "reading its CRC: {e}"))?;
        let expected = u32::from_le_bytes(crc);
        let actual = self.crc.finalize();
        if expected != actual {
            return Err(FormatError::ChecksumMismatch {
                what: self.what.to_string(),
                expected,
                actual,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_damage_refused() {
        let body = b"next-hot 3\nchunk 1 200 5 0.5\n";
        let b = TIER_INDEX.frame(body);
        assert_eq!(b.len(), 28 + body.len());
        assert_eq!(TIER_INDEX.unframe(&b).unwrap(), body);
        // Another kind's magic, any truncation, any flipped bit.
        assert!(HOT_MAP.unframe(&b).is_err());
        for n in 0..b.len() {
            assert!(TIER_INDEX.unframe(&b[..n]).is_err(), "truncated to {n}");
        }
        for i in 0..b.len() {
            for bit in 0..8 {
                let mut d = b.clone();
                d[i] ^= 1 << bit;
                assert!(TIER_INDEX.unframe(&d).is_err(), "byte {i} bit {bit}");
            }
        }
        let mut extra = b.clone();
        extra.push(0);
        assert!(TIER_INDEX.unframe(&extra).is_err());
    }

    #[test]
    fn a_version_from_another_granary_is_named() {
        let mut b = SCORE_TABLE.frame(b"x");
        b[8] = 1;
        let crc = crc32fast::hash(&b[..b.len() - 4]);
        let n = b.len();
        b[n - 4..].copy_from_slice(&crc.to_le_bytes());
        let e = SCORE_TABLE.unframe(&b).unwrap_err().to_string();
        assert!(e.contains("version 1; this granary reads version 2"), "{e}");
    }

    #[test]
    fn streams_match_the_in_memory_frame() {
        let body: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let mut w = LocalWriter::new(Vec::new(), &PACK_PLAN, body.len() as u64).unwrap();
        w.write_all(&body[..3000]).unwrap();
        w.write_all(&body[3000..]).unwrap();
        let b = w.finish().unwrap();
        assert_eq!(b, PACK_PLAN.frame(&body));
        let mut r = LocalReader::new(&b[..], &PACK_PLAN, b.len() as u64).unwrap();
        let mut got = vec![0u8; body.len()];
        r.read_body(&mut got[..10]).unwrap();
        assert_eq!(r.left(), body.len() as u64 - 10);
        r.read_body(&mut got[10..]).unwrap();
        assert!(r.read_body(&mut [0u8; 1]).is_err());
        r.finish().unwrap();
        assert_eq!(got, body);
        // A writer that writes less than it declared fails instead of framing a lie.
        let mut w = LocalWriter::new(Vec::new(), &PACK_PLAN, 5).unwrap();
        w.write_all(b"1234").unwrap();
        assert!(w.finish().is_err());
        // A stream with a flipped body byte fails at finish.
        let mut d = b.clone();
        d[100] ^= 1;
        let mut r = LocalReader::new(&d[..], &PACK_PLAN, d.len() as u64).unwrap();
        r.read_body(&mut got).unwrap();
        assert!(r.finish().is_err());
    }
}
