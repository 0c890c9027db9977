//! What `granary serve` accepts from the network, parsed here (and fuzzed,
//! `fuzz/fuzz_targets/peer_request.rs`): the request path, which must name exactly one chunk
//! copy of one dataset, and a single byte range.

/// The dataset id (as written) and copy file name a request path names:
/// `/<id>/chunk-NNNNNNNN-<digest>.gchunk`, spelled exactly as [`crate::copy_file_name`] does
/// (a copy is served only to whoever names its digest); `Err` with the reason otherwise.
pub fn chunk_request(path: &str) -> Result<(&str, &str), &'static str> {
    let mut parts = path.trim_start_matches('/').split('/');
    let (Some(id), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err("not found: ask for /<dataset id>/chunk-NNNNNNNN-<digest>.gchunk\n");
    };
    match crate::parse_copy_file_name(name) {
        Some(_) => Ok((id, name)),
        None => Err("not found: only chunk copies are served\n"),
    }
}

/// A `Range` header that no part of the file satisfies (answered with 416).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unsatisfiable;

/// The byte range a `Range` header asks of a `size`-byte file: `Ok(None)` for the whole file
/// (no header, or one this server does not do, such as several ranges: the whole file is a
/// valid answer to those), `Err` if it cannot be satisfied. `Ok(Some((start, end)))` always
/// has `start < end <= size`.
pub fn byte_range(header: Option<&str>, size: u64) -> Result<Option<(u64, u64)>, Unsatisfiable> {
    let spec = header.and_then(|h| h.trim().strip_prefix("bytes="));
    let spec = spec.filter(|s| !s.contains(','));
    let Some((a, b)) = spec.and_then(|s| s.split_once('-')) else {
        return Ok(None);
    };
    let (a, b) = (a.trim(), b.trim());
    let parse = |s: &str| s.parse::<u64>().map_err(|_| Unsatisfiable);
    let (start, end) = match (a.is_empty(), b.is_empty()) {
        (true, true) => return Err(Unsatisfiable),
        // The last n bytes.
        (true, false) => {
            let n = parse(b)?;
            if n == 0 {
                return Err(Unsatisfiable);
            }
            (size.saturating_sub(n), size)
        }
        (false, true) => (parse(a)?, size),
        (false, false) => {
            let (s, e) = (parse(a)?, parse(b)?);
            if e < s {
                return Err(Unsatisfiable);
            }
            (s, e.saturating_add(1).min(size))
        }
    };
    if start >= size {
        return Err(Unsatisfiable);
    }
    Ok(Some((start, end)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_single_byte_ranges_inside_the_file() {
        assert_eq!(byte_range(None, 100), Ok(None));
        assert_eq!(byte_range(Some("bytes=0-9"), 100), Ok(Some((0, 10))));
        assert_eq!(byte_range(Some("bytes=90-"), 100), Ok(Some((90, 100))));
        assert_eq!(byte_range(Some("bytes=-10"), 100), Ok(Some((90, 100))));
        assert_eq!(byte_range(Some("bytes=-1000"), 100), Ok(Some((0, 100))));
        assert_eq!(byte_range(Some("bytes=50-1000"), 100), Ok(Some((50, 100))));
        assert_eq!(byte_range(Some("bytes=0-1,5-6"), 100), Ok(None));
        assert_eq!(byte_range(Some("items=0-1"), 100), Ok(None));
        for bad in [
            "bytes=100-",
            "bytes=9-3",
            "bytes=-0",
            "bytes=-",
            "bytes=x-1",
        ] {
            assert_eq!(byte_range(Some(bad), 100), Err(Unsatisfiable), "{bad}");
        }
    }

    #[test]
    fn only_chunk_copy_names_are_requests() {
        let copy = crate::copy_file_name(7, &[0x3c; 16]);
        assert_eq!(
            chunk_request(&format!("/ab/{copy}")),
            Ok(("ab", copy.as_str()))
        );
        let upper = format!("/ab/{}", copy.to_uppercase());
        let dotted = format!("/ab/../ab/{copy}");
        for bad in [
            "/ab/chunk-00000007.gchunk",
            &upper,
            &dotted,
            "/ab/hot-00000001.gchunk",
            "/ab/index",
            "/ab/lock",
            "/ab/../ab/chunk-00000007.gchunk",
            "/ab/chunk-7.gchunk",
            "/ab/chunk-00000007.gchunk/x",
            "/ab/chunk-+0000007.gchunk",
            "/ab",
            "/",
        ] {
            assert!(chunk_request(bad).is_err(), "{bad}");
        }
    }
}
