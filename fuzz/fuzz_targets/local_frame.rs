//! The frame of every node-local file (docs/internals.md): whatever unframes, frames back to
//! the same bytes.
#![no_main]
use granary_format::local::{LocalReader, LOCAL_KINDS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for kind in LOCAL_KINDS {
        let framed = kind.unframe(data);
        if let Ok(body) = framed {
            assert_eq!(kind.frame(body), data);
        }
        // The streaming reader agrees with the in-memory one.
        let streamed = LocalReader::new(data, &kind, data.len() as u64).and_then(|mut r| {
            let mut b = vec![0u8; r.left() as usize];
            r.read_body(&mut b)?;
            r.finish().map(|_| b)
        });
        assert_eq!(streamed.is_ok(), framed.is_ok());
    }
});
