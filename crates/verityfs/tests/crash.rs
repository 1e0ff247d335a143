//! Enables killed at random moments. A child process (this test binary, run
//! again for its ignored [`child_enable`] with [`CHILD_ENV`] set) enables
//! verity on a file and is sent
//! SIGKILL after a random delay; then [`recover`] must leave the file either
//! an ordinary file with exactly its original bytes, or a complete verity
//! file with the expected digest whose verified reads give the original
//! bytes. (Cancelling through the progress callback at each chunk is
//! `interrupted_enable_leaves_the_file_as_it_was` in `store.rs`.)

mod common;

use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{enable, expected_digest, open, open_rw, random_bytes, write_file};
use verityfs::layout::{ENABLING_XATTR, LOCATION_XATTR};
use verityfs::recover;
use verityfs::{FileState, MerkleTreeParams, ReadOptions, Verifier};

/// Set in the child's environment to the path to enable.
const CHILD_ENV: &str = "VERITYFS_CRASH_TEST_ENABLE";

/// The child's work: enables verity on the file named by [`CHILD_ENV`].
/// Not a test of its own, hence ignored: only
/// `killed_enables_leave_the_file_intact_or_verity` runs it, in a child.
#[test]
#[ignore = "the child process of killed_enables_leave_the_file_intact_or_verity, which runs it"]
fn child_enable() {
    let path = std::env::var_os(CHILD_ENV).unwrap_or_else(|| {
        panic!("{CHILD_ENV} is not set: run killed_enables_leave_the_file_intact_or_verity")
    });
    enable(Path::new(&path), MerkleTreeParams::default()).unwrap();
}

/// Starts a child enabling `path`, sends it SIGKILL after `delay`, and
/// returns whether it had finished its enable by then.
fn enable_in_child(path: &Path, delay: Option<Duration>) -> bool {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_enable", "--ignored", "--test-threads=1"])
        .env(CHILD_ENV, path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    if let Some(delay) = delay {
        std::thread::sleep(delay);
        child.kill().unwrap(); // a no-op if it has exited
    }
    let status = child.wait().unwrap();
    assert!(
        status.success() || (delay.is_some() && status.signal() == Some(libc::SIGKILL)),
        "the child's enable failed: {status}"
    );
    status.success()
}

/// What a kill left behind, before recovery.
#[derive(Debug, Default)]
struct Outcomes {
    untouched: u32,
    interrupted: u32,
    verity: u32,
}

#[test]
fn killed_enables_leave_the_file_intact_or_verity() {
    let dir = tempfile::tempdir().unwrap();
    let params = MerkleTreeParams::default();
    let mut rng = fastrand::Rng::with_seed(0xdead_beef);
    let mut outcomes = Outcomes::default();
    for (size, kills) in [(1 << 20, 30), (16 << 20, 20), (64 << 20, 12)] {
        let data = random_bytes(size, size as u64);
        let path = write_file(dir.path(), &format!("f{size}"), &data);
        let digest = expected_digest(&data, &params);
        // How long a whole enable in a child takes, start-up included.
        let start = Instant::now();
        assert!(enable_in_child(&path, None));
        let whole = start.elapsed();
        // The child really enabled (a child that ran no test exits 0 too).
        let state = FileState::read(&File::open(&path).unwrap()).unwrap();
        assert!(
            matches!(state, FileState::Verity(_)),
            "{size} bytes: the child's enable left {state:?}"
        );
        make_regular(&path, size as u64);
        for kill in 0..kills {
            // The first kill lands before the child can start, whatever
            // the load: some kills must find the file untouched.
            let delay = match kill {
                0 => Duration::ZERO,
                _ => whole.mul_f64(f64::from(rng.u32(..1200)) / 1000.0),
            };
            let finished = enable_in_child(&path, Some(delay));
            let what = format!("{size} bytes, kill {kill} after {delay:?} of {whole:?}");
            let file = open_rw(&path);
            match FileState::read(&file).unwrap() {
                FileState::Regular => outcomes.untouched += 1,
                FileState::Enabling(_) => outcomes.interrupted += 1,
                FileState::Verity(_) => outcomes.verity += 1,
            }
            match recover(&file).unwrap() {
                FileState::Regular => {
                    assert!(!finished, "{what}: a finished enable left no verity file");
                    assert!(
                        std::fs::read(&path).unwrap() == data,
                        "{what}: data changed"
                    );
                }
                FileState::Verity(_) => {
                    let verity = open(&Verifier::new(ReadOptions::default()), &path);
                    assert_eq!(verity.digest(), &digest, "{what}");
                    let mut buf = vec![0u8; size + 1];
                    assert_eq!(verity.read_at(&mut buf, 0).unwrap(), size, "{what}");
                    assert!(buf[..size] == data[..], "{what}: verified read differs");
                    make_regular(&path, size as u64);
                }
                FileState::Enabling(_) => panic!("{what}: not recovered"),
            }
        }
    }
    // The kills landed before, during and after the enable's work.
    eprintln!("{outcomes:?}");
    assert!(
        outcomes.untouched > 0 && outcomes.interrupted > 0 && outcomes.verity > 0,
        "{outcomes:?}"
    );
}

/// Turns the verity file at `path` back into the ordinary file of its first
/// `size` bytes, for the next enable.
fn make_regular(path: &Path, size: u64) {
    let file = open_rw(path);
    for name in [LOCATION_XATTR, ENABLING_XATTR] {
        match rustix::fs::fremovexattr(&file, name) {
            Ok(()) | Err(rustix::io::Errno::NODATA) => {}
            Err(e) => panic!("removing {name}: {e}"),
        }
    }
    file.set_len(size).unwrap();
    assert_eq!(
        FileState::read(&File::open(path).unwrap()).unwrap(),
        FileState::Regular
    );
}
