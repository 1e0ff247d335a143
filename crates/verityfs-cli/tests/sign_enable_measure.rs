//! Differential tests of `verityfs sign`, `enable` and `measure` against
//! fsverity-utils v1.5 (`/usr/bin/fsverity`).
//!
//! `sign` runs both programs on the same inputs (keys and certificates made
//! at test time with the `openssl` command) and compares exit status,
//! stdout, stderr, the signature and the `--out-*` files byte for byte. The
//! normalisations: usage lines name the program, and the thread id OpenSSL
//! puts at the start of each of its error lines is masked. ECDSA signatures
//! are random, so those are verified instead of compared.
//!
//! `enable` and `measure` run on a real `verityfs mount` (spawned here, as
//! root, unmounted when the test ends): each program works in its own
//! directory of the mount holding the same files, and after the same
//! command sequence the two directories' backing files must be identical,
//! signatures stored after the descriptor.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::random_bytes;
use verityfs::signature::{verify_signature, Certificate};
use verityfs::{Descriptor, FileState, HashAlgorithm};

const FSVERITY: &str = "/usr/bin/fsverity";
const VERITYFS: &str = env!("CARGO_BIN_EXE_verityfs");

/// What one program did.
#[derive(PartialEq)]
struct Outcome {
    status: Option<i32>,
    stdout: String,
    stderr: String,
    /// Files the run created in its directory, by name.
    created: BTreeMap<String, Vec<u8>>,
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let created: Vec<String> = self
            .created
            .iter()
            .map(|(name, data)| {
                let sum = data
                    .iter()
                    .fold(0u32, |a, &b| a.rotate_left(5) ^ u32::from(b));
                format!("{name} ({} bytes, sum {sum:08x})", data.len())
            })
            .collect();
        f.debug_struct("Outcome")
            .field("status", &self.status)
            .field("stdout", &self.stdout)
            .field("stderr", &self.stderr)
            .field("created", &created)
            .finish()
    }
}

/// Runs `prog args` in `dir`; `inputs` are the names present before.
fn run_in(prog: &str, dir: &Path, args: &[String], inputs: &[String]) -> Outcome {
    let out = Command::new(prog)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {prog}: {e}"));
    let mut created = BTreeMap::new();
    for entry in fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if !inputs.contains(&name) && entry.file_type().unwrap().is_file() {
            created.insert(name, fs::read(entry.path()).unwrap());
        }
    }
    Outcome {
        status: out.status.code(),
        stdout: normalise(&out.stdout),
        stderr: normalise(&out.stderr),
        created,
    }
}

/// Masks the intended differences: the program name in usage lines, and
/// the thread id before `:error:` in OpenSSL's error lines.
fn normalise(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::new();
    for line in text.split_inclusive('\n') {
        let line = match line.strip_prefix("    verityfs ") {
            Some(rest) => format!("    fsverity {rest}"),
            None => line.to_owned(),
        };
        let masked = line.strip_prefix("ERROR: ").and_then(|rest| {
            let (id, tail) = rest.split_once(":error:")?;
            id.bytes()
                .all(|b| b.is_ascii_hexdigit())
                .then(|| format!("ERROR: <thread>:error:{tail}"))
        });
        out += masked.as_deref().unwrap_or(&line);
    }
    out
}

/// Differences found, reported together at the end of a test.
#[derive(Default)]
struct Report(Vec<String>);

impl Report {
    fn check(&mut self, what: &str, theirs: &Outcome, ours: &Outcome) {
        if theirs != ours {
            self.0.push(format!(
                "`{what}`:\n  fsverity: {theirs:?}\n  verityfs: {ours:?}"
            ));
        }
    }

    fn finish(self) {
        assert!(self.0.is_empty(), "{}", self.0.join("\n"));
    }
}

fn run_checked(cmd: &mut Command) -> Vec<u8> {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{cmd:?} failed: {err}");
    out.stdout
}

/// A temporary directory named after the test.
fn scratch_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(prefix).tempdir().unwrap()
}

/// Makes the key `<name>.key` and a self-signed certificate `<name>.crt`
/// in `dir` with `openssl req`, `newkey` choosing the key type.
fn make_key(dir: &Path, name: &str, newkey: &[&str]) -> [String; 2] {
    let (key, crt) = (format!("{name}.key"), format!("{name}.crt"));
    let subject = format!("/CN=verityfs {name}");
    let args = ["req", "-x509", "-nodes", "-days", "30", "-subj", &subject];
    run_checked(
        Command::new("openssl")
            .current_dir(dir)
            .args(args)
            .args(["-keyout", &key, "-out", &crt])
            .args(newkey),
    );
    [key, crt]
}

