//! Differential tests: `verityfs digest` against fsverity-utils' `fsverity
//! digest` (v1.5, the real program at `/usr/bin/fsverity`, Debian package
//! `fsverity`).
//!
//! Each case runs both programs with the same arguments, each in its own
//! scratch directory holding hard links to the same input files, and compares
//! the exit status, stdout, stderr and every file the run left behind
//! (`--out-merkle-tree`, `--out-descriptor`, ...) byte for byte. The only
//! normalisations are the intended differences: usage lines say `verityfs`
//! instead of `fsverity`, and both full usages lose the blocks of the
//! commands only one of them has ([`IMPLEMENTED`]). `--version` is
//! checked separately (`version_is_ours`).
//!
//! Random inputs come from a SplitMix64 generator with fixed seeds, so a
//! failure reproduces; set `VERITYFS_DIFF_SEED` to try other seeds (failure
//! messages name the seed). Without `/usr/bin/fsverity` every test fails.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::{BufWriter, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use fastrand::Rng;

/// The reference implementation.
const ORACLE: &str = "/usr/bin/fsverity";
/// What `fsverity --version` must print for these expectations to hold.
const ORACLE_VERSION: &str = "fsverity v1.5\n";
/// The program under test.
const OURS: &str = env!("CARGO_BIN_EXE_verityfs");
/// What `verityfs --version` prints.
const OUR_VERSION: &str = "verityfs v0.1.0\n";
/// Commands both programs have; each one's full usage is cut to these.
const IMPLEMENTED: &[&str] = &["digest", "enable", "measure", "sign"];
/// Largest input the parameter matrix generates (bigger boundary sizes are
/// left to `large_file_streams_in_chunks`).
const MATRIX_SIZE_CAP: u64 = 32 << 20;
/// The unprivileged user (and group) permission cases run as: `nobody`.
/// Root reads any file (CAP_DAC_OVERRIDE), so they cannot run as root.
const NOBODY: u32 = 65534;

// ---------------------------------------------------------------------------
// Running both programs
// ---------------------------------------------------------------------------

/// The oracle's path, after checking once that it exists and is v1.5.
/// The program under test, copied where any user may run it: the checkout,
/// and `target/` in it, may be private to root.
fn ours_for_everyone() -> &'static Path {
    use std::os::unix::fs::PermissionsExt;
    static COPY: std::sync::OnceLock<(tempfile::TempDir, PathBuf)> = std::sync::OnceLock::new();
    let (_, path) = COPY.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join("verityfs");
        fs::copy(OURS, &path).expect("copying the program under test");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        (dir, path)
    });
    path
}

fn oracle() -> &'static str {
    static CHECKED: OnceLock<()> = OnceLock::new();
    CHECKED.get_or_init(|| {
        let out = Command::new(ORACLE).arg("--version").output();
        let out = out.unwrap_or_else(|e| {
            panic!(
                "cannot run {ORACLE} ({e}); these differential tests need \
                 fsverity-utils v1.5: `apt-get install fsverity`"
            )
        });
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            ORACLE_VERSION,
            "{ORACLE} is not the fsverity-utils version these tests expect"
        );
    });
    ORACLE
}

/// One file system entry a run left in its directory.
#[derive(PartialEq)]
enum Entry {
    Dir,
    File(Vec<u8>),
    Other,
}

/// Everything observable about one run.
struct Outcome {
    /// Exit code; `None` if killed by a signal.
    status: Option<i32>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// Every entry of the run directory except the inputs, by relative path.
    files: BTreeMap<OsString, Entry>,
}

/// A scratch directory with input files shared by both programs: `in/` holds
/// the inputs, and each run gets a fresh directory of hard links to them.
struct Sandbox {
    root: tempfile::TempDir,
    /// Top-level input names, and whether each is a directory.
    inputs: Vec<(OsString, bool)>,
}

impl Sandbox {
    fn new() -> Self {
        let root = tempfile::Builder::new()
            .prefix("digest-vs-fsverity")
            .tempdir()
            .expect("creating a temporary directory");
        fs::create_dir(root.path().join("in")).unwrap();
        Sandbox {
            root,
            inputs: Vec::new(),
        }
    }

    fn input_path(&self, name: &OsStr) -> PathBuf {
        self.root.path().join("in").join(name)
    }

    /// Adds an input file `name` holding `data`.
    fn file(&mut self, name: impl AsRef<OsStr>, data: &[u8]) -> &mut Self {
        let name = name.as_ref();
        fs::write(self.input_path(name), data).unwrap();
        self.inputs.push((name.to_owned(), false));
        self
    }

