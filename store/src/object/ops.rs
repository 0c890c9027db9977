//! Reads, listings, deletes and single PUTs of objects under a prefix.

use std::ops::Range;

use futures_util::stream::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::{GetOptions, ObjectStore, ObjectStoreExt, PutPayload};

use super::errors::remote_error;
use super::ObjectUrl;
use crate::error::{Result, StoreError};

/// What [`ObjectUrl::get_into`] found.
pub(crate) enum Sized {
    /// All of it, with this digest (the first 16 bytes of SHA-256, as a chunk's).
    Got([u8; 16]),
    Missing,
    /// Another length than asked for (the body is not read).
    Wrong(u64),
}
impl ObjectUrl {
    /// Bytes `range` of object `name`; exactly that many, or an error naming the object.
    pub fn get_range(&self, name: &str, range: Range<u64>) -> Result<bytes::Bytes> {
        let client = self.client()?;
        let (key, url) = (self.key(name), self.object_url(name));
        self.run("reading", &url, fetch_range(&*client, &key, &url, range))?
    }

    /// The whole of object `name`.
    pub fn get(&self, name: &str) -> Result<bytes::Bytes> {
        let client = self.client()?;
        let (key, url) = (self.key(name), self.object_url(name));
        self.run("reading", &url, async {
            client.get(&key).await?.bytes().await
        })?
        .map_err(|e| remote_error("reading", &url, e))
    }

    /// Object `name`, if it is `size` bytes long, streamed into `parts` one after another (no
    /// second copy in memory; they must hold `size` bytes together): its length is checked
    /// before its body is read, so that a peer announcing another size costs nothing. Returns
    /// the digest of what was written (SHA-256's first 16 bytes: a chunk's identity).
    pub(crate) fn get_into(&self, name: &str, size: u64, parts: &mut [&mut [u8]]) -> Result<Sized> {
        let client = self.client()?;
        let key = self.key(name);
        let url = self.object_url(name);
        self.run("reading", &url, async {
            let res = match client.get(&key).await {
                Ok(r) => r,
                Err(object_store::Error::NotFound { .. }) => return Ok(Sized::Missing),
                Err(e) => return Err(remote_error("reading", &url, e)),
            };
            if res.meta.size != size {
                return Ok(Sized::Wrong(res.meta.size));
            }
            let mut digest = granary_format::ContentDigest::new();
            let (mut part, mut at, mut total) = (0usize, 0usize, 0u64);
            let mut body = res.into_stream();
            while let Some(got) = body.next().await {
                let got = got.map_err(|e| remote_error("reading", &url, e))?;
                total += got.len() as u64;
                if total > size {
                    return Ok(Sized::Wrong(total));
                }
                digest.update(&got);
                let mut rest: &[u8] = &got;
                while !rest.is_empty() {
                    let dst = &mut parts[part][at..];
                    let n = dst.len().min(rest.len());
                    dst[..n].copy_from_slice(&rest[..n]);
                    rest = &rest[n..];
                    at += n;
                    if at == parts[part].len() {
                        (part, at) = (part + 1, 0);
                    }
                }
            }
            Ok(if total == size {
                Sized::Got(digest.finish())
            } else {
                Sized::Wrong(total)
            })
        })?
    }

