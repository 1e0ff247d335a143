//! Usage and help texts, written from the definitions ([`crate::opts`]).
//!
//! The commands that mirror fsverity's print fsverity's usage texts, byte
//! for byte (`[--name=VALUE]` for each option, grouped on lines as
//! fsverity groups them); verityfs's own commands print a usage line on
//! errors and every option with its description for `--help`.

use std::fmt::Write;

use crate::commands::{Command, Style};
use crate::opts::{Arity, OptSpec};

/// Where continuation lines of fsverity's usage texts start.
const USAGE_INDENT: &str = "               ";
/// Where option descriptions start in `--help`.
const DOC_INDENT: &str = "          ";
/// Width the descriptions are wrapped to.
const WIDTH: usize = 80;

/// The usage of `cmd` as `verityfs --help` lists it, after its
/// description: indented, ending with a newline.
pub fn usage(cmd: &Command) -> String {
    match cmd.style {
        Style::Own => format!("    {}\n", usage_line(cmd)),
        Style::Getopt | Style::Verbatim => fsverity_usage(cmd),
    }
}

/// What a usage error prints after the messages.
pub fn usage_error(cmd: &Command) -> String {
    match cmd.style {
        Style::Own => format!(
            "Usage: {}\nTry 'verityfs {} --help' for more information.\n",
            usage_line(cmd),
            cmd.name
        ),
        Style::Getopt | Style::Verbatim => format!("Usage:\n{}", fsverity_usage(cmd)),
    }
}

/// What `verityfs COMMAND --help` prints.
pub fn help(cmd: &Command) -> String {
    match cmd.style {
        Style::Own => own_help(cmd),
        Style::Getopt | Style::Verbatim => format!("Usage:\n{}", fsverity_usage(cmd)),
    }
}

/// `verityfs NAME [OPTIONS] OPERAND...`, on one line.
pub fn usage_line(cmd: &Command) -> String {
    let mut line = format!("verityfs {}", cmd.name);
    if !(cmd.options)().is_empty() {
        line += " [OPTIONS]";
    }
    for operand in cmd.operands {
        line += " ";
        line += &operand.usage();
    }
    line
}

/// fsverity's layout: `    verityfs NAME OPERANDS [--opt=VALUE]...`,
/// a new indented line where an option starts one.
fn fsverity_usage(cmd: &Command) -> String {
    let mut text = format!("    verityfs {}", cmd.name);
    for operand in cmd.operands {
        text += " ";
        text += &operand.usage();
    }
    for opt in (cmd.options)() {
        text += if opt.new_line { "\n" } else { " " };
        if opt.new_line {
            text += USAGE_INDENT;
        }
        text += &bracketed(opt);
    }
    text + "\n"
}

/// `[--name=VALUE]` or `[--name]`.
fn bracketed(opt: &OptSpec) -> String {
    match opt.value {
        Some(value) => format!("[--{}={value}]", opt.long),
        None => format!("[--{}]", opt.long),
    }
}

/// `-o, --options=OPTIONS`, `    --create`.
fn names(opt: &OptSpec) -> String {
    let short = match opt.short {
        Some(c) => format!("-{c}, "),
        None => "    ".to_owned(),
    };
    match opt.value {
        Some(value) => format!("{short}--{}={value}", opt.long),
        None => format!("{short}--{}", opt.long),
    }
}

/// The full help of one of verityfs's own commands.
fn own_help(cmd: &Command) -> String {
    let mut text = format!("{}\n\nUsage: {}\n", cmd.about, usage_line(cmd));
    if !cmd.operands.is_empty() {
        text += "\nArguments:\n";
        let width = cmd.operands.iter().map(|o| o.name.len()).max().unwrap_or(0);
        for operand in cmd.operands {
            let repeat = if operand.arity == Arity::One {
                ""
            } else {
                "..."
            };
            let name = format!("{}{repeat}", operand.name);
            let _ = writeln!(text, "  {name:width$}  {}", operand.help, width = width + 3);
        }
    }
    text += "\nOptions:\n";
    for opt in (cmd.options)() {
        let _ = writeln!(text, "  {}", names(opt));
        let doc = match opt.doc {
            "" => opt.help.to_owned(),
            doc => format!("{}. {doc}", opt.help),
        };
        text += &wrap(&doc, DOC_INDENT);
    }
    text + "  -h, --help\n          Print this help and exit\n"
}

/// `text` wrapped at [`WIDTH`] columns, each line starting with `indent`.
pub fn wrap(text: &str, indent: &str) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && indent.len() + line.len() + 1 + word.len() > WIDTH {
            let _ = writeln!(out, "{indent}{line}");
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line += word;
    }
    if !line.is_empty() {
        let _ = writeln!(out, "{indent}{line}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::find;

    #[test]
    fn fsverity_usage_texts_are_fsverity_s() {
        let usage = |name: &str| fsverity_usage(find(name.as_bytes()).unwrap());
        assert_eq!(
            usage("digest"),
            "    verityfs digest FILE...
               [--hash-alg=HASH_ALG] [--block-size=BLOCK_SIZE] [--salt=SALT]
               [--out-merkle-tree=FILE] [--out-descriptor=FILE]
               [--compact] [--for-builtin-sig]
"
        );
        assert_eq!(
            usage("sign"),
            "    verityfs sign FILE OUT_SIGFILE
               [--key=KEYFILE] [--cert=CERTFILE] [--pkcs11-engine=SOFILE]
               [--pkcs11-module=SOFILE] [--pkcs11-keyid=KEYID]
               [--hash-alg=HASH_ALG] [--block-size=BLOCK_SIZE] [--salt=SALT]
               [--out-merkle-tree=FILE] [--out-descriptor=FILE]
"
        );
        assert_eq!(
            usage("enable"),
            "    verityfs enable FILE
               [--hash-alg=HASH_ALG] [--block-size=BLOCK_SIZE] [--salt=SALT]
               [--signature=SIGFILE]
"
        );
        assert_eq!(
            usage("dump_metadata"),
            "    verityfs dump_metadata TYPE FILE [--offset=OFFSET] [--length=LENGTH]\n"
        );
        assert_eq!(usage("measure"), "    verityfs measure FILE...\n");
    }

    #[test]
    fn own_help_describes_every_option() {
        let mount = find(b"mount").unwrap();
        let text = help(mount);
        assert!(text.starts_with("Serve a directory"), "{text}");
        assert!(text.contains("Usage: verityfs mount [OPTIONS] SOURCE MOUNTPOINT\n"));
        assert!(text.contains("\n  -o, --options=OPTIONS\n          Comma-separated"));
        for line in text.lines() {
            assert!(line.len() <= WIDTH || !line.contains(' '), "{line}");
        }
    }

    #[test]
    fn wrapping() {
        assert_eq!(wrap("a b", "  "), "  a b\n");
        let long = "word ".repeat(30);
        let wrapped = wrap(&long, DOC_INDENT);
        assert!(wrapped
            .lines()
            .all(|l| l.len() <= WIDTH && l.starts_with(DOC_INDENT)));
        assert_eq!(wrapped.split_whitespace().count(), 30);
    }
}