    /// Adds an input file `name` of `size` pseudo-random bytes from `seed`,
    /// written in pieces so that large files cost no memory.
    fn random_file(&mut self, name: impl AsRef<OsStr>, size: u64, seed: u64) -> &mut Self {
        let name = name.as_ref();
        let file = fs::File::create(self.input_path(name)).unwrap();
        let mut out = BufWriter::new(file);
        let mut rng = Rng::with_seed(seed);
        let mut buf = vec![0u8; 1 << 20];
        let mut left = size;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            rng.fill(&mut buf[..n]);
            out.write_all(&buf[..n]).unwrap();
            left -= n as u64;
        }
        out.flush().unwrap();
        self.inputs.push((name.to_owned(), false));
        self
    }

    /// Adds an empty input directory `name`.
    fn dir(&mut self, name: impl AsRef<OsStr>) -> &mut Self {
        let name = name.as_ref();
        fs::create_dir(self.input_path(name)).unwrap();
        self.inputs.push((name.to_owned(), true));
        self
    }

    /// An invocation of `args` (after the program name) in this sandbox.
    fn cmd<S: AsRef<OsStr>>(&self, args: &[S]) -> Invocation<'_> {
        Invocation {
            sandbox: self,
            args: args.iter().map(|a| a.as_ref().to_owned()).collect(),
            env: Vec::new(),
            stdout_to: None,
            prefill: Vec::new(),
            user: None,
        }
    }

    /// Gives the run directory `dir` to `uid`, and lets it reach `dir`.
    /// The inputs (hard links) keep their owner and modes.
    fn hand_over(&self, dir: &Path, uid: u32) {
        use std::os::unix::fs::PermissionsExt;
        let traverse = fs::Permissions::from_mode(0o711);
        fs::set_permissions(self.root.path(), traverse).unwrap();
        std::os::unix::fs::chown(dir, Some(uid), Some(uid)).unwrap();
    }

    /// A fresh run directory for `prog`: hard links to the inputs.
    fn run_dir(&self, prog: &str) -> PathBuf {
        let dir = self.root.path().join(format!("run-{prog}"));
        if dir.exists() {
            fs::remove_dir_all(&dir).unwrap();
        }
        fs::create_dir(&dir).unwrap();
        for (name, is_dir) in &self.inputs {
            if *is_dir {
                fs::create_dir(dir.join(name)).unwrap();
            } else {
                fs::hard_link(self.input_path(name), dir.join(name)).unwrap();
            }
        }
        dir
    }
}

/// What to compare.
#[derive(Clone, Copy, PartialEq)]
enum Check {
    /// Status, stdout, stderr and the files left behind.
    All,
    /// Status, stdout and stderr only: for runtime errors that stop midway,
    /// where partly written output files may legitimately differ.
    Streams,
}

/// One command line to run with both programs.
struct Invocation<'a> {
    sandbox: &'a Sandbox,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    /// Send stdout to this file instead of capturing it.
    stdout_to: Option<PathBuf>,
    /// Files (not inputs) to create before each run.
    prefill: Vec<(OsString, Vec<u8>)>,
    /// Run as this user and group instead of the test's own (root).
    user: Option<u32>,
}

impl Invocation<'_> {
    fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    fn stdout_to(mut self, path: &str) -> Self {
        self.stdout_to = Some(path.into());
        self
    }

    fn prefill(mut self, name: &str, data: &[u8]) -> Self {
        self.prefill.push((name.into(), data.to_vec()));
        self
    }

    /// Runs both programs as `uid` (user and group, no supplementary
    /// groups), in a run directory that user owns. Needs root.
    fn run_as(mut self, uid: u32) -> Self {
        let euid = rustix::process::geteuid().as_raw();
        assert_eq!(
            euid, 0,
            "running fsverity and verityfs as user {uid} needs root (the test runs as uid {euid})"
        );
        self.user = Some(uid);
        self
    }

    /// Runs `prog` in a fresh run directory.
    fn run_one(&self, prog: &str, name: &str) -> Outcome {
        let dir = self.sandbox.run_dir(name);
        for (file, data) in &self.prefill {
            fs::write(dir.join(file), data).unwrap();
        }
        let mut cmd = match self.user {
            Some(_) if prog == OURS => Command::new(ours_for_everyone()),
            _ => Command::new(prog),
        };
        if let Some(uid) = self.user {
            self.sandbox.hand_over(&dir, uid);
            cmd.uid(uid).gid(uid);
        }
        cmd.args(&self.args)
            .current_dir(&dir)
            .env_remove("POSIXLY_CORRECT")
            .env("LC_ALL", "C")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        if let Some(path) = &self.stdout_to {
            cmd.stdout(fs::OpenOptions::new().write(true).open(path).unwrap());
        }
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("cannot run {prog}: {e}"));
        let mut files = BTreeMap::new();
        let inputs: Vec<&OsStr> = self.sandbox.inputs.iter().map(|(n, _)| &**n).collect();
        snapshot(&dir, Path::new(""), &inputs, &mut files);
        Outcome {
            status: out.status.code(),
            stdout: out.stdout,
            stderr: out.stderr,
            files,
        }
    }

    /// Runs both programs; returns (fsverity, verityfs) after normalisation.
    fn run(&self) -> (Outcome, Outcome) {
        let mut theirs = self.run_one(oracle(), "fsverity");
        theirs.stdout = normalise_oracle(&theirs.stdout);
        theirs.stderr = normalise_oracle(&theirs.stderr);
        let mut ours = self.run_one(OURS, "verityfs");
        ours.stdout = normalise_oracle(&normalise_ours(&ours.stdout));
        ours.stderr = normalise_oracle(&normalise_ours(&ours.stderr));
        (theirs, ours)
    }

    /// A description of every difference, or `None` if there is none.
    fn diff(&self, what: Check) -> Option<String> {
        let (theirs, ours) = self.run();
        describe_differences(&self.describe(), &theirs, &ours, what)
    }

    /// Compares everything ([`Check::All`]), and also requires fsverity to
    /// succeed, so a case cannot pass by failing the same way in both
    /// programs.
    fn check_success(&self) -> Option<String> {
        let (theirs, ours) = self.run();
        let cmd = self.describe();
        if theirs.status != Some(0) {
            return Some(format!(
                "`{cmd}`: fsverity itself failed ({:?}): {}",
                theirs.status,
                show(&theirs.stderr)
            ));
        }
        describe_differences(&cmd, &theirs, &ours, Check::All)
    }

    /// Compares everything ([`Check::All`]), and also requires fsverity to fail with
    /// `message` on stderr, so a case cannot pass by succeeding the same
    /// way in both programs.
    fn check_failure(&self, message: &str) -> Option<String> {
        let (theirs, ours) = self.run();
        let cmd = self.describe();
        if theirs.status == Some(0) || !show(&theirs.stderr).contains(message) {
            return Some(format!(
                "`{cmd}`: fsverity did not fail with {message:?} ({:?}): {}",
                theirs.status,
                show(&theirs.stderr)
            ));
        }
        describe_differences(&cmd, &theirs, &ours, Check::All)
    }

    /// The command line, shell-like, for messages.
    fn describe(&self) -> String {
        let mut s = String::new();
        for (k, v) in &self.env {
            s += &format!("{}={} ", show(k.as_bytes()), show(v.as_bytes()));
        }
        s += "fsverity";
        for a in &self.args {
            s += &format!(" {}", quote(a.as_bytes()));
        }
        if let Some(path) = &self.stdout_to {
            s += &format!(" >{}", path.display());
        }
        if let Some(uid) = self.user {
            s += &format!(" (as uid {uid})");
        }
        s
    }
}

