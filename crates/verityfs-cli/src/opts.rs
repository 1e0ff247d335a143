//! The command line as typed definitions: each option is one [`Opt`] (its
//! names, value name, help and how its value lands in the command's
//! argument struct), each operand one [`Operand`], and each command's
//! argument struct lists its options ([`Args::OPTIONS`]). Parsing
//! (here and in [`crate::getopt`]), the usage and help texts
//! ([`crate::help`]), the manual pages and the shell completions
//! ([`crate::cli_spec`]) all come from these definitions.
//!
//! An option belongs to the commands whose [`Args::OPTIONS`] list it; the
//! options several commands share are generic over what the argument
//! struct holds (e.g. [`crate::tree_params::hash_alg`]), so an option can
//! only be given to a command that has somewhere to put its value.
//!
//! This module also parses verityfs's own commands ([`parse`]), with the
//! usual conventions: `--name=VALUE` or `--name VALUE`, `-x VALUE` or
//! `-xVALUE`, options and operands in any order, `--` ending the options,
//! and no abbreviations.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

use crate::commands::Command;
use crate::error::{Error, Result};
use crate::output::quote;

/// What shells complete a value with.
#[derive(Clone, Copy)]
pub enum Hint {
    /// Anything.
    Other,
    /// A file name.
    File,
    /// A directory name.
    Dir,
    /// A file or directory name.
    Path,
    /// One of a fixed list of words.
    Values(fn() -> Vec<&'static str>),
}

/// What documentation needs of an option, whatever its command.
pub struct OptSpec {
    /// The long name, without `--`.
    pub long: &'static str,
    /// A one-letter alias (`-o`).
    pub short: Option<char>,
    /// The value's name in usage texts (`--salt=SALT`); `None` for an
    /// option without a value.
    pub value: Option<&'static str>,
    /// What shells complete the value with.
    pub hint: Hint,
    /// One line saying what the option does.
    pub help: &'static str,
    /// More about it, for `--help` of verityfs's own commands and the
    /// manual pages (may be empty).
    pub doc: &'static str,
    /// Starts a new line of the usage text (fsverity's layout of its
    /// usage texts, which groups related options on a line).
    pub new_line: bool,
}

/// One option of the commands whose arguments are an `A`.
pub struct Opt<A> {
    /// Its names and documentation.
    pub spec: OptSpec,
    /// Takes the value (empty for an option without one) into the
    /// arguments, checking it.
    pub set: fn(&mut A, OsString) -> Result<()>,
}

/// How an option's value lands in the arguments.
type Setter<A> = fn(&mut A, OsString) -> Result<()>;

impl<A> Opt<A> {
    /// An option without a value; `set` gets an empty string.
    pub const fn flag(long: &'static str, help: &'static str, set: Setter<A>) -> Self {
        Self::new(long, None, help, set)
    }

    /// An option with a value named `value` in usage texts.
    pub const fn value(
        long: &'static str,
        value: &'static str,
        help: &'static str,
        set: Setter<A>,
    ) -> Self {
        Self::new(long, Some(value), help, set)
    }

    const fn new(
        long: &'static str,
        value: Option<&'static str>,
        help: &'static str,
        set: Setter<A>,
    ) -> Self {
        let hint = Hint::Other;
        let (short, doc, new_line) = (None, "", false);
        let spec = OptSpec {
            long,
            short,
            value,
            hint,
            help,
            doc,
            new_line,
        };
        Self { spec, set }
    }

    /// The same option, also spelled `-<letter>`.
    pub const fn short(mut self, letter: char) -> Self {
        self.spec.short = Some(letter);
        self
    }

    /// The same option, its value completed with `hint`.
    pub const fn hint(mut self, hint: Hint) -> Self {
        self.spec.hint = hint;
        self
    }

    /// The same option, with more to say than its help line.
    pub const fn doc(mut self, doc: &'static str) -> Self {
        self.spec.doc = doc;
        self
    }

    /// The same option, starting a new line of the usage text.
    pub const fn new_line(mut self) -> Self {
        self.spec.new_line = true;
        self
    }
}

/// How many times an operand is given.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Arity {
    /// Exactly once.
    One,
    /// At least once (`FILE...`).
    OneOrMore,
    /// Any number of times (`[PATH...]`).
    Any,
}

/// One operand of a command.
pub struct Operand {
    /// Its name in usage texts (`FILE`).
    pub name: &'static str,
    /// How many times it is given.
    pub arity: Arity,
    /// What it is.
    pub help: &'static str,
    /// What shells complete it with.
    pub hint: Hint,
}

impl Operand {
    /// An operand given once.
    pub const fn one(name: &'static str, help: &'static str, hint: Hint) -> Self {
        let arity = Arity::One;
        Self {
            name,
            arity,
            help,
            hint,
        }
    }

    /// The same operand, given `arity` times.
    pub const fn times(mut self, arity: Arity) -> Self {
        self.arity = arity;
        self
    }

    /// How usage texts show it: `FILE`, `FILE...` or `[PATH...]`.
    pub fn usage(&self) -> String {
        match self.arity {
            Arity::One => self.name.to_owned(),
            Arity::OneOrMore => format!("{}...", self.name),
            Arity::Any => format!("[{}...]", self.name),
        }
    }
}

