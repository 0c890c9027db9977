//! Importing WebDataset tar shards: each run of consecutive tar members that share a key (the
//! member's path up to the first dot of its last component) is one sample, its members the
//! sample's fields by extension (`000123.jpg`, `000123.txt`, `000123.cls`, as WebDataset groups
//! them). The label comes from the `.cls` field when there is one (an integer, or a class name);
//! `cls` stays a field too, so extracting the dataset gives back the files the tars held.
//! Shards are read in the order given, from local files or object store URLs (read in 16 MiB
//! ranged GETs), and written through the [`Writer`] (which mixes samples across chunks and can
//! resume).

use std::io::Read;
use std::path::Path;

use granary_store::object::ObjectUrl;
use granary_store::{Location, StoreConfig};

use crate::writer::{Label, Writer, WriterOptions, Written};
use crate::{IoAt, PackError, PackSummary};

/// Bytes one ranged GET of a remote shard fetches.
const REMOTE_BLOCK: u64 = 16 << 20;

/// Expands WebDataset's brace notation: `shard-{000000..000123}.tar` (a zero-padded numeric
/// range, inclusive) and `{a,b,c}` (alternatives), any number of them in one pattern.
pub fn expand_braces(pattern: &str) -> Result<Vec<String>, String> {
    let Some(open) = pattern.find('{') else {
        return Ok(vec![pattern.to_string()]);
    };
    let close = pattern[open..]
        .find('}')
        .map(|i| open + i)
        .ok_or_else(|| format!("{pattern}: '{{' without '}}'"))?;
    let (head, body, tail) = (
        &pattern[..open],
        &pattern[open + 1..close],
        &pattern[close + 1..],
    );
    let items: Vec<String> = if let Some((a, b)) = body.split_once("..") {
        let (lo, hi): (u64, u64) = match (a.parse(), b.parse()) {
            (Ok(lo), Ok(hi)) if lo <= hi => (lo, hi),
            _ => {
                return Err(format!(
                    "{pattern}: {{{body}}} is not a range LOW..HIGH of numbers"
                ))
            }
        };
        if hi - lo >= 10_000_000 {
            return Err(format!("{pattern}: {{{body}}} names too many shards"));
        }
        // Zero-padded as LOW is (a width of 1 pads nothing).
        let width = if a.starts_with('0') { a.len() } else { 0 };
        (lo..=hi).map(|n| format!("{n:0width$}")).collect()
    } else if body.contains(',') {
        body.split(',').map(str::to_string).collect()
    } else {
        return Err(format!(
            "{pattern}: {{{body}}} is neither a range nor a list"
        ));
    };
    let mut out = Vec::new();
    for item in items {
        for rest in expand_braces(tail)? {
            out.push(format!("{head}{item}{rest}"));
        }
    }
    Ok(out)
}

/// A remote object read front to back with ranged GETs.
struct RemoteReader {
    dir: ObjectUrl,
    name: String,
    size: u64,
    pos: u64,
    buf: bytes::Bytes,
}

impl Read for RemoteReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.buf.is_empty() {
            if self.pos >= self.size {
                return Ok(0);
            }
            let end = (self.pos + REMOTE_BLOCK).min(self.size);
            self.buf = self
                .dir
                .get_range(&self.name, self.pos..end)
                .map_err(std::io::Error::other)?;
            if self.buf.is_empty() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("{} ended at byte {} of {}", self.name, self.pos, self.size),
                ));
            }
            self.pos += self.buf.len() as u64;
        }
        let n = out.len().min(self.buf.len());
        out[..n].copy_from_slice(&self.buf[..n]);
        self.buf = self.buf.slice(n..);
        Ok(n)
    }
}

/// Opens shard `src` (a path or an object store URL, its client configured by `cfg`) for
/// reading.
fn open_shard(src: &str, cfg: &StoreConfig) -> Result<Box<dyn Read>, PackError> {
    if let Location::Object(u) = granary_store::open(Path::new(src), cfg)? {
        let (dir, name) = u
            .as_object()
            .ok_or_else(|| usage!("{src}: not a URL of an object"))?;
        let size = dir
            .size(&name)
            .map_err(PackError::Destination)?
            .ok_or_else(|| usage!("{src}: no such object"))?;
        return Ok(Box::new(RemoteReader {
            dir,
            name,
            size,
            pos: 0,
            buf: bytes::Bytes::new(),
        }));
    }
    let f = std::fs::File::open(src).at("opening", Path::new(src))?;
    Ok(Box::new(std::io::BufReader::with_capacity(4 << 20, f)))
}

