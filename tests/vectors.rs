//! The format's test vectors (`format/testdata`): small datasets covering every section,
//! feature bit, field type, page and block boundary, appended generations, empty chunks and
//! zero samples and deletions, each with an `expected.json` describing its content (with
//! DELETIONS: the live samples, and as `deleted` each deleted id with its generation, whose
//! every read by id must fail saying it was deleted; with REVISIONS: as `revisions` each
//! chunk's revision, whose file a reader opens), and damaged variants
//! (`damaged.json`) with the error each must produce. SPEC.md's readers (this crate's and
//! `format/python/granary_format.py`) must pass all of them.
//!
//! The vectors are written once by the ignored `write_vectors` test, which checks what it
//! describes against the sources it packed (paths, bytes, modes, mtimes, field values), and are
//! then frozen: `reads_vectors` and `damaged_vectors` compare this crate's reader with them.

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::common::*;

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("format/testdata")
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn sha256(b: &[u8]) -> String {
    use sha2::Digest;
    hex(&sha2::Sha256::digest(b))
}

/// A sample as its source had it: bytes, or typed fields (name, descriptor, bytes), and the
/// mode and mtime a packed file had.
struct Src {
    data: Vec<u8>,
    fields: Option<Vec<(String, String, Vec<u8>)>>,
    attrs: Option<(u32, i64)>,
}

/// A field's decoded value, for the types that have one (SPEC §6.5), from its bytes.
fn field_value(ty: &str, b: &[u8]) -> Option<Value> {
    let ty = granary_format::FieldType::parse(ty).expect("a valid descriptor");
    use granary_format::FieldType as T;
    Some(match ty {
        T::Int => json!(i64::from_le_bytes(b.try_into().expect("8 bytes"))),
        T::Str => json!(std::str::from_utf8(b).expect("UTF-8")),
        T::Json => serde_json::from_slice(b).expect("JSON"),
        T::Ndarray { dtype, shape } => {
            let data: Vec<Value> = match dtype.as_str() {
                "float32" => b
                    .chunks_exact(4)
                    .map(|c| json!(f32::from_le_bytes(c.try_into().unwrap())))
                    .collect(),
                "int16" => b
                    .chunks_exact(2)
                    .map(|c| json!(i16::from_le_bytes(c.try_into().unwrap())))
                    .collect(),
                "uint8" => b.iter().map(|&x| json!(x)).collect(),
                other => panic!("the vectors use no {other} arrays"),
            };
            json!({"dtype": dtype, "shape": shape, "data": data})
        }
        _ => return None,
    })
}

/// Describes the dataset at `ds`, checking every sample against `src` (by path or key).
fn describe(ds: &Path, what: &str, src: &BTreeMap<Vec<u8>, Src>) -> Value {
    let d = granary::Dataset::open_checked(ds).expect("a vector opens");
    assert!(granary::verify(ds).is_clean(), "{what}: verify");
    let snap = d.snapshot();
    let h = snap.header();
    let l = snap.lineage();
    // Deleted samples (SPEC §6.8) keep their ids but are no sample of the dataset's: every
    // read of one by id fails, saying so.
    let deleted: Vec<Value> = snap
        .deleted()
        .iter()
        .map(|&id| {
            let g = snap.deleted_by(id).expect("a deleted sample's generation");
            for (how, e) in [
                ("read", d.read(id).err()),
                ("path", d.path(id).err()),
                ("stat", d.stat(id).err()),
                ("sample", d.sample(id).err()),
            ] {
                let e = e.unwrap_or_else(|| panic!("{what}: {how} of deleted sample {id}"));
                assert!(
                    e.to_string().contains("deleted"),
                    "{what}: {how} of {id}: {e}"
                );
            }
            json!({"id": id, "generation": g})
        })
        .collect();
    let live: Vec<u64> = (0..d.len())
        .filter(|&id| snap.deleted_by(id).is_none())
        .collect();
    assert_eq!(live.len(), src.len(), "{what}: sample count");
    let types: BTreeMap<Vec<u8>, String> = match d.has_fields() {
        false => BTreeMap::new(),
        true => {
            let names = d.field_names().unwrap();
            let types = snap.field_types().unwrap();
            names
                .iter()
                .zip(types)
                .map(|(n, t)| (n.to_vec(), t.descriptor()))
                .collect()
        }
    };
    let mut samples = Vec::new();
    for &id in &live {
        let path = d.path(id).unwrap();
        let s = src
            .get(&path)
            .unwrap_or_else(|| panic!("{what}: {path:?} not in the source"));
        let data = d.read(id).unwrap();
        assert_eq!(data, s.data, "{what}: {path:?}");
        let stat = d.stat(id).unwrap();
        assert_eq!(stat.size, data.len() as u64);
        let a = stat.attrs.map(|a| (a.mode, a.mtime_ns));
        assert_eq!(a, s.attrs, "{what}: attributes of {path:?}");
        let rec = d.sample(id).unwrap();
        let fields = s.fields.as_ref().map(|fs| {
            let got = d.read_fields(id, None).unwrap();
            assert_eq!(got.len(), fs.len(), "{what}: fields of {path:?}");
            fs.iter()
                .zip(got)
                .map(|((n, t, b), (gn, gb))| {
                    assert_eq!((n.as_bytes(), &b[..]), (&gn[..], &gb[..]));
                    assert_eq!(&types[n.as_bytes()], t, "{what}: type of {n}");
                    let mut f = json!({"name": n, "type": t, "len": b.len(),
                                       "crc32": crc32fast::hash(b)});
                    if let Some(v) = field_value(t, b) {
                        f["value"] = v;
                    }
                    f
                })
                .collect::<Vec<_>>()
        });
        samples.push(json!({
            "id": id,
            "path_hex": hex(&path),
            "size": data.len(),
            "crc32": crc32fast::hash(&data),
            "sha256": sha256(&data),
            "label": (rec.entry.label != granary_format::NO_LABEL).then_some(rec.entry.label),
            "compression": match rec.compression {
                granary_format::Compression::None => "none",
                granary_format::Compression::Zstd => "zstd",
            },
            "mode": a.map(|a| a.0),
            "mtime_ns": a.map(|a| a.1),
            "fields": fields,
        }));
    }
    let dirs: Vec<Value> = d
        .dirs()
        .unwrap()
        .iter()
        .map(|e| {
            let a = e.attrs;
            json!({"path_hex": hex(&e.path), "mode": a.map(|a| a.mode),
                   "mtime_ns": a.map(|a| a.mtime_ns)})
        })
        .collect();
    let chunks: Vec<Value> = snap
        .chunks()
        .iter()
        .map(|c| {
            json!({"id": c.chunk_id, "samples": c.sample_count, "file_size": c.file_size,
                   "digest": hex(&c.digest)})
        })
        .collect();
    let mut v = json!({
        "description": what,
        "dataset_id": hex(&snap.dataset_id()),
        "content_digest": hex(&snap.content_digest()),
        "generation": l.generation,
        "parent": l.has_parent().then(|| hex(&l.parent)),
        "incompat": h.incompat,
        "compat": h.compat,
        "classes_hex": d.classes().unwrap().iter().map(|c| hex(c)).collect::<Vec<_>>(),
        "entries": d.entry_count(),
        "chunks": chunks,
        "dirs": dirs,
        "samples": samples,
    });
    // Only a snapshot with DELETIONS lists them (the other vectors' descriptions stay).
    if h.incompat & granary_format::features::DELETIONS != 0 {
        v["deleted"] = json!(deleted);
    }
    // Only a snapshot with REVISIONS lists each chunk's (SPEC §6.9).
    if h.incompat & granary_format::features::REVISIONS != 0 {
        v["revisions"] = json!(snap.revisions());
    }
    v
}

