//! A faithful emulation of glibc's `getopt_long(argc, argv, "", longopts, NULL)`
//! as used by the subcommands of fsverity-utils' `fsverity` command.
//!
//! Only long options exist (the short-option string is empty), so:
//!
//! * `--name=value` and `--name value` both supply the argument of an option
//!   that requires one; the separate form takes the next argument verbatim,
//!   even if it looks like an option (`--salt --compact` sets the salt to
//!   `--compact`) or is `--`.
//! * Any unambiguous prefix of an option name is accepted (`--hash=sha512`
//!   means `--hash-alg=sha512`); an exact match always wins over prefixes.
//!   As in glibc, several prefix matches are only ambiguous if they differ in
//!   their [`HasArg`] or their `id`.
//! * `--` ends option parsing; a lone `-` (and the empty string) is an operand.
//! * Operands and options may be interleaved (GNU argument permutation):
//!   options are reported in command-line order, operands in command-line order.
//!   If the `POSIXLY_CORRECT` environment variable is set (to anything, even
//!   the empty string), [`parse`] and [`Getopt::new`] instead stop at the
//!   first operand, exactly like glibc; [`parse_with_ordering`] and
//!   [`Getopt::with_ordering`] take the [`Ordering`] explicitly.
//!
//! [`Getopt`] is the streaming interface, one option at a time like a
//! `getopt_long` loop; [`parse`] collects everything and stops at the first
//! error. `fsverity` prints the diagnostic and its usage text and exits 2 as
//! soon as `getopt_long` returns `'?'`, but it also validates each option's
//! value inside the loop, so only [`Getopt`] reproduces which error wins
//! (`fsverity digest --salt=zz --foo` complains about the salt).
//! The diagnostic is available byte-for-byte (without the trailing newline)
//! from [`GetoptError::message`]. The texts are those of the C locale; glibc
//! would translate them under other locales if a translation is installed.
//!
//! Arguments are handled as [`OsStr`]s, so operands and option values that
//! are not valid UTF-8 survive unchanged. On non-Unix platforms the part of a
//! non-UTF-8 `--name=value` argument after the `=` is converted lossily.

use std::ffi::{OsStr, OsString};
use std::fmt;

/// Whether a long option takes an argument (glibc's `has_arg` field).
///
/// `optional_argument` is not supported because fsverity never uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HasArg {
    /// The option takes no argument (`no_argument`).
    No,
    /// The option needs an argument, given as `--name=value` or as the next
    /// command-line argument (`required_argument`).
    Required,
}

/// One entry of the long-option table (glibc's `struct option` with
/// `flag == NULL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LongOpt {
    /// The option name without the leading `--`.
    pub name: &'static str,
    /// Whether the option takes an argument.
    pub has_arg: HasArg,
    /// The value reported for this option in [`Parsed::options`]
    /// (glibc's `val`).
    pub id: u32,
    /// A one-letter alias (`-o VALUE`, `-oVALUE`), as in glibc's optstring.
    pub short: Option<u8>,
    /// One line saying what the option does, for the generated manual pages
    /// and shell completions (`cli_spec`); empty if not given. Not used for
    /// parsing.
    pub help: &'static str,
}

impl LongOpt {
    /// An option that takes no argument.
    pub const fn flag(name: &'static str, id: u32) -> Self {
        Self {
            name,
            has_arg: HasArg::No,
            id,
            short: None,
            help: "",
        }
    }

    /// An option that requires an argument.
    pub const fn required(name: &'static str, id: u32) -> Self {
        Self {
            name,
            has_arg: HasArg::Required,
            id,
            short: None,
            help: "",
        }
    }

    /// The same option, also spelled `-<letter>`.
    pub const fn with_short(self, letter: u8) -> Self {
        Self {
            short: Some(letter),
            ..self
        }
    }

    /// The same option, described by `help` (one line, for the manual
    /// pages and completions).
    pub const fn with_help(self, help: &'static str) -> Self {
        Self { help, ..self }
    }
}

