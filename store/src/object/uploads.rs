//! Uploads: multipart uploads registered so that an interruption can abort them, and the
//! listing of uploads left open on the server.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt, TryStreamExt};
use object_store::multipart::MultipartStore;
use object_store::path::Path as ObjPath;
use object_store::PutPayload;

use super::block_on;
use super::errors::remote_error;
use super::url::Multipart;
use super::{ObjectUrl, PUTS_IN_FLIGHT, PUT_PART};
use crate::error::{RemoteKind, Result, StoreError};

/// A multipart upload in progress, which [`abort_open_uploads`] can abort from any thread.
struct OpenUpload {
    store: Arc<dyn Multipart>,
    key: ObjPath,
    id: String,
    url: String,
}

/// This process's multipart uploads in progress; `closed` once they were aborted for an
/// interruption (no new one starts after that); `starting` counts the uploads whose start
/// request is on its way (the server may list them before this process learns their ids).
struct Uploads {
    closed: bool,
    starting: usize,
    open: Vec<OpenUpload>,
}

static UPLOADS: Mutex<Uploads> = Mutex::new(Uploads {
    closed: false,
    starting: 0,
    open: Vec::new(),
});

/// Signalled when an upload's start request returns.
static STARTED: std::sync::Condvar = std::sync::Condvar::new();

/// How long an interruption waits for start requests on their way, so that it can abort the
/// uploads they open.
const START_WAIT: Duration = Duration::from_secs(30);

