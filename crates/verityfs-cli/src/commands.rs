//! The command table, usage texts and the dispatch shared by all commands,
//! following fsverity-utils' `programs/fsverity.c`.

use std::ffi::OsString;
use std::io::Write;

use crate::output::{error_msg, quote};

/// One subcommand.
pub struct Command {
    /// Its name on the command line.
    pub name: &'static str,
    /// The entry point: gets the arguments after the command name and
    /// returns the exit status.
    pub func: fn(&Command, &[OsString]) -> u8,
    short_desc: &'static str,
    usage: &'static str,
}

/// Exit status of a successful command.
pub const EXIT_OK: u8 = 0;
/// Exit status of a runtime failure.
pub const EXIT_FAILURE: u8 = 1;
/// Exit status of a usage error.
pub const EXIT_USAGE: u8 = 2;

const COMMANDS: &[Command] = &[
    Command {
        name: "digest",
        func: crate::cmd_digest::run,
        short_desc: "Compute the fs-verity digest of the given file(s), for offline signing",
        usage: "    verityfs digest FILE...
               [--hash-alg=HASH_ALG] [--block-size=BLOCK_SIZE] [--salt=SALT]
               [--out-merkle-tree=FILE] [--out-descriptor=FILE]
               [--compact] [--for-builtin-sig]
",
    },
    Command {
        name: "mount",
        func: crate::cmd_mount::run,
        short_desc: "Serve a directory with fs-verity semantics through FUSE (foreground)",
        usage: "    verityfs mount BACKING MOUNTPOINT
               [-o allow_other,ro,...] [--read-only] [--no-merkle-readahead]
               [--cache-size=BYTES] [--threads=N]
",
    },
];

impl Command {
    /// Prints this command's usage to `out` (stdout for `--help`, stderr
    /// after a usage error).
    pub fn usage(&self, out: &mut dyn Write) {
        let _ = write!(out, "Usage:\n{}", self.usage);
    }

    /// Prints the usage to stderr and returns [`EXIT_USAGE`].
    pub fn usage_error(&self) -> u8 {
        self.usage(&mut std::io::stderr());
        EXIT_USAGE
    }
}

/// The line listing the hash algorithms, as fsverity-utils prints it.
pub fn show_all_hash_algs(out: &mut dyn Write) {
    let names: Vec<&str> = verityfs::HashAlgorithm::ALL
        .iter()
        .map(|a| a.name())
        .collect();
    let _ = writeln!(out, "Available hash algorithms: {}", names.join(" "));
}

fn usage_all(out: &mut dyn Write) {
    let _ = writeln!(out, "Usage:");
    for cmd in COMMANDS {
        let _ = write!(out, "  {}:\n{}\n", cmd.short_desc, cmd.usage);
    }
    let _ = write!(
        out,
        "  Standard options:\n    verityfs --help\n    verityfs --version\n\n"
    );
    show_all_hash_algs(out);
}

/// Handles `--help` and `--version` anywhere before `--`, as fsverity does
/// before parsing the command's own options.
fn handle_common_options(args: &[OsString], cmd: Option<&Command>) -> Option<u8> {
    for arg in args {
        match arg.as_encoded_bytes() {
            b"--help" => {
                let mut out = std::io::stdout();
                match cmd {
                    Some(cmd) => cmd.usage(&mut out),
                    None => usage_all(&mut out),
                }
                return Some(EXIT_OK);
            }
            b"--version" => {
                println!("verityfs v{}", env!("CARGO_PKG_VERSION"));
                return Some(EXIT_OK);
            }
            b"--" => return None,
            _ => {}
        }
    }
    None
}

/// Runs the command line `args` (with `argv[0]`) and returns the exit status.
pub fn run(args: &[OsString]) -> u8 {
    let Some(name) = args.get(1) else {
        error_msg("no command specified");
        usage_all(&mut std::io::stderr());
        return EXIT_USAGE;
    };
    let cmd = COMMANDS
        .iter()
        .find(|c| name.as_encoded_bytes() == c.name.as_bytes());
    if let Some(status) = handle_common_options(&args[1..], cmd) {
        return status;
    }
    match cmd {
        Some(cmd) => (cmd.func)(cmd, &args[2..]),
        None => {
            error_msg(quote("unrecognized command: '", name, "'"));
            usage_all(&mut std::io::stderr());
            EXIT_USAGE
        }
    }
}