/// Writes `files` (path, bytes, mode, mtime) as a tree under `root`, plus `empty_dirs`.
fn tree(root: &Path, files: &[(Vec<u8>, Vec<u8>, u32, i64)], empty_dirs: &[&str]) {
    let plain: Vec<(Vec<u8>, Vec<u8>)> = files.iter().map(|f| (f.0.clone(), f.1.clone())).collect();
    write_tree(root, &plain);
    for d in empty_dirs {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for (p, _, mode, mtime) in files {
        set_attrs(&root.join(std::ffi::OsStr::from_bytes(p)), *mode, *mtime);
    }
}

fn as_src(files: &[(Vec<u8>, Vec<u8>, u32, i64)]) -> BTreeMap<Vec<u8>, Src> {
    files
        .iter()
        .map(|(p, d, m, t)| {
            let s = Src {
                data: d.clone(),
                fields: None,
                attrs: Some((*m, *t)),
            };
            (p.clone(), s)
        })
        .collect()
}

/// The `files` vector's source: 2,000 small files under three classes in nested directories
/// (several namespace pages, a snapshot of two blocks), some compressible (zstd records), an
/// empty file, a name that is not UTF-8, a file at the top (no label), modes and mtimes
/// before and after 1970.
fn files_source() -> Vec<(Vec<u8>, Vec<u8>, u32, i64)> {
    let modes = [0o644, 0o600, 0o755, 0o444, 0o4755];
    let mut v: Vec<(Vec<u8>, Vec<u8>, u32, i64)> = (0..2000u64)
        .map(|i| {
            let class = ["alpha", "beta", "gamma"][(i % 3) as usize];
            let path = format!("{class}/d{:02}/sample-{i:06}.bin", i % 17);
            let data = match i % 100 {
                0 => format!("compressible text {i} ").repeat(120).into_bytes(),
                _ => bytes(i, (i % 23) as usize + 1),
            };
            let mtime = 1_700_000_000_123_456_789 - (i as i64) * 1_000_003_007;
            (path.into_bytes(), data, modes[(i % 5) as usize], mtime)
        })
        .collect();
    v.push((
        b"README".to_vec(),
        b"at the top: no label\n".to_vec(),
        0o644,
        -86_400_000_000_001,
    ));
    v.push((b"beta/empty.bin".to_vec(), Vec::new(), 0o600, 0));
    v.push((b"beta/caf\xe9.bin".to_vec(), b"latin-1".to_vec(), 0o644, -1));
    v
}

/// (key, fields, label name) of the `fields` vector: every field type, labels by name, a
/// sample without some fields.
type FieldSample = (String, Vec<(String, String, Vec<u8>)>, &'static str);

fn fields_source() -> Vec<FieldSample> {
    let npy = {
        let head = b"{'descr': '<u1', 'fortran_order': False, 'shape': (3,), }";
        let mut h = b"\x93NUMPY\x01\x00".to_vec();
        let pad = 64 - (10 + head.len() + 1) % 64;
        h.extend_from_slice(&((head.len() + pad + 1) as u16).to_le_bytes());
        h.extend_from_slice(head);
        h.extend(std::iter::repeat_n(b' ', pad));
        h.push(b'\n');
        h.extend_from_slice(&[1, 2, 3]);
        h
    };
    (0..30u32)
        .map(|i| {
            let f = |n: &str, t: &str, b: Vec<u8>| (n.to_string(), t.to_string(), b);
            let arr: Vec<u8> = (0..6)
                .flat_map(|k| (i as f32 * 0.5 + k as f32).to_le_bytes())
                .collect();
            let mut fields = vec![
                f("arr", "ndarray:float32:2,3", arr),
                f(
                    "meta",
                    "json",
                    format!("{{\"i\": {i}, \"tags\": [\"x\", null]}}").into_bytes(),
                ),
                f(
                    "n",
                    "int",
                    (i as i64 * 1_000_000_007 - 9).to_le_bytes().to_vec(),
                ),
                f(
                    "png",
                    "image:png",
                    [&b"\x89PNG\r\n\x1a\n"[..], &bytes(i as u64, 40)].concat(),
                ),
                f("raw", "bytes", bytes(100 + i as u64, (i % 7) as usize)),
                f(
                    "scalar",
                    "ndarray:int16:",
                    (i as i16 - 15).to_le_bytes().to_vec(),
                ),
                f("tensor", "npy", npy.clone()),
                f(
                    "txt",
                    "str",
                    format!("caption {i} \u{e9}\u{4e2d}").into_bytes(),
                ),
            ];
            if i % 4 == 3 {
                fields.retain(|(n, _, _)| n != "png" && n != "raw");
            }
            (
                format!("part{}/k{i:03}", i % 3),
                fields,
                ["cat", "dog", "eel"][(i % 3) as usize],
            )
        })
        .collect()
}

/// Writes vector `name` unless it exists (delete `format/testdata/NAME` to write it again).
fn write_vector(name: &str, what: &str, ds: &Path, src: &BTreeMap<Vec<u8>, Src>) {
    let dir = testdata().join(name);
    if dir.exists() {
        return;
    }
    std::fs::create_dir_all(&dir).unwrap();
    copy_dir(ds, &dir.join("dataset"));
    let v = describe(&dir.join("dataset"), what, src);
    std::fs::write(dir.join("expected.json"), json_lines(&v)).unwrap();
}

/// `v` as JSON with each array element on a line of its own: compact, and readable in a diff.
fn json_lines(v: &Value) -> String {
    let Value::Object(m) = v else { unreachable!() };
    let mut out = String::from("{\n");
    for (i, (k, x)) in m.iter().enumerate() {
        let x = match x {
            Value::Array(a) if !a.is_empty() => {
                let items: Vec<String> = a.iter().map(|e| format!("  {e}")).collect();
                format!("[\n{}\n ]", items.join(",\n"))
            }
            x => x.to_string(),
        };
        let sep = if i + 1 < m.len() { "," } else { "" };
        out.push_str(&format!(" {}: {x}{sep}\n", Value::from(k.as_str())));
    }
    out + "}\n"
}

/// The offsets a damaged variant needs, found by parsing the snapshot as SPEC.md lays it out.
struct Layout {
    /// (kind, offset, length) of every section.
    sections: Vec<(u32, usize, usize)>,
    snap: Vec<u8>,
}

impl Layout {
    fn of(ds: &Path) -> Layout {
        let snap = std::fs::read(ds.join("snapshot.gsnap")).unwrap();
        let head = granary_format::SNAPSHOT_HEADER_LEN;
        let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let sections = (0..u32_at(&snap, head) as usize)
            .map(|i| {
                let e = head + 8 + 24 * i;
                (
                    u32_at(&snap, e),
                    u64_at(&snap, e + 8) as usize,
                    u64_at(&snap, e + 16) as usize,
                )
            })
            .collect();
        Layout { sections, snap }
    }

    fn section(&self, kind: u32) -> (usize, usize) {
        let s = self.sections.iter().find(|s| s.0 == kind).expect("section");
        (s.1, s.2)
    }

    /// Where sample `s`'s entry of the namespace's id table lies.
    fn id_table_entry(&self, s: usize) -> usize {
        let (ns, _) = self.section(7);
        let u64_at =
            |o: usize| u64::from_le_bytes(self.snap[o..o + 8].try_into().unwrap()) as usize;
        let (pages, first_paths_len) = (u64_at(ns + 8), u64_at(ns + 16));
        let idtab = ns + 40 + 16 * (pages + 1) + first_paths_len;
        idtab.next_multiple_of(8) + 4 * s
    }
}

fn flip(file: &str, at: usize) -> Value {
    json!({"file": file, "op": "flip", "at": at, "mask": 1})
}

fn reseal() -> Value {
    json!({"file": "snapshot.gsnap", "op": "reseal"})
}

/// The damaged variants: what each edit must make a reader say, and when.
fn damaged_variants() -> Vec<Value> {
    let files = testdata().join("files/dataset");
    let l = Layout::of(&files);
    let snap = "snapshot.gsnap";
    let exp: Value =
        serde_json::from_slice(&std::fs::read(testdata().join("files/expected.json")).unwrap())
            .unwrap();
    let samples = exp["samples"].as_array().unwrap();
    let first_in = |chunk: u64| -> u64 {
        let chunks = exp["chunks"].as_array().unwrap();
        chunks[..chunk as usize]
            .iter()
            .map(|c| c["samples"].as_u64().unwrap())
            .sum()
    };
    let path_of = |s: u64| samples[s as usize]["path_hex"].clone();
    let (records, _) = l.section(6);
    let (ns, ns_len) = l.section(7);
    // The digest changed, the header CRC made right: only a full check sees it.
    let mut head = l.snap[..96].to_vec();
    head[60] ^= 0x80;
    let crc = crc32fast::hash(&head[..92]);
    let bad = |name: &str, base: &str, edits: Vec<Value>, error: &str, when: &str| json!({"name": name, "base": base, "edits": edits, "error": error, "when": when});
    let with = |mut v: Value, k: &str, x: Value| {
        v[k] = x;
        v
    };
    let chunk_name = |c: u32| granary_format::chunk_file_name(c);
    let s1 = first_in(1) + 2;
    vec![
        bad(
            "snapshot magic",
            "files",
            vec![flip(snap, 0)],
            "damaged",
            "open",
        ),
        bad(
            "snapshot header byte",
            "files",
            vec![flip(snap, 33)],
            "damaged",
            "open",
        ),
        bad(
            "block CRC table",
            "files",
            vec![flip(snap, l.snap.len() - 3)],
            "damaged",
            "open",
        ),
        bad(
            "section table",
            "files",
            vec![flip(snap, 96 + 8 + 8)],
            "damaged",
            "open",
        ),
        bad(
            "snapshot cut short",
            "files",
            vec![json!({"file": snap, "op": "truncate", "len": l.snap.len() - 1})],
            "damaged",
            "open",
        ),
        bad(
            "major version 1",
            "files",
            vec![json!({"file": snap, "op": "put", "at": 8, "hex": "0100"})],
            "unsupported",
            "open",
        ),
        bad(
            "major version 3",
            "files",
            vec![json!({"file": snap, "op": "put", "at": 8, "hex": "0300"})],
            "unsupported",
            "open",
        ),
        bad(
            "unknown incompatible bit",
            "files",
            vec![
                json!({"file": snap, "op": "put", "at": 13, "hex": "02"}),
                reseal(),
            ],
            "unsupported",
            "open",
        ),
        with(
            bad(
                "namespace page",
                "files",
                vec![flip(snap, ns + ns_len - 40)],
                "damaged",
                "lookup",
            ),
            "path_hex",
            path_of(samples.len() as u64 - 1),
        ),
        with(
            bad(
                "record CRC in the snapshot, resealed",
                "files",
                vec![flip(snap, records + 16 * s1 as usize + 8), reseal()],
                "damaged",
                "read",
            ),
            "sample",
            json!(s1),
        ),
        with(
            bad(
                "tag and id table disagree, resealed",
                "files",
                {
                    let (a, b) = (l.id_table_entry(5), l.id_table_entry(6));
                    vec![
                        json!({"file": snap, "op": "put", "at": a, "hex": hex(&l.snap[b..b + 4])}),
                        json!({"file": snap, "op": "put", "at": b, "hex": hex(&l.snap[a..a + 4])}),
                        reseal(),
                    ]
                },
                "damaged",
                "lookup",
            ),
            "path_hex",
            path_of(5),
        ),
        bad(
            "content digest",
            "files",
            vec![
                json!({"file": snap, "op": "put", "at": 60, "hex": hex(&head[60..61])}),
                json!({"file": snap, "op": "put", "at": 92, "hex": hex(&crc.to_le_bytes())}),
            ],
            "damaged",
            "verify",
        ),
        with(
            bad(
                "record byte",
                "files",
                vec![flip(&chunk_name(1), 64 + 5)],
                "damaged",
                "read",
            ),
            "sample",
            json!(first_in(1)),
        ),
        with(
            bad(
                "chunk cut short",
                "files",
                vec![json!({"file": chunk_name(2), "op": "truncate", "len": 100})],
                "damaged",
                "read",
            ),
            "sample",
            json!(first_in(2)),
        ),
        with(
            bad(
                "chunk missing",
                "files",
                vec![json!({"file": chunk_name(0), "op": "delete"})],
                "missing",
                "read",
            ),
            "sample",
            json!(0),
        ),
        bad(
            "chunk of other bytes with the same CRC-32s",
            "files",
            {
                // Five bytes of a raw record changed so that its CRC-32, and so the chunk's,
                // stay: only the chunk's digest says it is not the chunk the snapshot lists.
                let d = granary::Dataset::open(&files).unwrap();
                let e = (0..d.len())
                    .map(|s| d.sample(s).unwrap().entry)
                    .find(|e| e.flags == 0 && e.stored_len >= 16)
                    .expect("a raw record");
                let c = std::fs::read(files.join(chunk_name(e.chunk))).unwrap();
                let (at, len) = (e.offset as usize, e.stored_len as usize);
                let fix = granary_format::testing::crc_preserving_fix(len, 0, 8);
                let mut forged = c[at..at + len].to_vec();
                forged[0] ^= 1;
                for (k, b) in fix.iter().enumerate() {
                    forged[8 + k] ^= b;
                }
                assert_eq!(crc32fast::hash(&forged), crc32fast::hash(&c[at..at + len]));
                vec![
                    json!({"file": chunk_name(e.chunk), "op": "put", "at": at, "hex": hex(&forged[..12])}),
                ]
            },
            "damaged",
            "verify",
        ),
        with(
            bad(
                "chunks swapped",
                "files",
                vec![json!({"file": chunk_name(2), "op": "copy_from", "from": chunk_name(1)})],
                "damaged",
                "read",
            ),
            "sample",
            json!(first_in(2)),
        ),
        bad(
            "ATTRS with FIELDS, resealed",
            "fields",
            vec![
                json!({"file": snap, "op": "put", "at": 12, "hex": "03"}),
                reseal(),
            ],
            "damaged",
            "open",
        ),
        with(
            bad(
                "field byte",
                "fields",
                vec![flip(&chunk_name(0), 64 + 3)],
                "damaged",
                "read",
            ),
            "sample",
            json!(0),
        ),
        with(
            bad(
                "field-group bit without fields, resealed",
                "files",
                vec![
                    json!({"file": snap, "op": "put", "at": records + 16 * 3 + 6, "hex": "10"}),
                    reseal(),
                ],
                "damaged",
                "read",
            ),
            "sample",
            json!(3),
        ),
        with(
            bad(
                "compression code 2, resealed",
                "files",
                vec![
                    json!({"file": snap, "op": "put", "at": records + 16 * 4 + 6, "hex": "02"}),
                    reseal(),
                ],
                "damaged",
                "read",
            ),
            "sample",
            json!(4),
        ),
        with(
            bad(
                "unknown chunk feature bit, header CRC made right",
                "files",
                {
                    // A chunk of a snapshot whose features the reader knows cannot hold more:
                    // damage, not a newer format.
                    let c = std::fs::read(files.join(chunk_name(1))).unwrap();
                    let mut h = c[..64].to_vec();
                    h[11] |= 0x80;
                    let crc = crc32fast::hash(&h[..60]);
                    vec![
                        json!({"file": chunk_name(1), "op": "put", "at": 11, "hex": hex(&h[11..12])}),
                        json!({"file": chunk_name(1), "op": "put", "at": 60, "hex": hex(&crc.to_le_bytes())}),
                    ]
                },
                "damaged",
                "read",
            ),
            "sample",
            json!(first_in(1)),
        ),
        bad(
            "unknown type descriptor, resealed",
            "fields",
            {
                // The fields section's types table: "str" (txt's type) becomes "stx".
                let f = Layout::of(&testdata().join("fields/dataset"));
                let (fs, len) = f.section(5);
                let at = f.snap[fs..fs + len]
                    .windows(3)
                    .position(|w| w == b"str")
                    .expect("a str type")
                    + fs;
                vec![
                    json!({"file": snap, "op": "put", "at": at + 2, "hex": "78"}),
                    reseal(),
                ]
            },
            "damaged",
            "open",
        ),
        with(
            bad(
                "a field named twice, resealed",
                "fields",
                {
                    // Sample 0's second field entry names its first entry's field.
                    let f = Layout::of(&testdata().join("fields/dataset"));
                    let (fs, _) = f.section(5);
                    let u64_at =
                        |o: usize| u64::from_le_bytes(f.snap[o..o + 8].try_into().unwrap());
                    let n = u64_at(32) as usize;
                    let index =
                        fs + (32 + u64_at(fs + 16) + u64_at(fs + 24)).next_multiple_of(8) as usize;
                    let entries = index + 8 * (n + 1);
                    let first = hex(&f.snap[entries..entries + 4]);
                    vec![
                        json!({"file": snap, "op": "put", "at": entries + 16, "hex": first}),
                        reseal(),
                    ]
                },
                "damaged",
                "read",
            ),
            "sample",
            json!(0),
        ),
        with(
            bad(
                "appended chunk missing",
                "appended",
                vec![json!({"file": chunk_name(2), "op": "delete"})],
                "missing",
                "read",
            ),
            "sample",
            {
                let e: Value = serde_json::from_slice(
                    &std::fs::read(testdata().join("appended/expected.json")).unwrap(),
                )
                .unwrap();
                let c = e["chunks"].as_array().unwrap();
                json!(c[..2]
                    .iter()
                    .map(|c| c["samples"].as_u64().unwrap())
                    .sum::<u64>())
            },
        ),
    ]
    .into_iter()
    .chain(deleted_variants())
    .chain(compacted_variants())
    .collect()
}

/// The damaged variants of the deletions section (SPEC §6.8) and of what it says of the
/// namespace, on the `deleted` vector.
fn deleted_variants() -> Vec<Value> {
    let snap = "snapshot.gsnap";
    let l = Layout::of(&testdata().join("deleted/dataset"));
    let exp: Value =
        serde_json::from_slice(&std::fs::read(testdata().join("deleted/expected.json")).unwrap())
            .unwrap();
    let ids = |k: &str| -> Vec<u64> {
        exp[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["id"].as_u64().unwrap())
            .collect()
    };
    let (gone, live) = (ids("deleted"), ids("samples"));
    assert!(gone.len() >= 2);
    let path_of = |s: u64| {
        let x = exp["samples"].as_array().unwrap().iter();
        x.clone().find(|x| x["id"] == s).unwrap()["path_hex"].clone()
    };
    let (dels, _) = l.section(8);
    let entry = |k: usize| dels + 8 + 8 * k;
    let u32_hex = |x: u64| hex(&(x as u32).to_le_bytes());
    let bad = |name: &str, edits: Vec<Value>, when: &str| json!({"name": name, "base": "deleted", "edits": edits, "error": "damaged", "when": when});
    // A live sample that can take a deleted one's place in the rising list.
    let (k, x) = (0..gone.len())
        .flat_map(|k| live.iter().map(move |&x| (k, x)))
        .find(|&(k, x)| (k == 0 || gone[k - 1] < x) && gone.get(k + 1).is_none_or(|&next| x < next))
        .expect("a live sample between two deleted ones");
    let (slot, other) = (
        l.id_table_entry(gone[0] as usize),
        l.id_table_entry(live[0] as usize),
    );
    let mut incompat = l.snap[12];
    incompat &= !(granary_format::features::DELETIONS as u8);
    vec![
        bad("deletions section byte", vec![flip(snap, entry(0))], "open"),
        bad(
            "deleted samples not rising, resealed",
            vec![
                json!({"file": snap, "op": "put", "at": entry(0), "hex": hex(&l.snap[entry(1)..entry(1) + 4])}),
                json!({"file": snap, "op": "put", "at": entry(1), "hex": hex(&l.snap[entry(0)..entry(0) + 4])}),
                reseal(),
            ],
            "open",
        ),
        bad(
            "deleted sample past the sample count, resealed",
            vec![
                json!({"file": snap, "op": "put", "at": entry(gone.len() - 1), "hex": u32_hex(u32::MAX as u64 - 1)}),
                reseal(),
            ],
            "open",
        ),
        bad(
            "deleted by a generation past the lineage's, resealed",
            vec![
                json!({"file": snap, "op": "put", "at": entry(0) + 4, "hex": u32_hex(exp["generation"].as_u64().unwrap() + 1)}),
                reseal(),
            ],
            "open",
        ),
        bad(
            "deleted by generation 0, resealed",
            vec![
                json!({"file": snap, "op": "put", "at": entry(0) + 4, "hex": u32_hex(0)}),
                reseal(),
            ],
            "open",
        ),
        bad(
            "deletion count past the section, resealed",
            vec![
                json!({"file": snap, "op": "put", "at": dels, "hex": hex(&(gone.len() as u64 + 1).to_le_bytes())}),
                reseal(),
            ],
            "open",
        ),
        bad(
            "DELETIONS cleared, the deletions section kept, resealed",
            vec![
                json!({"file": snap, "op": "put", "at": 12, "hex": hex(&[incompat])}),
                reseal(),
            ],
            "open",
        ),
        with_key(
            bad(
                "a sample listed deleted keeps its entry, resealed",
                vec![
                    json!({"file": snap, "op": "put", "at": entry(k), "hex": u32_hex(x)}),
                    reseal(),
                ],
                "lookup",
            ),
            "path_hex",
            path_of(x),
        ),
        bad(
            "a deleted sample's id table slot names an entry, resealed",
            vec![
                json!({"file": snap, "op": "put", "at": slot, "hex": hex(&l.snap[other..other + 4])}),
                reseal(),
            ],
            "verify",
        ),
    ]
}

/// The damaged variants of the revisions section (SPEC §6.9), of the chunk files it names
/// (§2) and of the removed flag (§6.6), on the `compacted` vector.
fn compacted_variants() -> Vec<Value> {
    let snap = "snapshot.gsnap";
    let ds = testdata().join("compacted/dataset");
    let l = Layout::of(&ds);
    let s = granary_format::Snapshot::open(l.snap.clone()).unwrap();
    let exp: Value =
        serde_json::from_slice(&std::fs::read(testdata().join("compacted/expected.json")).unwrap())
            .unwrap();
    let revisions: Vec<u32> = exp["revisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(revisions, s.revisions());
    let name = |c: u32, r: u32| granary_format::chunk_file_name_at(c, r);
    let flags = |id: u64| u32::from(s.record(id).unwrap().flags);
    let removed = |id: u64| flags(id) & granary_format::FLAG_REMOVED != 0;
    let live = |c: u32| -> u64 { live_of(&s, c)[0] };
    // The first chunk at revision `r` with a live sample.
    let at = |r: u32| -> u32 {
        (0..s.chunk_count() as u32)
            .find(|&c| revisions[c as usize] == r && !live_of(&s, c).is_empty())
            .unwrap_or_else(|| panic!("a chunk at revision {r} with a live sample"))
    };
    let (c2, c1) = (at(2), at(1));
    let (rev, _) = l.section(9);
    let (records, _) = l.section(6);
    let flag_at = |id: u64| records + 16 * id as usize + 6;
    let put_flags = |id: u64| {
        let f = (flags(id) | granary_format::FLAG_REMOVED) as u16;
        json!({"file": snap, "op": "put", "at": flag_at(id), "hex": hex(&f.to_le_bytes())})
    };
    // A sample deleted after the last compaction: its record is still in its chunk.
    let kept = s
        .deleted()
        .iter()
        .copied()
        .find(|&id| !removed(id))
        .expect("a deleted sample whose record is kept");
    let live_in_compacted = live(c1);
    let mut incompat = l.snap[12];
    incompat &= !(granary_format::features::REVISIONS as u8);
    let bad = |name: &str, edits: Vec<Value>, error: &str, when: &str| json!({"name": name, "base": "compacted", "edits": edits, "error": error, "when": when});
    let read = |v: Value, id: u64| with_key(v, "sample", json!(id));
    vec![
        bad(
            "revisions section byte",
            vec![flip(snap, rev + 4 * c2 as usize)],
            "damaged",
            "open",
        ),
        bad(
            "REVISIONS cleared, the revisions section kept, resealed",
            vec![
                json!({"file": snap, "op": "put", "at": 12, "hex": hex(&[incompat])}),
                reseal(),
            ],
            "damaged",
            "open",
        ),
        read(
            bad(
                "a revision 2 chunk file renamed to revision 1",
                vec![
                    json!({"file": name(c2, 1), "op": "copy_from", "from": name(c2, 2)}),
                    json!({"file": name(c2, 2), "op": "delete"}),
                ],
                "missing",
                "read",
            ),
            live(c2),
        ),
        read(
            bad(
                "a revision 1 chunk file renamed to the name of revision 0",
                vec![
                    json!({"file": name(c1, 0), "op": "copy_from", "from": name(c1, 1)}),
                    json!({"file": name(c1, 1), "op": "delete"}),
                ],
                "missing",
                "read",
            ),
            live(c1),
        ),
        read(
            bad(
                "the revision 2 chunk file missing",
                vec![json!({"file": name(c2, 2), "op": "delete"})],
                "missing",
                "read",
            ),
            live(c2),
        ),
        read(
            bad(
                "removed flag on a live sample, resealed",
                vec![put_flags(live_in_compacted), reseal()],
                "damaged",
                "read",
            ),
            live_in_compacted,
        ),
        bad(
            "removed flag on a deleted sample whose record has bytes, resealed",
            vec![put_flags(kept), reseal()],
            "damaged",
            "verify",
        ),
    ]
}

fn with_key(mut v: Value, k: &str, x: Value) -> Value {
    v[k] = x;
    v
}

/// Writes `format/testdata`: every vector not there yet, and `damaged.json`.
#[test]
#[ignore = "writes the test vectors; run only when the format changes"]
fn write_vectors() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    std::fs::create_dir_all(testdata()).unwrap();

    // files: a packed tree (ATTRS, labels, raw and zstd records, pages, two blocks).
    let files = files_source();
    tree(
        &t.join("files"),
        &files,
        &["gamma/empty", "gamma/empty/deeper"],
    );
    pack(
        &t.join("files"),
        &t.join("files.ds"),
        &["--chunk-size", "16KiB", "--seed", "1"],
    );
    write_vector(
        "files",
        "a packed tree: labels from the first directory, raw and zstd \
                  records, file modes and mtimes, empty directories, several pages and blocks",
        &t.join("files.ds"),
        &as_src(&files),
    );

    // appended: generation 2.
    let gen = |g: u32, n: u32, classes: &[&str]| -> Vec<(Vec<u8>, Vec<u8>, u32, i64)> {
        (0..n)
            .map(|i| {
                let c = classes[(i as usize) % classes.len()];
                let p = format!("{c}/g{g}-{i:03}.txt").into_bytes();
                (
                    p,
                    format!("generation {g} sample {i}\n").into_bytes(),
                    0o640,
                    1_600_000_000_000_000_000 + i as i64,
                )
            })
            .collect()
    };
    let (g0, g1, g2) = (
        gen(0, 24, &["a", "b"]),
        gen(1, 10, &["b"]),
        gen(2, 6, &["a", "b"]),
    );
    let mut all = Vec::new();
    for (g, files) in [&g0, &g1, &g2].into_iter().enumerate() {
        let src = t.join(format!("app{g}"));
        tree(&src, files, &[]);
        let ds = t.join("appended.ds");
        match g {
            0 => drop(run_ok([
                "pack".as_ref(),
                src.as_os_str(),
                "-o".as_ref(),
                ds.as_os_str(),
                "--chunk-size".as_ref(),
                "512".as_ref(),
                "--seed".as_ref(),
                "1".as_ref(),
            ])),
            _ => drop(run_ok([
                "append".as_ref(),
                ds.as_os_str(),
                src.as_os_str(),
                "--chunk-size".as_ref(),
                "512".as_ref(),
                "--seed".as_ref(),
                "1".as_ref(),
            ])),
        }
        all.extend(files.iter().cloned());
    }
    write_vector(
        "appended",
        "generation 2: two appends after a pack (an append keeps the class table)",
        &t.join("appended.ds"),
        &as_src(&all),
    );

    // sharded: three shards merged (empty chunks where a shard had fewer).
    let sh: Vec<(Vec<u8>, Vec<u8>, u32, i64)> = (0..90u64)
        .map(|i| {
            let size = if i < 60 { 700 } else { 20 };
            (
                format!("s/{i:03}").into_bytes(),
                bytes(i, size),
                0o644,
                1_000_000_000 * i as i64,
            )
        })
        .collect();
    tree(&t.join("sh"), &sh, &[]);
    for i in 0..3 {
        pack(
            &t.join("sh"),
            &t.join("sharded.ds"),
            &[
                "--chunk-size",
                "2KiB",
                "--seed",
                "1",
                "--compress",
                "none",
                "--shard",
                &format!("{i}/3"),
            ],
        );
    }
    run_ok(["merge".as_ref(), t.join("sharded.ds").as_os_str()]);
    write_vector(
        "sharded",
        "three shards merged: empty chunks",
        &t.join("sharded.ds"),
        &as_src(&sh),
    );

    // fields: typed fields written by the writer API, labels by name.
    let mut o = granary_packer::WriterOptions::new(t.join("fields.ds"));
    o.output.chunk_size = 1024;
    o.output.seed = 1;
    let mut w = granary_packer::Writer::create(o).unwrap();
    let mut fsrc = BTreeMap::new();
    for (key, fields, label) in fields_source() {
        for (n, ty, _) in &fields {
            w.declare_field_type(n.as_bytes(), ty).unwrap();
        }
        let f = fields
            .iter()
            .map(|(n, _, b)| (n.as_bytes().to_vec(), b.clone()))
            .collect();
        w.write_fields(
            key.as_bytes(),
            f,
            granary_packer::Label::Name(label.as_bytes()),
        )
        .unwrap();
        let data = fields.iter().flat_map(|f| f.2.clone()).collect();
        fsrc.insert(
            key.into_bytes(),
            Src {
                data,
                fields: Some(fields),
                attrs: None,
            },
        );
    }
    w.finish().unwrap();
    write_vector(
        "fields",
        "field groups of every type, labels by class name, several chunks",
        &t.join("fields.ds"),
        &fsrc,
    );

    // webdataset: a tar import, labels from `cls` as class indexes.
    let members: Vec<(String, Vec<u8>)> = (0..12u32)
        .flat_map(|i| {
            [
                (
                    format!("shard/k{i:02}.cls"),
                    format!("{}", i % 4).into_bytes(),
                ),
                (
                    format!("shard/k{i:02}.jpg"),
                    [&b"\xff\xd8\xff"[..], &bytes(i as u64, 30)].concat(),
                ),
            ]
        })
        .collect();
    write_tar(&t.join("wds.tar"), &members);
    import_tar(&t.join("wds.tar"), &t.join("wds.ds"), &["--seed", "1"]);
    let wsrc = (0..12u32)
        .map(|i| {
            let cls = format!("{}", i % 4).into_bytes();
            let jpg = [&b"\xff\xd8\xff"[..], &bytes(i as u64, 30)].concat();
            let fields = vec![
                ("cls".to_string(), "bytes".to_string(), cls.clone()),
                ("jpg".to_string(), "image:jpeg".to_string(), jpg.clone()),
            ];
            let key = format!("shard/k{i:02}").into_bytes();
            (
                key,
                Src {
                    data: [cls, jpg].concat(),
                    fields: Some(fields),
                    attrs: None,
                },
            )
        })
        .collect();
    write_vector(
        "webdataset",
        "a WebDataset tar imported: fields, labels from cls",
        &t.join("wds.ds"),
        &wsrc,
    );

    // untyped: chunks without feature bit 2 (written by granary 0.1.0, declaring no field
    // types: every field is `bytes`), the golden dataset of them with its source.
    let mut usrc: BTreeMap<Vec<u8>, Src> = BTreeMap::new();
    // Fields in the order the tar listed them (which is the order the records keep).
    for (name, data) in crate::golden::golden_members_1_3() {
        let dot = name.iter().rposition(|&b| b == b'.').unwrap();
        let (key, field) = (
            name[..dot].to_vec(),
            String::from_utf8(name[dot + 1..].to_vec()).unwrap(),
        );
        let s = usrc.entry(key).or_insert(Src {
            data: Vec::new(),
            fields: Some(Vec::new()),
            attrs: None,
        });
        s.data.extend_from_slice(&data);
        s.fields
            .as_mut()
            .unwrap()
            .push((field, "bytes".to_string(), data));
    }
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v2-fields/dataset");
    write_vector(
        "untyped",
        "field groups in chunks without feature bit 2 (no declared types)",
        &golden,
        &usrc,
    );

    // empty: zero samples in one empty chunk that lists directories (pack and the writer
    // refuse to make a dataset of nothing; the format's own writers make it).
    let id = [0x5a; 16];
    let mut c = granary_format::ChunkWriter::with_attrs(Vec::new(), id, 0).unwrap();
    let dir = |p: &str, mode, mtime_ns| {
        (
            p.as_bytes().to_vec(),
            granary_format::FileAttrs { mode, mtime_ns },
        )
    };
    c.dirs(vec![
        dir("one", 0o755, 7),
        dir("one/two", 0o700, -7),
        dir("three", 0o555, 0),
    ])
    .unwrap();
    let (bytes, summary) = c.finish::<&[u8]>(&[]).unwrap();
    let e = t.join("empty.ds");
    std::fs::create_dir_all(&e).unwrap();
    std::fs::write(e.join(granary_format::chunk_file_name(0)), bytes).unwrap();
    let mut b = granary_format::SnapshotBuilder::new(id, vec![]);
    b.push_chunk(&summary).unwrap();
    std::fs::write(e.join(granary_format::SNAPSHOT_FILE), b.build().unwrap()).unwrap();
    write_vector(
        "empty",
        "zero samples: one empty chunk listing three directories",
        &e,
        &BTreeMap::new(),
    );

    deleted_vectors(t);
    compacted_vectors(t);
    write_damaged();
}

/// The `deleted` and `compacted` vectors' source: 40 files under two classes (raw and zstd
/// records), the only file of `gone`, a file at the top.
fn deleted_source() -> Vec<(Vec<u8>, Vec<u8>, u32, i64)> {
    let mut files: Vec<(Vec<u8>, Vec<u8>, u32, i64)> = (0..40u64)
        .map(|i| {
            let class = ["x", "y"][(i % 2) as usize];
            let data = match i % 5 {
                0 => format!("compressible line {i} ").repeat(60).into_bytes(),
                _ => bytes(1000 + i, 100 + (i as usize * 13) % 200),
            };
            let mtime = 1_650_000_000_000_000_000 + i as i64 * 1_000_001;
            let mode = [0o644, 0o600][(i % 2) as usize];
            (
                format!("{class}/f{i:03}.dat").into_bytes(),
                data,
                mode,
                mtime,
            )
        })
        .collect();
    files.push((
        b"gone/only.dat".to_vec(),
        b"deleted first\n".to_vec(),
        0o644,
        5,
    ));
    files.push((b"top.txt".to_vec(), b"no label\n".to_vec(), 0o640, -5));
    files
}

/// The vectors with deletions (SPEC §6.8): `deleted`, a packed tree of which samples were
/// deleted in two generations, and `deleted-fields`, field groups of which a whole directory's
/// were deleted.
fn deleted_vectors(t: &Path) {
    // deleted: ATTRS, raw and zstd records, several chunks; generation 1 deletes a compressed
    // record, the only file of `gone` (whose directory stays, empty) and one more; generation 2
    // every sample of a chunk (which then holds no live sample).
    let files = deleted_source();
    tree(&t.join("del"), &files, &[]);
    let ds = t.join("deleted.ds");
    let (first, second, paths) = pack_to_delete(&t.join("del"), &ds);
    granary_packer::delete(&ds, &first, &granary_store::StoreConfig::default()).unwrap();
    granary_packer::delete(&ds, &second, &granary_store::StoreConfig::default()).unwrap();
    let gone: Vec<&Vec<u8>> = first.iter().chain(&second).map(|id| &paths[id]).collect();
    let live: Vec<_> = files
        .iter()
        .filter(|f| !gone.contains(&&f.0))
        .cloned()
        .collect();
    write_vector(
        "deleted",
        "generation 2: samples deleted twice after a pack (a zstd record, a directory's only \
         file, a whole chunk's samples)",
        &ds,
        &as_src(&live),
    );

    // deleted-fields: field groups, every sample under part2/ deleted (the directory stays,
    // an ancestor of the deleted samples' paths the chunks still hold).
    let ds = t.join("deleted-fields.ds");
    let fsrc = write_fields_to_delete(&ds);
    let ids = part2_ids(&ds);
    granary_packer::delete(&ds, &ids, &granary_store::StoreConfig::default()).unwrap();
    write_vector(
        "deleted-fields",
        "generation 1: field groups, every sample of a directory deleted",
        &ds,
        &fsrc,
    );
}

/// Packs `src` (the `deleted` source) to `ds` and chooses what the `deleted` vector deletes:
/// (a zstd record, `gone/only.dat` and one more; every sample of a chunk of two samples or more,
/// none of those; every sample's path).
fn pack_to_delete(src: &Path, ds: &Path) -> (Vec<u64>, Vec<u64>, BTreeMap<u64, Vec<u8>>) {
    let o = pack(src, ds, &["--chunk-size", "1KiB", "--seed", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let d = granary::Dataset::open(ds).unwrap();
    let zstd = (0..d.len())
        .find(|&id| d.sample(id).unwrap().compression == granary_format::Compression::Zstd)
        .expect("a zstd record");
    let gone = d.lookup(b"gone/only.dat").unwrap().unwrap();
    let mut first = vec![zstd, gone, (zstd + 3) % d.len()];
    first.sort_unstable();
    first.dedup();
    let chunks = d.snapshot().chunks();
    let c = chunks
        .iter()
        .find(|c| c.sample_count >= 2 && !c.samples().any(|id| first.contains(&id)))
        .expect("a chunk of two samples or more, none deleted yet");
    let second: Vec<u64> = c.samples().collect();
    let paths: BTreeMap<u64, Vec<u8>> = (0..d.len()).map(|id| (id, d.path(id).unwrap())).collect();
    (first, second, paths)
}

/// Writes the `deleted-fields` vector's 12 field groups (keys under part0..part2, chunks of
/// one or two) to `ds`; returns the source of those not under part2/ (which are deleted).
fn write_fields_to_delete(ds: &Path) -> BTreeMap<Vec<u8>, Src> {
    let mut o = granary_packer::WriterOptions::new(ds.to_path_buf());
    o.output.chunk_size = 64;
    o.output.seed = 1;
    let mut w = granary_packer::Writer::create(o).unwrap();
    let mut fsrc = BTreeMap::new();
    for i in 0..12u32 {
        let key = format!("part{}/k{i:02}", i % 3);
        let fields = vec![
            (
                "n".to_string(),
                "int".to_string(),
                (i as i64 - 6).to_le_bytes().to_vec(),
            ),
            (
                "txt".to_string(),
                "str".to_string(),
                format!("sample {i}").into_bytes(),
            ),
        ];
        for (n, ty, _) in &fields {
            w.declare_field_type(n.as_bytes(), ty).unwrap();
        }
        let f = fields
            .iter()
            .map(|(n, _, b)| (n.as_bytes().to_vec(), b.clone()))
            .collect();
        let label = ["p", "q"][(i % 2) as usize];
        w.write_fields(
            key.as_bytes(),
            f,
            granary_packer::Label::Name(label.as_bytes()),
        )
        .unwrap();
        if i % 3 != 2 {
            let data = fields.iter().flat_map(|f| f.2.clone()).collect();
            let s = Src {
                data,
                fields: Some(fields),
                attrs: None,
            };
            fsrc.insert(key.into_bytes(), s);
        }
    }
    w.finish().unwrap();
    fsrc
}

fn part2_ids(ds: &Path) -> Vec<u64> {
    let d = granary::Dataset::open(ds).unwrap();
    let ids: Vec<u64> = (0..d.len())
        .filter(|&id| d.path(id).unwrap().starts_with(b"part2/"))
        .collect();
    assert_eq!(ids.len(), 4);
    ids
}

/// Compacts `ds` as `granary compact --all --grace 0` does: every chunk keeping a deleted
/// sample's record rewritten, the files replaced removed at once.
fn compact_all(ds: &Path) -> granary_packer::CompactSummary {
    let o = granary_packer::CompactOptions {
        all: true,
        grace: std::time::Duration::ZERO,
        ..Default::default()
    };
    granary_packer::compact(ds, &o, &granary_store::StoreConfig::default()).unwrap()
}

/// Chunk `c`'s samples that are not deleted.
fn live_of(snap: &granary_format::Snapshot<Vec<u8>>, c: u32) -> Vec<u64> {
    let ce = snap.chunk(c as u64).unwrap();
    ce.samples()
        .filter(|&id| snap.deleted_by(id).is_none())
        .collect()
}

/// The vectors of compacted chunks (SPEC §6.9, REVISIONS; §6.6, the removed flag).
fn compacted_vectors(t: &Path) {
    // compacted: the `deleted` vector's two generations of deletions (a whole chunk's samples
    // among them: its new file holds no record), then generation 3 compacts every chunk that
    // keeps a deleted record (revision 1); generation 4 deletes a sample of a chunk at revision
    // 1, generation 5 compacts it again (revision 2); generation 6 deletes one more sample, whose
    // record stays (deleted, not removed). Replaced files are removed at once (grace 0).
    let files = deleted_source();
    tree(&t.join("cmp"), &files, &[]);
    let ds = t.join("compacted.ds");
    let (first, second, paths) = pack_to_delete(&t.join("cmp"), &ds);
    granary_packer::delete(&ds, &first, &granary_store::StoreConfig::default()).unwrap();
    granary_packer::delete(&ds, &second, &granary_store::StoreConfig::default()).unwrap();
    let s = compact_all(&ds);
    assert_eq!(s.generation, Some(3));
    assert!(s.chunks_rewritten >= 2 && s.files_waiting.is_empty());
    let snapshot = |ds: &Path| {
        let b = std::fs::read(ds.join(granary_format::SNAPSHOT_FILE)).unwrap();
        granary_format::Snapshot::open(b).unwrap()
    };
    let snap = snapshot(&ds);
    // A chunk at revision 1 with three live samples or more: one is deleted now, one later.
    let c = (0..snap.chunk_count() as u32)
        .find(|&c| snap.revision(c) == 1 && live_of(&snap, c).len() >= 3)
        .expect("a compacted chunk of three live samples");
    let third = vec![live_of(&snap, c)[0]];
    granary_packer::delete(&ds, &third, &granary_store::StoreConfig::default()).unwrap();
    let s = compact_all(&ds);
    assert_eq!((s.generation, s.chunks_rewritten), (Some(5), 1));
    assert_eq!(s.files_removed.len(), 1);
    let snap = snapshot(&ds);
    assert_eq!(snap.revision(c), 2);
    let fourth = vec![live_of(&snap, c)[0]];
    granary_packer::delete(&ds, &fourth, &granary_store::StoreConfig::default()).unwrap();
    let snap = snapshot(&ds);
    assert_eq!(snap.lineage().generation, 6);
    // The dataset's files are the snapshot and the revision of each chunk it names.
    let mut want: Vec<String> = (0..snap.chunk_count() as u32)
        .map(|c| snap.chunk_file_name(c))
        .collect();
    want.push(granary_format::SNAPSHOT_FILE.to_string());
    want.sort();
    let mut have: Vec<String> = std::fs::read_dir(&ds)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    have.sort();
    assert_eq!(have, want);
    let removed =
        |id: u64| u32::from(snap.record(id).unwrap().flags) & granary_format::FLAG_REMOVED != 0;
    assert!(removed(third[0]) && !removed(fourth[0]));
    assert!(snap.revisions().contains(&1));
    let gone: Vec<&Vec<u8>> = [&first, &second, &third, &fourth]
        .into_iter()
        .flatten()
        .map(|id| &paths[id])
        .collect();
    let live: Vec<_> = files
        .iter()
        .filter(|f| !gone.contains(&&f.0))
        .cloned()
        .collect();
    write_vector(
        "compacted",
        "generation 6: the deleted vector compacted (revision 1), a sample deleted and its \
         chunk compacted again (revision 2), one more deleted (its record kept); replaced \
         files removed",
        &ds,
        &as_src(&live),
    );

    // compacted-fields: the deleted-fields vector compacted (field groups; the part2/
    // directory stays, though no footer holds a path under it any more).
    let ds = t.join("compacted-fields.ds");
    let fsrc = write_fields_to_delete(&ds);
    let ids = part2_ids(&ds);
    granary_packer::delete(&ds, &ids, &granary_store::StoreConfig::default()).unwrap();
    let s = compact_all(&ds);
    assert_eq!(s.generation, Some(2));
    write_vector(
        "compacted-fields",
        "generation 2: field groups, every sample of a directory deleted, then compacted",
        &ds,
        &fsrc,
    );
}

/// Writes `format/testdata/damaged.json` from the vectors as they are.
#[test]
#[ignore = "writes the damaged variants; run only when they change"]
fn write_damaged() {
    let items: Vec<String> = damaged_variants().iter().map(|v| format!(" {v}")).collect();
    let text = format!("[\n{}\n]\n", items.join(",\n"));
    std::fs::write(testdata().join("damaged.json"), text).unwrap();
}

fn vector_names() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(testdata())
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().join("expected.json").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Every vector reads as its `expected.json` says.
#[test]
fn reads_vectors() {
    let names = vector_names();
    assert!(names.len() >= 6, "{names:?}");
    for name in names {
        let dir = testdata().join(&name);
        let want: Value =
            serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
        let mut got = describe_unchecked(&dir.join("dataset"));
        got["description"] = want["description"].clone();
        assert_eq!(got, want, "vector {name}");
    }
}

/// [`describe`] without a source to check against: what this reader makes of the dataset.
fn describe_unchecked(ds: &Path) -> Value {
    let d = granary::Dataset::open_checked(ds).expect("a vector opens");
    let mut src = BTreeMap::new();
    let live = (0..d.len()).filter(|&id| d.snapshot().deleted_by(id).is_none());
    for id in live {
        let data = d.read(id).unwrap();
        let fields = d.has_fields().then(|| {
            let types: Vec<String> = d
                .snapshot()
                .field_types()
                .unwrap()
                .iter()
                .map(|t| t.descriptor())
                .collect();
            let names = d.field_names().unwrap();
            d.read_fields(id, None)
                .unwrap()
                .into_iter()
                .map(|(n, b)| {
                    let k = names.iter().position(|x| *x == &n[..]).unwrap();
                    (String::from_utf8(n).unwrap(), types[k].clone(), b)
                })
                .collect()
        });
        let attrs = d.stat(id).unwrap().attrs.map(|a| (a.mode, a.mtime_ns));
        src.insert(
            d.path(id).unwrap(),
            Src {
                data,
                fields,
                attrs,
            },
        );
    }
    describe(ds, "", &src)
}

/// Applies a variant's edits to `ds`, as `damaged.json` defines them.
fn apply(ds: &Path, edits: &[Value]) {
    for e in edits {
        let f = ds.join(e["file"].as_str().unwrap());
        let at = || e["at"].as_u64().unwrap() as usize;
        match e["op"].as_str().unwrap() {
            "flip" => {
                let mut b = std::fs::read(&f).unwrap();
                b[at()] ^= e["mask"].as_u64().unwrap() as u8;
                std::fs::write(&f, b).unwrap();
            }
            "put" => {
                let mut b = std::fs::read(&f).unwrap();
                let x = unhex(e["hex"].as_str().unwrap());
                b[at()..at() + x.len()].copy_from_slice(&x);
                std::fs::write(&f, b).unwrap();
            }
            "truncate" => {
                let file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
                file.set_len(e["len"].as_u64().unwrap()).unwrap();
            }
            "delete" => std::fs::remove_file(&f).unwrap(),
            "copy_from" => {
                std::fs::copy(ds.join(e["from"].as_str().unwrap()), &f).unwrap();
            }
            "reseal" => {
                let mut b = std::fs::read(&f).unwrap();
                reseal_snapshot(&mut b);
                std::fs::write(&f, b).unwrap();
            }
            op => panic!("unknown edit {op}"),
        }
    }
}

/// What class of error a message is, as `damaged.json` names them.
fn class_of(e: &str) -> &'static str {
    if e.contains("No such file") || e.contains("not found") {
        "missing"
    } else if e.contains("not supported by this reader") || e.contains("unknown to this reader") {
        "unsupported"
    } else {
        "damaged"
    }
}

/// Every damaged variant fails as `damaged.json` says, and not before.
#[test]
fn damaged_vectors() {
    let variants: Vec<Value> =
        serde_json::from_slice(&std::fs::read(testdata().join("damaged.json")).unwrap()).unwrap();
    assert!(variants.len() >= 15);
    for v in &variants {
        let name = v["name"].as_str().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let ds = tmp.path().join("dataset");
        copy_dir(
            &testdata().join(v["base"].as_str().unwrap()).join("dataset"),
            &ds,
        );
        apply(&ds, v["edits"].as_array().unwrap());
        let opened = granary::Dataset::open(&ds);
        let when = v["when"].as_str().unwrap();
        let err = match (when, opened) {
            ("open", Ok(_)) => panic!("{name}: opened"),
            ("open", Err(e)) => e.to_string(),
            (_, Err(e)) => panic!("{name}: did not open: {e}"),
            ("read", Ok(d)) => {
                // Reading a sample: its bytes and, with fields, each field.
                let s = v["sample"].as_u64().unwrap();
                let read = d.read(s).and_then(|_| match d.has_fields() {
                    true => d.read_fields(s, None).map(drop),
                    false => Ok(()),
                });
                read.err()
                    .unwrap_or_else(|| panic!("{name}: read {s}"))
                    .to_string()
            }
            ("lookup", Ok(d)) => {
                let p = unhex(v["path_hex"].as_str().unwrap());
                match d.lookup(&p).and_then(|id| d.read(id.expect("present"))) {
                    Ok(_) => panic!("{name}: looked up and read"),
                    Err(e) => e.to_string(),
                }
            }
            ("verify", Ok(_)) => {
                let r = granary::verify(&ds);
                assert!(!r.is_clean(), "{name}: verified");
                let p: Vec<String> = r
                    .problems
                    .iter()
                    .map(|p| format!("{}: {}", p.location, p.detail))
                    .collect();
                p.join("; ")
            }
            (w, _) => panic!("{name}: unknown when {w}"),
        };
        assert_eq!(
            class_of(&err),
            v["error"].as_str().unwrap(),
            "{name}: {err}"
        );
    }
}

/// `ls --long` shows beside a path only its own sample's sizes and class: with a tag and the id
/// table disagreeing (a damaged variant) it fails, naming the entry.
#[test]
fn a_long_listing_checks_the_id_table() {
    let variants: Vec<Value> =
        serde_json::from_slice(&std::fs::read(testdata().join("damaged.json")).unwrap()).unwrap();
    let v = variants
        .iter()
        .find(|v| v["name"] == "tag and id table disagree, resealed")
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let ds = tmp.path().join("dataset");
    copy_dir(&testdata().join("files/dataset"), &ds);
    run_ok(["ls".as_ref(), "--long".as_ref(), ds.as_os_str()]);
    apply(&ds, v["edits"].as_array().unwrap());
    let o = run(["ls".as_ref(), "--long".as_ref(), ds.as_os_str()]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stderr(&o).contains("id table"), "{}", stderr(&o));
}