fn uploads() -> std::sync::MutexGuard<'static, Uploads> {
    UPLOADS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Aborts every multipart upload this process has in progress (for a pack interrupted by a
/// signal, before it exits), and refuses new ones from then on. Start requests on their way
/// are waited for (up to 30 s) so that the uploads they open are aborted too. Returns the URL
/// of each upload and whether its abort succeeded (the server then drops its parts).
pub fn abort_open_uploads() -> Vec<(String, Result<()>)> {
    let (open, unknown) = {
        let mut u = uploads();
        u.closed = true;
        let t0 = Instant::now();
        while u.starting > 0 && t0.elapsed() < START_WAIT {
            u = STARTED
                .wait_timeout(u, START_WAIT.saturating_sub(t0.elapsed()))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        (std::mem::take(&mut u.open), u.starting)
    };
    let mut done: Vec<(String, Result<()>)> = open
        .into_iter()
        .map(|o| {
            let r =
                block_on(async { o.store.abort_multipart(&o.key, &o.id).await }).and_then(|r| {
                    r.or_else(|e| match e {
                        object_store::Error::NotFound { .. } => Ok(()),
                        e => Err(remote_error("aborting the upload of", &o.url, e)),
                    })
                });
            (o.url, r)
        })
        .collect();
    if unknown > 0 {
        done.push((
            format!("{unknown} upload(s) being started"),
            Err(StoreError::Invalid(format!(
                "no answer to their start request within {}s: any upload they opened stays \
                 open until --resume aborts it",
                START_WAIT.as_secs()
            ))),
        ));
    }
    done
}

/// What listing the open uploads is called in errors.
const LISTING: &str = "listing the open uploads of";

/// An upload left open on the server: its object's name under the prefix, and its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenUploadInfo {
    pub name: String,
    pub id: String,
}

impl ObjectUrl {
    /// The multipart uploads open on the server under the prefix (S3's ListMultipartUploads:
    /// an interrupted pack's, or anyone's); `None` for stores other than S3, which granary
    /// does not list.
    pub fn open_uploads(&self) -> Result<Option<Vec<OpenUploadInfo>>> {
        let Some(s3) = self.clients()?.s3 else {
            return Ok(None);
        };
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let region = env("AWS_REGION")
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| "us-east-1".into());
        let endpoint = env("AWS_ENDPOINT_URL")
            .or_else(|| env("AWS_ENDPOINT"))
            .unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"));
        let endpoint = endpoint.trim_end_matches('/');
        let bucket = self.url.split('/').nth(2).unwrap_or_default();
        let prefix = match self.prefix.as_ref() {
            "" => String::new(),
            p => format!("{p}/"),
        };
        let unsigned = env("AWS_SKIP_SIGNATURE").is_some_and(|v| v == "true" || v == "1");
        let options = object_store::ClientOptions::new()
            .with_allow_http(endpoint.starts_with("http://"))
            .with_connect_timeout(self.timeouts.connect)
            .with_read_timeout(self.timeouts.request);
        use object_store::client::HttpConnector;
        let listing = |e| remote_error(LISTING, &self.url, e);
        let http = object_store::client::ReqwestConnector::default()
            .connect(&options)
            .map_err(listing)?;
        let failed = |e: &dyn std::fmt::Display| StoreError::Remote {
            op: LISTING,
            url: self.url.clone(),
            detail: e.to_string(),
            kind: RemoteKind::Failed,
        };
        let list = async {
            let mut found = Vec::new();
            let mut markers = String::new();
            loop {
                let uri = format!(
                    "{endpoint}/{bucket}?prefix={}&uploads={markers}",
                    query_encode(&prefix)
                );
                let mut req = http::Request::builder()
                    .method("GET")
                    .uri(&uri)
                    .body(object_store::client::HttpRequestBody::from(Vec::new()))
                    .map_err(|e| StoreError::Invalid(format!("{uri}: {e}")))?;
                if !unsigned {
                    let cred = s3.credentials().get_credential().await.map_err(listing)?;
                    object_store::aws::AwsAuthorizer::new(&cred, "s3", &region)
                        .try_authorize(&mut req, None)
                        .map_err(listing)?;
                }
                let resp = http.execute(req).await.map_err(|e| failed(&e))?;
                let status = resp.status();
                let body = resp.into_body().bytes().await.map_err(|e| failed(&e))?;
                let text = String::from_utf8_lossy(&body);
                if !status.is_success() {
                    return Err(failed(&format!("{status}: {text}")));
                }
                let page = parse_upload_listing(&text).map_err(|e| failed(&e))?;
                found.extend(page.uploads.into_iter().map(|u| OpenUploadInfo {
                    name: u.key.strip_prefix(&prefix).unwrap_or(&u.key).to_string(),
                    id: u.upload_id,
                }));
                let (true, Some(k), Some(u)) = (
                    page.is_truncated,
                    page.next_key_marker,
                    page.next_upload_id_marker,
                ) else {
                    return Ok(found);
                };
                markers = format!(
                    "&key-marker={}&upload-id-marker={}",
                    query_encode(&k),
                    query_encode(&u)
                );
            }
        };
        self.run(LISTING, &self.url, list)?.map(Some)
    }

    /// Aborts open multipart upload `u` (found by [`ObjectUrl::open_uploads`]); one already
    /// gone is fine.
    pub fn abort_upload(&self, u: &OpenUploadInfo) -> Result<()> {
        let Some(s3) = self.clients()?.s3 else {
            return Ok(());
        };
        let (key, url) = (self.key(&u.name), self.object_url(&u.name));
        match self.run("aborting the upload of", &url, async {
            s3.abort_multipart(&key, &u.id).await
        })? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(remote_error("aborting the upload of", &url, e)),
        }
    }

    /// Stores the local file `path` as object `name`: one PUT up to [`PUT_PART`], a multipart
    /// upload (parts in flight, aborted on failure) above. The object appears whole or not at
    /// all. `progress` is called with each part's size once it is uploaded.
    pub fn put_file(&self, name: &str, path: &Path, progress: &(dyn Fn(u64) + Sync)) -> Result<()> {
        let url = self.object_url(name);
        let file = std::fs::File::open(path).map_err(|e| StoreError::io("opening", path, e))?;
        let len = file
            .metadata()
            .map_err(|e| StoreError::io("inspecting", path, e))?
            .len();
        if len <= PUT_PART as u64 {
            let data = std::fs::read(path).map_err(|e| StoreError::io("reading", path, e))?;
            let n = data.len() as u64;
            self.put_bytes(name, data)?;
            progress(n);
            return Ok(());
        }
        let Some(store) = self.clients()?.multipart else {
            return Err(StoreError::Invalid(format!(
                "{url}: this store takes no multipart uploads"
            )));
        };
        let key = self.key(name);
        let up = put_parts(&store, &key, &url, path, &file, len, progress);
        self.run("uploading", &url, up)?
    }
}

