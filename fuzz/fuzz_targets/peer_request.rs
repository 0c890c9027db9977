//! What `granary serve` takes from the network: the request path, the `Range` header and the
//! `x-granary-auth` proof. Parsing never panics; a path is accepted only as one chunk name of
//! one dataset (its id and digest); a range lies inside the file; no proof made without the secret passes, and a
//! proof made with it passes once.
#![no_main]
use granary_store::auth::{parse_proof, Secret, Verifier};
use granary_store::serving::{byte_range, chunk_request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    let mut f = s.splitn(4, '\n');
    let (path, range, proof) = (f.next().unwrap_or(""), f.next(), f.next());
    // The id is only a key looked up among the served datasets; the name is the one file
    // name joined to a tier directory: exactly a chunk copy's, so no separator and no `..`.
    if let Ok((id, name)) = chunk_request(path) {
        let (n, digest) = granary::parse_copy_file_name(name).expect("a copy's name");
        assert_eq!(granary::copy_file_name(n, &digest), name);
        assert!(!id.contains('/') && !name.contains('/') && !name.contains(".."));
    }
    let size = data.len() as u64;
    if let Ok(Some((a, b))) = byte_range(range, size) {
        assert!(a < b && b <= size, "{a}..{b} of {size}");
    }
    let secret = Secret::new(b"fuzzing-secret-0123456789", "fuzz").unwrap();
    let v = Verifier::new(secret.clone());
    let now = 1_700_000_000;
    let _ = parse_proof(proof.unwrap_or(""));
    // Whatever the input says, it was not made with the secret.
    assert!(
        v.check("GET", path, range, proof, now).is_err(),
        "a proof not made with the secret passed"
    );
    let good = secret.sign("GET", path, range, now);
    assert!(v.check("GET", path, range, Some(&good), now).is_ok());
    assert!(v.check("GET", path, range, Some(&good), now).is_err(), "a replay");
});
