//! The command table and the dispatch shared by all commands, following
//! fsverity-utils' `programs/fsverity.c`.

use std::ffi::OsString;
use std::io::Write;

use crate::error::{Error, Result, EXIT_OK, EXIT_USAGE};
use crate::help;
use crate::opts::{specs, Args, Operand, OptSpec};
use crate::output::{error_msg, quote};

/// How a command's arguments are parsed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// As fsverity parses them: glibc's `getopt_long` ([`crate::getopt`]),
    /// with fsverity's usage texts.
    Getopt,
    /// Not at all, as `fsverity measure`: every argument is an operand.
    Verbatim,
    /// verityfs's own commands: the usual conventions ([`crate::opts::parse`])
    /// and a full `--help`.
    Own,
}

/// One subcommand. The table of commands is also what the usage texts,
/// the manual pages and completions are made from.
pub struct Command {
    /// Its name on the command line.
    pub name: &'static str,
    /// What it does, in one line.
    pub about: &'static str,
    /// How its arguments are parsed.
    pub style: Style,
    /// A maintenance command, missing from the usage texts, manual pages
    /// and completions.
    pub hidden: bool,
    /// Its options.
    pub options: fn() -> Vec<&'static OptSpec>,
    /// Its operands.
    pub operands: &'static [Operand],
    /// Parses the arguments after the command name and runs it.
    run: fn(&Command, &[OsString]) -> Result<()>,
}

impl Command {
    /// The command `name` whose arguments are an `A`.
    const fn new<A: Args>(name: &'static str, style: Style, about: &'static str) -> Self {
        Command {
            name,
            about,
            style,
            hidden: false,
            options: specs::<A>,
            operands: A::OPERANDS,
            run: parse_and_run::<A>,
        }
    }

    /// The same command, left out of the documentation.
    const fn hidden(mut self) -> Self {
        self.hidden = true;
        self
    }
}

/// Parses `args` into an `A` in `cmd`'s style, then runs it.
fn parse_and_run<A: Args>(cmd: &Command, args: &[OsString]) -> Result<()> {
    let mut parsed = A::default();
    let operands = match cmd.style {
        Style::Getopt => crate::getopt::parse(cmd.name, args, A::OPTIONS, &mut parsed)?,
        Style::Verbatim => args.to_vec(),
        Style::Own => crate::opts::parse(args, A::OPTIONS, &mut parsed)?,
    };
    parsed.run(cmd, operands)
}

const COMMANDS: &[Command] = &[
    Command::new::<crate::cmd_digest::DigestArgs>(
        "digest",
        Style::Getopt,
        "Compute the fs-verity digest of the given file(s), for offline signing",
    ),
    Command::new::<crate::cmd_dump_metadata::DumpArgs>(
        "dump_metadata",
        Style::Getopt,
        "Dump the fs-verity metadata of the given file",
    ),
    Command::new::<crate::cmd_enable::EnableArgs>(
        "enable",
        Style::Getopt,
        "Enable fs-verity on a file",
    ),
    Command::new::<crate::cmd_enable::EnableArgs>(
        crate::cmd_enable::OFFLINE,
        Style::Own,
        "Enable fs-verity on a backing file directly, without a verityfs mount",
    ),
    Command::new::<crate::cmd_measure::MeasureArgs>(
        "measure",
        Style::Verbatim,
        "Display the fs-verity digest of the given verity file(s)",
    ),
    Command::new::<crate::cmd_stats::StatsArgs>(
        "stats",
        Style::Own,
        "Print the read-path counters of a running verityfs mount as JSON",
    ),
    Command::new::<crate::cmd_sign::SignArgs>(
        "sign",
        Style::Getopt,
        "Sign a file for fs-verity built-in signature verification",
    ),
    Command::new::<crate::cmd_publish::PublishArgs>(
        "publish",
        Style::Own,
        "Publish a directory tree as an image of verity objects and print its digest",
    ),
    Command::new::<crate::cmd_mount::MountArgs>(
        "mount",
        Style::Own,
        "Serve a directory with fs-verity semantics, or an image, by FUSE (foreground)",
    ),
    Command::new::<crate::cmd_verify::VerifyArgs>(
        "verify",
        Style::Own,
        "Check every block of the verity files at the given path(s)",
    ),
    Command::new::<crate::cmd_reattach::ReattachArgs>(
        "reattach",
        Style::Own,
        "Make backing files copied without their extended attributes verity again",
    ),
    Command::new::<crate::cmd_bench::BenchArgs>(
        "bench",
        Style::Own,
        "Measure cold verified reads against plain reads and hashing tools (as root)",
    ),
    Command::new::<crate::cli_spec::DocsArgs>(
        "generate-docs",
        Style::Own,
        "Write the manual pages and shell completions into DIR (for packagers)",
    )
    .hidden(),
];