/// The multipart upload of the local file `path` (`len` bytes) as `key`: started, registered
/// (so that [`abort_open_uploads`] can abort it from the thread that handles an interruption),
/// parts in flight, completed; aborted on failure.
async fn put_parts(
    store: &Arc<dyn Multipart>,
    key: &ObjPath,
    url: &str,
    path: &Path,
    file: &std::fs::File,
    len: u64,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<()> {
    use object_store::multipart::PartId;
    use std::os::unix::fs::FileExt;
    let interrupted =
        || StoreError::Invalid(format!("{url}: not uploaded: the pack was interrupted"));
    {
        let mut u = uploads();
        if u.closed {
            return Err(interrupted());
        }
        u.starting += 1;
    }
    let started = store.create_multipart(key).await;
    // Registered (or known to have failed) in the same step that ends its start, so that an
    // interruption waiting for `starting` to reach 0 finds every upload the server opened.
    let closed = {
        let mut u = uploads();
        u.starting -= 1;
        if let Ok(id) = &started {
            u.open.push(OpenUpload {
                store: store.clone(),
                key: key.clone(),
                id: id.clone(),
                url: url.to_string(),
            });
        }
        STARTED.notify_all();
        u.closed
    };
    let id = started.map_err(|e| remote_error("starting the upload of", url, e))?;
    if closed {
        // The interruption aborts it (it is on the list it takes).
        return Err(interrupted());
    }
    let parts = len.div_ceil(PUT_PART as u64) as usize;
    let sent: Result<Vec<PartId>> = stream::iter(0..parts)
        .map(|i| {
            let id = &id;
            async move {
                let at = i as u64 * PUT_PART as u64;
                let n = (len - at).min(PUT_PART as u64) as usize;
                let mut buf = vec![0u8; n];
                file.read_exact_at(&mut buf, at)
                    .map_err(|e| StoreError::io("reading", path, e))?;
                let part = store
                    .put_part(key, id, i, PutPayload::from(buf))
                    .await
                    .map_err(|e| remote_error("uploading", url, e))?;
                progress(n as u64);
                Ok(part)
            }
        })
        .buffered(PUTS_IN_FLIGHT)
        .try_collect()
        .await;
    let done = match sent {
        Ok(parts) => store
            .complete_multipart(key, &id, parts)
            .await
            .map(|_| ())
            .map_err(|e| remote_error("completing the upload of", url, e)),
        Err(e) => Err(e),
    };
    // Whoever takes it off the list aborts it (the interruption may have, meanwhile).
    let mine = {
        let mut u = uploads();
        let before = u.open.len();
        u.open.retain(|o| o.url != url || o.id != id);
        u.open.len() < before
    };
    if done.is_err() && mine {
        // The server drops the parts (best effort: the error that stopped it is reported).
        let _ = store.abort_multipart(key, &id).await;
    }
    done
}

/// `s` percent-encoded for a URL query (RFC 3986 unreserved characters kept).
fn query_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One page of S3's ListMultipartUploads answer (`ListMultipartUploadsResult`); elements
/// granary does not use are ignored.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct UploadListing {
    /// Required: every S3 answer has it, so another document (an HTML error page from a
    /// proxy, say) is an error rather than an empty listing.
    is_truncated: bool,
    next_key_marker: Option<String>,
    next_upload_id_marker: Option<String>,
    #[serde(default, rename = "Upload")]
    uploads: Vec<ListedUpload>,
}

/// One `<Upload>` of a listing.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListedUpload {
    key: String,
    upload_id: String,
}

/// Parses a ListMultipartUploads answer (an XML document; entities decoded by the parser).
fn parse_upload_listing(text: &str) -> std::result::Result<UploadListing, String> {
    quick_xml::de::from_str(text)
        .map_err(|e| format!("not a ListMultipartUploads answer ({e}): {text:.200}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upload_listing_parses_pages_and_entities() {
        let text = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListMultipartUploadsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Bucket>b</Bucket><KeyMarker></KeyMarker><UploadIdMarker></UploadIdMarker>
  <NextKeyMarker>ds/chunk-000001.gchunk</NextKeyMarker>
  <NextUploadIdMarker>id&amp;2</NextUploadIdMarker>
  <MaxUploads>2</MaxUploads><IsTruncated>true</IsTruncated>
  <Upload><Key>ds/a&lt;b&gt;.gchunk</Key><UploadId>id1</UploadId>
    <Initiator><ID>x</ID></Initiator><StorageClass>STANDARD</StorageClass></Upload>
  <Upload><Key>ds/chunk-000001.gchunk</Key><UploadId>id&amp;2</UploadId></Upload>
</ListMultipartUploadsResult>"#;
        let page = parse_upload_listing(text).unwrap();
        assert!(page.is_truncated);
        assert_eq!(
            page.next_key_marker.as_deref(),
            Some("ds/chunk-000001.gchunk")
        );
        assert_eq!(page.next_upload_id_marker.as_deref(), Some("id&2"));
        let got: Vec<_> = page
            .uploads
            .iter()
            .map(|u| (&*u.key, &*u.upload_id))
            .collect();
        assert_eq!(
            got,
            [
                ("ds/a<b>.gchunk", "id1"),
                ("ds/chunk-000001.gchunk", "id&2")
            ]
        );
        let empty = parse_upload_listing(
            "<ListMultipartUploadsResult><IsTruncated>false</IsTruncated></ListMultipartUploadsResult>",
        )
        .unwrap();
        assert!(!empty.is_truncated && empty.uploads.is_empty());
        assert!(parse_upload_listing("<html>not s3</html>").is_err());
    }
}