// ---------------------------------------------------------------------------
// sign
// ---------------------------------------------------------------------------

/// A directory of inputs (data files, keys, certificates); each run gets a
/// fresh copy of it.
struct Inputs {
    root: tempfile::TempDir,
    names: Vec<String>,
}

impl Inputs {
    fn new() -> Self {
        let root = scratch_dir("sign-vs-fsverity");
        fs::create_dir(root.path().join("in")).unwrap();
        let mut inputs = Inputs {
            root,
            names: Vec::new(),
        };
        inputs.make_keys();
        inputs
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.path().join("in").join(name)
    }

    fn add(&mut self, name: &str, data: &[u8]) {
        fs::write(self.path(name), data).unwrap();
        self.names.push(name.to_owned());
    }

    /// `rsa.key`/`rsa.crt`, `ec.key`/`ec.crt`, `both.pem` (RSA key and
    /// certificate in one file) and `nocert.pem` (a key alone).
    fn make_keys(&mut self) {
        let specs: [(&str, &[&str]); 2] = [
            ("rsa", &["-newkey", "rsa:2048"]),
            (
                "ec",
                &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"],
            ),
        ];
        for (name, newkey) in specs {
            let files = make_key(&self.path(""), name, newkey);
            self.names.extend(files);
        }
        let mut both = fs::read(self.path("rsa.key")).unwrap();
        both.extend(fs::read(self.path("rsa.crt")).unwrap());
        self.add("both.pem", &both);
        let key_alone = fs::read(self.path("rsa.key")).unwrap();
        self.add("nocert.pem", &key_alone);
    }

    /// A fresh directory for `prog` holding copies of the inputs.
    fn run_dir(&self, prog: &str) -> PathBuf {
        let dir = self.root.path().join(format!("run-{prog}"));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir(&dir).unwrap();
        for name in &self.names {
            fs::copy(self.path(name), dir.join(name)).unwrap();
        }
        dir
    }

    /// Runs `args` with both programs.
    fn both(&self, args: &[&str]) -> (Outcome, Outcome) {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let theirs = run_in(FSVERITY, &self.run_dir("fsverity"), &args, &self.names);
        let ours = run_in(VERITYFS, &self.run_dir("verityfs"), &args, &self.names);
        (theirs, ours)
    }
}

fn sign_inputs() -> Inputs {
    let mut inputs = Inputs::new();
    for (name, len) in [("empty", 0), ("one", 1), ("block", 4096), ("f", 100_000)] {
        inputs.add(name, &random_bytes(len, len as u64 + 1));
    }
    inputs.add("big", &random_bytes(3 << 20, 99));
    inputs
}

#[test]
fn rsa_sign_is_identical() {
    let inputs = sign_inputs();
    let mut report = Report::default();
    let cases: &[&[&str]] = &[
        &["f", "f.sig", "--key=rsa.key", "--cert=rsa.crt"],
        &[
            "f",
            "f.sig",
            "--key=rsa.key",
            "--cert=rsa.crt",
            "--hash-alg=sha512",
        ],
        &["empty", "s", "--key=rsa.key", "--cert=rsa.crt"],
        &[
            "one",
            "s",
            "--key=rsa.key",
            "--cert=rsa.crt",
            "--block-size=1024",
        ],
        &[
            "block",
            "s",
            "--key",
            "rsa.key",
            "--cert",
            "rsa.crt",
            "--salt=00ff",
        ],
        &[
            "big",
            "s",
            "--cert=rsa.crt",
            "--key=rsa.key",
            "--hash-alg=2",
            "--salt=",
        ],
        &["f", "s", "--key=both.pem"],
        &[
            "f",
            "s",
            "--ke=rsa.key",
            "--ce=rsa.crt",
            "--block-size=65536",
        ],
        &[
            "--key=rsa.key",
            "f",
            "--cert=rsa.crt",
            "s",
            "--salt=0123456789abcdef",
        ],
        // The --out-* files of `digest`.
        &[
            "big",
            "s",
            "--key=rsa.key",
            "--cert=rsa.crt",
            "--out-merkle-tree=tree",
            "--out-descriptor=desc",
        ],
        &[
            "f",
            "s",
            "--key=rsa.key",
            "--cert=rsa.crt",
            "--hash-alg=sha512",
            "--block-size=1024",
            "--salt=aa",
            "--out-merkle-tree=tree",
            "--out-descriptor=desc",
        ],
        &[
            "empty",
            "s",
            "--key=both.pem",
            "--out-merkle-tree=t",
            "--out-descriptor=d",
        ],
    ];
    for args in cases {
        let args = [&["sign"][..], args].concat();
        let (theirs, ours) = inputs.both(&args);
        assert_eq!(theirs.status, Some(0), "fsverity {args:?}: {theirs:?}");
        report.check(&args.join(" "), &theirs, &ours);
    }
    report.finish();
}

