//! Messages in fsverity-utils' style: `ERROR: <what>[: <strerror>]`.
//!
//! Messages are bytes, not strings, because they quote file names and
//! arguments, which are printed exactly as given even when not UTF-8.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Write};

use crate::error::{Error, Result};

/// Prints `ERROR: <msg>` to stderr, with the journal's error priority
/// prefix (`<3>`) when stderr is the journal, as under the systemd unit.
pub fn error_msg(msg: impl AsRef<[u8]>) {
    let priority: &[u8] = match crate::logging::stderr_is_journal() {
        true => b"<3>",
        false => b"",
    };
    let line = [priority, b"ERROR: ", msg.as_ref(), b"\n"].concat();
    let _ = io::stderr().write_all(&line);
}

/// Prints `ERROR: <msg>: <strerror(errno)>` to stderr.
pub fn error_msg_errno(msg: impl AsRef<[u8]>, err: &io::Error) {
    error_msg([msg.as_ref(), b": ", strerror(err).as_bytes()].concat());
}

/// `<before><name><after>` as bytes: a message quoting a file name or an
/// argument.
pub fn quote(before: &str, name: &OsStr, after: &str) -> Vec<u8> {
    [before.as_bytes(), name.as_encoded_bytes(), after.as_bytes()].concat()
}

/// Opens `name` for reading as fsverity's `open_file()` does, failing
/// with `can't open '<name>' for reading: <strerror>`.
pub fn open_for_reading(name: &OsStr) -> Result<File> {
    File::open(name).map_err(|e| Error::io(quote("can't open '", name, "' for reading"), &e))
}

/// The C library's text for an I/O error, without Rust's " (os error N)".
pub fn strerror(err: &io::Error) -> String {
    let text = err.to_string();
    match err.raw_os_error() {
        Some(code) => text
            .strip_suffix(&format!(" (os error {code})"))
            .unwrap_or(&text)
            .to_owned(),
        None => text,
    }
}

/// Writes `bytes` to stdout. Like fsverity's `printf()`, a failed write is
/// not an error, except that a closed pipe ends the program quietly, as
/// SIGPIPE ends a C program.
pub fn print_stdout(bytes: &[u8]) {
    let mut out = io::stdout().lock();
    if let Err(e) = out.write_all(bytes).and_then(|()| out.flush()) {
        if e.kind() == io::ErrorKind::BrokenPipe {
            std::process::exit(1);
        }
    }
}
