//! The command line as a [`clap::Command`] tree, built from the typed
//! definitions ([`crate::opts`], [`crate::commands`]), for generating
//! manual pages (clap_mangen) and shell completions (clap_complete), and
//! the hidden maintenance command `verityfs generate-docs DIR` that writes
//! them. clap parses nothing here.

use std::ffi::OsString;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use clap::{Arg, ArgAction, ValueHint};
use clap_complete::Shell;

use crate::commands::{self, Command, Style};
use crate::error::{Error, Result};
use crate::help;
use crate::opts::{exactly, Args, Arity, Hint, Operand, Opt, OptSpec};
use crate::output::quote;

/// The program's name.
const BIN: &str = "verityfs";

/// The DESCRIPTION of `verityfs(1)`.
const DESCRIPTION: &str = "\
verityfs gives fs-verity semantics to files on any filesystem, bit for bit \
compatible with the Linux kernel and fsverity-utils. Its digest, sign, enable, \
measure and dump_metadata subcommands take the options of fsverity(1) and print \
the same bytes; mount serves a directory through FUSE so that the unmodified \
fsverity tool works on it and every byte read is checked against the Merkle \
tree; verify scrubs verity files offline.

The options of the subcommands shared with fsverity are parsed by the C \
library's getopt_long, as fsverity parses them: long options may be \
abbreviated to any unambiguous prefix (--hash=sha512) and may follow the \
operands. The other subcommands take --name=VALUE or --name VALUE, options \
anywhere, and describe their options with verityfs help SUBCOMMAND (or -h, \
--help). Each subcommand has its own manual page, named verityfs-SUBCOMMAND.";

/// Sections appended to `verityfs(1)`, in roff.
const ROOT_EXTRA: &str = r#".SH "EXIT STATUS"
.TP
0
Success.
.TP
1
A runtime error (a file could not be read, a verity file is corrupted...).
.TP
2
A usage error: unknown option, missing operand, invalid value.
.SH ENVIRONMENT
.TP
.B RUST_LOG
Log filter of the mount daemon (default: warnings only; \fBinfo\fR for more).
.TP
.B POSIXLY_CORRECT
If set, options must come before the operands, as with glibc.
.SH FILES
.TP
.I /sbin/mount.fuse.verityfs
Helper letting \fBmount \-t fuse.verityfs\fR and \fI/etc/fstab\fR start \fBverityfs mount\fR.
.TP
.I /lib/systemd/system/verityfs@.service
systemd unit template serving a mount: instance = mount point escaped by \fBsystemd\-escape \-\-path\fR,
backing directory in \fI/etc/verityfs/INSTANCE.conf\fR (\fBBACKING=\fR, \fBOPTIONS=\fR).
.TP
.I /etc/verityfs/INSTANCE.conf
Settings of the systemd unit's instance INSTANCE.
.SH EXAMPLES
.nf
verityfs digest \-\-hash\-alg=sha512 \-\-out\-merkle\-tree=f.tree \-\-out\-descriptor=f.desc f
verityfs mount /srv/backing /srv/verity \-o allow_other
mount \-t fuse.verityfs /srv/backing /srv/verity \-o allow_other,ro
.fi
.SH "SEE ALSO"
\fBfsverity\fR(1), \fBmount\fR(8), \fBfstab\fR(5), \fBfusermount3\fR(1), \fBsystemd.service\fR(5)
"#;

/// Sections appended to `verityfs-mount(1)`, in roff.
const MOUNT_EXTRA: &str = r#".SH NOTES
The daemon runs in the foreground and unmounts cleanly on SIGINT or SIGTERM,
or when the mount point is unmounted with \fBumount\fR or \fBfusermount3 \-u\fR.
BACKING must exist unless \fB\-\-create\fR is given; a missing mount point is created.
The mount point may be neither BACKING nor inside it (by device and inode, through
symbolic links and bind mounts): the daemon's lookups would wait for its own mount.
A mount point that already is a verityfs mount is refused.
\fBmount \-o remount,ro\fR makes the running mount read-only.
It logs to standard error; a corrupted block is logged at warning level.
.PP
With \fI/sbin/mount.fuse.verityfs\fR installed, mount(8) and \fI/etc/fstab\fR work:
.PP
.nf
mount \-t fuse.verityfs /srv/backing /srv/verity \-o allow_other
/srv/backing  /srv/verity  fuse.verityfs  allow_other,nofail  0  0
mount \-o remount,ro /srv/verity
.fi
.PP
As a systemd service, with the messages in the journal:
.PP
.nf
printf 'BACKING=/srv/backing\\nOPTIONS=\-o allow_other\\n' > /etc/verityfs/srv\-verity.conf
systemctl enable \-\-now verityfs@srv\-verity.service   # srv\-verity: systemd\-escape \-\-path /srv/verity
.fi
.SH "SEE ALSO"
\fBverityfs\fR(1), \fBmount\fR(8), \fBfstab\fR(5), \fBsystemd.service\fR(5)
"#;

