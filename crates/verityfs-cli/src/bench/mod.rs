//! `verityfs bench`: reads of verity files through the mount measured
//! against the same bytes in a plain file, in several workloads, in one run
//! (see [`crate::cmd_bench`] for the options).
//!
//! - [`loopdev`] makes the scratch ext4 filesystem on a loop device whose
//!   request counters only this benchmark moves;
//! - [`files`] makes the test files in the backing directory;
//! - [`mount`] runs `verityfs mount` as a child process and always unmounts;
//! - [`measure`] drops caches, times reads and tools, and reads the device's
//!   request counters and the daemon's peak memory;
//! - [`workloads`] defines what each workload reads and measures it for each
//!   way of reading the file;
//! - [`hogs`] keeps CPUs busy for the busy-machine workload;
//! - [`report`] takes medians and ratios and writes the table, the JSON and
//!   the PNG chart.

pub mod files;
pub mod hogs;
pub mod loopdev;
pub mod measure;
pub mod mount;
pub mod report;
pub mod workloads;

use std::fmt::Display;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};

use workloads::Workload;

/// What the user asked for.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where the scratch files, the mount points and (by default) the
    /// outputs go.
    pub dir: PathBuf,
    /// Size in bytes of the large file (sequential and random reads).
    pub size: u64,
    /// Number of small files.
    pub files: usize,
    /// Number of random reads.
    pub reads: usize,
    /// Runs of every cold measurement; the report shows the median.
    pub runs: usize,
    /// The workloads to run, in report order.
    pub workloads: Vec<Workload>,
    /// Count the requests of the disk holding `dir` instead of those of a
    /// loop device made for the run.
    pub dir_device: bool,
    /// Where the JSON report is written.
    pub json: PathBuf,
    /// Where the PNG chart is written.
    pub chart: PathBuf,
    /// Size of the sparse file read through the mount to measure the
    /// daemon's peak memory, if asked for.
    pub huge: Option<u64>,
}

/// Errors of the benchmark: a message with its context, printed as
/// `ERROR: <message>`.
pub type Result<T> = std::result::Result<T, String>;

/// Adds what was being done to an error.
pub trait Context<T> {
    /// `what: <error>`.
    fn ctx(self, what: impl Display) -> Result<T>;
}

impl<T, E: Display> Context<T> for std::result::Result<T, E> {
    fn ctx(self, what: impl Display) -> Result<T> {
        self.map_err(|e| format!("{what}: {}", strip_os_error(&e.to_string())))
    }
}

/// Rust's io::Error text without the " (os error N)" suffix, as the other
/// commands print errors.
fn strip_os_error(text: &str) -> String {
    match text.rfind(" (os error ") {
        Some(i) if text.ends_with(')') => text[..i].to_owned(),
        _ => text.to_owned(),
    }
}

/// Prints a progress line to stderr (the table goes to stdout).
pub fn note(text: impl Display) {
    eprintln!("bench: {text}");
}

/// Set by SIGINT, SIGTERM or SIGHUP.
static INTERRUPTED: LazyLock<Arc<AtomicBool>> = LazyLock::new(Arc::default);

/// Turns Ctrl-C, SIGTERM and SIGHUP into an error at the next
/// [`check_interrupted`], so that the mounts, the loop device and the
/// scratch files are removed on the way out instead of left behind.
pub fn catch_signals() {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    for signal in [SIGINT, SIGTERM, SIGHUP] {
        // Fails only for a signal that cannot be caught; these can.
        let _ = signal_hook::flag::register(signal, Arc::clone(&INTERRUPTED));
    }
}

/// What the benchmark says when a signal stopped it.
const INTERRUPTED_TEXT: &str = "interrupted: cleaned up and stopped";

/// An error once a signal asked the benchmark to stop.
pub fn check_interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::Relaxed) {
        Err(INTERRUPTED_TEXT.into())
    } else {
        Ok(())
    }
}

/// The error to show for `error`: after Ctrl-C, the tools and the daemon
/// got the signal too, and their failures are only its consequence.
pub fn explain(error: String) -> String {
    match check_interrupted() {
        Err(interrupted) => interrupted,
        Ok(()) => error,
    }
}
