//! The kernel as the oracle: the scenarios of `oracle/` run on ext4 under
//! Linux 6.12 (booted once with `scripts/kernel-oracle.sh`) and on a
//! verityfs mount here, and must give the same results but for the
//! differences FUSE makes unavoidable (`oracle/known.rs`). With
//! `VERITYFS_ORACLE_FUSE_IN_VM=1` they also run on a verityfs mount inside
//! the VM (about twice the VM time), which tells the kernel's FUSE layer
//! apart from the daemon when a difference shows up.
//!
//! No libtest harness: this program is also what runs inside the VM
//! (`--oracle-vm`) and the helper processes of the scenarios
//! (`--oracle-enable`). It needs root, /dev/fuse, and what the script
//! needs (it installs the packages; the first run downloads the kernel).

mod common;
mod hostile;
mod oracle;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::*;
use oracle::{known, read_only, scenarios, signatures, Backend, Records};

/// The test's name, as `cargo test` filters see it.
const TEST_NAME: &str = "ext4_under_linux_and_verityfs_agree";
/// How long the VM may run.
const VM_TIMEOUT_SECS: u32 = 900;
/// Set (to 1) to also run the scenarios on a verityfs mount in the VM.
const FUSE_IN_VM: &str = "VERITYFS_ORACLE_FUSE_IN_VM";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("--oracle-vm") => in_vm(),
        Some("--oracle-enable") => child_enable(Path::new(&args[2])),
        _ => harness(&args[1..]),
    }
}

/// What `cargo test` expects of a test program: `--list`, name filters,
/// and a nonzero exit on failure.
fn harness(args: &[String]) {
    if args.iter().any(|a| a == "--list") {
        println!("{TEST_NAME}: test");
        return;
    }
    if !selected(args) {
        println!("running 0 tests (filtered out: {TEST_NAME})");
        return;
    }
    println!("running 1 test");
    let result = std::panic::catch_unwind(ext4_under_linux_and_verityfs_agree);
    let verdict = if result.is_ok() { "ok" } else { "FAILED" };
    println!("test {TEST_NAME} ... {verdict}");
    if result.is_err() {
        std::process::exit(101);
    }
}

/// Whether libtest's arguments select the test: name filters (`--exact`)
/// and `--skip`; the values of the other options are not filters.
fn selected(args: &[String]) -> bool {
    let exact = args.iter().any(|a| a == "--exact");
    let matches = |f: &str| {
        if exact {
            f == TEST_NAME
        } else {
            TEST_NAME.contains(f)
        }
    };
    let mut filters = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--skip" if args.next().is_some_and(|f| matches(f)) => return false,
            "--skip" => {}
            "--test-threads" | "--color" | "--format" | "--logfile" | "-Z" | "--shuffle-seed" => {
                args.next();
            }
            a if !a.starts_with('-') => filters.push(a),
            _ => {}
        }
    }
    filters.is_empty() || filters.into_iter().any(matches)
}