/// Records every entry under `dir` (relative to it) except the inputs.
fn snapshot(dir: &Path, rel: &Path, inputs: &[&OsStr], out: &mut BTreeMap<OsString, Entry>) {
    for entry in fs::read_dir(dir.join(rel)).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if rel.as_os_str().is_empty() && inputs.contains(&name.as_os_str()) {
            continue;
        }
        let path = rel.join(&name);
        let kind = entry.file_type().unwrap();
        let value = if kind.is_dir() {
            snapshot(dir, &path, inputs, out);
            Entry::Dir
        } else if kind.is_file() {
            Entry::File(fs::read(dir.join(&path)).unwrap())
        } else {
            Entry::Other
        };
        out.insert(path.into_os_string(), value);
    }
}

/// Our usage lines name `verityfs`; make them name `fsverity`.
fn normalise_ours(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for line in text.split_inclusive(|&b| b == b'\n') {
        match line.strip_prefix(b"    verityfs ") {
            Some(rest) => {
                out.extend_from_slice(b"    fsverity ");
                out.extend_from_slice(rest);
            }
            None => out.extend_from_slice(line),
        }
    }
    out
}

/// Drops from a full usage (ours after [`normalise_ours`]) the blocks of
/// commands not in [`IMPLEMENTED`]: `  <description>:` followed by
/// `    fsverity <cmd> ...` lines, up to and including the blank line that
/// ends the block.
fn normalise_oracle(text: &[u8]) -> Vec<u8> {
    let lines: Vec<&[u8]> = text.split_inclusive(|&b| b == b'\n').collect();
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < lines.len() {
        let is_heading = lines[i].starts_with(b"  ")
            && !lines[i].starts_with(b"   ")
            && lines[i].ends_with(b":\n");
        let command = lines
            .get(i + 1)
            .and_then(|next| next.strip_prefix(b"    fsverity "))
            .and_then(|rest| rest.split(|&b| b == b' ' || b == b'\n').next());
        let unimplemented = command.is_some_and(|c| {
            !c.starts_with(b"--") && !IMPLEMENTED.iter().any(|i| i.as_bytes() == c)
        });
        if is_heading && unimplemented {
            while i < lines.len() && lines[i] != b"\n" {
                i += 1;
            }
            i += 1; // the blank line
            continue;
        }
        out.extend_from_slice(lines[i]);
        i += 1;
    }
    out
}

/// Lists every difference between the two outcomes.
fn describe_differences(
    cmd: &str,
    theirs: &Outcome,
    ours: &Outcome,
    what: Check,
) -> Option<String> {
    let mut msg = String::new();
    if theirs.status != ours.status {
        msg += &format!(
            "  exit status: fsverity {:?}, verityfs {:?}\n",
            theirs.status, ours.status
        );
    }
    for (stream, a, b) in [
        ("stdout", &theirs.stdout, &ours.stdout),
        ("stderr", &theirs.stderr, &ours.stderr),
    ] {
        if a != b {
            msg += &format!(
                "  {stream} differs:\n    fsverity: {}\n    verityfs: {}\n",
                show_stream(a),
                show_stream(b)
            );
        }
    }
    if what == Check::All {
        let names: std::collections::BTreeSet<_> =
            theirs.files.keys().chain(ours.files.keys()).collect();
        for name in names {
            let file = quote(name.as_bytes());
            match (theirs.files.get(name), ours.files.get(name)) {
                (Some(a), Some(b)) if a == b => {}
                (Some(Entry::File(a)), Some(Entry::File(b))) => {
                    let first = a.iter().zip(b).position(|(x, y)| x != y);
                    let first = first.unwrap_or(a.len().min(b.len()));
                    msg += &format!(
                        "  file {file}: fsverity wrote {} bytes, verityfs {}; \
                         first difference at byte {first}\n",
                        a.len(),
                        b.len()
                    );
                }
                (Some(_), Some(_)) => msg += &format!("  {file}: entries of different types\n"),
                (Some(_), None) => msg += &format!("  {file}: only fsverity created it\n"),
                (None, _) => msg += &format!("  {file}: only verityfs created it\n"),
            }
        }
    }
    (!msg.is_empty()).then(|| format!("`{cmd}` (seed {:#x}):\n{msg}", base_seed()))
}

