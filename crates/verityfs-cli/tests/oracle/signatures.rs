//! The built-in signature policy: under Linux a certificate in the
//! `.fs-verity` keyring and `/proc/sys/fs/verity/require_signatures`, on
//! verityfs `--trusted-cert` and `--require-signatures`. Runs after the
//! other scenarios: it changes the policy of the whole filesystem.

use std::fs::{self, File, Permissions};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{command_outcome, outcome, Backend, Records};
use crate::common::*;

/// A key and its certificate, made with the openssl tool.
struct Key {
    key: PathBuf,
    cert: PathBuf,
}

impl Key {
    fn new(dir: &Path, name: &str) -> Key {
        let (key, cert) = (
            dir.join(format!("{name}.key")),
            dir.join(format!("{name}.pem")),
        );
        run_ok(
            Command::new("openssl")
                .args([
                    "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                ])
                .arg("-subj")
                .arg(format!("/CN={name}"))
                .arg("-keyout")
                .arg(&key)
                .arg("-out")
                .arg(&cert),
        );
        Key { key, cert }
    }

    /// Signs `file`'s digest into `sig` with `fsverity sign`.
    fn sign(&self, file: &Path, sig: &Path) {
        run_ok(
            Command::new(FSVERITY)
                .arg("sign")
                .arg(file)
                .arg(sig)
                .arg(format!("--key={}", self.key.display()))
                .arg(format!("--cert={}", self.cert.display())),
        );
    }
}

/// Makes the filesystem trust `cert` (once) and require signatures or not.
fn set_policy(backend: &mut Backend, cert: &Path, require: bool, trusted: &mut bool) {
    match backend {
        Backend::Ext4 { dir, device } => {
            if !*trusted {
                let der = run(Command::new("openssl")
                    .args(["x509", "-outform", "der", "-in"])
                    .arg(cert));
                assert!(der.status.success(), "openssl x509: {der:?}");
                let keyctl = Command::new("keyctl")
                    .args(["padd", "asymmetric", "", "%keyring:.fs-verity"])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn();
                let mut keyctl = keyctl.expect("running keyctl (keyutils)");
                use std::io::Write;
                keyctl.stdin.take().unwrap().write_all(&der.stdout).unwrap();
                let out = keyctl.wait_with_output().unwrap();
                assert!(out.status.success(), "keyctl padd: {out:?}");
            }
            let flag = if require { "1" } else { "0" };
            fs::write("/proc/sys/fs/verity/require_signatures", flag).unwrap();
            // Linux checks a signature when it loads an inode: mount
            // again, so that none loaded under the previous policy stays.
            run_ok(Command::new("umount").arg(&*dir));
            run_ok(
                Command::new("mount")
                    .args(["-t", "ext4"])
                    .arg(&*device)
                    .arg(&*dir),
            );
        }
        Backend::Verityfs(m) => {
            let trust = format!("--trusted-cert={}", cert.display());
            let mut args = vec!["-o", "allow_other", trust.as_str()];
            if require {
                args.push("--require-signatures");
            }
            m.remount(&args);
        }
    }
    *trusted = true;
}

/// Runs the signature scenarios on `backend`.
pub fn run_all(backend: &mut Backend) -> Records {
    let keys = tempfile::tempdir().unwrap();
    let (trusted_key, other_key) = (
        Key::new(keys.path(), "trusted"),
        Key::new(keys.path(), "other"),
    );
    let dir = backend.dir().join("signatures");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, Permissions::from_mode(0o755)).unwrap();
    let mut records = Records::default();
    let mut trusted = false;
    let file = |name: &str| {
        let path = dir.join(name);
        fs::write(&path, random_bytes(50_000, name.len() as u64)).unwrap();
        path
    };
    // Signature files live outside the filesystem under test.
    let sig = |name: &str| keys.path().join(format!("{name}.sig"));
    let enable = |path: &Path, sig: Option<&Path>| {
        let mut cmd = Command::new(FSVERITY);
        cmd.arg("enable").arg(path);
        if let Some(sig) = sig {
            cmd.arg(format!("--signature={}", sig.display()));
        }
        command_outcome(&mut cmd, path)
    };

    set_policy(backend, &trusted_key.cert, false, &mut trusted);
    let cases = [
        ("good", Some(&trusted_key)),
        ("untrusted-signer", Some(&other_key)),
        ("unsigned", None),
    ];
    for (name, key) in cases {
        let path = file(name);
        if let Some(key) = key {
            key.sign(&path, &sig(name));
        }
        let sig_path = key.map(|_| sig(name));
        let result = enable(&path, sig_path.as_deref());
        records.add(format!("signature/trusted/{name}"), result);
    }
    // A valid signature of other contents, and one that is not PKCS#7.
    let other = file("other-contents");
    trusted_key.sign(&other, &sig("other-contents"));
    let path = file("wrong-digest");
    records.add(
        "signature/trusted/wrong-digest",
        enable(&path, Some(&sig("other-contents"))),
    );
    fs::write(sig("malformed"), [0x30u8; 100]).unwrap();
    let path = file("malformed");
    records.add(
        "signature/trusted/malformed",
        enable(&path, Some(&sig("malformed"))),
    );
    let stored = super::scenarios::read_signature(backend, &dir.join("good"));
    let given = fs::read(sig("good")).unwrap();
    records.add(
        "signature/trusted/good-read-back",
        match stored {
            Ok(bytes) if bytes == given => "identical to the signature given".to_owned(),
            Ok(bytes) => format!("DIFFERENT: {} bytes", bytes.len()),
            Err(errno) => super::errno_name(errno),
        },
    );

    set_policy(backend, &trusted_key.cert, true, &mut trusted);
    let dir = backend.dir().join("signatures");
    for (name, signed) in [("required-unsigned", false), ("required-good", true)] {
        let path = dir.join(name);
        fs::write(&path, random_bytes(50_000, 7)).unwrap();
        if signed {
            trusted_key.sign(&path, &sig(name));
        }
        let sig_path = signed.then(|| sig(name));
        let result = enable(&path, sig_path.as_deref());
        records.add(format!("signature/required/{name}"), result);
    }
    for name in ["good", "unsigned"] {
        let opened = File::open(dir.join(name));
        records.add(
            format!("signature/required/open-existing-{name}"),
            outcome(opened),
        );
    }
    set_policy(backend, &trusted_key.cert, false, &mut trusted);
    records
}
