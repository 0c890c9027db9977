//! `granary pack --from webdataset`: tar shards to a dataset of samples with named fields, and
//! back to the same files; bad shards refused with the shard and member named.

use std::path::Path;

use crate::common::*;

/// One tar member: (path, bytes).
type Member = (String, Vec<u8>);

/// `shards` shards of `per` samples each: jpg, txt, (every third) json, cls; keys unique.
fn shards(dir: &Path, shards: usize, per: usize) -> Vec<Member> {
    std::fs::create_dir_all(dir).unwrap();
    let mut all = Vec::new();
    for s in 0..shards {
        let mut members = Vec::new();
        for i in 0..per {
            let key = format!("{s:02}{i:05}");
            members.push((
                format!("{key}.jpg"),
                bytes((s * 1000 + i) as u64, 300 + i * 37),
            ));
            members.push((
                format!("{key}.txt"),
                format!("a photo of thing {i}").into_bytes(),
            ));
            if i % 3 == 0 {
                members.push((
                    format!("{key}.json"),
                    format!("{{\"w\": {i}}}").into_bytes(),
                ));
            }
            members.push((format!("{key}.cls"), format!("{}", i % 5).into_bytes()));
        }
        write_tar(&dir.join(format!("shard-{s:06}.tar")), &members);
        all.extend(members);
    }
    all
}

fn pattern(dir: &Path, n: usize) -> String {
    format!("{}/shard-{{000000..{:06}}}.tar", dir.display(), n - 1)
}

#[test]
fn shards_import_as_field_samples_and_extract_to_the_same_files() {
    let t = tempfile::tempdir().unwrap();
    let members = shards(&t.path().join("shards"), 3, 120);
    let ds = t.path().join("ds");
    let o = run_ok([
        "pack",
        "--from",
        "webdataset",
        &pattern(&t.path().join("shards"), 3),
        "-o",
        ds.to_str().unwrap(),
        "--chunk-size",
        "64KiB",
        "--json",
    ]);
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["files"], 360);
    assert_eq!(s["classes"], 5);
    let info = stdout(&run_ok(["info".as_ref(), ds.as_os_str()]));
    assert!(info.contains("format         2.0"), "{info}");
    assert!(
        info.contains("fields         4: cls (bytes), jpg (image:jpeg), json (bytes), txt (bytes)"),
        "{info}"
    );
    run_ok(["verify".as_ref(), ds.as_os_str()]);
    // Extract gives back exactly the members, by name and bytes.
    let got = extracted(&ds, &t.path().join("out"));
    let want = sorted(
        members
            .iter()
            .map(|(n, d)| (n.clone().into_bytes(), d.clone()))
            .collect(),
    );
    assert_eq!(sorted(got), want);
    // ls lists the same names; cat reads one field alone; labels come from .cls.
    let ls = stdout(&run_ok(["ls".as_ref(), ds.as_os_str()]));
    assert_eq!(ls.lines().count(), members.len());
    let cat = run_ok(["cat".as_ref(), ds.as_os_str(), "0100007.txt".as_ref()]);
    assert_eq!(cat.stdout, b"a photo of thing 7");
    let long = stdout(&run_ok(["ls", ds.to_str().unwrap(), "0100007.", "--long"]));
    assert!(
        long.lines()
            .all(|l| l.split_whitespace().nth(5) == Some("2")),
        "{long}"
    );
    assert_eq!(long.lines().count(), 3, "{long}");
    // A key without its field name is not a file, and says what the sample holds.
    let o = run(["cat".as_ref(), ds.as_os_str(), "0100007".as_ref()]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("fields jpg, txt, cls"),
        "{}",
        stderr(&o)
    );
    let o = run(["cat", ds.to_str().unwrap(), "--id", "0", "--field", "nope"]);
    assert!(stderr(&o).contains("no field nope"), "{}", stderr(&o));
    // A lost snapshot is rebuilt from the chunks' fields blocks, byte for byte.
    let snap = std::fs::read(ds.join("snapshot.gsnap")).unwrap();
    std::fs::remove_file(ds.join("snapshot.gsnap")).unwrap();
    run_ok(["reindex".as_ref(), ds.as_os_str()]);
    assert_eq!(std::fs::read(ds.join("snapshot.gsnap")).unwrap(), snap);
    // Files (one blob each) cannot be appended to samples with fields: said, nothing changed.
    let more = t.path().join("more");
    write_tree(&more, &[(b"c/x".to_vec(), b"x".to_vec())]);
    let o = run(["append".as_ref(), ds.as_os_str(), more.as_os_str()]);
    assert!(stderr(&o).contains("named fields"), "{}", stderr(&o));
    assert_eq!(std::fs::read(ds.join("snapshot.gsnap")).unwrap(), snap);
}

