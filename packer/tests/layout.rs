//! The layout is a pure function of the file list and the settings: the same seed gives the
//! same chunks, the default order mixes classes across chunks, `walk` keeps path order.

use std::path::Path;

use granary_format::{Snapshot, SNAPSHOT_FILE};
use granary_packer::{pack, Order, PackOptions};

fn tree(root: &Path) {
    for c in 0..8 {
        for i in 0..50 {
            let p = root.join(format!("class{c}/{i:03}.bin"));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, vec![(c * 50 + i) as u8; 700]).unwrap();
        }
    }
}

/// (path, chunk, label) of every sample, in sample-id order.
fn layout(ds: &Path) -> Vec<(Vec<u8>, u32, u32)> {
    let bytes = std::fs::read(ds.join(SNAPSHOT_FILE)).unwrap();
    let s = Snapshot::open(bytes).unwrap();
    (0..s.sample_count())
        .map(|id| {
            let e = s.sample(id).unwrap();
            (s.path(id).unwrap().to_vec(), e.chunk, e.label)
        })
        .collect()
}

fn packed(src: &Path, out: &Path, order: Order, seed: u64) -> Vec<(Vec<u8>, u32, u32)> {
    let mut o = PackOptions::new(src, out);
    o.output.chunk_size = 8 << 10;
    o.order = order;
    o.output.seed = seed;
    o.output.compress = granary_packer::CompressMode::None;
    pack(&o).unwrap();
    layout(out)
}

#[test]
fn same_seed_same_layout_and_classes_are_mixed() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    tree(&src);
    let a = packed(&src, &tmp.path().join("a"), Order::Random, 3);
    let b = packed(&src, &tmp.path().join("b"), Order::Random, 3);
    let c = packed(&src, &tmp.path().join("c"), Order::Random, 4);
    assert_eq!(a, b);
    assert_ne!(a, c);
    // Random layout: most chunks hold several classes.
    let chunks = a.iter().map(|x| x.1).max().unwrap() + 1;
    let mixed = (0..chunks)
        .filter(|&ch| {
            let mut labels: Vec<u32> = a.iter().filter(|x| x.1 == ch).map(|x| x.2).collect();
            labels.sort();
            labels.dedup();
            labels.len() >= 4
        })
        .count();
    assert!(
        mixed as u32 >= chunks * 3 / 4,
        "{mixed} of {chunks} chunks mixed"
    );
    // Walk layout: path order, one or two classes per chunk.
    let w = packed(&src, &tmp.path().join("w"), Order::Walk, 0);
    let paths: Vec<&Vec<u8>> = w.iter().map(|x| &x.0).collect();
    let mut sorted = paths.clone();
    sorted.sort();
    assert_eq!(paths, sorted);
}
