//! Showing raw path bytes to people, and reading them back.

/// Escapes a raw path for display: valid UTF-8 is kept, except control characters and `\`;
/// every other byte is shown as `\xNN`. [`unescape_path`] inverts it.
pub fn escape_path(p: &[u8]) -> String {
    let mut out = String::with_capacity(p.len());
    for chunk in p.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                c if c.is_control() => {
                    let mut buf = [0u8; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        out.push_str(&format!("\\x{b:02x}"));
                    }
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// Inverts [`escape_path`]; `None` if `s` holds a malformed escape.
pub fn unescape_path(s: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] != b'\\' {
            out.push(s[i]);
            i += 1;
            continue;
        }
        match s.get(i + 1)? {
            b'\\' => {
                out.push(b'\\');
                i += 2;
            }
            b'x' => {
                // Exactly two hex digits (`from_str_radix` alone would take a sign: `\x+f`).
                let digit = |c: &u8| (*c as char).to_digit(16).map(|d| d as u8);
                let (hi, lo) = (digit(s.get(i + 2)?)?, digit(s.get(i + 3)?)?);
                out.push(hi << 4 | lo);
                i += 4;
            }
            _ => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for p in [
            &b"a/b.jpg"[..],
            b"\xff\xfe/x",
            b"back\\slash",
            b"tab\there",
            "é/ü".as_bytes(),
        ] {
            let e = escape_path(p);
            assert_eq!(unescape_path(e.as_bytes()).unwrap(), p, "{e}");
        }
        assert_eq!(escape_path(b"\xffa"), "\\xffa");
    }

    #[test]
    fn a_signed_or_short_hex_escape_is_malformed() {
        for bad in [
            &b"\\x+f"[..],
            b"\\x-1",
            b"\\x f",
            b"\\xf",
            b"\\x",
            b"\\q",
            b"\\",
        ] {
            assert_eq!(unescape_path(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        assert_eq!(unescape_path(b"\\xFf\\x0a").unwrap(), b"\xff\n");
    }
}