#[test]
fn bad_shards_are_refused_naming_the_shard_and_member() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    let import = |shard: &Path, out: &str| {
        run([
            "pack",
            "--from",
            "webdataset",
            shard.to_str().unwrap(),
            "-o",
            d.join(out).to_str().unwrap(),
        ])
    };
    // A member cut short: the tar ends inside it.
    write_tar(
        &d.join("ok.tar"),
        &[("a.jpg", vec![7; 5000]), ("a.txt", b"x".to_vec())],
    );
    let full = std::fs::read(d.join("ok.tar")).unwrap();
    std::fs::write(d.join("cut.tar"), &full[..3000]).unwrap();
    let o = import(&d.join("cut.tar"), "ds1");
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("cut.tar") && stderr(&o).contains("cut short"),
        "{}",
        stderr(&o)
    );
    assert!(!d.join("ds1").exists(), "nothing published");
    // A symbolic link among the members.
    {
        let mut b = tar::Builder::new(std::fs::File::create(d.join("link.tar")).unwrap());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        h.set_cksum();
        b.append_link(&mut h, "a.jpg", "/etc/passwd").unwrap();
        b.finish().unwrap();
    }
    let o = import(&d.join("link.tar"), "ds2");
    assert!(
        stderr(&o).contains("not a regular file") && stderr(&o).contains("a.jpg"),
        "{}",
        stderr(&o)
    );
    // A member without an extension, a key with a bad field name, a key twice.
    write_tar(&d.join("noext.tar"), &[("README", b"x".to_vec())]);
    assert!(stderr(&import(&d.join("noext.tar"), "ds3")).contains("has no extension"));
    write_tar(&d.join("badname.tar"), &[("k.j pg", b"x".to_vec())]);
    assert!(stderr(&import(&d.join("badname.tar"), "ds4")).contains("not a valid field name"));
    write_tar(
        &d.join("twice.tar"),
        &[
            ("k.jpg", b"1".to_vec()),
            ("j.jpg", b"2".to_vec()),
            ("k.txt", b"3".to_vec()),
        ],
    );
    let o = import(&d.join("twice.tar"), "ds5");
    assert!(
        stderr(&o).contains("written twice") && stderr(&o).contains("\"k\""),
        "{}",
        stderr(&o)
    );
    // Not a tar at all, and a shard that does not exist.
    std::fs::write(d.join("junk.tar"), vec![0x5a; 2000]).unwrap();
    let o = import(&d.join("junk.tar"), "ds6");
    assert!(!o.status.success());
    let o = import(&d.join("missing.tar"), "ds7");
    assert!(stderr(&o).contains("missing.tar"), "{}", stderr(&o));
}

#[test]
fn an_import_killed_midway_resumes_to_the_whole_dataset() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("shards");
    let members = shards(&dir, 6, 400);
    let ds = t.path().join("ds");
    let args = |extra: &[&str]| {
        let mut a = vec![
            "pack".to_string(),
            "--from".into(),
            "webdataset".into(),
            pattern(&dir, 6),
            "-o".into(),
            ds.to_str().unwrap().into(),
            // Most samples in the spill logs, where the kill can find them.
            "--memory".into(),
            "64KiB".into(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    // Killed once the spill logs hold something (mid-import).
    let spill = t.path().join(".ds.spill");
    let child = spawn(args(&[]));
    kill_when(child, || {
        std::fs::read_dir(&spill).is_ok_and(|rd| {
            rd.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum::<u64>()
                > 200_000
        })
    });
    assert!(!ds.exists());
    let o = run(args(&[]));
    assert!(
        stderr(&o).contains("pass resume")
            || stderr(&o).contains("--resume")
            || stderr(&o).contains("resume"),
        "{}",
        stderr(&o)
    );
    run_ok(args(&["--resume"]));
    run_ok(["verify".as_ref(), ds.as_os_str()]);
    let got = extracted(&ds, &t.path().join("out"));
    assert_eq!(got.len(), members.len());
}
