//! `verityfs bench`: the 2019 Merkle tree readahead experiment, reproduced on
//! our own mount in one run (see [`crate::cmd_bench`] for the options).
//!
//! - [`files`] makes the test files in the backing directory;
//! - [`mount`] runs `verityfs mount` as a child process and always unmounts;
//! - [`measure`] drops caches, times reads and tools, and reads the device's
//!   request counters and the daemon's peak memory;
//! - [`report`] takes medians and ratios and writes the table, the JSON and
//!   the PNG chart.

pub mod files;
pub mod measure;
pub mod mount;
pub mod report;

use std::fmt::Display;
use std::path::PathBuf;

/// What the user asked for.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where the test files, the mount points and (by default) the outputs go.
    pub dir: PathBuf,
    /// Size of the test file in bytes.
    pub size: u64,
    /// Runs of every measurement; the report shows the median.
    pub runs: usize,
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
