//! Mount-wide behaviour through a real mount, driven by the unmodified
//! `fsverity` tool: the built-in signature policy (`--trusted-cert`,
//! `--require-signatures`) with the kernel's errnos (xfstests generic/577),
//! what happens to descriptors and cached pages at enable, the counters
//! `verityfs stats` reports, and crash consistency when the daemon is
//! killed in the middle of enables.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// A `verityfs mount` child, unmounted and reaped when dropped.
struct Mount {
    child: Child,
    point: PathBuf,
}

impl Mount {
    fn new(backing: &Path, point: &Path, extra: &[&str]) -> Mount {
        let child = Command::new(env!("CARGO_BIN_EXE_verityfs"))
            .arg("mount")
            .args([backing, point])
            .args(extra)
            .spawn()
            .expect("spawn verityfs mount");
        let mount = Mount {
            child,
            point: point.to_owned(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let wanted = format!(" {} ", point.display());
        while !std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .contains(&wanted)
        {
            assert!(
                Instant::now() < deadline,
                "{} never mounted",
                point.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        mount
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.point).status();
        let _ = self.child.wait();
    }
}

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"))
}

/// `fsverity enable` on `file` with optional `--signature`; its stderr.
fn enable(file: &Path, sig: Option<&Path>) -> String {
    let mut args = vec!["enable".to_owned(), file.display().to_string()];
    if let Some(sig) = sig {
        args.push(format!("--signature={}", sig.display()));
    }
    let out = Command::new("fsverity")
        .args(&args)
        .output()
        .expect("fsverity installed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A self-signed RSA certificate and key in `dir` named `name`.
fn make_key(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let (key, cert) = (
        dir.join(format!("{name}.key")),
        dir.join(format!("{name}.pem")),
    );
    let out = run(
        "openssl",
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            key.to_str().unwrap(),
            "-out",
            cert.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "openssl req: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (key, cert)
}

/// `fsverity sign` of `file` (its plain bytes) with `key`/`cert` into `sig`.
fn sign(file: &Path, key: &Path, cert: &Path, sig: &Path) {
    let args = [
        "sign".to_owned(),
        file.display().to_string(),
        sig.display().to_string(),
        format!("--key={}", key.display()),
        format!("--cert={}", cert.display()),
    ];
    let out = Command::new("fsverity").args(&args).output().unwrap();
    assert!(
        out.status.success(),
        "fsverity sign: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn policy_on_enable_and_open() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, backing, mnt) = (tmp.path(), tmp.path().join("b"), tmp.path().join("m"));
    std::fs::create_dir_all(&backing).unwrap();
    let (key, cert) = make_key(dir, "trusted");
    let (other_key, other_cert) = make_key(dir, "other");
    for name in [
        "unsigned",
        "signed",
        "garbage",
        "untrusted",
        "wrong",
        "plain",
    ] {
        std::fs::write(
            backing.join(name),
            format!("contents of {name}\n").repeat(1000),
        )
        .unwrap();
    }
    std::fs::write(dir.join("garbage.sig"), b"not a PKCS#7 message").unwrap();
    sign(
        &backing.join("signed"),
        &key,
        &cert,
        &dir.join("signed.sig"),
    );
    sign(
        &backing.join("untrusted"),
        &other_key,
        &other_cert,
        &dir.join("untrusted.sig"),
    );
    sign(&backing.join("plain"), &key, &cert, &dir.join("wrong.sig")); // another file's digest

    // Without a policy, an unsigned verity file is made...
    {
        let _m = Mount::new(&backing, &mnt, &[]);
        assert_eq!(enable(&mnt.join("plain"), None), "");
    }
    let cert_arg = format!("--trusted-cert={}", cert.display());
    let _m = Mount::new(&backing, &mnt, &[&cert_arg, "--require-signatures"]);
    let m = |name: &str| mnt.join(name);
    assert!(enable(&m("unsigned"), None).contains("Operation not permitted"));
    assert!(enable(&m("garbage"), Some(&dir.join("garbage.sig"))).contains("Bad message"));
    assert!(enable(&m("untrusted"), Some(&dir.join("untrusted.sig")))
        .contains("Required key not available"));
    assert!(
        enable(&m("wrong"), Some(&dir.join("wrong.sig"))).contains("Key was rejected by service")
    );
    assert_eq!(enable(&m("signed"), Some(&dir.join("signed.sig"))), "");
    // Refused enables leave the files as they were; the signed one reads back.
    for name in ["unsigned", "garbage", "untrusted", "wrong"] {
        let out = run("fsverity", &["measure", m(name).to_str().unwrap()]);
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("No data available"),
            "{name}"
        );
    }
    assert_eq!(
        std::fs::read(m("signed")).unwrap(),
        "contents of signed\n".repeat(1000).as_bytes()
    );
    // ...and the unsigned verity file made earlier cannot be opened now.
    let err = std::fs::read(m("plain")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{err}");
    // The signature is kept with the file.
    let dumped = run(
        env!("CARGO_BIN_EXE_verityfs"),
        &[
            "dump_metadata",
            "signature",
            backing.join("signed").to_str().unwrap(),
        ],
    );
    assert_eq!(
        dumped.stdout,
        std::fs::read(dir.join("signed.sig")).unwrap()
    );
}

/// Pages the kernel cached before a file became verity were never
/// verified: the first open after enable must drop them, so a reader sees
/// the bytes the tree was built over, not a stale cached copy.
#[test]
fn pages_cached_before_enable_are_dropped() {
    let tmp = tempfile::tempdir().unwrap();
    let (backing, mnt) = (tmp.path().join("b"), tmp.path().join("m"));
    std::fs::create_dir_all(&backing).unwrap();
    std::fs::write(backing.join("f"), vec![b'a'; 65536]).unwrap();
    let _m = Mount::new(&backing, &mnt, &[]);
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), vec![b'a'; 65536]); // now cached
                                                                          // Changed behind the mount's back, then enabled: the tree covers the new bytes.
    std::fs::write(backing.join("f"), vec![b'b'; 65536]).unwrap();
    assert_eq!(enable(&mnt.join("f"), None), "");
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), vec![b'b'; 65536]);
}

/// A descriptor opened before the enable reads verified data afterwards,
/// as in the kernel where verity belongs to the inode.
#[test]
fn descriptors_opened_before_enable_are_verified_after() {
    use std::io::{Read, Seek};
    let tmp = tempfile::tempdir().unwrap();
    let (backing, mnt) = (tmp.path().join("b"), tmp.path().join("m"));
    std::fs::create_dir_all(&backing).unwrap();
    std::fs::write(backing.join("f"), vec![b'a'; 65536]).unwrap();
    let _m = Mount::new(&backing, &mnt, &[]);
    let mut early = std::fs::File::open(mnt.join("f")).unwrap();
    assert_eq!(enable(&mnt.join("f"), None), "");
    // Tamper with the stored data and drop the page cache.
    let stored = std::fs::OpenOptions::new()
        .write(true)
        .open(backing.join("f"))
        .unwrap();
    std::os::unix::fs::FileExt::write_at(&stored, b"X", 100).unwrap();
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    let mut buf = Vec::new();
    early.rewind().unwrap();
    let err = early.read_to_end(&mut buf).unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(libc::EIO),
        "read {} bytes",
        buf.len()
    );
}

/// `verityfs stats` reads the running daemon's counters.
#[test]
fn stats_of_a_running_mount() {
    let tmp = tempfile::tempdir().unwrap();
    let (backing, mnt) = (tmp.path().join("b"), tmp.path().join("m"));
    std::fs::create_dir_all(&backing).unwrap();
    std::fs::write(backing.join("f"), vec![7u8; 3 << 20]).unwrap();
    let _m = Mount::new(&backing, &mnt, &[]);
    assert_eq!(enable(&mnt.join("f"), None), "");
    assert_eq!(std::fs::read(mnt.join("f")).unwrap().len(), 3 << 20);
    let out = run(
        env!("CARGO_BIN_EXE_verityfs"),
        &["stats", mnt.to_str().unwrap()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Every block of the 3 MiB read, once; some twice if the kernel read
    // them again after the page cache invalidation that follows an enable.
    let verified = stats["data_blocks_verified"].as_u64().unwrap();
    assert!((768..=2 * 768).contains(&verified), "{stats}");
    assert_eq!(stats["verification_failures"], 0);
    assert!(stats["tree_blocks_read"].as_u64().unwrap() >= 7, "{stats}");
    // Not a verityfs mount: a clear error.
    let out = run(
        env!("CARGO_BIN_EXE_verityfs"),
        &["stats", tmp.path().to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a verityfs mount"));
}

/// `fsverity digest` of `path`: the digest of its current bytes.
fn digest_of(path: &Path) -> String {
    let out = run("fsverity", &["digest", "--compact", path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// kill -9 the daemon at random moments of enables of files of several
/// sizes, and once per size just after the enable succeeded; after a
/// remount every file is either intact and not verity, or verity with the
/// digest of its original bytes, and every enable fsverity saw succeed
/// stays done.
#[test]
fn daemon_killed_during_enable() {
    let tmp = tempfile::tempdir().unwrap();
    let (backing, mnt) = (tmp.path().join("b"), tmp.path().join("m"));
    std::fs::create_dir_all(&backing).unwrap();
    let mut rng = fastrand::Rng::with_seed(0x5eed_ca11);
    let (mut rolled_back, mut completed) = (0, 0);
    for (size, iterations) in [(8u64 << 20, 6), (64 << 20, 6), (1 << 30, 4)] {
        for i in 0..iterations {
            let name = format!("f{size}-{i}");
            let path = backing.join(&name);
            // Random bytes at the start, then a hole: big files stay cheap.
            let mut head = vec![0; size.min(8 << 20) as usize];
            rng.fill(&mut head);
            std::fs::write(&path, &head).unwrap();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(size)
                .unwrap();
            let original = digest_of(&path);
            let mut mount = Mount::new(&backing, &mnt, &[]);
            let mut enabler = Command::new("fsverity")
                .arg("enable")
                .arg(mnt.join(&name))
                .spawn()
                .unwrap();
            let acknowledged = if i + 1 < iterations {
                // Up to about the time the enable takes (hashing at ~2 GB/s).
                std::thread::sleep(Duration::from_micros(rng.u64(..size / 2000)));
                mount.child.kill().unwrap();
                // Killed or not, fsverity exits.
                enabler.wait().unwrap().success()
            } else {
                let status = enabler.wait().unwrap();
                assert!(status.success(), "{name}: fsverity enable: {status}");
                mount.child.kill().unwrap();
                true
            };
            drop(mount);
            let _m = Mount::new(&backing, &mnt, &[]);
            let measured = run("fsverity", &["measure", mnt.join(&name).to_str().unwrap()]);
            if measured.status.success() {
                completed += 1;
                assert_eq!(
                    digest_of(&mnt.join(&name)),
                    original,
                    "{name}: verity with another digest"
                );
            } else {
                rolled_back += 1;
                assert!(
                    !acknowledged,
                    "{name}: enabled, then not verity after the kill"
                );
                assert!(String::from_utf8_lossy(&measured.stderr).contains("No data available"));
                assert_eq!(
                    std::fs::metadata(&path).unwrap().len(),
                    size,
                    "{name}: leftovers"
                );
                assert_eq!(digest_of(&path), original, "{name}: data changed");
            }
        }
    }
    eprintln!("daemon kills: {rolled_back} rolled back, {completed} completed");
    assert!(rolled_back > 0, "no kill landed during an enable");
}
