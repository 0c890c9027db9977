//! Who may read a node's tier: requests to `granary serve` carry proof that the caller holds
//! the job's secret.
//!
//! Every request has a header `x-granary-auth: v1 <unix seconds> <nonce> <mac>`, where `mac`
//! is the hex HMAC-SHA256, keyed with the job's secret, of
//! `granary-peer-v1\n<METHOD>\n<path>\n<Range header or empty>\n<seconds>\n<nonce>`. The server
//! refuses a request without the header (401), and one whose MAC does not match, whose time is
//! more than [`WINDOW_SECS`] from its own clock, or whose nonce it has already seen within that
//! window (a replay) with 403. The secret never crosses the network; a captured request is
//! good for nothing but itself, once, for a minute at most. The bytes themselves are not
//! encrypted: the job's network is trusted not to be read (see `docs/shared-tiers.md`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::{Result, StoreError};

/// The request header that carries the proof.
pub const AUTH_HEADER: &str = "x-granary-auth";
/// The environment variable that holds the job's secret (readers and `granary serve`).
pub const SECRET_ENV: &str = "GRANARY_PEER_SECRET";
/// How far a request's time may be from the server's clock, either way.
pub const WINDOW_SECS: u64 = 60;
/// Shortest secret accepted.
pub const MIN_SECRET: usize = 16;

/// The job's shared secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// `bytes` as a secret (at least [`MIN_SECRET`] bytes; surrounding whitespace, such as a
    /// file's final newline, is not part of it).
    pub fn new(bytes: &[u8], from: &str) -> Result<Secret> {
        let b = bytes.trim_ascii();
        if b.len() < MIN_SECRET {
            return Err(StoreError::Invalid(format!(
                "{from}: a peer secret needs at least {MIN_SECRET} bytes (it has {}); make one \
                 with `head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'`",
                b.len()
            )));
        }
        Ok(Secret(b.to_vec()))
    }

    /// The secret in file `path`.
    pub fn from_file(path: &Path) -> Result<Secret> {
        let b =
            std::fs::read(path).map_err(|e| StoreError::io("reading the secret in", path, e))?;
        Secret::new(&b, &path.display().to_string())
    }

    /// The secret in [`SECRET_ENV`], if it is set.
    pub fn from_env() -> Result<Option<Secret>> {
        match std::env::var_os(SECRET_ENV).filter(|v| !v.is_empty()) {
            Some(v) => Secret::new(v.as_encoded_bytes(), SECRET_ENV).map(Some),
            None => Ok(None),
        }
    }

    fn mac(&self) -> Hmac<Sha256> {
        Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length")
    }

    /// The header value for a request `method path` with `range` (the `Range` header, if
    /// any) at `now` (unix seconds), with a fresh nonce.
    pub fn sign(&self, method: &str, path: &str, range: Option<&str>, now: u64) -> String {
        let mut n = [0u8; 16];
        if rustix::rand::getrandom(&mut n, rustix::rand::GetRandomFlags::empty()).is_err() {
            // No entropy: a counter and the time still never repeat within one process.
            static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let c = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            n[..8].copy_from_slice(&c.to_le_bytes());
            n[8..].copy_from_slice(&(std::process::id() as u64 ^ now).to_le_bytes());
        }
        let nonce = hex(&n);
        let mut m = self.mac();
        m.update(&message(method, path, range, now, &nonce));
        format!("v1 {now} {nonce} {}", hex(&m.finalize().into_bytes()))
    }
}

