//! Object store errors as ones a user can act on.

use crate::config::{CONNECT_TIMEOUT_ENV, REQUEST_TIMEOUT_ENV, RETRY_TIMEOUT_ENV};
use crate::error::{RemoteKind, StoreError};
use object_store::client::{HttpError, HttpErrorKind};

/// An object store error as one a user can act on: what failed, on which URL, and why.
pub fn remote_error(op: &'static str, url: &str, e: object_store::Error) -> StoreError {
    use object_store::Error as E;
    let text = e.to_string();
    // S3-style servers say what is wrong in an XML error body: its code decides.
    let body = error_body(&text).unwrap_or_default();
    let code = body.code.trim();
    let said = match &body.message {
        Some(m) => format!("{code}: {}", m.trim()),
        None => text.clone(),
    };
    let detail = match (&e, code) {
        (_, "SignatureDoesNotMatch" | "InvalidAccessKeyId" | "InvalidToken" | "ExpiredToken")
        | (E::Unauthenticated { .. }, _) => format!(
            "the credentials were rejected: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY \
             (or the store's equivalents) ({said})"
        ),
        (_, "NoSuchBucket") => "the bucket does not exist: check the URL's bucket name".into(),
        (E::NotFound { .. }, _) | (_, "NoSuchKey") => {
            "not found: check the bucket and prefix (and that the dataset was packed there)".into()
        }
        (E::PermissionDenied { .. }, _) | (_, "AccessDenied") => format!(
            "access denied: the credentials may not do this; check their permissions ({said})"
        ),
        (_, "SlowDown" | "Throttling" | "RequestLimitExceeded" | "ServiceUnavailable") => {
            format!(
                "the server kept throttling the request (retried with backoff, then gave up; \
                 fewer readers or a larger --memory window make fewer requests): {said}"
            )
        }
        _ if failed_as(&e, HttpErrorKind::Connect) => {
            format!("could not connect (refused, unreachable or not resolved): {said}")
        }
        _ if failed_as(&e, HttpErrorKind::Timeout) => format!(
            "the store did not answer: no connection, or no byte, within the timeouts \
             ({CONNECT_TIMEOUT_ENV}, {REQUEST_TIMEOUT_ENV}), and retries ran out after \
             {RETRY_TIMEOUT_ENV} ({said})"
        ),
        _ => said,
    };
    let kind = match (&e, code) {
        (E::NotFound { .. }, _) | (_, "NoSuchKey" | "NoSuchBucket") => RemoteKind::NotFound,
        (_, "SignatureDoesNotMatch" | "InvalidAccessKeyId" | "InvalidToken" | "ExpiredToken")
        | (E::Unauthenticated { .. } | E::PermissionDenied { .. }, _)
        | (_, "AccessDenied") => RemoteKind::Denied,
        (_, "SlowDown" | "Throttling" | "RequestLimitExceeded" | "ServiceUnavailable")
        | (E::Generic { .. }, _) => RemoteKind::Transient,
        _ => RemoteKind::Failed,
    };
    StoreError::Remote {
        op,
        url: url.to_string(),
        detail,
        kind,
    }
}

/// True if `e` ends in a request that failed as `kind` says (timed out, could not connect).
fn failed_as(e: &object_store::Error, kind: HttpErrorKind) -> bool {
    let first: &(dyn std::error::Error + 'static) = e;
    std::iter::successors(Some(first), |c| c.source())
        .find_map(|c| c.downcast_ref::<HttpError>())
        .is_some_and(|h| std::mem::discriminant(&h.kind()) == std::mem::discriminant(&kind))
}

/// The `<Error>` document an S3-style server answers with, as much of it as granary reads.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ErrorBody {
    #[serde(default)]
    code: String,
    message: Option<String>,
}

/// The server's `<Error>` document inside an error message (the client quotes the body), if
/// the message carries one that parses.
fn error_body(text: &str) -> Option<ErrorBody> {
    let start = text.find("<Error>")?;
    let end = text[start..].find("</Error>")? + start + "</Error>".len();
    quick_xml::de::from_str(&text[start..end]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_decide_the_kind() {
        let e = |body: &str| object_store::Error::Generic {
            store: "S3",
            source: format!("Client error with status 403 Forbidden: {body}").into(),
        };
        let denied = remote_error(
            "reading",
            "s3://b/x",
            e(
                "<?xml version=\"1.0\"?><Error><Code>AccessDenied</Code><Message>no &amp; \
               never</Message><RequestId>1</RequestId></Error>",
            ),
        );
        let StoreError::Remote { kind, detail, .. } = denied else {
            panic!("not remote")
        };
        assert_eq!(kind, RemoteKind::Denied);
        assert!(detail.contains("AccessDenied: no & never"), "{detail}");
        let slow = remote_error(
            "reading",
            "s3://b/x",
            e("<Error><Code>SlowDown</Code></Error>"),
        );
        assert!(matches!(
            slow,
            StoreError::Remote {
                kind: RemoteKind::Transient,
                ..
            }
        ));
        let plain = remote_error("reading", "s3://b/x", e("connection reset"));
        assert!(matches!(
            plain,
            StoreError::Remote {
                kind: RemoteKind::Transient,
                ..
            }
        ));
    }
}
