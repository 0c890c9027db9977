use super::*;
use granary_format::local;

#[test]
fn hot_map_round_trip_and_damage() {
    let mut m = BTreeMap::new();
    m.insert(
        3,
        HotChunk {
            id: 3,
            file_size: 900,
            file_crc: 7,
            sources: vec![(0, [1; 16]), (4, [2; 16])],
            samples: vec![(10, 64), (99, 300)],
        },
    );
    m.insert(
        5,
        HotChunk {
            id: 5,
            file_size: 100,
            file_crc: 8,
            sources: vec![],
            samples: vec![],
        },
    );
    let b = encode_hot_map(&m);
    granary_format::testing::dump_fuzz_seed("hot_map", "two-chunks", &b);
    assert_eq!(decode_hot_map(&b), Some(m));
    for i in 0..b.len() {
        let mut d = b.clone();
        d[i] ^= 0x10;
        assert_eq!(decode_hot_map(&d), None, "flip at {i} accepted");
        assert_eq!(decode_hot_map(&b[..i]), None, "truncation at {i} accepted");
    }
    assert_eq!(parse_hot_file_name(&hot_file_name(42)), Some(42));
    assert_eq!(parse_hot_file_name("hot-42.gchunk"), None);
    let d = [0x5a; 16];
    assert_eq!(parse_copy_file_name(&copy_file_name(42, &d)), Some((42, d)));
    for bad in [
        "chunk-00000042.gchunk".to_string(),
        format!("chunk-42-{}.gchunk", hex16(&d)),
        copy_file_name(42, &d).to_uppercase(),
        copy_file_name(42, &d).replace(".gchunk", ".gchunk.tmp"),
    ] {
        assert_eq!(parse_copy_file_name(&bad), None, "{bad}");
    }
}

#[test]
fn content_list_round_trip_and_damage() {
    let mut m = BTreeMap::new();
    let e = |size, last_use, score| Entry {
        size,
        last_use,
        score,
    };
    m.insert(Key::Chunk(7, [0xa5; 16]), e(1 << 20, 12, 0.25));
    m.insert(Key::Hot(2), e(4096, 40, 1.5e-9));
    let b = encode_index(&m, 3);
    granary_format::testing::dump_fuzz_seed("tier_index", "chunk-and-hot", &b);
    let (got, clock, next) = parse_index(&b).expect("intact list");
    assert_eq!((got.len(), clock, next), (2, 40, 3));
    assert_eq!(got[&Key::Hot(2)].score, 1.5e-9);
    for i in 0..b.len() {
        let mut d = b.clone();
        d[i] ^= 0x04;
        assert!(parse_index(&d).is_none(), "flip at {i} accepted");
        assert!(parse_index(&b[..i]).is_none(), "truncation at {i} accepted");
    }
    // A well-framed body with a line the tier never writes is not trusted either.
    for body in [
        "next-hot 1\nchunk x 1 2 3\n",
        "next-hot 1\nchunk 7 1 2 3\n",
        "next-hot 1\nchunk 7-00 1 2 3\n",
        "chunk 1 2 3 4\n",
        "next-hot 1\nodd 1 2 3 4\n",
    ] {
        assert!(
            parse_index(&local::TIER_INDEX.frame(body.as_bytes())).is_none(),
            "{body}"
        );
    }
}

#[test]
fn tier_directory_names_parse_whatever_their_bytes() {
    let id = [
        0xab, 0x01, 0, 0xff, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 0x10, 0xcd,
    ];
    assert_eq!(parse_hex_id(hex16(&id).as_bytes()), Some(id));
    assert_eq!(parse_hex_id(hex16(&id).to_uppercase().as_bytes()), Some(id));
    // 32 bytes that are not 32 characters (this panicked slicing inside a character).
    assert_eq!(parse_hex_id("é".repeat(16).as_bytes()), None);
    assert_eq!(
        parse_hex_id(format!("a{}b", "é".repeat(15)).as_bytes()),
        None
    );
    assert_eq!(parse_hex_id(b"+f+f+f+f+f+f+f+f+f+f+f+f+f+f+f+f"), None);
    assert_eq!(parse_hex_id(&[0xff; 32]), None);
    assert_eq!(parse_hex_id(b"abc"), None);
}

#[test]
fn temporary_names_and_their_owners() {
    assert_eq!(temp_lock("chunk-00000001.tmp123"), Some("lock"));
    assert_eq!(temp_lock("hot-00000001.tmp1"), Some("lock"));
    assert_eq!(temp_lock("index.tmp77"), Some("lock"));
    assert_eq!(temp_lock("hot.tmp77"), Some("lock"));
    assert_eq!(temp_lock("scores.tmp5"), Some("scores.lock"));
    for (name, tier) in [
        ("chunk-00000001.gchunk.0a0b0c0d-1f-0.tmp", true),
        ("hot-00000002.gchunk.0a0b0c0d-1f-3.tmp", true),
        ("index.0a0b0c0d-1f-0.tmp", true),
        ("hot.map.0a0b0c0d-1f-0.tmp", true),
        ("scores.0a0b0c0d-1f-0.tmp", false),
    ] {
        match temp_lock(name) {
            Some("lock") => assert!(tier, "{name}"),
            Some("scores.lock") => assert!(!tier, "{name}"),
            _ => panic!("{name} is a temporary file of the tier"),
        }
    }
    for other in [
        "index",
        "hot.map",
        "scores.lock",
        "chunk-00000001.gchunk",
        "x.tmp1",
        "index.tmp",
        "index.tmpx",
    ] {
        assert!(temp_lock(other).is_none(), "{other}");
    }
}

/// A FIFO put under the name of the tier's lock, content list or hot map is never waited on:
/// lookups treat the list and the map as missing, and what needs the lock (or must replace
/// the list) is an error naming the file, at once.
#[test]
fn fifos_under_the_tiers_own_names_are_never_waited_on() {
    let tmp = tempfile::tempdir().unwrap();
    let t = LocalTier::open(tmp.path(), [3; 16], 1 << 20, TierPolicy::Lru).unwrap();
    let dir = t.dir().to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let fifo = |name: &str| {
            let p = dir.join(name);
            let _ = std::fs::remove_file(&p);
            rustix::fs::mknodat(
                rustix::fs::CWD,
                &p,
                rustix::fs::FileType::Fifo,
                rustix::fs::Mode::from_raw_mode(0o644),
                0,
            )
            .unwrap();
        };
        fifo("index");
        fifo("hot.map");
        let used = t.used().map_err(|e| e.to_string());
        let listed = t.hot_map(&[]).chunks.is_empty()
            && used.as_ref().map_or_else(|e| e.contains("index"), |_| true);
        fifo("lock");
        let ce = ChunkEntry {
            chunk_id: 0,
            file_size: 10,
            ..Default::default()
        };
        let locked = t.discard(Key::copy(&ce), true).map_err(|e| e.to_string());
        let _ = tx.send((listed, locked));
    });
    let (listed, locked) = rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("a FIFO in the tier was waited on");
    assert!(listed, "a FIFO list or hot map is read as missing");
    let e = locked.expect_err("a FIFO lock cannot be taken");
    assert!(
        e.contains("lock") && e.contains("not a regular file"),
        "{e}"
    );
}
