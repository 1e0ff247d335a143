//! The command table, usage texts and the dispatch shared by all commands,
//! following fsverity-utils' `programs/fsverity.c`.

use std::ffi::OsString;
use std::io::Write;

use crate::getopt::{Getopt, LongOpt};
use crate::output::{error_msg, quote};

/// One subcommand.
///
/// The table of commands is also what the manual pages and shell
/// completions are generated from (`cli_spec`): the name, the short
/// description, the usage text (operands and option value names) and the
/// options (`longopts`, with their help lines).
pub struct Command {
    /// Its name on the command line.
    pub name: &'static str,
    /// The entry point: gets the arguments after the command name and
    /// returns the exit status.
    pub func: fn(&Command, &[OsString]) -> u8,
    /// The long-option table the command's `getopt_long` loop uses.
    pub longopts: fn() -> Vec<LongOpt>,
    /// A maintenance command, missing from the usage texts, manual pages
    /// and completions.
    pub hidden: bool,
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
        longopts: crate::cmd_digest::longopts,
        hidden: false,
        short_desc: "Compute the fs-verity digest of the given file(s), for offline signing",
        usage: "    verityfs digest FILE...
               [--hash-alg=HASH_ALG] [--block-size=BLOCK_SIZE] [--salt=SALT]
               [--out-merkle-tree=FILE] [--out-descriptor=FILE]
               [--compact] [--for-builtin-sig]
",
    },
    Command {
        name: "dump_metadata",
        func: crate::cmd_dump_metadata::run,
        longopts: || crate::cmd_dump_metadata::LONGOPTS.to_vec(),
        hidden: false,
        short_desc: "Dump the fs-verity metadata of the given file",
        usage: "    verityfs dump_metadata TYPE FILE [--offset=OFFSET] [--length=LENGTH]
",
    },
    Command {
        name: "enable",
        func: crate::cmd_enable::run,
        longopts: crate::cmd_enable::longopts,
        hidden: false,
        short_desc: "Enable fs-verity on a file",
        usage: "    verityfs enable FILE
               [--hash-alg=HASH_ALG] [--block-size=BLOCK_SIZE] [--salt=SALT]
               [--signature=SIGFILE]
",
    },
    Command {
        name: crate::cmd_enable::OFFLINE,
        func: crate::cmd_enable::run,
        longopts: crate::cmd_enable::longopts,
        hidden: false,
        short_desc: "Enable fs-verity on a backing file directly, without a verityfs mount",
        usage: "    verityfs enable-offline FILE
               [--hash-alg=HASH_ALG] [--block-size=BLOCK_SIZE] [--salt=SALT]
               [--signature=SIGFILE]
",
    },
    Command {
        name: "measure",
        func: crate::cmd_measure::run,
        longopts: Vec::new,
        hidden: false,
        short_desc: "Display the fs-verity digest of the given verity file(s)",
        usage: "    verityfs measure FILE...
",
    },
    Command {
        name: "stats",
        func: crate::cmd_stats::run,
        longopts: Vec::new,
        hidden: false,
        short_desc: "Print the read-path counters of a running verityfs mount as JSON",
        usage: "    verityfs stats MOUNTPOINT
",
    },
    Command {
        name: "sign",
        func: crate::cmd_sign::run,
        longopts: crate::cmd_sign::longopts,
        hidden: false,
        short_desc: "Sign a file for fs-verity built-in signature verification",
        usage: "    verityfs sign FILE OUT_SIGFILE
               [--key=KEYFILE] [--cert=CERTFILE] [--pkcs11-engine=SOFILE]
               [--pkcs11-module=SOFILE] [--pkcs11-keyid=KEYID]
               [--hash-alg=HASH_ALG] [--block-size=BLOCK_SIZE] [--salt=SALT]
               [--out-merkle-tree=FILE] [--out-descriptor=FILE]
",
    },
    Command {
        name: "mount",
        func: crate::cmd_mount::run,
        longopts: || crate::cmd_mount::LONGOPTS.to_vec(),
        hidden: false,
        short_desc: "Serve a directory with fs-verity semantics through FUSE (foreground)",
        usage: "    verityfs mount BACKING MOUNTPOINT
               [-o allow_other,ro,...] [--read-only] [--create] [--no-merkle-readahead]
               [--cache-size=BYTES] [--threads=N]
               [--trusted-cert=PEM] [--require-signatures]
",
    },
    Command {
        name: "verify",
        func: crate::cmd_verify::run,
        longopts: || crate::cmd_verify::LONGOPTS.to_vec(),
        hidden: false,
        short_desc: "Check every block of the verity files at the given path(s)",
        usage: "    verityfs verify [PATH...] [--json] [--check=LIST] [--digest=DIGEST]
               [--tree=TREE_FILE] [--descriptor=DESCRIPTOR_FILE]
",
    },
    Command {
        name: "reattach",
        func: crate::cmd_reattach::run,
        longopts: Vec::new,
        hidden: false,
        short_desc: "Make backing files copied without their extended attributes verity again",
        usage: "    verityfs reattach FILE...
",
    },
    Command {
        name: "bench",
        func: crate::cmd_bench::run,
        longopts: || crate::cmd_bench::LONGOPTS.to_vec(),
        hidden: false,
        short_desc:
            "Measure reads of verity files through the mount against the plain file (as root)",
        usage: "    verityfs bench [--dir=DIR] [--workload=LIST] [--size=BYTES] [--files=N]
               [--reads=N] [--runs=N] [--dir-device] [--json=FILE] [--chart=FILE]
               [--huge=BYTES]
",
    },
    Command {
        name: "generate-docs",
        func: crate::cli_spec::run_generate_docs,
        longopts: Vec::new,
        hidden: true,
        short_desc: "Write the manual pages and shell completions into DIR (for packagers)",
        usage: "    verityfs generate-docs DIR
",
    },
];