/// `--help`, which every command takes (`-h` too for verityfs's own).
const HELP: OptSpec = standard(
    "help",
    "Print the usage (of the command, or of all) and exit",
);
/// `--version`, which every command takes.
const VERSION: OptSpec = standard("version", "Print the version and exit");

const fn standard(long: &'static str, help: &'static str) -> OptSpec {
    OptSpec {
        long,
        short: None,
        value: None,
        hint: Hint::Other,
        help,
        doc: "",
        new_line: false,
    }
}

/// The visible commands.
fn visible() -> impl Iterator<Item = &'static Command> {
    commands::commands().iter().filter(|c| !c.hidden)
}

/// The whole command line: `verityfs` and its visible subcommands.
pub fn command() -> clap::Command {
    let mut usage: Vec<String> = visible().map(help::usage_line).collect();
    usage.extend([&HELP, &VERSION].map(|o| format!("{BIN} --{}", o.long)));
    let about = "fs-verity in user space: digests, signatures, verified reads and a FUSE mount";
    let mut root = clap::Command::new(BIN)
        .version(env!("CARGO_PKG_VERSION"))
        .about(about)
        .long_about(DESCRIPTION)
        .override_usage(usage.join("\n"))
        .disable_help_flag(true)
        .disable_version_flag(true)
        .disable_help_subcommand(true)
        .subcommand_required(true);
    for opt in [&HELP, &VERSION] {
        root = root.arg(option(opt, None));
    }
    for cmd in visible() {
        root = root.subcommand(subcommand(cmd));
    }
    root
}

/// The options of `cmd` as it documents them: its own, then `--help` and
/// `--version`.
pub fn all_options(cmd: &Command) -> Vec<(&'static OptSpec, Option<char>)> {
    let help_short = (cmd.style == Style::Own).then_some('h');
    let own = (cmd.options)().into_iter().map(|o| (o, o.short));
    own.chain([(&HELP, help_short), (&VERSION, None)]).collect()
}

/// One subcommand: its options, then its operands.
fn subcommand(cmd: &Command) -> clap::Command {
    let mut sub = clap::Command::new(cmd.name)
        .about(cmd.about)
        .override_usage(help::usage_line(cmd))
        .disable_help_flag(true)
        .disable_version_flag(true);
    for (opt, short) in all_options(cmd) {
        sub = sub.arg(option(opt, short));
    }
    for operand in cmd.operands {
        sub = sub.arg(operand_arg(operand));
    }
    sub
}

/// The clap argument for one option.
fn option(opt: &OptSpec, short: Option<char>) -> Arg {
    let mut arg = Arg::new(opt.long).long(opt.long).help(opt.help);
    if !opt.doc.is_empty() {
        arg = arg.long_help(format!("{}. {}", opt.help, opt.doc));
    }
    if let Some(letter) = short {
        arg = arg.short(letter);
    }
    match opt.value {
        None => arg.action(ArgAction::SetTrue),
        Some(name) => with_hint(arg, opt.hint)
            .num_args(1)
            .value_name(name)
            .action(ArgAction::Append),
    }
}

/// The clap argument for one operand.
fn operand_arg(operand: &Operand) -> Arg {
    let arg = Arg::new(operand.name)
        .value_name(operand.name)
        .help(operand.help)
        .required(operand.arity != Arity::Any);
    let arg = with_hint(arg, operand.hint);
    match operand.arity {
        Arity::One => arg,
        Arity::OneOrMore | Arity::Any => arg.num_args(1..).action(ArgAction::Append),
    }
}

/// `arg`, its values completed as `hint` says.
fn with_hint(arg: Arg, hint: Hint) -> Arg {
    match hint {
        Hint::Other => arg.value_hint(ValueHint::Other),
        Hint::File => arg.value_hint(ValueHint::FilePath),
        Hint::Dir => arg.value_hint(ValueHint::DirPath),
        Hint::Path => arg.value_hint(ValueHint::AnyPath),
        Hint::Values(values) => arg.value_parser(values()),
    }
}

/// The manual pages: `verityfs.1`, then `verityfs-SUBCOMMAND.1` for each
/// visible subcommand, as (file name, roff text).
pub fn man_pages() -> io::Result<Vec<(String, Vec<u8>)>> {
    let mut root = command();
    root.build();
    let mut pages = Vec::new();
    let page = |cmd: clap::Command, extra: &str| -> io::Result<(String, Vec<u8>)> {
        let man = clap_mangen::Man::new(cmd)
            .manual("verityfs manual")
            .source(format!("verityfs {}", env!("CARGO_PKG_VERSION")));
        let mut text = Vec::new();
        man.render(&mut text)?;
        text.extend_from_slice(extra.as_bytes());
        Ok((man.get_filename(), text))
    };
    for sub in root.get_subcommands() {
        let extra = match sub.get_name() {
            "mount" => MOUNT_EXTRA.to_owned(),
            _ => ".SH \"SEE ALSO\"\n\\fBverityfs\\fR(1), \\fBfsverity\\fR(1)\n".to_owned(),
        };
        pages.push(page(sub.clone(), &extra)?);
    }
    pages.insert(0, page(root, ROOT_EXTRA)?);
    Ok(pages)
}