/// How operands interleaved with options are treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ordering {
    /// GNU default: options may follow operands (glibc's `PERMUTE`).
    Permute,
    /// POSIX: the first operand ends option parsing; it and everything after
    /// it are operands, including a later `--` (glibc's `REQUIRE_ORDER`).
    RequireOrder,
}

impl Ordering {
    /// The ordering glibc picks for an empty option string: `RequireOrder`
    /// if `POSIXLY_CORRECT` is set in the environment, else `Permute`.
    pub fn from_env() -> Self {
        if std::env::var_os("POSIXLY_CORRECT").is_some() {
            Self::RequireOrder
        } else {
            Self::Permute
        }
    }
}

#[cfg(test)]
/// The result of a successful [`parse`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    /// The options found, in command-line order (see [`Opt`]).
    pub options: Vec<Opt>,
    /// The operands (non-option arguments), in command-line order.
    pub operands: Vec<OsString>,
}

/// What went wrong, in structured form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GetoptErrorKind {
    /// `--name` matches no option; holds the whole argument as given,
    /// including any `=value` (e.g. `--foo=bar`).
    UnrecognizedOption(OsString),
    /// `--name` is a prefix of several options that differ in `has_arg` or
    /// `id`.
    AmbiguousOption {
        /// The whole argument as given, including any `=value`.
        given: OsString,
        /// The full names (without `--`) of the conflicting options, in
        /// table order.
        candidates: Vec<&'static str>,
    },
    /// `--name=value` was given for an option without an argument; holds
    /// the option's full name (without `--`).
    ArgumentNotAllowed(&'static str),
    /// An option needing an argument was the last argument; holds the
    /// option's full name (without `--`).
    ArgumentRequired(&'static str),
    /// A short option (`-x`) was given that does not exist. Holds the
    /// first byte after the `-`, the one glibc reports.
    InvalidShortOption(u8),
    /// A short option needing an argument was the last argument.
    ShortArgumentRequired(u8),
}

/// A command-line error, carrying glibc's exact diagnostic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetoptError {
    kind: GetoptErrorKind,
    message: Vec<u8>,
}

impl GetoptError {
    #[cfg(test)]
    /// The structured error.
    pub fn kind(&self) -> &GetoptErrorKind {
        &self.kind
    }

    /// The exact bytes glibc writes to stderr, without the trailing newline,
    /// e.g. `digest: unrecognized option '--foo'`. They are not valid UTF-8
    /// if the offending argument is not.
    pub fn message(&self) -> &[u8] {
        &self.message
    }

    fn new(prog: &str, kind: GetoptErrorKind) -> Self {
        let message = render(prog, &kind);
        Self { kind, message }
    }
}

impl fmt::Display for GetoptError {
    /// Writes the message, replacing invalid UTF-8 with U+FFFD; write
    /// [`GetoptError::message`] instead to be byte-exact.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(&self.message))
    }
}

impl std::error::Error for GetoptError {}

/// Builds glibc's diagnostic (C locale) for `kind`.
fn render(prog: &str, kind: &GetoptErrorKind) -> Vec<u8> {
    let mut m = Vec::from(prog.as_bytes());
    m.extend_from_slice(b": ");
    match kind {
        GetoptErrorKind::UnrecognizedOption(given) => {
            m.extend_from_slice(b"unrecognized option '");
            m.extend_from_slice(given.as_encoded_bytes());
            m.push(b'\'');
        }
        GetoptErrorKind::AmbiguousOption { given, candidates } => {
            m.extend_from_slice(b"option '");
            m.extend_from_slice(given.as_encoded_bytes());
            m.extend_from_slice(b"' is ambiguous; possibilities:");
            for name in candidates {
                m.extend_from_slice(format!(" '--{name}'").as_bytes());
            }
        }
        GetoptErrorKind::ArgumentNotAllowed(name) => {
            m.extend_from_slice(format!("option '--{name}' doesn't allow an argument").as_bytes());
        }
        GetoptErrorKind::ArgumentRequired(name) => {
            m.extend_from_slice(format!("option '--{name}' requires an argument").as_bytes());
        }
        GetoptErrorKind::InvalidShortOption(byte) => {
            m.extend_from_slice(b"invalid option -- '");
            m.push(*byte);
            m.push(b'\'');
        }
        GetoptErrorKind::ShortArgumentRequired(byte) => {
            m.extend_from_slice(b"option requires an argument -- '");
            m.push(*byte);
            m.push(b'\'');
        }
    }
    m
}

