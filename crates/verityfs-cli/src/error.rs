//! The one error type of the commands, and the exit status it maps to.
//!
//! An error carries the lines to print, each as `ERROR: <line>`, in the
//! order they were added: the cause first, then what it made fail, as
//! fsverity-utils prints them (`can't open 'f' for reading: ...`, then
//! `failed to compute digest`). Lines are bytes, not strings, because they
//! quote file names and arguments exactly as given, even when not UTF-8;
//! that is also why this is not `anyhow`, whose messages are strings.

use std::io;

use crate::output::strerror;

/// Exit status of a successful command.
pub const EXIT_OK: u8 = 0;
/// Exit status of a runtime failure.
pub const EXIT_FAILURE: u8 = 1;
/// Exit status of a usage error.
pub const EXIT_USAGE: u8 = 2;

/// Why a command stopped.
#[derive(Debug)]
pub enum Error {
    /// A bad command line (exit status 2): the lines, then the command's
    /// usage.
    Usage(Vec<Vec<u8>>),
    /// The command failed (exit status 1) after the lines.
    Failed(Vec<Vec<u8>>),
}

/// The result of a command or of one of its steps.
pub type Result<T = (), E = Error> = std::result::Result<T, E>;

impl Error {
    /// A usage error with nothing to say beyond the usage (a wrong number
    /// of operands, or a message the C library already printed).
    pub fn usage() -> Self {
        Error::Usage(Vec::new())
    }

    /// A usage error saying `line` first.
    pub fn usage_msg(line: impl Into<Vec<u8>>) -> Self {
        Error::Usage(vec![line.into()])
    }

    /// A failure saying `line`.
    pub fn msg(line: impl Into<Vec<u8>>) -> Self {
        Error::Failed(vec![line.into()])
    }

    /// A failure of a system call: `<what>: <strerror(errno)>`.
    pub fn io(what: impl Into<Vec<u8>>, e: &io::Error) -> Self {
        let mut line = what.into();
        line.extend_from_slice(b": ");
        line.extend_from_slice(strerror(e).as_bytes());
        Error::msg(line)
    }

    /// A failure whose messages were already printed, as a command that
    /// goes on with its other operands prints them.
    pub fn reported() -> Self {
        Error::Failed(Vec::new())
    }

    /// The same error followed by `line`: what the cause made fail.
    pub fn context(mut self, line: impl Into<Vec<u8>>) -> Self {
        match &mut self {
            Error::Usage(lines) | Error::Failed(lines) => lines.push(line.into()),
        }
        self
    }

    /// The same lines as a usage error: fsverity prints its usage after
    /// some failures while parsing options (an output file that cannot be
    /// created).
    pub fn into_usage(self) -> Self {
        match self {
            Error::Usage(lines) | Error::Failed(lines) => Error::Usage(lines),
        }
    }

    /// The lines to print, in order.
    pub fn lines(&self) -> &[Vec<u8>] {
        match self {
            Error::Usage(lines) | Error::Failed(lines) => lines,
        }
    }

    /// The error as an `io::Error`, for passing it through code that only
    /// passes those (the library's callbacks); [`Error::carried`] gets it
    /// back.
    pub fn into_io(self, kind: io::ErrorKind) -> io::Error {
        io::Error::new(kind, Carried(self.lines().to_vec()))
    }

    /// The error [`Error::into_io`] put into `e`, if it is one.
    pub fn carried(e: &io::Error) -> Option<Error> {
        let carried = e.get_ref()?.downcast_ref::<Carried>()?;
        Some(Error::Failed(carried.0.clone()))
    }

    /// The exit status: 2 for a usage error, else 1.
    pub fn exit_status(&self) -> u8 {
        match self {
            Error::Usage(_) => EXIT_USAGE,
            Error::Failed(_) => EXIT_FAILURE,
        }
    }
}

/// The lines of a failure, inside an `io::Error`.
#[derive(Debug)]
struct Carried(Vec<Vec<u8>>);

impl std::fmt::Display for Carried {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lines: Vec<_> = self.0.iter().map(|l| String::from_utf8_lossy(l)).collect();
        f.write_str(&lines.join("; "))
    }
}

impl std::error::Error for Carried {}

/// [`Error::context`] on results.
pub trait Context<T> {
    /// Adds `line` after the error's lines.
    fn context(self, line: impl Into<Vec<u8>>) -> Result<T>;
}

impl<T> Context<T> for Result<T> {
    fn context(self, line: impl Into<Vec<u8>>) -> Result<T> {
        self.map_err(|e| e.context(line))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_keep_their_order_and_status_follows_the_kind() {
        let e: Result<()> = Err(Error::msg("cause"));
        let e = e.context(b"effect".to_vec()).unwrap_err();
        assert_eq!(e.lines(), [b"cause".to_vec(), b"effect".to_vec()]);
        assert_eq!(e.exit_status(), EXIT_FAILURE);
        assert_eq!(Error::usage().exit_status(), EXIT_USAGE);
        let e = Error::io("open", &io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(e.lines(), [b"open: No such file or directory".to_vec()]);
        let io = Error::msg("inner").into_io(io::ErrorKind::Other);
        let back = Error::carried(&io).unwrap();
        assert_eq!(back.lines(), [b"inner".to_vec()]);
        assert!(Error::carried(&io::Error::other("x")).is_none());
    }
}