#[test]
fn sign_errors_are_identical() {
    let inputs = sign_inputs();
    let mut report = Report::default();
    let key = "--key=rsa.key";
    let cases: &[&[&str]] = &[
        // Usage errors.
        &[],
        &["f"],
        &["f", "s", "t", key],
        &["f", "s", key, "--key=rsa.key"],
        &["f", "s", key, "--cert=rsa.crt", "--cert=rsa.crt"],
        &["f", "s", key, "--pkcs11-keyid=1", "--pkcs11-keyid=1"],
        &["f", "s", key, "--foo"],
        &["f", "s", key, "--p=x"],
        &["f", "s", key, "--hash-alg=md5"],
        &["f", "s", key, "--block-size=1000"],
        &["f", "s", key, "--salt=abc"],
        &["f", "s", key, "--out-descriptor=a", "--out-descriptor=b"],
        &["f", "s", "--key"],
        // Digest errors.
        &["missing", "s", key],
        &["f", "s", key, "--block-size=32"],
        &["f", "s", key, "--hash-alg=3"],
        &["f", "s", key, &format!("--salt={}", "ab".repeat(33))],
        // Key and certificate errors, in libfsverity's order.
        &["f", "s"],
        &["f", "s", "--cert=rsa.crt"],
        &["f", "s", "--key=missing.pem"],
        &["f", "s", key, "--cert=missing.pem"],
        &["f", "s", "--key=missing.pem", "--cert=missing.crt"],
        &["f", "s", "--key=nocert.pem"],
        &["f", "s", "--key=rsa.crt"],
        &["f", "s", "--key=rsa.crt", "--cert=rsa.crt"],
        &["f", "s", key, "--cert=/"],
        &["f", "s", "--key=/dev/null", "--cert=rsa.crt"],
        &["f", "s", "--key=ec.key", "--cert=rsa.crt"],
        &[
            "f",
            "s",
            "--key=rsa.key",
            "--cert=ec.crt",
            "--hash-alg=sha512",
        ],
        // PKCS#11 options: the checks made before any token is used.
        &["f", "s", "--pkcs11-engine=x.so"],
        &["f", "s", "--pkcs11-module=y.so", "--pkcs11-engine=x.so"],
        &["f", "s", key, "--cert=rsa.crt", "--pkcs11-keyid=1"],
        &["f", "s", "--pkcs11-keyid=1", "--cert=missing.crt"],
        // Output errors.
        &["f", "nodir/s", key, "--cert=rsa.crt"],
        &["f", "s", key, "--cert=rsa.crt", "--out-merkle-tree=nodir/t"],
    ];
    for args in cases {
        let args = [&["sign"][..], args].concat();
        let (theirs, ours) = inputs.both(&args);
        report.check(&args.join(" "), &theirs, &ours);
    }
    report.finish();
}

/// A PKCS#11 token would be used: fsverity v1.5 (Debian's, built with
/// OpenSSL's ENGINE API) tries to load it; verityfs reports, as a v1.5
/// built without PKCS#11 support does, that it cannot.
#[test]
fn pkcs11_tokens_are_reported_unsupported() {
    let inputs = sign_inputs();
    for extra in [
        &["--pkcs11-engine=x.so", "--pkcs11-module=y.so"][..],
        &["--pkcs11-keyid=1"],
        &["--pkcs11-module=y.so", "--pkcs11-keyid=pkcs11:id=%01"],
    ] {
        let args = [&["sign", "f", "s", "--cert=rsa.crt"][..], extra].concat();
        let (theirs, ours) = inputs.both(&args);
        assert_eq!(theirs.status, Some(1), "{theirs:?}");
        assert_eq!(
            (ours.status, ours.stdout.as_str(), ours.created.len()),
            (Some(1), "", 0),
            "{args:?}: {ours:?}"
        );
        assert_eq!(
            ours.stderr,
            "ERROR: verityfs doesn't support PKCS#11 tokens\nERROR: failed to sign digest\n"
        );
    }
}

