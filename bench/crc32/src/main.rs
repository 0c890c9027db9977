//! CRC-32 (IEEE, the polynomial granary's format uses) implementations on this CPU: GB/s on
//! one core, for the buffer sizes a reader checks (a 4 KiB page, a 64 KiB block, an
//! ImageNet-like record of 113 KB, 1 MiB, a 32 MiB chunk), from cache (the same 256 KiB
//! again and again) and from memory (walking 1 GiB). Prints TSV: impl, bytes, from, GB/s
//! (the best of 3 runs of 2 GiB each).

use std::time::Instant;

type Crc = fn(&[u8]) -> u32;

fn crc_fast(b: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32IsoHdlc, b) as u32
}

fn main() {
    let total: usize = 1 << 30;
    let data: Vec<u8> = (0..total)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let impls: [(&str, Crc); 2] = [("crc32fast", crc32fast::hash), ("crc-fast", crc_fast)];
    for (name, f) in impls {
        assert_eq!(f(b"123456789"), 0xcbf4_3926, "{name}: not CRC-32/ISO-HDLC");
        assert_eq!(f(&data[..100_003]), crc32fast::hash(&data[..100_003]), "{name}");
    }
    println!("impl\tbytes\tfrom\tgb_per_s");
    for piece in [4096usize, 65536, 113_000, 1 << 20, 32 << 20] {
        for (name, f) in impls {
            for from in ["cache", "memory"] {
                let span = if from == "cache" { (256 << 10).max(piece) } else { total };
                let mut best = 0f64;
                for _ in 0..3 {
                    let t = Instant::now();
                    let (mut done, mut at, mut x) = (0usize, 0usize, 0u32);
                    while done < 2usize << 30 {
                        if at + piece > span {
                            at = 0;
                        }
                        x ^= f(&data[at..at + piece]);
                        at += piece;
                        done += piece;
                    }
                    std::hint::black_box(x);
                    best = best.max(done as f64 / t.elapsed().as_secs_f64() / 1e9);
                }
                println!("{name}\t{piece}\t{from}\t{best:.1}");
            }
        }
    }
}