fn message(method: &str, path: &str, range: Option<&str>, ts: u64, nonce: &str) -> Vec<u8> {
    format!(
        "granary-peer-v1\n{method}\n{path}\n{}\n{ts}\n{nonce}",
        range.unwrap_or("")
    )
    .into_bytes()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Parses an `x-granary-auth` header value: `v1 <seconds> <nonce: 32 hex> <mac: 64 hex>`, as
/// its time, nonce and MAC.
pub fn parse_proof(h: &str) -> std::result::Result<(u64, &str, Vec<u8>), Refusal> {
    let mut it = h.split(' ');
    let (Some("v1"), Some(ts), Some(nonce), Some(mac), None) =
        (it.next(), it.next(), it.next(), it.next(), it.next())
    else {
        return Err(Refusal::Malformed);
    };
    let ts: u64 = ts.parse().map_err(|_| Refusal::Malformed)?;
    let nonce_ok = nonce.len() == 32 && unhex(nonce).is_some();
    unhex(mac)
        .filter(|m| m.len() == 32 && nonce_ok)
        .map(|mac| (ts, nonce, mac))
        .ok_or(Refusal::Malformed)
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No proof at all (401).
    #[error("no x-granary-auth header: the caller does not have the job's secret")]
    Missing,
    /// A header that is not a proof (403).
    #[error("a malformed x-granary-auth header")]
    Malformed,
    /// Signed with another secret, or for another request (403).
    #[error("a proof made with another secret, or for another request")]
    Forged,
    /// Its time is outside the window (403).
    #[error("a proof outside the time window (clocks more than 60 s apart?)")]
    Stale,
    /// Seen before (403).
    #[error("a proof seen before (a replayed request)")]
    Replayed,
}

impl Refusal {
    /// The HTTP status to answer with.
    pub fn status(self) -> u16 {
        match self {
            Refusal::Missing => 401,
            _ => 403,
        }
    }
}

/// The server's side: checks proofs and remembers the nonces of the window.
pub struct Verifier {
    secret: Secret,
    seen: Mutex<HashMap<String, u64>>,
}

impl Verifier {
    pub fn new(secret: Secret) -> Verifier {
        Verifier {
            secret,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Checks the proof `header` of request `method path` with `range`, at `now`.
    pub fn check(
        &self,
        method: &str,
        path: &str,
        range: Option<&str>,
        header: Option<&str>,
        now: u64,
    ) -> std::result::Result<(), Refusal> {
        let (ts, nonce, mac) = parse_proof(header.ok_or(Refusal::Missing)?)?;
        let mut m = self.secret.mac();
        m.update(&message(method, path, range, ts, nonce));
        // Constant time: a wrong MAC says nothing about how much of it was right.
        m.verify_slice(&mac).map_err(|_| Refusal::Forged)?;
        if ts.abs_diff(now) > WINDOW_SECS {
            return Err(Refusal::Stale);
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() > 4096 {
            // Nonces older than the window can never be accepted again anyway.
            seen.retain(|_, &mut ts| ts.abs_diff(now) <= WINDOW_SECS);
        }
        if seen.insert(nonce.to_string(), ts).is_some() {
            return Err(Refusal::Replayed);
        }
        Ok(())
    }
}

/// Now, in unix seconds.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> Secret {
        Secret::new(b"0123456789abcdef0123456789abcdef\n", "test").unwrap()
    }

    #[test]
    fn a_signed_request_passes_once_and_nothing_else_does() {
        let v = Verifier::new(secret());
        let now = 1_700_000_000;
        let h = secret().sign("GET", "/ab/chunk-00000001.gchunk", Some("bytes=0-9"), now);
        let check = |m, p, r, h: &str, t| v.check(m, p, r, Some(h), t);
        // Another method, path, range, or a missing range: forged.
        assert_eq!(
            check(
                "HEAD",
                "/ab/chunk-00000001.gchunk",
                Some("bytes=0-9"),
                &h,
                now
            ),
            Err(Refusal::Forged)
        );
        assert_eq!(
            check(
                "GET",
                "/ab/chunk-00000002.gchunk",
                Some("bytes=0-9"),
                &h,
                now
            ),
            Err(Refusal::Forged)
        );
        assert_eq!(
            check("GET", "/ab/chunk-00000001.gchunk", None, &h, now),
            Err(Refusal::Forged)
        );
        // Too far from the server's clock.
        assert_eq!(
            check(
                "GET",
                "/ab/chunk-00000001.gchunk",
                Some("bytes=0-9"),
                &h,
                now + 61
            ),
            Err(Refusal::Stale)
        );
        // Right: once.
        assert_eq!(
            check(
                "GET",
                "/ab/chunk-00000001.gchunk",
                Some("bytes=0-9"),
                &h,
                now + 5
            ),
            Ok(())
        );
        assert_eq!(
            check(
                "GET",
                "/ab/chunk-00000001.gchunk",
                Some("bytes=0-9"),
                &h,
                now + 6
            ),
            Err(Refusal::Replayed)
        );
        // Another secret.
        let other = Secret::new(b"another secret, long enough", "t").unwrap();
        let h2 = other.sign("GET", "/ab/chunk-00000001.gchunk", None, now);
        assert_eq!(
            check("GET", "/ab/chunk-00000001.gchunk", None, &h2, now),
            Err(Refusal::Forged)
        );
        assert_eq!(v.check("GET", "/x", None, None, now), Err(Refusal::Missing));
        assert_eq!(Refusal::Missing.status(), 401);
        assert_eq!(Refusal::Forged.status(), 403);
    }

    #[test]
    fn proofs_parse_strictly_and_secrets_are_long_enough() {
        let good = secret().sign("GET", "/p", None, 5);
        assert!(parse_proof(&good).is_ok());
        for bad in [
            "",
            "v1",
            "v2 5 00000000000000000000000000000000 00",
            &good.replace("v1 5", "v1 x"),
            &format!("{good} extra"),
            &good[..good.len() - 1],
            &good.replacen(' ', "  ", 1),
        ] {
            assert_eq!(parse_proof(bad), Err(Refusal::Malformed), "{bad:?}");
        }
        assert!(Secret::new(b"short\n", "t").is_err());
    }
}