/// The key and field name of a tar member's path (`dir/000123.seg.png` -> `dir/000123`,
/// `seg.png`), without a leading `./`.
fn split_member(path: &[u8]) -> Option<(&[u8], &[u8])> {
    let path = path.strip_prefix(b"./").unwrap_or(path);
    granary_format::split_field_path(path)
}

/// What an import did, besides the writer's summary.
#[derive(Debug, Default)]
pub struct ImportCounts {
    pub shards: u64,
    pub members: u64,
}

/// A sample being gathered from consecutive members.
struct Pending {
    key: Vec<u8>,
    fields: Vec<(Vec<u8>, Vec<u8>)>,
    /// Where it came from, for messages.
    shard: String,
}

/// The label a sample's `cls` field (`v`) gives: an integer, or else a class name.
fn label_of(cls: Option<&[u8]>) -> Label<'_> {
    match cls {
        None => Label::None,
        Some(v) => {
            let t = v.trim_ascii();
            if t.is_empty() {
                return Label::None;
            }
            if !t.iter().all(u8::is_ascii_digit) {
                return Label::Name(t);
            }
            // ASCII digits (leading zeros allowed, no sign) are a class index; one too large
            // (saturated here) is refused by the writer, never taken for a class name.
            let i = std::str::from_utf8(t)
                .ok()
                .and_then(|s| s.parse::<u32>().ok())
                .unwrap_or(u32::MAX);
            Label::Index(i)
        }
    }
}

/// The codec of a field whose extension (what follows its last `.`) names an image format,
/// as WebDataset's decoders read it: the field is then typed `image:CODEC` (its bytes are
/// stored as they are; readers decode them only on request). Other fields stay `bytes`: a
/// `txt` or `json` member is not checked to be UTF-8 or JSON, so it is not typed as such.
fn image_codec(field: &[u8]) -> Option<&'static str> {
    let ext = field.rsplit(|&b| b == b'.').next()?;
    Some(match ext.to_ascii_lowercase().as_slice() {
        b"jpg" | b"jpeg" => "jpeg",
        b"png" => "png",
        b"webp" => "webp",
        b"gif" => "gif",
        b"bmp" => "bmp",
        b"tif" | b"tiff" => "tiff",
        _ => return None,
    })
}

fn flush(w: &mut Writer, p: Option<Pending>) -> Result<(), PackError> {
    let Some(Pending { key, fields, shard }) = p else {
        return Ok(());
    };
    // The label borrows from the fields, which the writer takes: a copy of the `cls` field.
    let cls = fields
        .iter()
        .find(|(n, _)| n == b"cls")
        .map(|(_, v)| v.clone());
    let label = label_of(cls.as_deref());
    let shown = String::from_utf8_lossy(&key).into_owned();
    for (name, _) in &fields {
        if let Some(codec) = image_codec(name) {
            w.declare_field_type(name, &format!("image:{codec}"))?;
        }
    }
    match w.write_fields(&key, fields, label) {
        Ok(Written::New | Written::Resumed) => Ok(()),
        Err(PackError::Usage(m)) => Err(usage!("{shard}: sample {shown:?}: {m}")),
        Err(e) => Err(e),
    }
}

/// Imports the WebDataset shards `sources` (brace patterns allowed) into a dataset written
/// with `opts`. `progress` is told each shard as it starts.
pub fn import_webdataset(
    sources: &[String],
    opts: WriterOptions,
    progress: &dyn Fn(usize, usize, &str),
) -> Result<(PackSummary, ImportCounts), PackError> {
    let mut shards = Vec::new();
    for s in sources {
        shards.extend(expand_braces(s).map_err(PackError::Usage)?);
    }
    if shards.is_empty() {
        return Err(usage!("no shards to import"));
    }
    let store = opts.store.clone();
    let mut w = Writer::create(opts)?;
    let mut counts = ImportCounts::default();
    for (i, shard) in shards.iter().enumerate() {
        progress(i, shards.len(), shard);
        read_shard(&mut w, shard, &store, &mut counts)?;
        counts.shards += 1;
    }
    let summary = w.finish()?;
    Ok((summary, counts))
}

