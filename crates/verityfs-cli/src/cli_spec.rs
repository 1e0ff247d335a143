//! The command line as a [`clap::Command`] tree, for generating manual pages
//! (clap_mangen) and shell completions (clap_complete), and the hidden
//! maintenance command `verityfs generate-docs DIR` that writes them.
//!
//! The command line itself is not parsed with clap (`getopt.rs` reproduces
//! glibc's `getopt_long`, as fsverity-utils uses it). The tree is derived
//! from the same data the parser and `--help` use, so the documentation
//! cannot drift from the program:
//!
//! * the subcommands, their short descriptions and usage texts come from
//!   the command table ([`commands::commands`]);
//! * each option (long name, `-x` alias, whether it takes a value, its help
//!   line) comes from the command's [`LongOpt`] table;
//! * operand names (`FILE...`, `TYPE FILE`) and option value names
//!   (`--salt=SALT`) are read from the usage text.

use std::ffi::OsString;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use clap::{Arg, ArgAction, ValueHint};
use clap_complete::Shell;

use crate::commands::{self, Command, COMMON_OPTIONS, EXIT_FAILURE, EXIT_OK};
use crate::getopt::{HasArg, LongOpt};
use crate::output::{error_msg_errno, quote};

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

Long options may be abbreviated to any unambiguous prefix (--hash=sha512) and \
may follow the operands, as with GNU getopt_long. Each subcommand has its own \
manual page, named verityfs-SUBCOMMAND.";

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

/// The whole command line: `verityfs` and its visible subcommands.
pub fn command() -> clap::Command {
    let visible: Vec<&Command> = commands::commands().iter().filter(|c| !c.hidden).collect();
    let mut usage: Vec<String> = visible.iter().map(|c| one_line(c.usage_text())).collect();
    usage.extend(COMMON_OPTIONS.iter().map(|o| format!("{BIN} --{}", o.name)));
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
    for opt in COMMON_OPTIONS {
        root = root.arg(option(opt, None));
    }
    for cmd in visible {
        root = root.subcommand(subcommand(cmd));
    }
    root
}

/// One subcommand: its options, then its operands.
fn subcommand(cmd: &Command) -> clap::Command {
    let usage = Usage::parse(cmd);
    let mut sub = clap::Command::new(cmd.name)
        .about(cmd.short_desc())
        .override_usage(one_line(cmd.usage_text()))
        .disable_help_flag(true)
        .disable_version_flag(true);
    for opt in (cmd.longopts)().iter().chain(COMMON_OPTIONS) {
        sub = sub.arg(option(opt, usage.value_name(opt)));
    }
    for operand in &usage.operands {
        let mut arg = Arg::new(operand.name)
            .value_name(operand.name)
            .help(operand_help(cmd.name, operand.name))
            .required(true)
            .value_hint(hint(operand.name));
        if operand.repeated {
            arg = arg.num_args(1..).action(ArgAction::Append);
        }
        if let Some(values) = possible_values(operand.name) {
            arg = arg.value_parser(values);
        }
        sub = sub.arg(arg);
    }
    sub
}

/// The clap argument for one getopt option.
fn option(opt: &LongOpt, value_name: Option<&str>) -> Arg {
    let mut arg = Arg::new(opt.name).long(opt.name).help(opt.help);
    if let Some(letter) = opt.short {
        arg = arg.short(char::from(letter));
    }
    match opt.has_arg {
        HasArg::No => arg.action(ArgAction::SetTrue),
        HasArg::Required => {
            let name = value_name
                .map(str::to_owned)
                .unwrap_or_else(|| opt.name.to_uppercase().replace('-', "_"));
            let hint = hint(&name);
            if let Some(values) = possible_values(&name) {
                arg = arg.value_parser(values);
            }
            arg.num_args(1)
                .value_name(name)
                .value_hint(hint)
                .action(ArgAction::Append)
        }
    }
}

