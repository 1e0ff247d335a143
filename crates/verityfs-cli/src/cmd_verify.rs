//! `verityfs verify`: scrub verity backing files. Every regular file under
//! the given paths that is a verity file of the verityfs layout has every
//! data block checked against its Merkle tree
//! ([`verityfs::check::check_file`]).
//!
//! Output (stdout): one kernel-style `FILE CORRUPTED!` line per bad block,
//! then `<path>: OK (N blocks)` or `<path>: N corrupted blocks` per file,
//! and finally `verified N files, M corrupted, K not verity`. A file that
//! carries a location record but cannot be opened as a verity file (bad
//! record or descriptor, metadata cut off) is an `ERROR:` naming the
//! reason, and counts as verified and corrupted. Files that are not verity
//! files are skipped silently, and so are other kinds of files found in
//! directories; named on the command line, they are an error. Symbolic
//! links named on the command line are followed, those found in directories
//! are not (as `find -H`).
//! Exit status 1 if anything was corrupted or failed.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use verityfs::check::check_file;
use verityfs::{Error, ReadOptions, Verifier, VerityFile};

use crate::commands::{Command, EXIT_FAILURE, EXIT_OK};
use crate::output::{error_msg, error_msg_errno, print_stdout, quote};
use crate::progress::bytes_bar;

/// Runs `verityfs verify`.
pub fn run(cmd: &Command, args: &[OsString]) -> u8 {
    // No options: anything that looks like one is an error.
    let paths = match cmd.parse_options(args, &[], |_, _| Ok(())) {
        Ok(paths) => paths,
        Err(status) => return status,
    };
    if paths.is_empty() {
        return cmd.usage_error();
    }
    let mut scrub = Scrub::default();
    for path in &paths {
        scrub.visit(Path::new(path), true);
    }
    print_stdout(
        format!(
            "verified {} files, {} corrupted, {} not verity\n",
            scrub.verified, scrub.corrupted, scrub.not_verity
        )
        .as_bytes(),
    );
    if scrub.corrupted == 0 && !scrub.failed {
        EXIT_OK
    } else {
        EXIT_FAILURE
    }
}

/// The walk and its counts.
struct Scrub {
    verifier: Arc<Verifier>,
    /// Verity files checked (or found broken).
    verified: u64,
    /// Verity files with bad blocks, broken metadata or read errors.
    corrupted: u64,
    /// Regular files that are not verity files.
    not_verity: u64,
    /// A path could not be examined.
    failed: bool,
}

impl Default for Scrub {
    fn default() -> Self {
        Scrub {
            verifier: Verifier::new(ReadOptions::default()),
            verified: 0,
            corrupted: 0,
            not_verity: 0,
            failed: false,
        }
    }
}

impl Scrub {
    /// Checks `path`: a regular file, or everything under a directory.
    fn visit(&mut self, path: &Path, follow_symlink: bool) {
        let metadata = if follow_symlink {
            fs::metadata(path)
        } else {
            fs::symlink_metadata(path)
        };
        match metadata {
            Ok(m) if m.is_dir() => self.visit_dir(path),
            Ok(m) if m.is_file() => self.check(path),
            // Named on the command line: checking nothing is no success.
            Ok(_) if follow_symlink => {
                self.failed = true;
                let what = "' is not a regular file or directory";
                error_msg(quote("'", path.as_os_str(), what));
            }
            Ok(_) => {}
            Err(e) => self.fail(quote("can't stat '", path.as_os_str(), "'"), &e),
        }
    }

    /// Visits the entries of `dir` in name order.
    fn visit_dir(&mut self, dir: &Path) {
        let entries: io::Result<Vec<PathBuf>> =
            fs::read_dir(dir).and_then(|it| it.map(|entry| entry.map(|e| e.path())).collect());
        match entries {
            Ok(mut paths) => {
                paths.sort();
                for path in paths {
                    self.visit(&path, false);
                }
            }
            Err(e) => self.fail(quote("can't read directory '", dir.as_os_str(), "'"), &e),
        }
    }

    /// Checks one regular file if it is a verity file.
    fn check(&mut self, path: &Path) {
        let name = path.as_os_str();
        let file = match File::open(path) {
            Ok(file) => file,
            Err(e) => return self.fail(quote("can't open '", name, "' for reading"), &e),
        };
        let file = match VerityFile::open(&self.verifier, file, path) {
            Ok(file) => file,
            Err(Error::NotVerity) => return self.not_verity += 1,
            // No extended attributes here, so no verity files either.
            Err(Error::Io(e)) if e.kind() == io::ErrorKind::Unsupported => {
                return self.not_verity += 1
            }
            Err(e) => {
                self.verified += 1;
                self.corrupted += 1;
                let why = format!("' is not a valid verity file: {e}");
                return error_msg(quote("'", name, &why));
            }
        };
        self.verified += 1;
        let bar = bytes_bar(file.data_size(), &path.to_string_lossy());
        let result = check_file(&file, &mut |done| bar.set_position(done), &mut |c| {
            bar.suspend(|| print_stdout(format!("{c}\n").as_bytes()))
        });
        bar.finish_and_clear();
        match result {
            Ok(summary) if summary.is_ok() => {
                let ok = format!(": OK ({} blocks)\n", summary.data_blocks);
                print_stdout(&quote("", name, &ok));
            }
            Ok(summary) => {
                self.corrupted += 1;
                let bad = format!(": {} corrupted blocks\n", summary.corrupted_blocks);
                print_stdout(&quote("", name, &bad));
            }
            Err(e) => {
                self.corrupted += 1;
                error_msg(quote("reading '", name, &format!("' failed: {e}")));
            }
        }
    }

    fn fail(&mut self, what: Vec<u8>, e: &io::Error) {
        self.failed = true;
        error_msg_errno(what, e);
    }
}