/// Reads one tar shard into the writer.
fn read_shard(
    w: &mut Writer,
    shard: &str,
    store: &StoreConfig,
    counts: &mut ImportCounts,
) -> Result<(), PackError> {
    let bad = |detail: String| PackError::Source {
        path: shard.into(),
        detail,
    };
    let mut archive = tar::Archive::new(open_shard(shard, store)?);
    let entries = archive
        .entries()
        .map_err(|e| bad(format!("not a tar archive: {e}")))?;
    let mut pending: Option<Pending> = None;
    for entry in entries {
        let mut entry = entry.map_err(|e| bad(format!("damaged or cut short: {e}")))?;
        let path = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&path).into_owned();
        let kind = entry.header().entry_type();
        if kind.is_dir() {
            continue;
        }
        if !(kind.is_file() || kind.is_contiguous()) {
            return Err(bad(format!(
                "member {shown:?} is not a regular file ({kind:?}); a WebDataset shard holds files only"
            )));
        }
        let Some((key, name)) = split_member(&path) else {
            return Err(bad(format!(
                "member {shown:?} has no extension: WebDataset names members KEY.FIELD"
            )));
        };
        let size = entry.size();
        let mut data = Vec::new();
        data.try_reserve_exact(size as usize)
            .map_err(|_| bad(format!("member {shown:?} of {size} bytes cannot be held")))?;
        entry
            .read_to_end(&mut data)
            .map_err(|e| bad(format!("member {shown:?} is cut short: {e}")))?;
        if data.len() as u64 != size {
            return Err(bad(format!(
                "member {shown:?} is cut short ({} of {size} bytes)",
                data.len()
            )));
        }
        counts.members += 1;
        if pending.as_ref().is_some_and(|p| p.key != key) {
            flush(w, pending.take())?;
        }
        let p = pending.get_or_insert_with(|| Pending {
            key: key.to_vec(),
            fields: Vec::new(),
            shard: shard.to_string(),
        });
        if p.fields.iter().any(|(n, _)| n == name) {
            return Err(bad(format!(
                "member {shown:?}: sample {:?} has field {:?} twice",
                String::from_utf8_lossy(key),
                String::from_utf8_lossy(name)
            )));
        }
        p.fields.push((name.to_vec(), data));
    }
    flush(w, pending)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn braces_expand_like_webdataset() {
        assert_eq!(expand_braces("a.tar").unwrap(), vec!["a.tar"]);
        assert_eq!(
            expand_braces("s/{000008..000011}.tar").unwrap(),
            vec![
                "s/000008.tar",
                "s/000009.tar",
                "s/000010.tar",
                "s/000011.tar"
            ]
        );
        assert_eq!(
            expand_braces("{a,b}-{1..2}").unwrap(),
            vec!["a-1", "a-2", "b-1", "b-2"]
        );
        assert!(expand_braces("{3..1}").is_err());
        assert!(expand_braces("{x}").is_err());
        assert!(expand_braces("{1..2").is_err());
    }

    #[test]
    fn image_members_are_typed_by_extension() {
        assert_eq!(image_codec(b"jpg"), Some("jpeg"));
        assert_eq!(image_codec(b"seg.PNG"), Some("png"));
        assert_eq!(image_codec(b"left.webp"), Some("webp"));
        assert_eq!(image_codec(b"json"), None);
        assert_eq!(image_codec(b"jpg.txt"), None);
    }

    #[test]
    fn members_split_into_key_and_field() {
        assert_eq!(
            split_member(b"./a/000.seg.png"),
            Some((&b"a/000"[..], &b"seg.png"[..]))
        );
        assert_eq!(
            split_member(b"d.v1/x.jpg"),
            Some((&b"d.v1/x"[..], &b"jpg"[..]))
        );
        assert_eq!(split_member(b"noext"), None);
        assert_eq!(label_of(Some(b" 7\n")), Label::Index(7));
        assert_eq!(label_of(Some(b"dog")), Label::Name(b"dog"));
        assert_eq!(label_of(None), Label::None);
        // Digits only are an index (leading zeros too); a sign makes a name; a number past
        // u32 saturates, for the writer to refuse.
        for (v, want) in [
            (&b"007\n"[..], Label::Index(7)),
            (b"+7", Label::Name(b"+7")),
            (b"-1", Label::Name(b"-1")),
            (b"4000000000", Label::Index(4_000_000_000)),
            (b"99999999999999999999999", Label::Index(u32::MAX)),
            (b" \t\n", Label::None),
        ] {
            assert_eq!(label_of(Some(v)), want, "{v:?}");
        }
    }
}