/// What an operand is, for the OPTIONS section of the manual pages.
fn operand_help(cmd: &str, name: &str) -> &'static str {
    match (cmd, name) {
        ("digest" | "sign", "FILE") => "The file to compute the fs-verity digest of",
        ("dump_metadata", "TYPE") => "The metadata item to write to standard output",
        ("enable", "FILE") => "The file to enable fs-verity on",
        ("dump_metadata" | "measure", "FILE") => "A verity file",
        ("sign", "OUT_SIGFILE") => "Where to write the PKCS#7 DER signature",
        ("mount", "BACKING") => "The directory holding the files (and their Merkle trees)",
        ("mount", "MOUNTPOINT") => "Where to mount the verity view of BACKING",
        ("verify", "PATH") => "A verity backing file, or a directory to scan recursively",
        _ => "",
    }
}

/// What shells should complete a value named `name` with.
fn hint(name: &str) -> ValueHint {
    match name {
        "DIR" | "BACKING" | "MOUNTPOINT" => ValueHint::DirPath,
        "PATH" | "PEM" => ValueHint::AnyPath,
        n if n.ends_with("FILE") => ValueHint::FilePath,
        _ => ValueHint::Other,
    }
}

/// The values an operand or option value named `name` may take, when they
/// are a fixed list.
fn possible_values(name: &str) -> Option<Vec<&'static str>> {
    match name {
        "HASH_ALG" => Some(
            verityfs::HashAlgorithm::ALL
                .iter()
                .map(|a| a.name())
                .collect(),
        ),
        "TYPE" => Some(
            crate::cmd_dump_metadata::METADATA_TYPES
                .iter()
                .map(|(n, _)| *n)
                .collect(),
        ),
        _ => None,
    }
}