/// Text for messages: valid UTF-8 as is, other bytes as `\xNN`.
fn show(bytes: &[u8]) -> String {
    let mut s = String::new();
    for chunk in bytes.utf8_chunks() {
        s += chunk.valid();
        for b in chunk.invalid() {
            s += &format!("\\x{b:02x}");
        }
    }
    s
}

/// A captured stream for messages, continuation lines indented.
fn show_stream(bytes: &[u8]) -> String {
    match bytes.strip_suffix(b"\n") {
        _ if bytes.is_empty() => "(empty)".into(),
        Some(text) => show(text).replace('\n', "\n              "),
        None => show(bytes).replace('\n', "\n              ") + " [no newline at end]",
    }
}

/// An argument for a shell-like command line in messages.
fn quote(arg: &[u8]) -> String {
    let plain = !arg.is_empty()
        && arg
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_=./:+,".contains(b));
    if plain {
        show(arg)
    } else {
        format!("'{}'", show(arg))
    }
}

/// Collects the differences of many cases, to report them all at once.
#[derive(Default)]
struct Failures {
    cases: usize,
    messages: Vec<String>,
}

impl Failures {
    fn add(&mut self, result: Option<String>) {
        self.cases += 1;
        self.messages.extend(result);
    }

    fn finish(self) {
        const SHOWN: usize = 12;
        if self.messages.is_empty() {
            return;
        }
        let mut msg = format!(
            "{} of {} cases differ from fsverity:\n\n",
            self.messages.len(),
            self.cases
        );
        for m in self.messages.iter().take(SHOWN) {
            msg += m;
            msg += "\n";
        }
        if self.messages.len() > SHOWN {
            msg += &format!("... and {} more\n", self.messages.len() - SHOWN);
        }
        panic!("{msg}");
    }
}

// ---------------------------------------------------------------------------
// Deterministic randomness and parameters
// ---------------------------------------------------------------------------

/// The seed all tests derive theirs from: `VERITYFS_DIFF_SEED` or a constant.
fn base_seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| match std::env::var("VERITYFS_DIFF_SEED") {
        Ok(s) => {
            let s = s.trim();
            let parsed = match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse(),
            };
            parsed.expect("VERITYFS_DIFF_SEED must be a number")
        }
        Err(_) => 0x5eed_f57e_417b_1f00,
    })
}