    /// Size of object `name`, `None` if there is none.
    pub fn size(&self, name: &str) -> Result<Option<u64>> {
        let client = self.client()?;
        let (key, url) = (self.key(name), self.object_url(name));
        match self.run("inspecting", &url, async { client.head(&key).await })? {
            Ok(m) => Ok(Some(m.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(remote_error("inspecting", &url, e)),
        }
    }

    /// When object `name` was last written (its store's Last-Modified).
    pub fn modified(&self, name: &str) -> Result<std::time::SystemTime> {
        let client = self.client()?;
        let (key, url) = (self.key(name), self.object_url(name));
        match self.run("inspecting", &url, async { client.head(&key).await })? {
            Ok(m) => Ok(std::time::SystemTime::from(m.last_modified)),
            Err(e) => Err(remote_error("inspecting", &url, e)),
        }
    }

    /// Names and sizes of the objects directly under the prefix.
    pub fn list(&self) -> Result<Vec<(String, u64)>> {
        let client = self.client()?;
        let prefix = (!self.prefix.as_ref().is_empty()).then(|| self.prefix.clone());
        let listed = self
            .run("listing", &self.url, async {
                client.list_with_delimiter(prefix.as_ref()).await
            })?
            .map_err(|e| remote_error("listing", &self.url, e))?;
        Ok(listed
            .objects
            .into_iter()
            .filter_map(|m| Some((m.location.filename()?.to_string(), m.size)))
            .collect())
    }

    /// Deletes object `name` (absent is fine).
    pub fn delete(&self, name: &str) -> Result<()> {
        let client = self.client()?;
        let (key, url) = (self.key(name), self.object_url(name));
        match self.run("deleting", &url, async { client.delete(&key).await })? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(remote_error("deleting", &url, e)),
        }
    }

    /// Stores `data` as object `name` with one PUT (it appears whole or not at all).
    pub fn put_bytes(&self, name: &str, data: Vec<u8>) -> Result<()> {
        let client = self.client()?;
        let (key, url) = (self.key(name), self.object_url(name));
        self.run("uploading", &url, async {
            client.put(&key, PutPayload::from(data)).await
        })?
        .map(|_| ())
        .map_err(|e| remote_error("uploading", &url, e))
    }
}

/// Bytes `range` of the object at `key` (`url` for errors): exactly that many.
pub(super) async fn fetch_range(
    client: &dyn ObjectStore,
    key: &ObjPath,
    url: &str,
    range: Range<u64>,
) -> Result<bytes::Bytes> {
    let mut got = vec![0u8; (range.end - range.start) as usize];
    fetch_range_into(client, key, url, range, None, &mut got).await?;
    Ok(got.into())
}

/// Bytes `range` of the object at `key` (`url` for errors) straight into `dst` (`range`'s
/// length), and with `object_size`, from an object of that size (the response names the
/// object's whole size, so one truncated or replaced since the snapshot was written shows
/// whichever part is read). The body's pieces are copied there as they arrive, while they are
/// still in the CPU's cache, instead of being gathered into a new buffer first.
pub(super) async fn fetch_range_into(
    client: &dyn ObjectStore,
    key: &ObjPath,
    url: &str,
    range: Range<u64>,
    object_size: Option<u64>,
    dst: &mut [u8],
) -> Result<()> {
    let opts = GetOptions::default().with_range(Some(range.clone()));
    let res = client
        .get_opts(key, opts)
        .await
        .map_err(|e| remote_error("reading", url, e))?;
    if let Some(len) = object_size.filter(|&l| l != res.meta.size) {
        return Err(StoreError::damaged(
            url,
            format!(
                "object is {} bytes, the snapshot says {len} (truncated or replaced since the \
                 dataset was written)",
                res.meta.size
            ),
        ));
    }
    let want = dst.len();
    let mut body = res.into_stream();
    let mut at = 0usize;
    while let Some(piece) = body.next().await {
        let piece = piece.map_err(|e| remote_error("reading", url, e))?;
        let end = at + piece.len();
        if end > want {
            return Err(StoreError::damaged(
                url,
                format!(
                    "answered more than the {want} bytes asked for at offset {}",
                    range.start
                ),
            ));
        }
        dst[at..end].copy_from_slice(&piece);
        at = end;
    }
    if at != want {
        let detail = format!(
            "object ends early: asked for {want} bytes at offset {}, got {at} (truncated or \
             replaced since the snapshot was written)",
            range.start
        );
        return Err(StoreError::damaged(url, detail));
    }
    Ok(())
}