#[test]
fn ecdsa_sign_verifies() {
    let inputs = sign_inputs();
    let mut report = Report::default();
    for alg in ["sha256", "sha512"] {
        let args = [
            "sign",
            "f",
            "s",
            "--key=ec.key",
            "--cert=ec.crt",
            &format!("--hash-alg={alg}"),
            "--out-descriptor=d",
        ];
        let (mut theirs, mut ours) = inputs.both(&args);
        let sigs = [&mut theirs, &mut ours].map(|run| run.created.remove("s").unwrap());
        report.check(&args.join(" "), &theirs, &ours);

        let descriptor = Descriptor::parse(&ours.created["d"]).unwrap().0;
        let alg = descriptor.params().hash_algorithm();
        let cert = Certificate::from_pem(&fs::read(inputs.path("ec.crt")).unwrap()).unwrap();
        let trusted = [cert];
        for sig in &sigs {
            verify_signature(sig, alg, &descriptor.file_digest(), &trusted).unwrap();
            smime_verify(&inputs, sig, alg, &descriptor);
        }
    }
    report.finish();
}

/// `openssl smime -verify` of a detached signature over the formatted
/// digest, the certificate given (the signature carries none).
fn smime_verify(inputs: &Inputs, sig: &[u8], alg: HashAlgorithm, descriptor: &Descriptor) {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("sig"), sig).unwrap();
    let formatted = verityfs::formatted_digest(alg, &descriptor.file_digest());
    fs::write(dir.path().join("content"), formatted).unwrap();
    run_checked(
        Command::new("openssl")
            .current_dir(dir.path())
            .args([
                "smime", "-verify", "-binary", "-inform", "der", "-in", "sig",
            ])
            .args(["-content", "content", "-noverify", "-out", "/dev/null"])
            .arg("-certfile")
            .arg(inputs.path("ec.crt")),
    );
}

// ---------------------------------------------------------------------------
// enable and measure, through a mount
// ---------------------------------------------------------------------------

/// A `verityfs mount` of a fresh backing directory, unmounted on drop.
struct Mounted {
    daemon: Child,
    point: PathBuf,
    backing: PathBuf,
    _dir: tempfile::TempDir,
}