/// One option found by [`Getopt`]: its `id` and, for [`HasArg::Required`]
/// options, its value (possibly empty, as in `--salt=`).
pub type Opt = (u32, Option<OsString>);

/// A streaming parser: an iterator over the options, in command-line order,
/// that collects the operands on the side, like a `getopt_long` loop.
///
/// Use it instead of [`parse`] when option values are checked inside the
/// loop, as fsverity does: `fsverity digest --salt=zz --foo` reports the bad
/// salt, not the unknown `--foo`, because it stops before reaching `--foo`.
///
/// As with glibc, an error does not end the iteration: the next call resumes
/// after the offending argument (or with the next character of a `-xy`
/// cluster). Once [`Iterator::next`] has returned `None`,
/// [`Getopt::operands`] holds all operands.
#[derive(Debug, Clone)]
pub struct Getopt<'a, S> {
    prog: &'a str,
    args: std::slice::Iter<'a, S>,
    opts: &'a [LongOpt],
    ordering: Ordering,
    operands: Vec<OsString>,
    /// The not yet reported characters of a `-xy` cluster.
    short_rest: std::iter::Copied<std::slice::Iter<'a, u8>>,
}

impl<'a, S: AsRef<OsStr>> Getopt<'a, S> {
    /// A parser for `args` (the arguments after `argv[0]`) honouring
    /// `POSIXLY_CORRECT` like glibc (see [`Ordering::from_env`]).
    ///
    /// `prog` is `argv[0]` as it appears in diagnostics; fsverity passes its
    /// subcommand's arguments, so that is the subcommand name (e.g. `digest`).
    pub fn new(prog: &'a str, args: &'a [S], opts: &'a [LongOpt]) -> Self {
        Self::with_ordering(prog, args, opts, Ordering::from_env())
    }

    /// Like [`Getopt::new`], with an explicit [`Ordering`].
    pub fn with_ordering(
        prog: &'a str,
        args: &'a [S],
        opts: &'a [LongOpt],
        ordering: Ordering,
    ) -> Self {
        let short_rest = [].iter().copied();
        Self {
            prog,
            args: args.iter(),
            opts,
            ordering,
            operands: Vec::new(),
            short_rest,
        }
    }

    #[cfg(test)]
    /// The operands seen so far; all of them once the iterator is exhausted.
    pub fn operands(&self) -> &[OsString] {
        &self.operands
    }

    /// Consumes the parser, returning the operands seen so far.
    pub fn into_operands(self) -> Vec<OsString> {
        self.operands
    }

    /// Moves every remaining argument to the operands.
    fn finish(&mut self) {
        self.operands
            .extend(self.args.by_ref().map(|a| a.as_ref().to_owned()));
    }

    fn error(&self, kind: GetoptErrorKind) -> GetoptError {
        GetoptError::new(self.prog, kind)
    }
}

impl<S: AsRef<OsStr>> Iterator for Getopt<'_, S> {
    type Item = Result<Opt, GetoptError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(byte) = self.short_rest.next() {
            return Some(Err(self.error(GetoptErrorKind::InvalidShortOption(byte))));
        }
        while let Some(arg) = self.args.next() {
            let arg = arg.as_ref();
            let bytes = arg.as_encoded_bytes();
            if bytes == b"--" {
                break;
            }
            if bytes.len() < 2 || bytes[0] != b'-' {
                self.operands.push(arg.to_owned());
                if self.ordering == Ordering::RequireOrder {
                    break;
                }
                continue;
            }
            if bytes[1] != b'-' {
                if let Some(opt) = self.opts.iter().find(|o| o.short == Some(bytes[1])) {
                    let mut rest = self.args.by_ref().map(AsRef::as_ref);
                    let result = short_option(opt, arg, &mut rest);
                    return Some(result.map_err(|kind| self.error(kind)));
                }
                self.short_rest = bytes[2..].iter().copied();
                return Some(Err(
                    self.error(GetoptErrorKind::InvalidShortOption(bytes[1]))
                ));
            }
            let mut rest = self.args.by_ref().map(AsRef::as_ref);
            let result = long_option(arg, &mut rest, self.opts);
            return Some(result.map_err(|kind| self.error(kind)));
        }
        self.finish();
        None
    }
}

