//! Messages in fsverity-utils' style: `ERROR: <what>[: <strerror>]`.

use std::fmt;
use std::io::{self, Write};

/// Prints `ERROR: <msg>` to stderr.
pub fn error_msg(msg: fmt::Arguments) {
    let _ = writeln!(io::stderr(), "ERROR: {msg}");
}

/// Prints `ERROR: <msg>: <strerror(errno)>` to stderr.
pub fn error_msg_errno(msg: fmt::Arguments, err: &io::Error) {
    error_msg(format_args!("{msg}: {}", strerror(err)));
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

/// Writes `bytes` to stdout; a closed pipe ends the program quietly, as
/// SIGPIPE ends a C program.
pub fn print_stdout(bytes: &[u8]) {
    let mut out = io::stdout().lock();
    if let Err(e) = out.write_all(bytes).and_then(|()| out.flush()) {
        if e.kind() == io::ErrorKind::BrokenPipe {
            std::process::exit(1);
        }
        error_msg_errno(format_args!("writing to stdout"), &e);
        std::process::exit(1);
    }
}