/// `--help` and `--version`, which every command takes (exactly so spelled,
/// anywhere before `--`).
pub const COMMON_OPTIONS: &[LongOpt] = &[
    LongOpt::flag("help", OPT_HELP)
        .with_help("Print the usage (of the command, or of all) and exit"),
    LongOpt::flag("version", OPT_VERSION).with_help("Print the version and exit"),
];
const OPT_HELP: u32 = 1;
const OPT_VERSION: u32 = 2;

/// The command table, hidden commands included.
pub fn commands() -> &'static [Command] {
    COMMANDS
}

impl Command {
    /// The one-line description shown above the usage in `verityfs --help`.
    pub fn short_desc(&self) -> &'static str {
        self.short_desc
    }

    /// The usage text, as printed after `Usage:` (indented, one line per
    /// group of options).
    pub fn usage_text(&self) -> &'static str {
        self.usage
    }

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

    /// Parses `args` with `longopts` as fsverity's `getopt_long()` loops
    /// do: each option, in command-line order, goes to `take`, which checks
    /// its value (printing fsverity's message) and returns the exit status
    /// to stop with; a getopt error prints glibc's message. Returns the
    /// operands, or the exit status to return, the usage printed first for
    /// [`EXIT_USAGE`].
    pub fn parse_options(
        &self,
        args: &[OsString],
        longopts: &[LongOpt],
        mut take: impl FnMut(u32, OsString) -> Result<(), u8>,
    ) -> Result<Vec<OsString>, u8> {
        let mut getopt = Getopt::new(self.name, args, longopts);
        for opt in getopt.by_ref() {
            let result = match opt {
                Ok((id, value)) => take(id, value.unwrap_or_default()),
                Err(e) => {
                    let _ = std::io::stderr().write_all(&[e.message(), b"\n"].concat());
                    Err(EXIT_USAGE)
                }
            };
            match result {
                Err(EXIT_USAGE) => return Err(self.usage_error()),
                Err(status) => return Err(status),
                Ok(()) => {}
            }
        }
        Ok(getopt.into_operands())
    }
}

/// `Ok` if `ok`, else a usage error: for option checks that print their own
/// message.
pub fn usage_unless(ok: bool) -> Result<(), u8> {
    if ok {
        Ok(())
    } else {
        Err(EXIT_USAGE)
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
    for cmd in COMMANDS.iter().filter(|c| !c.hidden) {
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
        let arg = arg.as_encoded_bytes();
        if arg == b"--" {
            return None;
        }
        let common = COMMON_OPTIONS
            .iter()
            .find(|o| arg.strip_prefix(b"--") == Some(o.name.as_bytes()));
        match common.map(|o| o.id) {
            Some(OPT_HELP) => {
                let mut out = std::io::stdout();
                match cmd {
                    Some(cmd) => cmd.usage(&mut out),
                    None => usage_all(&mut out),
                }
                return Some(EXIT_OK);
            }
            Some(_) => {
                println!("verityfs v{}", env!("CARGO_PKG_VERSION"));
                return Some(EXIT_OK);
            }
            None => {}
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