#[cfg(test)]
/// Parses all of `args` (the arguments after `argv[0]`) against `opts`,
/// stopping at the first error; see [`Getopt::new`] for the parameters.
///
/// This reports a getopt error even if an earlier option has a value the
/// caller would reject; use [`Getopt`] to check values in order.
pub fn parse<S: AsRef<OsStr>>(
    prog: &str,
    args: &[S],
    opts: &[LongOpt],
) -> Result<Parsed, GetoptError> {
    parse_with_ordering(prog, args, opts, Ordering::from_env())
}

#[cfg(test)]
/// Like [`parse`], but with an explicit [`Ordering`] instead of consulting
/// the environment.
pub fn parse_with_ordering<S: AsRef<OsStr>>(
    prog: &str,
    args: &[S],
    opts: &[LongOpt],
    ordering: Ordering,
) -> Result<Parsed, GetoptError> {
    let mut getopt = Getopt::with_ordering(prog, args, opts, ordering);
    let options = getopt.by_ref().collect::<Result<Vec<_>, _>>()?;
    Ok(Parsed {
        options,
        operands: getopt.into_operands(),
    })
}

/// Handles one `--name[=value]` argument, taking a separate value from
/// `rest` if needed.
fn long_option<'a>(
    arg: &OsStr,
    rest: &mut impl Iterator<Item = &'a OsStr>,
    opts: &[LongOpt],
) -> Result<Opt, GetoptErrorKind> {
    let body = arg.as_encoded_bytes().get(2..).unwrap_or_default();
    let eq = body.iter().position(|&b| b == b'=');
    let name = &body[..eq.unwrap_or(body.len())];
    let opt = lookup(opts, name, arg)?;
    let value = match (opt.has_arg, eq) {
        (HasArg::No, None) => None,
        (HasArg::No, Some(_)) => return Err(GetoptErrorKind::ArgumentNotAllowed(opt.name)),
        (HasArg::Required, Some(i)) => Some(suffix(arg, 2 + i + 1)),
        (HasArg::Required, None) => match rest.next() {
            Some(v) => Some(v.to_owned()),
            None => return Err(GetoptErrorKind::ArgumentRequired(opt.name)),
        },
    };
    Ok((opt.id, value))
}

/// Handles `-x`, `-xVALUE` or `-x VALUE` for the option `opt`.
fn short_option<'a>(
    opt: &LongOpt,
    arg: &OsStr,
    rest: &mut impl Iterator<Item = &'a OsStr>,
) -> Result<Opt, GetoptErrorKind> {
    let letter = arg.as_encoded_bytes()[1];
    match opt.has_arg {
        HasArg::No => Ok((opt.id, None)),
        HasArg::Required if arg.len() > 2 => Ok((opt.id, Some(suffix(arg, 2)))),
        HasArg::Required => match rest.next() {
            Some(v) => Ok((opt.id, Some(v.to_owned()))),
            None => Err(GetoptErrorKind::ShortArgumentRequired(letter)),
        },
    }
}

/// Finds the option `name` (an exact match, else a unique prefix match) as
/// glibc's `process_long_option` does. `arg` is the whole argument, for
/// diagnostics.
fn lookup<'o>(
    opts: &'o [LongOpt],
    name: &[u8],
    arg: &OsStr,
) -> Result<&'o LongOpt, GetoptErrorKind> {
    if let Some(exact) = opts.iter().find(|o| o.name.as_bytes() == name) {
        return Ok(exact);
    }
    let mut matches = opts.iter().filter(|o| o.name.as_bytes().starts_with(name));
    let Some(first) = matches.next() else {
        return Err(GetoptErrorKind::UnrecognizedOption(arg.to_owned()));
    };
    // glibc only records options that conflict with the first match.
    let conflicting: Vec<&'static str> = matches
        .filter(|o| o.has_arg != first.has_arg || o.id != first.id)
        .map(|o| o.name)
        .collect();
    if conflicting.is_empty() {
        return Ok(first);
    }
    let candidates = std::iter::once(first.name).chain(conflicting).collect();
    Err(GetoptErrorKind::AmbiguousOption {
        given: arg.to_owned(),
        candidates,
    })
}