/// The command table, hidden commands included.
pub fn commands() -> &'static [Command] {
    COMMANDS
}

/// The command named `name`.
pub fn find(name: &[u8]) -> Option<&'static Command> {
    COMMANDS.iter().find(|c| c.name.as_bytes() == name)
}

/// The line listing the hash algorithms, as fsverity-utils prints it.
pub fn hash_algs_line() -> String {
    format!("Available hash algorithms: {}", hash_alg_names().join(" "))
}

/// The names of the hash algorithms.
pub fn hash_alg_names() -> Vec<&'static str> {
    verityfs::HashAlgorithm::ALL
        .iter()
        .map(|a| a.name())
        .collect()
}

fn usage_all(out: &mut dyn Write) {
    let _ = writeln!(out, "Usage:");
    for cmd in COMMANDS.iter().filter(|c| !c.hidden) {
        let _ = write!(out, "  {}:\n{}\n", cmd.about, help::usage(cmd));
    }
    let _ = write!(
        out,
        "  Standard options:\n    verityfs --help\n    verityfs --version\n\n"
    );
    let _ = writeln!(out, "{}", hash_algs_line());
}

/// What an argument asks for before any parsing, as fsverity looks for
/// `--help` and `--version` anywhere before `--`.
enum Standard {
    Help,
    Version,
}

/// Handles `--help` (and `-h` for verityfs's own commands) and `--version`
/// anywhere before `--`, as fsverity does before parsing the command's
/// own options.
fn handle_standard_options(args: &[OsString], cmd: Option<&Command>) -> Option<u8> {
    let own = cmd.is_some_and(|c| c.style == Style::Own);
    let standard = args
        .iter()
        .map(|a| a.as_encoded_bytes())
        .take_while(|&a| a != b"--")
        .find_map(|a| match a {
            b"--help" => Some(Standard::Help),
            b"-h" if own => Some(Standard::Help),
            b"--version" => Some(Standard::Version),
            _ => None,
        })?;
    let mut out = std::io::stdout();
    match (standard, cmd) {
        (Standard::Help, Some(cmd)) => {
            let _ = out.write_all(help::help(cmd).as_bytes());
        }
        (Standard::Help, None) => usage_all(&mut out),
        (Standard::Version, _) => {
            let _ = writeln!(out, "verityfs v{}", env!("CARGO_PKG_VERSION"));
        }
    }
    Some(EXIT_OK)
}

/// `verityfs help [COMMAND]`: the help of COMMAND, or the usage of all.
fn help_command(args: &[OsString]) -> u8 {
    let mut out = std::io::stdout();
    match args {
        [] => usage_all(&mut out),
        [name] => match find(name.as_encoded_bytes()) {
            Some(cmd) => {
                let _ = out.write_all(help::help(cmd).as_bytes());
            }
            None => return unknown_command(name),
        },
        _ => {
            error_msg("usage: verityfs help [COMMAND]");
            return EXIT_USAGE;
        }
    }
    EXIT_OK
}

fn unknown_command(name: &OsString) -> u8 {
    error_msg(quote("unrecognized command: '", name, "'"));
    usage_all(&mut std::io::stderr());
    EXIT_USAGE
}

/// Prints what `e` says: its lines, then for a usage error the usage of
/// `cmd`.
fn report(cmd: &Command, e: &Error) {
    for line in e.lines() {
        error_msg(line);
    }
    if let Error::Usage(_) = e {
        let _ = std::io::stderr().write_all(help::usage_error(cmd).as_bytes());
    }
}

/// Runs the command line `args` (with `argv[0]`) and returns the exit status.
pub fn run(args: &[OsString]) -> u8 {
    let Some(name) = args.get(1) else {
        error_msg("no command specified");
        usage_all(&mut std::io::stderr());
        return EXIT_USAGE;
    };
    let cmd = find(name.as_encoded_bytes());
    if let Some(status) = handle_standard_options(&args[1..], cmd) {
        return status;
    }
    if name == "help" {
        return help_command(&args[2..]);
    }
    let Some(cmd) = cmd else {
        return unknown_command(name);
    };
    match (cmd.run)(cmd, &args[2..]) {
        Ok(()) => EXIT_OK,
        Err(e) => {
            report(cmd, &e);
            e.exit_status()
        }
    }
}