/// A usage text on one line, without the indentation.
fn one_line(usage: &str) -> String {
    usage.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// An operand named in a usage text.
struct Operand {
    /// `FILE`, `MOUNTPOINT`...
    name: &'static str,
    /// Written `NAME...`: one or more.
    repeated: bool,
}

/// What a usage text says beyond the option table.
struct Usage {
    /// The operands, in order.
    operands: Vec<Operand>,
    /// `(option name, value name)` from each `--name=VALUE`.
    value_names: Vec<(&'static str, &'static str)>,
}

impl Usage {
    /// Reads `verityfs NAME OPERAND... [--opt=VALUE] [-o VALUE] ...`: words
    /// outside brackets are operands, `--name=VALUE` inside name the values.
    fn parse(cmd: &Command) -> Usage {
        let mut usage = Usage {
            operands: Vec::new(),
            value_names: Vec::new(),
        };
        let mut depth = 0usize;
        for word in cmd.usage_text().split_whitespace().skip(2) {
            let opens = word.starts_with('[');
            depth += word.matches('[').count();
            let bare = word.trim_matches(|c| c == '[' || c == ']');
            if let Some((name, value)) = bare.strip_prefix("--").and_then(|o| o.split_once('=')) {
                usage.value_names.push((name, value));
            } else if depth == 0 && !opens && !bare.starts_with('-') {
                let name = bare.trim_end_matches("...");
                usage.operands.push(Operand {
                    name,
                    repeated: name.len() != bare.len(),
                });
            }
            depth = depth.saturating_sub(word.matches(']').count());
        }
        usage
    }

    /// The value name the usage gives `opt`, if any.
    fn value_name(&self, opt: &LongOpt) -> Option<&'static str> {
        self.value_names
            .iter()
            .find(|(name, _)| *name == opt.name)
            .map(|&(_, value)| value)
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

/// Runs `verityfs generate-docs DIR`: prints the files written.
pub fn run_generate_docs(cmd: &Command, args: &[OsString]) -> u8 {
    let operands = match cmd.parse_options(args, &[], |_, _| Ok(())) {
        Ok(operands) => operands,
        Err(status) => return status,
    };
    let [dir] = operands.as_slice() else {
        return cmd.usage_error();
    };
    match generate_docs(Path::new(dir)) {
        Ok(files) => {
            let mut out = io::stdout().lock();
            for file in files {
                let _ = writeln!(out, "{}", file.display());
            }
            EXIT_OK
        }
        Err(e) => {
            error_msg_errno(quote("can't write the documentation to '", dir, "'"), &e);
            EXIT_FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn visible() -> impl Iterator<Item = &'static Command> {
        commands::commands().iter().filter(|c| !c.hidden)
    }

    /// A man page's text with roff's escaped hyphens made plain.
    fn plain(roff: &[u8]) -> String {
        String::from_utf8(roff.to_vec())
            .unwrap()
            .replace("\\-", "-")
    }

    #[test]
    fn usage_texts_and_option_tables_agree() {
        for cmd in commands::commands() {
            let usage = cmd.usage_text();
            let opts = (cmd.longopts)();
            for opt in &opts {
                let long = format!("--{}", opt.name);
                let short = opt.short.map(|c| format!("-{}", char::from(c)));
                assert!(
                    usage.contains(&long) || short.is_some_and(|s| usage.contains(&s)),
                    "{}: {long} missing from the usage",
                    cmd.name
                );
                assert!(!opt.help.is_empty(), "{}: {long} has no help", cmd.name);
            }
            for word in usage.split(['[', ']', ' ', '\n', '=']) {
                if let Some(name) = word.strip_prefix("--") {
                    assert!(
                        opts.iter().any(|o| o.name == name),
                        "{}: usage names --{name}, which the table lacks",
                        cmd.name
                    );
                }
            }
        }
    }

    #[test]
    fn usage_operands_and_value_names() {
        let find = |name| {
            commands::commands()
                .iter()
                .find(|c| c.name == name)
                .unwrap()
        };
        let u = Usage::parse(find("dump_metadata"));
        let ops: Vec<_> = u.operands.iter().map(|o| (o.name, o.repeated)).collect();
        assert_eq!(ops, [("TYPE", false), ("FILE", false)]);
        assert_eq!(u.value_names, [("offset", "OFFSET"), ("length", "LENGTH")]);
        let u = Usage::parse(find("digest"));
        let ops: Vec<_> = u.operands.iter().map(|o| (o.name, o.repeated)).collect();
        assert_eq!(ops, [("FILE", true)]);
        let u = Usage::parse(find("mount"));
        let ops: Vec<_> = u.operands.iter().map(|o| o.name).collect();
        assert_eq!(ops, ["BACKING", "MOUNTPOINT"]);
        assert!(Usage::parse(find("bench")).operands.is_empty());
    }

    #[test]
    fn clap_tree_is_valid() {
        command().debug_assert();
    }

    #[test]
    fn man_pages_mention_every_subcommand_and_option() {
        let pages = man_pages().unwrap();
        let (name, root) = &pages[0];
        assert_eq!(name, "verityfs.1");
        let root = plain(root);
        for cmd in visible() {
            assert!(
                root.contains(&format!("verityfs-{}(1)", cmd.name)),
                "{} missing from verityfs.1",
                cmd.name
            );
            let file = format!("verityfs-{}.1", cmd.name);
            let (_, page) = pages.iter().find(|(n, _)| *n == file).expect(&file);
            let page = plain(page);
            assert!(page.contains(cmd.short_desc()), "{file}: no description");
            for opt in (cmd.longopts)().iter().chain(COMMON_OPTIONS) {
                assert!(
                    page.contains(&format!("--{}", opt.name)),
                    "{file}: --{}",
                    opt.name
                );
                if let Some(c) = opt.short {
                    assert!(page.contains(&format!("-{}", char::from(c))), "{file}");
                }
            }
        }
        assert!(!pages.iter().any(|(n, _)| n.contains("generate")));
        assert!(!root.contains("generate-docs"));
    }
}