/// The part of `arg` from byte offset `start` on; `start` must follow an
/// ASCII byte (here: the `=`), so it is a valid split point.
#[cfg(unix)]
fn suffix(arg: &OsStr, start: usize) -> OsString {
    use std::os::unix::ffi::OsStrExt;
    OsStr::from_bytes(arg.as_bytes().get(start..).unwrap_or_default()).to_owned()
}

/// The part of `arg` from byte offset `start` on; `start` must follow an
/// ASCII byte (here: the `=`). Non-UTF-8 text is converted lossily.
#[cfg(not(unix))]
fn suffix(arg: &OsStr, start: usize) -> OsString {
    let tail = arg.as_encoded_bytes().get(start..).unwrap_or_default();
    OsString::from(String::from_utf8_lossy(tail).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMPACT: u32 = 1;
    const HASH_ALG: u32 = 2;
    const SALT: u32 = 3;
    const BLOCK_SIZE: u32 = 4;
    const ENGINE: u32 = 5;
    const MODULE: u32 = 6;
    const KEYID: u32 = 7;
    const KEY: u32 = 8;

    /// A subset of `fsverity digest`'s table.
    const DIGEST: &[LongOpt] = &[
        LongOpt::required("hash-alg", HASH_ALG),
        LongOpt::required("block-size", BLOCK_SIZE),
        LongOpt::required("salt", SALT),
        LongOpt::flag("compact", COMPACT),
    ];

    /// The options of `fsverity sign` relevant to ambiguity.
    const SIGN: &[LongOpt] = &[
        LongOpt::required("key", KEY),
        LongOpt::required("pkcs11-engine", ENGINE),
        LongOpt::required("pkcs11-module", MODULE),
        LongOpt::required("pkcs11-keyid", KEYID),
    ];

    fn run(prog: &str, args: &[&str], opts: &[LongOpt]) -> Result<Parsed, GetoptError> {
        parse_with_ordering(prog, args, opts, Ordering::Permute)
    }

    fn ok(args: &[&str]) -> Parsed {
        run("digest", args, DIGEST).expect("should parse")
    }

    fn err_msg(prog: &str, args: &[&str], opts: &[LongOpt]) -> String {
        let e = run(prog, args, opts).expect_err("should fail");
        String::from_utf8(e.message().to_vec()).expect("utf-8")
    }

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn val(s: &str) -> Option<OsString> {
        Some(OsString::from(s))
    }

    #[test]
    fn empty_args() {
        assert_eq!(ok(&[]), Parsed::default());
    }

    #[test]
    fn operands_and_options_are_permuted() {
        let p = ok(&["a", "--compact", "b", "--salt", "00", "c"]);
        assert_eq!(p.options, vec![(COMPACT, None), (SALT, val("00"))]);
        assert_eq!(p.operands, os(&["a", "b", "c"]));
    }

    #[test]
    fn equals_and_separate_values() {
        let p = ok(&["--hash-alg=sha512", "--salt", "ab", "--block-size=", "f"]);
        let want = vec![
            (HASH_ALG, val("sha512")),
            (SALT, val("ab")),
            (BLOCK_SIZE, val("")),
        ];
        assert_eq!(p.options, want);
        assert_eq!(p.operands, os(&["f"]));
    }

    #[test]
    fn value_may_contain_equals() {
        assert_eq!(ok(&["--salt=a=b"]).options, vec![(SALT, val("a=b"))]);
    }

    #[test]
    fn separate_value_is_taken_verbatim() {
        // glibc takes the next argument whatever it looks like.
        let p = ok(&["--salt", "--compact", "f"]);
        assert_eq!(p.options, vec![(SALT, val("--compact"))]);
        let p = ok(&["--salt", "--", "--compact"]);
        assert_eq!(p.options, vec![(SALT, val("--")), (COMPACT, None)]);
        assert!(p.operands.is_empty());
    }

    #[test]
    fn repeated_options_are_all_reported() {
        let p = ok(&["--salt=1", "--salt=2"]);
        assert_eq!(p.options, vec![(SALT, val("1")), (SALT, val("2"))]);
    }

    #[test]
    fn double_dash_ends_options() {
        let p = ok(&["a", "--", "--compact", "-x", "--"]);
        assert!(p.options.is_empty());
        assert_eq!(p.operands, os(&["a", "--compact", "-x", "--"]));
    }

    #[test]
    fn lone_dash_and_empty_string_are_operands() {
        let p = ok(&["-", "", "--compact"]);
        assert_eq!(p.options, vec![(COMPACT, None)]);
        assert_eq!(p.operands, os(&["-", ""]));
    }

    #[test]
    fn unique_prefixes_are_accepted() {
        let p = ok(&["--hash", "sha512", "--h=sha256", "--comp", "--s=00"]);
        let want = vec![
            (HASH_ALG, val("sha512")),
            (HASH_ALG, val("sha256")),
            (COMPACT, None),
            (SALT, val("00")),
        ];
        assert_eq!(p.options, want);
    }

    #[test]
    fn exact_match_beats_prefixes() {
        let opts = [LongOpt::flag("key", 1), LongOpt::flag("keyid", 2)];
        let p = run("x", &["--key"], &opts).unwrap();
        assert_eq!(p.options, vec![(1, None)]);
        let p = run("x", &["--keyi"], &opts).unwrap();
        assert_eq!(p.options, vec![(2, None)]);
    }

    #[test]
    fn identical_prefix_matches_are_not_ambiguous() {
        // glibc: same has_arg and val means no ambiguity; the first wins.
        let opts = [LongOpt::flag("color", 9), LongOpt::flag("colour", 9)];
        let p = run("x", &["--col"], &opts).unwrap();
        assert_eq!(p.options, vec![(9, None)]);
        let opts = [LongOpt::flag("color", 9), LongOpt::required("colour", 9)];
        let msg = err_msg("x", &["--col"], &opts);
        assert_eq!(
            msg,
            "x: option '--col' is ambiguous; possibilities: '--color' '--colour'"
        );
    }

    #[test]
    fn ambiguity_lists_only_options_conflicting_with_first_match() {
        let opts = [
            LongOpt::flag("aa", 1),
            LongOpt::flag("ab", 1),
            LongOpt::flag("ac", 2),
        ];
        let e = run("x", &["--a"], &opts).unwrap_err();
        let kind = GetoptErrorKind::AmbiguousOption {
            given: "--a".into(),
            candidates: vec!["aa", "ac"],
        };
        assert_eq!(e.kind(), &kind);
    }

    // The messages below were checked byte for byte against fsverity v1.5
    // on glibc 2.36 (Debian 12).

    #[test]
    fn unrecognized_option() {
        assert_eq!(
            err_msg("digest", &["--foo", "f"], DIGEST),
            "digest: unrecognized option '--foo'"
        );
        // The whole argument, including the value, is quoted.
        let msg = err_msg("digest", &["--foo=bar", "f"], DIGEST);
        assert_eq!(msg, "digest: unrecognized option '--foo=bar'");
        // A longer string is not a prefix of anything.
        let msg = err_msg("digest", &["--compactt"], DIGEST);
        assert_eq!(msg, "digest: unrecognized option '--compactt'");
    }

    #[test]
    fn argument_not_allowed_uses_full_name() {
        let msg = err_msg("digest", &["--compact=1", "f"], DIGEST);
        assert_eq!(msg, "digest: option '--compact' doesn't allow an argument");
        let msg = err_msg("digest", &["--comp=1", "f"], DIGEST);
        assert_eq!(msg, "digest: option '--compact' doesn't allow an argument");
        let e = run("digest", &["--compact="], DIGEST).unwrap_err();
        assert_eq!(e.kind(), &GetoptErrorKind::ArgumentNotAllowed("compact"));
    }

    #[test]
    fn argument_required_uses_full_name() {
        assert_eq!(
            err_msg("digest", &["--salt"], DIGEST),
            "digest: option '--salt' requires an argument"
        );
        let msg = err_msg("digest", &["f", "--hash"], DIGEST);
        assert_eq!(msg, "digest: option '--hash-alg' requires an argument");
        assert_eq!(
            err_msg("sign", &["--key"], SIGN),
            "sign: option '--key' requires an argument"
        );
    }

    #[test]
    fn invalid_short_option_reports_first_byte() {
        assert_eq!(
            err_msg("digest", &["-x", "f"], DIGEST),
            "digest: invalid option -- 'x'"
        );
        assert_eq!(
            err_msg("digest", &["-xy", "f"], DIGEST),
            "digest: invalid option -- 'x'"
        );
        let e = run("digest", &["-\u{e9}"], DIGEST).unwrap_err();
        assert_eq!(e.message(), b"digest: invalid option -- '\xc3'");
        assert_eq!(e.kind(), &GetoptErrorKind::InvalidShortOption(0xc3));
    }

    #[test]
    fn ambiguous_option() {
        let want = "sign: option '--pkcs11' is ambiguous; possibilities: \
                    '--pkcs11-engine' '--pkcs11-module' '--pkcs11-keyid'";
        assert_eq!(err_msg("sign", &["--pkcs11", "a", "b"], SIGN), want);
        let want = "sign: option '--pkcs11=x' is ambiguous; possibilities: \
                    '--pkcs11-engine' '--pkcs11-module' '--pkcs11-keyid'";
        assert_eq!(err_msg("sign", &["--pkcs11=x", "a", "b"], SIGN), want);
    }

    #[test]
    fn empty_name_matches_every_option() {
        let want = "digest: option '--=x' is ambiguous; possibilities: \
                    '--hash-alg' '--block-size' '--salt' '--compact'";
        assert_eq!(err_msg("digest", &["--=x", "f"], DIGEST), want);
        let only = [LongOpt::required("salt", SALT)];
        let p = run("x", &["--=00"], &only).unwrap();
        assert_eq!(p.options, vec![(SALT, val("00"))]);
        assert_eq!(
            err_msg("x", &["--=x"], &[]),
            "x: unrecognized option '--=x'"
        );
    }

    #[test]
    fn first_error_wins() {
        let msg = err_msg("digest", &["--compact", "-x", "--foo"], DIGEST);
        assert_eq!(msg, "digest: invalid option -- 'x'");
        let msg = err_msg("digest", &["--foo", "-x"], DIGEST);
        assert_eq!(msg, "digest: unrecognized option '--foo'");
    }

    #[test]
    fn getopt_streams_options_and_collects_operands() {
        let args = ["a", "--salt=zz", "b", "--foo", "--", "c"];
        let mut g = Getopt::with_ordering("digest", &args, DIGEST, Ordering::Permute);
        assert_eq!(g.next().unwrap().unwrap(), (SALT, val("zz")));
        // A caller rejecting the salt here never sees the `--foo` error.
        assert_eq!(g.operands(), os(&["a"]).as_slice());
        let e = g.next().unwrap().unwrap_err();
        assert_eq!(e.message(), b"digest: unrecognized option '--foo'");
        assert!(g.next().is_none());
        assert!(g.next().is_none());
        assert_eq!(g.into_operands(), os(&["a", "b", "c"]));
    }

    #[test]
    fn getopt_resumes_after_errors_like_glibc() {
        let args = ["-xy", "--foo", "--compact=1", "--compact", "f", "--salt"];
        let g = Getopt::with_ordering("digest", &args, DIGEST, Ordering::Permute);
        let got: Vec<_> = g.map(|r| r.map_err(|e| e.to_string())).collect();
        let want: Vec<Result<Opt, String>> = vec![
            Err("digest: invalid option -- 'x'".into()),
            Err("digest: invalid option -- 'y'".into()),
            Err("digest: unrecognized option '--foo'".into()),
            Err("digest: option '--compact' doesn't allow an argument".into()),
            Ok((COMPACT, None)),
            Err("digest: option '--salt' requires an argument".into()),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn options_after_double_dash_are_not_errors() {
        let p = ok(&["--", "-x", "--foo"]);
        assert_eq!(p.operands, os(&["-x", "--foo"]));
    }

    #[test]
    fn require_order_stops_at_first_operand() {
        let args = ["--compact", "f", "--salt=00", "--", "-x"];
        let p = parse_with_ordering("digest", &args, DIGEST, Ordering::RequireOrder).unwrap();
        assert_eq!(p.options, vec![(COMPACT, None)]);
        assert_eq!(p.operands, os(&["f", "--salt=00", "--", "-x"]));
        let p = parse_with_ordering(
            "digest",
            &["--", "--compact"],
            DIGEST,
            Ordering::RequireOrder,
        )
        .unwrap();
        assert_eq!(p.operands, os(&["--compact"]));
    }

    #[test]
    fn accepts_string_and_os_string_slices() {
        let strings = vec![String::from("--compact"), String::from("f")];
        let a = parse_with_ordering("digest", &strings, DIGEST, Ordering::Permute).unwrap();
        let oss = os(&["--compact", "f"]);
        let b = parse_with_ordering("digest", &oss, DIGEST, Ordering::Permute).unwrap();
        assert_eq!(a, b);
        // `parse` consults the environment but agrees when no permutation is
        // involved.
        assert_eq!(parse("digest", &oss, DIGEST).unwrap(), a);
        let mut g = Getopt::new("digest", &oss, DIGEST);
        assert_eq!(g.next().unwrap().unwrap(), (COMPACT, None));
        assert!(g.next().is_none());
        assert_eq!(g.operands(), os(&["f"]).as_slice());
    }

    #[test]
    fn display_matches_message() {
        let e = run("digest", &["--foo"], DIGEST).unwrap_err();
        assert_eq!(e.to_string(), "digest: unrecognized option '--foo'");
    }

    #[cfg(unix)]
    #[test]
    fn non_utf8_arguments_are_preserved() {
        use std::os::unix::ffi::{OsStrExt, OsStringExt};
        let raw = |b: &[u8]| OsStr::from_bytes(b).to_owned();
        let args = [
            raw(b"f\xff"),
            raw(b"--salt=\xfe"),
            raw(b"--hash-alg"),
            raw(b"\xfd"),
        ];
        let p = parse_with_ordering("digest", &args, DIGEST, Ordering::Permute).unwrap();
        assert_eq!(p.operands, vec![raw(b"f\xff")]);
        assert_eq!(
            p.options,
            vec![(SALT, Some(raw(b"\xfe"))), (HASH_ALG, Some(raw(b"\xfd")))]
        );
        let e = parse_with_ordering("digest", &[raw(b"--fo\xffo")], DIGEST, Ordering::Permute)
            .unwrap_err();
        assert_eq!(e.message(), b"digest: unrecognized option '--fo\xffo'");
        assert_eq!(
            e.kind(),
            &GetoptErrorKind::UnrecognizedOption(OsString::from_vec(b"--fo\xffo".to_vec()))
        );
        assert_eq!(e.to_string(), "digest: unrecognized option '--fo\u{fffd}o'");
    }

    #[test]
    fn short_option_with_argument() {
        const OPTS: &[LongOpt] = &[LongOpt::required("options", 9).with_short(b'o')];
        let p = parse_with_ordering(
            "mount",
            &["a", "-o", "ro", "-oallow_other", "b"],
            OPTS,
            Ordering::Permute,
        )
        .unwrap();
        assert_eq!(
            p.options,
            vec![(9, Some("ro".into())), (9, Some("allow_other".into()))]
        );
        assert_eq!(p.operands, os(&["a", "b"]));
        let e = parse_with_ordering("mount", &["-o"], OPTS, Ordering::Permute).unwrap_err();
        assert_eq!(e.message(), b"mount: option requires an argument -- 'o'");
        let e = parse_with_ordering("mount", &["-x"], OPTS, Ordering::Permute).unwrap_err();
        assert_eq!(e.message(), b"mount: invalid option -- 'x'");
    }
}