/// A generator for the test named `name`, seeded from [`base_seed`].
fn rng_for(name: &str) -> Rng {
    let mut seed = base_seed();
    for b in name.bytes() {
        seed = (seed ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    Rng::with_seed(seed)
}

/// The argument of a random `--salt` option of 0 to 32 bytes, in lower,
/// upper or mixed case hex (`--salt=` for the empty salt), or none.
fn salt_option(rng: &mut Rng) -> Option<String> {
    let len = match rng.u32(..6) {
        0 => return None,
        1 => 0,
        _ => rng.usize(1..=32),
    };
    let mut bytes = vec![0; len];
    rng.fill(&mut bytes);
    let style = rng.u32(..3);
    let hex: String = bytes
        .iter()
        .flat_map(|b| [b >> 4, b & 15])
        .map(|nibble| {
            let c = char::from_digit(nibble.into(), 16).unwrap();
            match style {
                0 => c,
                1 => c.to_ascii_uppercase(),
                _ if rng.bool() => c.to_ascii_uppercase(),
                _ => c,
            }
        })
        .collect();
    Some(format!("--salt={hex}"))
}

/// The hash algorithms fs-verity knows.
#[derive(Clone, Copy, Debug)]
enum Alg {
    Sha256,
    Sha512,
}

impl Alg {
    fn name(self) -> &'static str {
        match self {
            Alg::Sha256 => "sha256",
            Alg::Sha512 => "sha512",
        }
    }

    fn id(self) -> u32 {
        match self {
            Alg::Sha256 => 1,
            Alg::Sha512 => 2,
        }
    }

    fn digest_size(self) -> u64 {
        match self {
            Alg::Sha256 => 32,
            Alg::Sha512 => 64,
        }
    }

    /// The block sizes fsverity accepts for this algorithm that the tests
    /// use: every power of two from twice the digest size to 128 KiB, plus
    /// 1 MiB (far beyond what the kernel takes).
    fn block_sizes(self) -> Vec<u64> {
        let smallest = 2 * self.digest_size();
        let mut sizes: Vec<u64> = (0..)
            .map(|shift| smallest << shift)
            .take_while(|&b| b <= 131072)
            .collect();
        sizes.push(1 << 20);
        sizes
    }

    /// The `--hash-alg` option spelled in one of several ways: by name, by
    /// number, as a separate argument, with an abbreviated option name, or
    /// left to the default (SHA-256 only).
    fn option(self, variant: usize) -> Vec<String> {
        match (variant % 4, self) {
            (0, _) => vec![format!("--hash-alg={}", self.name())],
            (1, _) => vec![format!("--hash-alg={}", self.id())],
            (2, Alg::Sha256) => vec![],
            (2, Alg::Sha512) => vec!["--hash=sha512".into()],
            _ => vec!["--hash-alg".into(), self.id().to_string()],
        }
    }
}

/// Sizes that sit on the Merkle tree's boundaries for `alg` and
/// `block_size`: empty, one byte, around one block, and exactly at and just
/// past 1, 2 and 3 full levels (arity^k blocks), up to [`MATRIX_SIZE_CAP`].
fn boundary_sizes(alg: Alg, block_size: u64) -> Vec<u64> {
    let arity = block_size / alg.digest_size();
    let mut sizes = vec![0, 1, block_size - 1, block_size, block_size + 1];
    let mut full = block_size;
    for _ in 0..3 {
        full = full.saturating_mul(arity);
        sizes.extend([full, full.saturating_add(1)]);
    }
    sizes.retain(|&s| s <= MATRIX_SIZE_CAP);
    sizes.dedup();
    sizes
}

/// A single file of `size` random bytes digested with `params`, writing
/// both output files; fsverity must succeed and verityfs must match it.
fn digest_one_file(size: u64, seed: u64, params: &[String]) -> Option<String> {
    let mut sandbox = Sandbox::new();
    sandbox.random_file("data", size, seed);
    let mut args = vec!["digest".to_string(), "data".to_string()];
    args.extend(params.iter().cloned());
    args.extend([
        "--out-merkle-tree=tree".into(),
        "--out-descriptor=desc".into(),
    ]);
    sandbox.cmd(&args).check_success()
}

/// Every accepted block size of `alg` at every boundary size, with random
/// salts and contents.
fn parameter_matrix(alg: Alg) {
    let mut rng = rng_for(alg.name());
    let mut failures = Failures::default();
    let mut variant = 0;
    for block_size in alg.block_sizes() {
        for size in boundary_sizes(alg, block_size) {
            let mut params = alg.option(variant);
            if block_size != 4096 || variant % 2 == 0 {
                params.push(format!("--block-size={block_size}"));
            }
            params.extend(salt_option(&mut rng));
            failures.add(digest_one_file(size, rng.u64(..), &params));
            variant += 1;
        }
    }
    failures.finish();
}

// ---------------------------------------------------------------------------
// 1. Digests, trees and descriptors across parameters
// ---------------------------------------------------------------------------

#[test]
fn sha256_parameter_matrix() {
    parameter_matrix(Alg::Sha256);
}

#[test]
fn sha512_parameter_matrix() {
    parameter_matrix(Alg::Sha512);
}

#[test]
fn random_sizes_up_to_several_megabytes() {
    let mut rng = rng_for("random sizes");
    let mut failures = Failures::default();
    // The reader's 2 MiB chunks, then random sizes.
    let chunk = 2u64 << 20;
    let mut sizes = vec![chunk - 1, chunk, chunk + 1, 2 * chunk + 4096];
    sizes.extend((0..8).map(|_| rng.u64(..6 << 20)));
    for size in sizes {
        let alg = if rng.bool() { Alg::Sha256 } else { Alg::Sha512 };
        let block_size = 1024 << rng.u32(..7); // 1 KiB to 64 KiB
        let mut params = vec![
            format!("--hash-alg={}", alg.name()),
            format!("--block-size={block_size}"),
        ];
        params.extend(salt_option(&mut rng));
        failures.add(digest_one_file(size, rng.u64(..), &params));
    }
    failures.finish();
}

#[test]
fn zero_filled_and_huge_block_files() {
    let mut sandbox = Sandbox::new();
    sandbox
        .file("zeros", &vec![0; 3 << 20])
        .file("small", b"lorem ipsum\n");
    let mut failures = Failures::default();
    for args in [
        &[
            "digest",
            "zeros",
            "--out-merkle-tree=t",
            "--out-descriptor=d",
        ][..],
        &[
            "digest",
            "zeros",
            "--hash-alg=2",
            "--block-size=1024",
            "--salt=00",
        ],
        // Block sizes far beyond the kernel's: the file fits one block.
        &[
            "digest",
            "small",
            "--block-size=1048576",
            "--out-merkle-tree=t",
        ],
        &[
            "digest",
            "small",
            "--block-size=1073741824",
            "--out-descriptor=d",
        ],
    ] {
        failures.add(sandbox.cmd(args).check_success());
    }
    failures.finish();
}

// ---------------------------------------------------------------------------
// 2. Output formats, several files, option syntax, file names
// ---------------------------------------------------------------------------

#[test]
fn output_formats() {
    let mut sandbox = Sandbox::new();
    sandbox.random_file("a", 10_000, 1).random_file("b", 1, 2);
    let mut failures = Failures::default();
    for alg in ["--hash-alg=sha256", "--hash-alg=sha512"] {
        for flags in [
            &[][..],
            &["--compact"],
            &["--for-builtin-sig"],
            &["--compact", "--for-builtin-sig"],
            &["--for-builtin-sig", "--compact"],
        ] {
            let mut args = vec!["digest", "a", alg, "b"];
            args.extend(flags);
            failures.add(sandbox.cmd(&args).check_success());
        }
    }
    failures.finish();
}

#[test]
fn several_files_share_the_output_files() {
    let mut sandbox = Sandbox::new();
    sandbox
        .random_file("big", 300_000, 3)
        .random_file("small", 5_000, 4)
        .file("empty", b"")
        .file("one", b"x");
    let mut failures = Failures::default();
    let all = ["big", "small", "empty", "one"];
    let outs = ["--out-merkle-tree=tree", "--out-descriptor=desc"];
    let runs: Vec<Vec<&str>> = vec![
        all.to_vec(),
        [&all[..], &outs].concat(),
        // The tree file keeps the largest tree's length; later trees overwrite
        // its beginning.
        ["small", "big", outs[0]].to_vec(),
        ["big", "small", "one", outs[0]].to_vec(),
        ["big", "big", outs[1]].to_vec(),
        ["one", "empty", "--compact", outs[0], outs[1]].to_vec(),
        ["big", "--for-builtin-sig", "small", "--hash-alg=2", outs[1]].to_vec(),
        // Both outputs into one file, through two descriptors.
        [
            "big",
            "small",
            "--out-merkle-tree=same",
            "--out-descriptor=same",
        ]
        .to_vec(),
    ];
    for files in &runs {
        let args = [&["digest"][..], files].concat();
        failures.add(sandbox.cmd(&args).check_success());
    }
    // Existing output files are truncated, not overwritten in place.
    let args = [&["digest", "small"][..], &outs].concat();
    let inv = sandbox
        .cmd(&args)
        .prefill("tree", &[0xaa; 1 << 20])
        .prefill("desc", &[0x55; 1000]);
    failures.add(inv.check_success());
    failures.finish();
}

#[test]
fn option_placement_and_separate_arguments() {
    let mut sandbox = Sandbox::new();
    sandbox
        .random_file("a", 70_000, 5)
        .random_file("b", 4097, 6)
        .random_file("--compact", 100, 7)
        .random_file("--help", 200, 8)
        .random_file("-", 300, 9);
    let mut failures = Failures::default();
    for args in [
        &["digest", "a", "--compact", "b", "--hash-alg=sha512"][..],
        &["digest", "a", "--salt", "00ff", "b"],
        &["digest", "--block-size", "1024", "a", "--hash-alg", "2"],
        &["digest", "a", "--out-merkle-tree", "tree", "b"],
        // `--` ends the options; what follows is a file even if it looks
        // like an option.
        &["digest", "--", "--compact"],
        &["digest", "a", "--", "--compact", "-"],
        &["digest", "--compact", "--", "--help"],
        &["digest", "-"],
        // A separate option argument is taken verbatim.
        &["digest", "a", "--out-descriptor", "--salt=00"],
        &["digest", "a", "--out-merkle-tree", "--"],
    ] {
        failures.add(sandbox.cmd(args).check_success());
    }
    // POSIXLY_CORRECT: option parsing stops at the first file.
    for args in [
        &["digest", "--compact", "a", "b"][..],
        &["digest", "a", "--compact"],
    ] {
        failures.add(
            sandbox
                .cmd(args)
                .env("POSIXLY_CORRECT", "1")
                .diff(Check::All),
        );
    }
    failures.finish();
}

#[test]
fn abbreviated_option_names() {
    let mut sandbox = Sandbox::new();
    sandbox.random_file("a", 9_000, 10);
    let mut failures = Failures::default();
    for args in [
        &["digest", "a", "--hash=sha512"][..],
        &["digest", "a", "--h=2", "--b=2048"],
        &["digest", "a", "--block=1024"],
        &["digest", "a", "--s=abCD", "--comp"],
        &["digest", "a", "--sa", "ab", "--c"],
        &["digest", "a", "--out-m=tree", "--out-d=desc"],
        &["digest", "a", "--out-m", "tree", "--for"],
        &["digest", "a", "--f", "--compa"],
        &["digest", "a", "--hash", "sha512", "--block", "1024"],
    ] {
        failures.add(sandbox.cmd(args).check_success());
    }
    // Ambiguous and over-long names are usage errors.
    for args in [
        &["digest", "a", "--out=x"][..],
        &["digest", "a", "--out", "x"],
        &["digest", "a", "--o=x"],
        &["digest", "a", "--=x"],
        &["digest", "a", "--compactt"],
        &["digest", "a", "--hash-algo=sha256"],
    ] {
        failures.add(sandbox.cmd(args).diff(Check::All));
    }
    failures.finish();
}

/// An `OsString` from raw bytes.
fn raw(bytes: &[u8]) -> OsString {
    OsString::from_vec(bytes.to_vec())
}

#[test]
fn non_utf8_file_names() {
    let mut sandbox = Sandbox::new();
    sandbox
        .random_file(raw(b"data-\xff\xfe"), 5_000, 11)
        .random_file(raw(b"caf\xe9"), 123, 12);
    let mut failures = Failures::default();
    for args in [
        vec![raw(b"digest"), raw(b"data-\xff\xfe"), raw(b"caf\xe9")],
        vec![
            raw(b"digest"),
            raw(b"caf\xe9"),
            raw(b"--out-merkle-tree=tree-\xff"),
            raw(b"--out-descriptor=desc-\xe9\x80"),
        ],
        vec![
            raw(b"digest"),
            raw(b"--for-builtin-sig"),
            raw(b"data-\xff\xfe"),
        ],
    ] {
        failures.add(sandbox.cmd(&args).check_success());
    }
    failures.finish();
}

#[test]
fn non_utf8_bytes_in_error_messages() {
    let mut sandbox = Sandbox::new();
    sandbox.random_file("a", 100, 13).dir(raw(b"dir-\xff"));
    let mut failures = Failures::default();
    for args in [
        vec![raw(b"digest"), raw(b"missing-\xff\xfe")],
        vec![raw(b"digest"), raw(b"dir-\xff")],
        vec![raw(b"digest"), raw(b"a"), raw(b"--hash-alg=\xff")],
        vec![raw(b"digest"), raw(b"a"), raw(b"--block-size=\xff")],
        vec![raw(b"digest"), raw(b"a"), raw(b"--salt=\xff\xff")],
        vec![raw(b"digest"), raw(b"a"), raw(b"--fo\xffo")],
        vec![raw(b"digest"), raw(b"a"), raw(b"--out-merkle-tree=no/\xff")],
        vec![raw(b"dig\xffest"), raw(b"a")],
    ] {
        failures.add(sandbox.cmd(&args).diff(Check::All));
    }
    failures.finish();
}

// ---------------------------------------------------------------------------
// 3. Bad input
// ---------------------------------------------------------------------------

/// Runs `digest a <arg>` for each `arg` and collects the differences.
fn each_option_value(sandbox: &Sandbox, option: &str, values: &[&str], failures: &mut Failures) {
    for value in values {
        let arg = format!("{option}={value}");
        failures.add(sandbox.cmd(&["digest", "a", &arg]).diff(Check::All));
    }
}

#[test]
fn bad_option_values() {
    let mut sandbox = Sandbox::new();
    sandbox.random_file("a", 10_000, 14);
    let mut failures = Failures::default();
    let block_sizes = [
        "3",
        "0",
        "-1",
        "4096x",
        "2147483648",
        "",
        " 4096",
        "4096 ",
        "+4096",
        "04096",
        "0x1000",
        "1e3",
        "99999999999999999999",
        "1073741824x",
        // Powers of two too small for the hash (runtime errors).
        "1",
        "2",
        "16",
        "32",
    ];
    each_option_value(&sandbox, "--block-size", &block_sizes, &mut failures);
    let algs = [
        "md5",
        "3",
        "0",
        "",
        "SHA256",
        "sha",
        "sha2566",
        "-1",
        " 2",
        "+2",
        "02",
        "2147483646",
        "2147483647",
        "4294967297",
        "-18446744073709551615",
    ];
    each_option_value(&sandbox, "--hash-alg", &algs, &mut failures);
    let salt_32 = "ab".repeat(32);
    let salt_33 = "Cd".repeat(33);
    let salts = [
        "abc", "zz", "0g", "g0", "  ", "+1", "0x00", " 00", &salt_32, &salt_33,
    ];
    each_option_value(&sandbox, "--salt", &salts, &mut failures);
    // Several bad parameters at once: libfsverity's order of checks.
    for args in [
        &["--hash-alg=3", "--block-size=32"][..],
        &["--hash-alg=3", &format!("--salt={salt_33}")],
        &["--block-size=32", &format!("--salt={salt_33}")],
        &["--hash-alg=2", "--block-size=64"],
        &[
            "--hash-alg=sha512",
            "--block-size=64",
            &format!("--salt={salt_33}"),
        ],
    ] {
        let args = [&["digest", "a"][..], args].concat();
        failures.add(sandbox.cmd(&args).diff(Check::All));
    }
    // A bad value wins over a later getopt error and vice versa.
    for args in [
        &["digest", "--salt=zz", "--foo", "a"][..],
        &["digest", "--foo", "--salt=zz", "a"],
        &["digest", "--block-size=3", "--hash-alg=md5", "a"],
    ] {
        failures.add(sandbox.cmd(args).diff(Check::All));
    }
    failures.finish();
}

#[test]
fn options_given_twice() {
    let mut sandbox = Sandbox::new();
    sandbox.random_file("a", 10_000, 15);
    let mut failures = Failures::default();
    for pair in [
        ["--hash-alg=sha256", "--hash-alg=sha256"],
        ["--hash-alg=1", "--hash-alg=sha512"],
        ["--block-size=4096", "--block-size=4096"],
        ["--block-size=1024", "--block-size=3"],
        ["--salt=00", "--salt=00"],
        ["--salt=", "--salt=00"],
        ["--salt=00", "--salt=zz"],
        ["--out-merkle-tree=t1", "--out-merkle-tree=t2"],
        ["--out-merkle-tree=t1", "--out-merkle-tree=t1"],
        ["--out-descriptor=d1", "--out-descriptor=d2"],
        ["--compact", "--compact"],
        ["--for-builtin-sig", "--for-builtin-sig"],
    ] {
        failures.add(
            sandbox
                .cmd(&["digest", pair[0], "a", pair[1]])
                .diff(Check::All),
        );
    }
    failures.finish();
}

#[test]
fn unreadable_inputs() {
    let mut sandbox = Sandbox::new();
    sandbox
        .random_file("a", 10_000, 16)
        .random_file("b", 5_000, 17)
        .dir("dir");
    let mut failures = Failures::default();
    for args in [
        &["digest", "missing"][..],
        &["digest", "dir"],
        &["digest", "."],
        &["digest", ""],
        &["digest", "missing", "--salt=00", "--out-merkle-tree=t"],
        &["digest", "missing", &format!("--salt={}", "00".repeat(33))],
        &["digest", "dir", "--hash-alg=3"],
        &["digest", "/dev/null"],
    ] {
        failures.add(sandbox.cmd(args).diff(Check::All));
    }
    // Errors after some files were digested: stdout, stderr and status must
    // agree; partly written output files need not.
    for args in [
        &["digest", "a", "missing", "b"][..],
        &["digest", "a", "dir", "b"],
        &[
            "digest",
            "a",
            "b",
            "missing",
            "--out-merkle-tree=t",
            "--out-descriptor=d",
        ],
        &[
            "digest",
            "a",
            "dir",
            "--out-merkle-tree=t",
            "--out-descriptor=d",
        ],
    ] {
        failures.add(sandbox.cmd(args).diff(Check::Streams));
    }
    failures.finish();
}

/// An input its user may not read: both programs run as `nobody`, since
/// root reads any file whatever its mode. Then an output file its user may
/// not write (root's, mode 0644).
#[test]
fn permission_denied() {
    use std::os::unix::fs::PermissionsExt;
    let mut sandbox = Sandbox::new();
    sandbox
        .random_file("secret", 100, 18)
        .random_file("a", 100, 19);
    let path = sandbox.input_path(OsStr::new("secret"));
    fs::set_permissions(&path, fs::Permissions::from_mode(0o000)).unwrap();
    let mut failures = Failures::default();
    for args in [
        &["digest", "secret"][..],
        &["digest", "secret", "--out-merkle-tree=t"],
    ] {
        let case = sandbox.cmd(args).run_as(NOBODY);
        failures.add(case.check_failure("Permission denied"));
    }
    for out in ["--out-merkle-tree=t", "--out-descriptor=t"] {
        let case = sandbox.cmd(&["digest", "a", out]).prefill("t", b"root's");
        failures.add(case.run_as(NOBODY).check_failure("Permission denied"));
    }
    failures.finish();
}

#[test]
fn command_line_structure() {
    let mut sandbox = Sandbox::new();
    sandbox.random_file("a", 10_000, 19);
    let mut failures = Failures::default();
    let cases: &[&[&str]] = &[
        &[],
        &["foo"],
        &["foo", "a"],
        &["Digest", "a"],
        &["--"],
        &["-x"],
        &["--foo"],
        &["digest"],
        &["digest", "--compact"],
        &["digest", "--"],
        &["digest", "--foo", "a"],
        &["digest", "--foo=bar", "a"],
        &["digest", "-x", "a"],
        &["digest", "-xy", "a"],
        &["digest", "--compact=1", "a"],
        &["digest", "--for-builtin-sig=", "a"],
        &["digest", "a", "--salt"],
        &["digest", "a", "--hash-alg"],
        &["digest", "a", "--block-size"],
        &["digest", "a", "--out-merkle-tree"],
        &["digest", "a", "--out-descriptor"],
        &["digest", "a", "--he"],
        // --help anywhere before `--` wins, even as an option's value.
        &["--help"],
        &["digest", "--help"],
        &["digest", "a", "--help"],
        &["foo", "--help"],
        &["digest", "--foo", "--help"],
        &["digest", "--salt", "--help"],
        &["--help", "--version"],
        &["digest", "--", "--help"],
        &["--", "--help"],
    ];
    for args in cases {
        failures.add(sandbox.cmd(args).diff(Check::All));
    }
    failures.finish();
}

#[test]
fn version_is_ours() {
    let mut sandbox = Sandbox::new();
    sandbox.file("a", b"a");
    let cases: &[&[&str]] = &[
        &["--version"],
        &["digest", "--version"],
        &["digest", "a", "--version"],
        &["foo", "--version"],
        &["--version", "--help"],
        &["digest", "--foo", "--version"],
        &["digest", "--salt", "--version"],
    ];
    let mut failures = Failures::default();
    for args in cases {
        let inv = sandbox.cmd(args);
        let (mut theirs, ours) = inv.run();
        // The one intended difference: the version line. Check it, then
        // compare everything else.
        let cmd = inv.describe();
        let mut problems = Vec::new();
        if theirs.stdout != ORACLE_VERSION.as_bytes() || ours.stdout != OUR_VERSION.as_bytes() {
            problems.push(format!(
                "`{cmd}`: want fsverity to print {ORACLE_VERSION:?} and verityfs \
                 {OUR_VERSION:?}; they printed {:?} and {:?}",
                show(&theirs.stdout),
                show(&ours.stdout)
            ));
        }
        theirs.stdout.clone_from(&ours.stdout);
        problems.extend(describe_differences(&cmd, &theirs, &ours, Check::All));
        failures.add((!problems.is_empty()).then(|| problems.join("\n")));
    }
    failures.finish();
}

#[test]
fn output_file_errors() {
    let mut sandbox = Sandbox::new();
    sandbox.random_file("a", 10_000, 20).dir("dir");
    let mut failures = Failures::default();
    for args in [
        &["digest", "a", "--out-merkle-tree=nodir/tree"][..],
        &["digest", "a", "--out-descriptor=nodir/desc"],
        &["digest", "a", "--out-merkle-tree="],
        &["digest", "a", "--out-descriptor=dir"],
        &["digest", "missing", "--out-merkle-tree=nodir/tree"],
        &[
            "digest",
            "--out-merkle-tree=t",
            "--out-descriptor=nodir/d",
            "a",
        ],
    ] {
        failures.add(sandbox.cmd(args).diff(Check::All));
    }
    failures.finish();
}

#[test]
fn write_errors() {
    let mut sandbox = Sandbox::new();
    sandbox.random_file("a", 10_000, 21);
    let mut failures = Failures::default();
    for args in [
        &["digest", "a", "--out-merkle-tree=/dev/full"][..],
        &["digest", "a", "--out-merkle-tree=/dev/null"],
        &["digest", "a", "--out-descriptor=/dev/full"],
    ] {
        failures.add(sandbox.cmd(args).diff(Check::Streams));
    }
    let inv = sandbox.cmd(&["digest", "a"]).stdout_to("/dev/full");
    failures.add(inv.diff(Check::Streams));
    failures.finish();
}

// ---------------------------------------------------------------------------
// 4. A large file
// ---------------------------------------------------------------------------

#[test]
fn large_file_streams_in_chunks() {
    let mut sandbox = Sandbox::new();
    // Not a multiple of the 2 MiB read chunk nor of any block size.
    let size = (150 << 20) + 4321;
    sandbox.random_file("large", size, rng_for("large").u64(..));
    let outs = ["--out-merkle-tree=tree", "--out-descriptor=desc"];
    let mut failures = Failures::default();
    for params in [
        &[][..],
        &[
            "--hash-alg=sha512",
            "--block-size=1024",
            "--salt=0123456789abcdef",
        ],
        // Two levels of 64 KiB blocks.
        &["--block-size=65536"],
    ] {
        let args = [&["digest", "large"][..], params, &outs].concat();
        failures.add(sandbox.cmd(&args).check_success());
    }
    failures.finish();
}