impl Mounted {
    fn new() -> Self {
        let dir = scratch_dir("enable-vs-fsverity");
        let root = fs::canonicalize(dir.path()).unwrap();
        let (backing, point) = (root.join("backing"), root.join("mnt"));
        fs::create_dir(&backing).unwrap();
        fs::create_dir(&point).unwrap();
        let daemon = Command::new(VERITYFS)
            .arg("mount")
            .arg(&backing)
            .arg(&point)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("cannot run verityfs mount");
        let mut mounted = Mounted {
            daemon,
            point,
            backing,
            _dir: dir,
        };
        let start = Instant::now();
        while !mounted.in_mountinfo() {
            let exited = mounted.daemon.try_wait().unwrap();
            assert!(
                exited.is_none() && start.elapsed() < Duration::from_secs(20),
                "verityfs mount did not come up ({exited:?}); these tests need root and /dev/fuse"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        mounted
    }

    fn in_mountinfo(&self) -> bool {
        let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
        let point = self.point.to_str().unwrap();
        info.lines().any(|l| l.split(' ').nth(4) == Some(point))
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let unmounted = Command::new("umount").arg(&self.point).status();
        if !unmounted.is_ok_and(|s| s.success()) {
            let _ = Command::new("umount").arg("-l").arg(&self.point).status();
        }
        let start = Instant::now();
        while matches!(self.daemon.try_wait(), Ok(None)) {
            if start.elapsed() > Duration::from_secs(10) {
                let _ = self.daemon.kill();
                let _ = self.daemon.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Each program's directory in the mount, with the same files.
struct Twins<'a> {
    mount: &'a Mounted,
    names: Vec<String>,
}

impl<'a> Twins<'a> {
    const PROGS: [(&'static str, &'static str); 2] =
        [("fsverity", FSVERITY), ("verityfs", VERITYFS)];

    fn new(mount: &'a Mounted) -> Self {
        for (tag, _) in Self::PROGS {
            fs::create_dir(mount.point.join(tag)).unwrap();
        }
        Twins {
            mount,
            names: Vec::new(),
        }
    }

    fn add(&mut self, name: &str, data: &[u8]) {
        for (tag, _) in Self::PROGS {
            fs::write(self.mount.point.join(tag).join(name), data).unwrap();
        }
        self.names.push(name.to_owned());
    }

    fn add_dir(&mut self, name: &str) {
        for (tag, _) in Self::PROGS {
            fs::create_dir(self.mount.point.join(tag).join(name)).unwrap();
        }
        self.names.push(name.to_owned());
    }

    /// Runs `args` with both programs, each in its directory.
    fn both(&self, args: &[&str]) -> [Outcome; 2] {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        Self::PROGS.map(|(tag, prog)| run_in(prog, &self.mount.point.join(tag), &args, &self.names))
    }

    /// The backing file of `name` for each program.
    fn backing(&self, name: &str) -> [PathBuf; 2] {
        Self::PROGS.map(|(tag, _)| self.mount.backing.join(tag).join(name))
    }
}

/// The signature stored after the descriptor of the verity backing file
/// `path`, and the file digest.
fn stored_signature(path: &Path) -> (Vec<u8>, String) {
    let FileState::Verity(location) = FileState::read_path(path).unwrap() else {
        panic!("{} is not a verity file", path.display());
    };
    let backing = fs::read(path).unwrap();
    let start = location.desc_pos as usize;
    let stored = &backing[start..start + location.desc_size as usize];
    let (descriptor, sig) = Descriptor::parse(stored).unwrap();
    assert_eq!(descriptor.sig_size() as usize, sig.len());
    assert_eq!(
        start + stored.len(),
        backing.len(),
        "the signature ends the file"
    );
    (sig.to_vec(), descriptor.file_digest().to_hex())
}

/// fsverity's signature of `data` (SHA-512 with 1024-byte blocks if
/// `sha512`) with a fresh RSA key.
fn real_signature(dir: &Path, data: &[u8], sha512: bool) -> Vec<u8> {
    make_key(dir, "k", &["-newkey", "rsa:2048"]);
    fs::write(dir.join("data"), data).unwrap();
    let mut cmd = Command::new(FSVERITY);
    cmd.current_dir(dir)
        .args(["sign", "data", "sig", "--key=k.key", "--cert=k.crt"]);
    if sha512 {
        cmd.args(["--hash-alg=sha512", "--block-size=1024"]);
    }
    run_checked(&mut cmd);
    fs::read(dir.join("sig")).unwrap()
}

#[test]
fn enable_and_measure_are_identical() {
    let mount = Mounted::new();
    let mut twins = Twins::new(&mount);
    let scratch = tempfile::tempdir().unwrap();
    let file = |name: &str| scratch.path().join(name).to_str().unwrap().to_owned();

    let data: Vec<Vec<u8>> = (0..9)
        .map(|i| random_bytes(5000 * i * i + 1, i as u64))
        .collect();
    for (i, d) in data.iter().enumerate() {
        twins.add(&format!("f{i}"), d);
    }
    twins.add_dir("dir");
    let sig4 = real_signature(scratch.path(), &data[4], false);
    let sig5 = real_signature(scratch.path(), &data[5], true);
    fs::write(file("sig4"), &sig4).unwrap();
    fs::write(file("sig5"), &sig5).unwrap();
    fs::write(file("empty"), b"").unwrap();
    fs::write(file("big"), vec![0x30; 1_000_001]).unwrap();
    fs::write(file("max"), vec![0x30; 1_000_000]).unwrap();
    let (sig4, sig5, empty, big, max) = (
        &*file("sig4"),
        &*file("sig5"),
        &*file("empty"),
        &*file("big"),
        &*file("max"),
    );
    let signature_max = format!("--signature={max}");
    let long_salt = format!("--salt={}", "ab".repeat(33));

    let steps: &[&[&str]] = &[
        &["measure", "f0"],
        &["enable", "f0"],
        &["measure", "f0"],
        &["enable", "f0"],
        &[
            "enable",
            "--hash-alg=sha512",
            "--block-size=1024",
            "--salt=00112233",
            "f1",
        ],
        &["enable", "f2", "--salt="],
        &["enable", &format!("--signature={sig4}"), "f4"],
        &[
            "enable",
            "--signature",
            sig5,
            "--hash-alg=sha512",
            "--block-size=1024",
            "f5",
        ],
        &["enable", "--block-size=65536", "--", "f6"],
        &["measure", "f0", "f1", "f2", "f4", "f5", "f6"],
        &["measure", "f1", "f3", "f2"],
        &["measure", "missing"],
        &["measure", "dir"],
        &["measure"],
        &["measure", "--"],
        &["measure", "--foo"],
        // Refused by the file system.
        &["enable", "missing"],
        &["enable", "dir"],
        &["enable", "--hash-alg=257", "f3"],
        &["enable", "--block-size=1", "f3"],
        &["enable", "--block-size=512", "f3"],
        &["enable", &long_salt, "f3"],
        // Signature files.
        &["enable", "--signature=/nonexistent", "f3"],
        &["enable", "--signature=/", "f3"],
        &["enable", "--sig", big, "f3"],
        &["enable", "f3", "--signature", empty],
        &["enable", &signature_max, "f3"],
        &["enable", "--signature", empty, "--salt=zz"],
        &["enable", &signature_max, &signature_max, "f3"],
        // Usage errors.
        &["enable"],
        &["enable", "f3", "f7"],
        &["enable", "--foo", "f3"],
        &["enable", "--s=1", "f3"],
        &["enable", "--salt=abc", "f3"],
        &["enable", "--block-size=3", "f3"],
        &["enable", "--hash-alg=sha1", "f3"],
        &["enable", "--out-descriptor=d", "f3"],
        &["enable", "f3", "--salt"],
        &["measure", "f3"],
    ];
    let mut report = Report::default();
    for step in steps {
        let [theirs, ours] = twins.both(step);
        report.check(&step.join(" "), &theirs, &ours);
    }
    report.finish();

    for name in &twins.names {
        let [theirs, ours] = twins.backing(name);
        if theirs.is_file() {
            assert_eq!(
                fs::read(&theirs).unwrap(),
                fs::read(&ours).unwrap(),
                "backing files of {name} differ"
            );
            assert_eq!(
                FileState::read_path(&theirs).unwrap(),
                FileState::read_path(&ours).unwrap(),
                "verity state of {name} differs"
            );
        }
    }
    // Both programs really enabled what they should, and refused f3: a
    // step cannot pass by failing the same way twice.
    for name in ["f0", "f1", "f2", "f3", "f4", "f5", "f6"] {
        for path in twins.backing(name) {
            let state = FileState::read_path(&path).unwrap();
            let verity = matches!(state, FileState::Verity(_));
            assert_eq!(verity, name != "f3", "{}: {state:?}", path.display());
        }
    }
    // The signatures are stored after the descriptor, and the digest is
    // the one signed.
    for (name, sig, sha512) in [("f4", sig4, false), ("f5", sig5, true)] {
        let sig = fs::read(sig).unwrap();
        for path in twins.backing(name) {
            let (stored, digest) = stored_signature(&path);
            assert_eq!(stored, sig, "{}", path.display());
            let [measured, _] = twins.both(&["measure", name]);
            let alg = if sha512 { "sha512" } else { "sha256" };
            assert_eq!(measured.stdout, format!("{alg}:{digest} {name}\n"));
        }
    }
    // Unsigned files store no signature.
    for path in twins.backing("f0") {
        assert!(stored_signature(&path).0.is_empty());
    }
}

/// `verityfs measure` prints the digest `verityfs digest` computes and
/// `fsverity measure` reads, through the mount.
#[test]
fn measure_matches_digest() {
    let mount = Mounted::new();
    let mut twins = Twins::new(&mount);
    twins.add("a", &random_bytes(200_000, 5));
    let [_, ours] = twins.both(&["enable", "--hash-alg=sha512", "--salt=feed", "a"]);
    assert_eq!(ours.status, Some(0), "{ours:?}");
    let [theirs, ours] = twins.both(&["measure", "a"]);
    assert_eq!(theirs, ours);
    let dir = mount.point.join("verityfs");
    let digest = run_in(
        VERITYFS,
        &dir,
        &["digest", "--hash-alg=sha512", "--salt=feed", "a"].map(String::from),
        &twins.names,
    );
    assert_eq!(digest.stdout, ours.stdout);
    assert!(ours.stdout.starts_with("sha512:"), "{ours:?}");
}