/// The test: one VM boot for the kernel's answers, then the mount here.
fn ext4_under_linux_and_verityfs_agree() {
    prerequisites();
    let vm = boot_vm();
    let kernel = read_records(vm.path(), "ext4.txt");
    let vm_mount = fuse_in_vm().then(|| read_records(vm.path(), "vm-mount.txt"));
    drop(vm);
    let started = Instant::now();
    let here = all_scenarios(Backend::Verityfs(Mount::with_args(&["-o", "allow_other"])));
    eprintln!(
        "{} scenarios on the mount here in {:.1?}",
        here.0.len(),
        started.elapsed()
    );

    if let Some(vm_mount) = &vm_mount {
        for line in known::compare(vm_mount, &here).unexplained {
            eprintln!("note: verityfs under the VM's kernel and here differ: {line}");
        }
    }
    let verdict = known::compare(&kernel, &here);
    eprintln!("known differences (the table of oracle/known.rs):");
    for line in &verdict.explained {
        eprintln!("  {line}");
    }
    let mut failures = Vec::new();
    for line in &verdict.unexplained {
        let name = line.split(':').next().unwrap();
        match vm_mount.as_ref().map(|r| r.0.get(name)) {
            Some(in_vm) => failures.push(format!(
                "{line}\n    verityfs in the VM: {}",
                in_vm.map_or("(not run)", String::as_str)
            )),
            None => failures.push(line.clone()),
        }
    }
    for scenario in &verdict.unused {
        failures.push(format!(
            "known difference {scenario} no longer occurs: update the table"
        ));
    }
    assert!(
        failures.is_empty(),
        "{} differences between Linux (ext4) and verityfs:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Boots the VM once, running this program with `--oracle-vm`; returns the
/// directory it wrote its records to (kept if the VM fails).
fn boot_vm() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("verityfs-oracle")
        .tempdir()
        .unwrap();
    let out = dir.path();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/kernel-oracle.sh");
    let started = Instant::now();
    let status = Command::new(&script)
        .arg("--out")
        .arg(out)
        .arg("--timeout")
        .arg(VM_TIMEOUT_SECS.to_string())
        .arg("--env")
        .arg(format!("{FUSE_IN_VM}={}", u8::from(fuse_in_vm())))
        .arg("--")
        .arg(std::env::current_exe().unwrap())
        .arg("--oracle-vm")
        .stdin(std::process::Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    if !status.success() {
        panic!(
            "the kernel oracle VM failed ({status}): see its output above and {}",
            dir.keep().display()
        );
    }
    eprintln!("the VM ran in {:.1?}", started.elapsed());
    dir
}

fn read_records(dir: &Path, name: &str) -> Records {
    let path = dir.join(name);
    let text = fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("the VM wrote no {}: {e}", path.display()));
    Records::parse(&text)
}

/// Whether to run the scenarios on a verityfs mount in the VM too.
fn fuse_in_vm() -> bool {
    std::env::var(FUSE_IN_VM).is_ok_and(|v| v == "1")
}

/// Inside the VM: the scenarios on the ext4 scratch disk, then (if asked)
/// on a verityfs mount; the records go to the shared directory.
fn in_vm() {
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: not in the oracle VM"))
    };
    let scratch = PathBuf::from(var("VERITYFS_ORACLE_SCRATCH"));
    let io = PathBuf::from(var("VERITYFS_ORACLE_IO"));
    let started = Instant::now();
    let ext4 = Backend::Ext4 {
        dir: scratch,
        device: PathBuf::from("/dev/vda"),
    };
    let records = all_scenarios(ext4);
    fs::write(io.join("ext4.txt"), records.to_text()).unwrap();
    eprintln!(
        "{} scenarios on ext4 in {:.1?}",
        records.0.len(),
        started.elapsed()
    );
    if !fuse_in_vm() {
        return;
    }
    let started = Instant::now();
    let records = all_scenarios(Backend::Verityfs(Mount::with_args(&["-o", "allow_other"])));
    fs::write(io.join("vm-mount.txt"), records.to_text()).unwrap();
    eprintln!(
        "{} scenarios on a verityfs mount in {:.1?}",
        records.0.len(),
        started.elapsed()
    );
}

/// Every scenario on `backend`; those that mount it again last.
fn all_scenarios(mut backend: Backend) -> Records {
    let mut records = scenarios::run_all(&backend);
    records.merge(read_only::run_all(&mut backend));
    records.merge(signatures::run_all(&mut backend));
    records
}

/// A helper process: says it is starting, then enables `path` with
/// default parameters (the scenarios kill it meanwhile).
fn child_enable(path: &Path) {
    let file = fs::File::open(path).unwrap();
    let mut stdout = std::io::stdout();
    writeln!(stdout, "enabling").unwrap();
    stdout.flush().unwrap();
    let result = scenarios::enable_on(&file, &EnableArg::default());
    writeln!(stdout, "{result}").unwrap();
}