/// The completion scripts, as (file name, script): bash, zsh and fish.
pub fn completions() -> Vec<(String, Vec<u8>)> {
    [
        (Shell::Bash, format!("{BIN}.bash")),
        (Shell::Zsh, format!("_{BIN}")),
        (Shell::Fish, format!("{BIN}.fish")),
    ]
    .into_iter()
    .map(|(shell, file)| {
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut command(), BIN, &mut script);
        (file, script)
    })
    .collect()
}

/// Writes `DIR/man/*.1` and `DIR/completions/{verityfs.bash,_verityfs,
/// verityfs.fish}`, creating the directories; returns the files written.
pub fn generate_docs(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for (sub, files) in [("man", man_pages()?), ("completions", completions())] {
        let dir = dir.join(sub);
        fs::create_dir_all(&dir)?;
        for (name, text) in files {
            let path = dir.join(name);
            fs::write(&path, text)?;
            written.push(path);
        }
    }
    Ok(written)
}

/// `verityfs generate-docs DIR`: no options.
#[derive(Default)]
pub struct DocsArgs;

impl Args for DocsArgs {
    const OPTIONS: &'static [Opt<Self>] = &[];
    const OPERANDS: &'static [Operand] = &[Operand::one(
        "DIR",
        "Where to write man/ and completions/",
        Hint::Dir,
    )];

    /// Writes the files and prints their names.
    fn run(self, _: &Command, operands: Vec<OsString>) -> Result<()> {
        let [dir] = exactly(operands)?;
        let files = generate_docs(Path::new(&dir))
            .map_err(|e| Error::io(quote("can't write the documentation to '", &dir, "'"), &e))?;
        let mut out = io::stdout().lock();
        for file in files {
            let _ = writeln!(out, "{}", file.display());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A man page's text with roff's escaped hyphens made plain.
    fn plain(roff: &[u8]) -> String {
        String::from_utf8(roff.to_vec())
            .unwrap()
            .replace("\\-", "-")
    }

    #[test]
    fn clap_tree_is_valid() {
        command().debug_assert();
    }

    #[test]
    fn every_option_is_in_the_man_page_the_help_and_the_bash_completion() {
        let pages = man_pages().unwrap();
        let (name, root) = &pages[0];
        assert_eq!(name, "verityfs.1");
        let root = plain(root);
        let completions = completions();
        let (_, bash) = completions
            .iter()
            .find(|(n, _)| n == "verityfs.bash")
            .unwrap();
        let bash = String::from_utf8(bash.clone()).unwrap();
        for cmd in visible() {
            assert!(
                root.contains(&format!("verityfs-{}(1)", cmd.name)),
                "{} missing from verityfs.1",
                cmd.name
            );
            let file = format!("verityfs-{}.1", cmd.name);
            let (_, page) = pages.iter().find(|(n, _)| *n == file).expect(&file);
            let page = plain(page);
            assert!(page.contains(cmd.about), "{file}: no description");
            let help = help::help(cmd);
            // The words bash offers after `verityfs NAME`: the `opts=` line
            // of the function's case for NAME.
            let case = format!("verityfs__subcmd__{})", cmd.name.replace('-', "__subcmd__"));
            let mut lines = bash.lines().skip_while(|l| l.trim() != case);
            let words = lines.nth(1).expect(&case);
            assert!(words.trim().starts_with("opts="), "{words}");
            for (opt, short) in all_options(cmd) {
                let long = format!("--{}", opt.long);
                assert!(page.contains(&long), "{file}: {long}");
                assert!(words.contains(&long), "bash, {}: {long}", cmd.name);
                if let Some(c) = short {
                    assert!(page.contains(&format!("-{c}")), "{file}: -{c}");
                }
                if !matches!(opt.long, "help" | "version") {
                    assert!(help.contains(&long), "verityfs {} --help: {long}", cmd.name);
                    if let (Style::Own, Some(c)) = (cmd.style, short) {
                        assert!(help.contains(&format!("-{c}, {long}")), "{}", cmd.name);
                    }
                }
            }
        }
        assert!(!pages.iter().any(|(n, _)| n.contains("generate")));
        assert!(!root.contains("generate-docs"));
    }

    #[test]
    fn option_names_are_unique_per_command() {
        for cmd in commands::commands() {
            let opts = all_options(cmd);
            for (i, (a, sa)) in opts.iter().enumerate() {
                for (b, sb) in &opts[i + 1..] {
                    assert_ne!(a.long, b.long, "{}", cmd.name);
                    assert!(sa.is_none() || sa != sb, "{}: -{sa:?}", cmd.name);
                }
            }
        }
    }
}