/// The typed arguments of a command: its options, operands and what it
/// does with them.
pub trait Args: Default + Sized + 'static {
    /// The options, in the order of fsverity's option table for its
    /// commands (which glibc's messages about ambiguous options follow),
    /// and of the usage texts.
    const OPTIONS: &'static [Opt<Self>];
    /// The operands, in order.
    const OPERANDS: &'static [Operand];

    /// Runs the command once the options are parsed; `operands` are the
    /// other arguments, in order (their number is not checked yet).
    fn run(self, cmd: &Command, operands: Vec<OsString>) -> Result<()>;
}

/// The documentation of the options of `A`.
pub fn specs<A: Args>() -> Vec<&'static OptSpec> {
    A::OPTIONS.iter().map(|o| &o.spec).collect()
}

/// Exactly `N` operands, else a usage error.
pub fn exactly<const N: usize>(operands: Vec<OsString>) -> Result<[OsString; N]> {
    operands.try_into().map_err(|_| Error::usage())
}

/// At least one operand, else a usage error.
pub fn at_least_one(operands: Vec<OsString>) -> Result<Vec<OsString>> {
    match operands.is_empty() {
        true => Err(Error::usage()),
        false => Ok(operands),
    }
}

/// Parses the arguments of one of verityfs's own commands into `into`;
/// returns the operands.
pub fn parse<A>(args: &[OsString], opts: &[Opt<A>], into: &mut A) -> Result<Vec<OsString>> {
    let mut operands = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let bytes = arg.as_encoded_bytes();
        let (opt, inline) = match bytes {
            b"--" => {
                operands.extend(args.cloned());
                break;
            }
            [b'-', b'-', body @ ..] => {
                let (name, value) = split_value(body);
                (opts.iter().find(|o| o.spec.long.as_bytes() == name), value)
            }
            [b'-', letter, rest @ ..] => {
                let short = |o: &&Opt<A>| o.spec.short == Some(char::from(*letter));
                (opts.iter().find(short), (!rest.is_empty()).then_some(rest))
            }
            _ => {
                operands.push(arg.clone());
                continue;
            }
        };
        let Some(opt) = opt else {
            return Err(Error::usage_msg(quote("unknown option '", arg, "'")));
        };
        let name = format!("--{}", opt.spec.long);
        let value = match (opt.spec.value, inline) {
            (None, None) => OsString::new(),
            (None, Some(_)) => {
                return Err(Error::usage_msg(format!("option '{name}' takes no value")))
            }
            (Some(_), Some(value)) => OsStr::from_bytes(value).to_owned(),
            (Some(_), None) => args
                .next()
                .cloned()
                .ok_or_else(|| Error::usage_msg(format!("option '{name}' needs a value")))?,
        };
        (opt.set)(into, value)?;
    }
    Ok(operands)
}

/// `name=value` as `(name, Some(value))`, `name` as `(name, None)`.
fn split_value(body: &[u8]) -> (&[u8], Option<&[u8]>) {
    match body.iter().position(|&b| b == b'=') {
        Some(i) => (&body[..i], Some(&body[i + 1..])),
        None => (body, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default, Debug, PartialEq)]
    struct T {
        flag: bool,
        values: Vec<OsString>,
    }

    const OPTS: &[Opt<T>] = &[
        Opt::<T>::flag("flag", "", |t, _| {
            t.flag = true;
            Ok(())
        }),
        Opt::<T>::value("value", "V", "", |t, v| {
            t.values.push(v);
            Ok(())
        })
        .short('o'),
    ];

    fn run(args: &[&str]) -> Result<(T, Vec<OsString>)> {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let mut t = T::default();
        let operands = parse(&args, OPTS, &mut t)?;
        Ok((t, operands))
    }

    fn message(args: &[&str]) -> String {
        let e = run(args).unwrap_err();
        assert_eq!(e.exit_status(), crate::error::EXIT_USAGE);
        String::from_utf8(e.lines().concat()).unwrap()
    }

    #[test]
    fn values_in_every_spelling_and_operands_anywhere() {
        let (t, operands) =
            run(&["a", "--value=1", "--value", "2", "-o3", "-o", "4", "b"]).unwrap();
        assert_eq!(t.values, ["1", "2", "3", "4"]);
        assert_eq!(operands, ["a", "b"]);
        let (t, operands) = run(&["--flag", "-", "--", "--flag", "-o"]).unwrap();
        assert!(t.flag);
        assert_eq!(operands, ["-", "--flag", "-o"]);
        // A separate value is taken as it is.
        let (t, _) = run(&["--value", "--flag"]).unwrap();
        assert_eq!((t.flag, t.values), (false, vec![OsString::from("--flag")]));
    }

    #[test]
    fn errors_name_the_option() {
        assert_eq!(message(&["--val=1"]), "unknown option '--val=1'");
        assert_eq!(message(&["-x"]), "unknown option '-x'");
        assert_eq!(message(&["--flag=1"]), "option '--flag' takes no value");
        assert_eq!(message(&["a", "-o"]), "option '--value' needs a value");
    }
}
