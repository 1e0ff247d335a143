//! The commands a user points at files, on a real mount: `verify`,
//! `measure` and `dump_metadata` on paths through the mount and on backing
//! paths alike; nothing unverified gets exit status 0; `verify --json`,
//! `--check` lists in the format `fsverity digest`/`measure` print,
//! backing files copied without their extended attributes (found by
//! `verify`, repaired by `reattach`), `enable-offline` and detached
//! trees. The real `fsverity` is the oracle for digests and metadata.

mod common;

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::*;

/// `verityfs ARGS`, run to completion.
fn verityfs(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut cmd = Command::new(VERITYFS);
    for arg in args {
        cmd.arg(arg);
    }
    run(&mut cmd)
}

/// `text` with the first byte of its first digest (after `sha256:`)
/// changed.
fn other_digest(text: &str) -> String {
    let first = if &text[7..9] == "00" { "11" } else { "00" };
    format!("{}{first}{}", &text[..7], &text[9..])
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// Exit code, stdout, stderr.
fn outcome(out: &Output) -> (i32, String, String) {
    (
        out.status.code().unwrap(),
        text(&out.stdout),
        text(&out.stderr),
    )
}

/// `fsverity digest FILE --out-merkle-tree --out-descriptor` into `dir`
/// (`oracle.tree`, `oracle.desc`): the digest, the tree and the descriptor.
fn fsverity_metadata(dir: &Path, original: &Path) -> (String, Vec<u8>, Vec<u8>) {
    let (tree, desc) = (dir.join("oracle.tree"), dir.join("oracle.desc"));
    let out = run_ok(
        Command::new(FSVERITY)
            .arg("digest")
            .arg(original)
            .arg(format!("--out-merkle-tree={}", tree.display()))
            .arg(format!("--out-descriptor={}", desc.display())),
    );
    let digest = out.split(' ').next().unwrap().to_owned();
    (digest, fs::read(tree).unwrap(), fs::read(desc).unwrap())
}

#[test]
fn verify_measure_and_dump_metadata_work_through_the_mount_and_on_backing_files() {
    let m = Mount::new();
    verity_file(&m, "f", 300_000);
    write_file(&m, "plain", b"not verity\n");
    fs::create_dir(m.path("plain_dir")).unwrap();
    fs::create_dir(m.scratch("plain_dir")).unwrap();
    write_file(&m, "plain_dir/x", b"x");
    let (digest, tree, desc) = fsverity_metadata(&m.scratch, &m.scratch("f"));

    // measure: the same digest on both paths, fsverity's format.
    for path in [m.path("f"), m.backing("f")] {
        let (code, stdout, stderr) = outcome(&verityfs(&[&"measure", &path]));
        assert_eq!((code, stderr.as_str()), (0, ""));
        assert_eq!(stdout, format!("{digest} {}\n", path.display()));
    }
    // dump_metadata: what fsverity digest writes, on both paths.
    for path in [m.path("f"), m.backing("f")] {
        let out = verityfs(&[&"dump_metadata", &"merkle_tree", &path]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(out.stdout, tree);
        let out = verityfs(&[&"dump_metadata", &"descriptor", &path]);
        assert_eq!(out.stdout, desc);
    }

    // verify: the mount's directory, a file through it, a backing file.
    let (code, stdout, stderr) = outcome(&verityfs(&[&"verify", &m.mnt]));
    assert_eq!((code, stderr.as_str()), (0, ""), "{stdout}");
    let f = m.path("f").display().to_string();
    assert_eq!(
        stdout,
        format!("{f}: OK (74 blocks)\nverified 1 files, 0 corrupted, 2 not verity\n")
    );
    for path in [m.path("f"), m.backing("f")] {
        assert_eq!(outcome(&verityfs(&[&"verify", &path])).0, 0);
    }

    // Nothing verified is never a success.
    for path in [m.path("plain"), m.backing("plain")] {
        let (code, _, stderr) = outcome(&verityfs(&[&"verify", &path]));
        assert_eq!(code, 1);
        assert_eq!(
            stderr,
            format!("ERROR: '{}' is not a verity file\n", path.display())
        );
    }
    let (code, _, stderr) = outcome(&verityfs(&[&"verify", &m.path("plain_dir")]));
    assert_eq!(code, 1);
    assert!(stderr.contains("no verity files under"), "{stderr}");
    let (plain_backing, plain) = (m.backing("plain"), m.path("plain"));
    assert_eq!(
        verityfs(&[&"measure", &plain_backing]).status.code(),
        Some(1)
    );
    let out = verityfs(&[&"dump_metadata", &"descriptor", &plain]);
    assert_eq!(out.status.code(), Some(1));

    // On a backing path, an ordinary attribute of that name is not taken
    // for the daemon's answer: the file itself is checked.
    let evil = m.backing("plain");
    let f_backing = m.backing("f");
    rustix::fs::setxattr(
        &evil,
        verityfs_fuse::BACKING_XATTR,
        f_backing.as_os_str().as_encoded_bytes(),
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    let (code, _, stderr) = outcome(&verityfs(&[&"verify", &evil]));
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        stderr,
        format!("ERROR: '{}' is not a verity file\n", evil.display())
    );

    // Corruption in the backing file is found through the mount.
    flip_byte(&m.backing("f"), 5000);
    let (code, stdout, _) = outcome(&verityfs(&[&"verify", &m.path("f")]));
    assert_eq!(code, 1);
    assert!(
        stdout.contains("FILE CORRUPTED! pos=4096, level=-1"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("{f}: 1 corrupted blocks\n")),
        "{stdout}"
    );
}

#[test]
fn verify_json_reports_every_file() {
    let m = Mount::new();
    verity_file(&m, "good", 10_000);
    verity_file(&m, "bad", 20_000);
    write_file(&m, "plain", b"p");
    flip_byte(&m.backing("bad"), 10);
    let out = verityfs(&[&"verify", &"--json", &m.mnt]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stderr), "");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["ok"], false);
    assert_eq!(
        (doc["verified"].as_u64(), doc["corrupted"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(doc["not_verity"], 1);
    let files = doc["files"].as_array().unwrap();
    let by_name = |name: &str| {
        let path = m.path(name).display().to_string();
        files
            .iter()
            .find(|f| f["path"] == path.as_str())
            .unwrap()
            .clone()
    };
    let bad = by_name("bad");
    assert_eq!(bad["result"], "corrupted");
    assert_eq!(bad["blocks"], 5);
    assert_eq!(bad["corrupted_blocks"], 1);
    assert_eq!(bad["corruptions"][0]["pos"], 0);
    assert_eq!(bad["corruptions"][0]["level"], -1);
    assert_eq!(
        bad["backing"],
        m.backing("bad").display().to_string().as_str()
    );
    let good = by_name("good");
    assert_eq!(good["result"], "ok");
    assert_eq!(good["digest"], measure(&m.path("good")).as_str());
    assert_eq!(by_name("plain")["result"], "not_verity");
}

#[test]
fn verify_check_takes_the_lists_fsverity_prints() {
    let m = Mount::new();
    verity_file(&m, "v", 50_000);
    write_file(&m, "p", &random_bytes(9000, 3));
    // As a user makes the list: fsverity measure through the mount,
    // fsverity digest of an ordinary file.
    let mut list = run_ok(Command::new(FSVERITY).arg("measure").arg(m.path("v")));
    list += &run_ok(Command::new(FSVERITY).arg("digest").arg(m.path("p")));
    let list_file = m.scratch("list");
    fs::write(&list_file, &list).unwrap();
    let (code, stdout, stderr) = outcome(&verityfs(&[&"verify", &"--check", &list_file]));
    assert_eq!((code, stderr.as_str()), (0, ""), "{stdout}");
    let (v, p) = (
        m.path("v").display().to_string(),
        m.path("p").display().to_string(),
    );
    assert_eq!(
        stdout,
        format!("{v}: OK (13 blocks)\n{p}: OK (3 blocks)\nverified 2 files, 0 corrupted, 0 not verity\n")
    );

    // From stdin, with one digest wrong: that file fails.
    let wrong = other_digest(&list);
    let mut child = Command::new(VERITYFS)
        .args(["verify", "-c", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(wrong.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let (code, stdout, _) = outcome(&out);
    assert_eq!(code, 1);
    assert!(
        stdout.starts_with(&format!("{v}: FAILED: digest is sha256:")),
        "{stdout}"
    );
    assert!(stdout.contains(&format!("{p}: OK")), "{stdout}");

    // A listed file that changed, a malformed line, an empty list.
    fs::write(m.path("p"), b"changed").unwrap();
    fs::write(&list_file, format!("{list}garbage\n")).unwrap();
    let (code, stdout, stderr) = outcome(&verityfs(&[&"verify", &"-c", &list_file]));
    assert_eq!(code, 1);
    assert!(stdout.contains(&format!("{p}: FAILED")), "{stdout}");
    assert!(stderr.contains(":3: not a 'DIGEST FILE' line"), "{stderr}");
    fs::write(&list_file, "").unwrap();
    assert_eq!(
        verityfs(&[&"verify", &"-c", &list_file]).status.code(),
        Some(1)
    );
}

#[test]
fn copies_without_xattrs_are_reported_and_reattached() {
    let m = Mount::new();
    verity_file(&m, "f", 200_000);
    let digest = measure(&m.path("f"));
    // A plain cp of the backing directory's file, into the backing directory.
    run_ok(
        Command::new("cp")
            .arg(m.backing("f"))
            .arg(m.backing("copy")),
    );
    assert!(get_xattr(&m.backing("copy"), "user.verityfs").is_err());

    let (code, _, stderr) = outcome(&verityfs(&[&"verify", &m.backing("copy")]));
    assert_eq!(code, 1);
    assert!(stderr.contains("lost its extended attributes"), "{stderr}");
    let (code, _, stderr) = outcome(&verityfs(&[&"verify", &m.mnt]));
    assert_eq!(code, 1, "the walk through the mount finds it too");
    assert!(
        stderr.contains("copy' is a verity file that lost"),
        "{stderr}"
    );

    // tar without --xattrs loses the record the same way.
    let tar = m.scratch("f.tar");
    run_ok(
        Command::new("tar")
            .arg("-C")
            .arg(&m.backing)
            .arg("-cf")
            .arg(&tar)
            .arg("f"),
    );
    fs::create_dir(m.backing("untarred")).unwrap();
    run_ok(
        Command::new("tar")
            .arg("-C")
            .arg(m.backing("untarred"))
            .arg("-xf")
            .arg(&tar),
    );
    let (code, _, stderr) = outcome(&verityfs(&[&"verify", &m.backing("untarred")]));
    assert_eq!(code, 1);
    assert!(
        stderr.contains("untarred/f' is a verity file that lost"),
        "{stderr}"
    );
    let (code, _, _) = outcome(&verityfs(&[&"reattach", &m.backing("untarred/f")]));
    assert_eq!(code, 0);

    // Repaired through the mount path; the mount then serves it as verity.
    let (code, stdout, stderr) = outcome(&verityfs(&[&"reattach", &m.path("copy")]));
    assert_eq!((code, stderr.as_str()), (0, ""));
    assert!(stdout.contains("verity again"), "{stdout}");
    assert_eq!(
        measure(&m.path("copy")).split(' ').next(),
        digest.split(' ').next()
    );
    assert_eq!(
        fs::read(m.path("copy")).unwrap(),
        fs::read(m.scratch("f")).unwrap()
    );
    assert_eq!(outcome(&verityfs(&[&"verify", &m.mnt])).0, 0);
    // Twice, or on an ordinary file: an error.
    assert_eq!(
        verityfs(&[&"reattach", &m.backing("copy")]).status.code(),
        Some(1)
    );
    write_file(&m, "plain", &[7; 70_000]);
    let (code, _, stderr) = outcome(&verityfs(&[&"reattach", &m.backing("plain")]));
    assert_eq!(code, 1);
    assert!(
        stderr.contains("does not end with verity metadata"),
        "{stderr}"
    );
}

#[test]
fn enable_offline_then_mount() {
    let mut m = Mount::new();
    m.unmount();
    let data = random_bytes(123_456, 9);
    let cases: [(&str, &[&str]); 2] = [
        ("a", &[]),
        (
            "b",
            &["--hash-alg=sha512", "--block-size=1024", "--salt=abcd"],
        ),
    ];
    for (name, params) in cases {
        fs::write(m.backing(name), &data).unwrap();
        fs::write(m.scratch(name), &data).unwrap();
        let out = run(Command::new(VERITYFS)
            .arg("enable-offline")
            .arg(m.backing(name))
            .args(params));
        assert!(out.status.success(), "{}", text(&out.stderr));
        let out = run(Command::new(VERITYFS)
            .arg("enable-offline")
            .arg(m.backing(name)));
        assert_eq!(out.status.code(), Some(1), "enabling twice");
        assert!(text(&out.stderr).contains("already a verity file"));
    }
    m.start(&[]);
    for (name, params) in cases {
        let want = run_ok(
            Command::new(FSVERITY)
                .arg("digest")
                .arg(m.scratch(name))
                .args(params),
        );
        let got = measure(&m.path(name));
        assert_eq!(got.split(' ').next(), want.split(' ').next(), "{name}");
        assert_eq!(fs::read(m.path(name)).unwrap(), data);
        // Verity through the mount: writes are refused.
        assert!(fs::OpenOptions::new()
            .append(true)
            .open(m.path(name))
            .is_err());
    }
}

#[test]
fn verify_against_a_detached_tree_and_descriptor() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("big.img");
    fs::write(&data, random_bytes(500_000, 4)).unwrap();
    let (digest, _, _) = fsverity_metadata(dir.path(), &data);
    let (tree, desc) = (
        dir.path().join("oracle.tree"),
        dir.path().join("oracle.desc"),
    );
    let args = |extra: &[&str]| {
        let mut cmd = Command::new(VERITYFS);
        cmd.arg("verify")
            .arg(&data)
            .arg(format!("--tree={}", tree.display()))
            .arg(format!("--descriptor={}", desc.display()))
            .args(extra);
        outcome(&run(&mut cmd))
    };
    let (code, stdout, _) = args(&[&format!("--digest={digest}")]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.starts_with(&format!("{}: OK (123 blocks)", data.display())));
    // The bare hex form is accepted too.
    assert_eq!(args(&[&format!("--digest={}", &digest[7..])]).0, 0);
    let other = other_digest(&digest);
    let (code, stdout, _) = args(&[&format!("--digest={other}")]);
    assert_eq!(code, 1);
    assert!(stdout.contains("FAILED: digest is"), "{stdout}");
    flip_byte(&data, 300_000);
    let (code, stdout, _) = args(&[]);
    assert_eq!(code, 1);
    assert!(stdout.contains("FILE CORRUPTED! pos=299008"), "{stdout}");
    // --tree without --descriptor: a usage error.
    let out = run(Command::new(VERITYFS)
        .arg("verify")
        .arg(&data)
        .arg("--tree=x"));
    assert_eq!(out.status.code(), Some(2));
}

/// `verityfs ARGS` as `nobody`.
fn verityfs_as_nobody(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut cmd = Command::new("setpriv");
    cmd.arg(format!("--reuid={NOBODY}"))
        .arg(format!("--regid={NOBODY}"))
        .arg("--clear-groups")
        .arg(VERITYFS);
    for arg in args {
        cmd.arg(arg);
    }
    run(&mut cmd)
}

#[test]
fn verify_reads_through_the_mount_when_the_backing_file_is_out_of_reach() {
    let mut m = Mount::with_args(&["-o", "allow_other"]);
    m.unmount();
    // The backing directory inside a directory only root may enter.
    let private = m.backing.parent().unwrap().join("private");
    fs::create_dir(&private).unwrap();
    fs::set_permissions(
        &private,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    fs::rename(&m.backing, private.join("backing")).unwrap();
    m.backing = private.join("backing");
    m.start(&["-o", "allow_other"]);
    verity_file(&m, "f", 100_000);
    write_file(&m, "plain", b"p");

    let (code, stdout, stderr) = outcome(&verityfs_as_nobody(&[&"verify", &m.mnt]));
    assert_eq!((code, stderr.as_str()), (0, ""), "{stdout}");
    let f = m.path("f").display().to_string();
    assert_eq!(
        stdout,
        format!(
            "{f}: OK (100000 bytes read through the mount, which verified them)\n\
             verified 1 files, 0 corrupted, 1 not verity\n"
        )
    );
    // Digest lists work the same way.
    let list = m.scratch("list");
    let line = format!("{} {f}\n", measure(&m.path("f")));
    fs::write(&list, &line).unwrap();
    let (code, stdout, stderr) = outcome(&verityfs_as_nobody(&[&"verify", &"-c", &list]));
    assert_eq!(code, 0, "{stdout}{stderr}");
    fs::write(&list, other_digest(&line)).unwrap();
    assert_eq!(
        verityfs_as_nobody(&[&"verify", &"-c", &list]).status.code(),
        Some(1)
    );

    flip_byte(&m.backing("f"), 50_000);
    let (code, _, stderr) = outcome(&verityfs_as_nobody(&[&"verify", &m.path("f")]));
    assert_eq!(code, 1);
    assert!(
        stderr.contains("reading through the mount failed at byte")
            && stderr.contains("Input/output error"),
        "{stderr}"
    );
}
