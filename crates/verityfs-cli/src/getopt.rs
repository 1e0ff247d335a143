//! Option parsing for the commands that mirror fsverity-utils' (`digest`,
//! `sign`, `enable`, `dump_metadata`), by calling the C library's own
//! `getopt_long(argc, argv, "", longopts, NULL)` as `fsverity` does.
//!
//! Why the C function rather than a Rust copy of it: these commands must
//! behave exactly like `fsverity` on the same system, and `fsverity` gets
//! its behaviour from this very function: unambiguous abbreviations of long
//! options (`--hash` for `--hash-alg`), the separate value taken verbatim
//! (`--salt --compact`), argument permutation unless `POSIXLY_CORRECT` is
//! set, which of several prefix matches is ambiguous, and the exact
//! diagnostics, which glibc prints itself. Calling it reproduces all of
//! that by construction in a few dozen lines; a Rust re-implementation
//! needs several hundred, and can only match one C library's version of
//! those rules. The price is `unsafe` code (the calls below) and the
//! function's global state, which [`GETOPT`] serializes.
//!
//! Each option is checked as soon as `getopt_long` returns it, as in
//! fsverity's loops, so that the first bad option wins
//! (`digest --salt=zz --foo` complains about the salt). verityfs never
//! calls `setlocale()`, so glibc's diagnostics are its untranslated texts.
//! (`measure`, like `fsverity measure`, parses no options at all.)

use std::ffi::{c_char, c_int, CStr, CString, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::opts::Opt;

extern "C" {
    /// Index of the next argument (`<getopt.h>`).
    static mut optind: c_int;
    /// The value of the option just returned (`<getopt.h>`).
    static mut optarg: *mut c_char;
}

/// `getopt_long` keeps its state in the C library's globals: one parse at
/// a time.
static GETOPT: Mutex<()> = Mutex::new(());

/// What `getopt_long` returns for the option at index `i` of the table
/// (above any character it returns for a short option or an error).
const FIRST_VAL: c_int = 0x100;

/// Parses `args` (the arguments after the command name) into `into` as
/// `fsverity <prog>` does; returns the operands. A getopt error (printed
/// by the C library, as `<prog>: unrecognized option '--foo'`) is a usage
/// error.
pub fn parse<A>(
    prog: &str,
    args: &[OsString],
    opts: &[Opt<A>],
    into: &mut A,
) -> Result<Vec<OsString>> {
    let strings = c_strings(prog, args)?;
    let mut argv: Vec<*mut c_char> = strings.iter().map(|s| s.as_ptr().cast_mut()).collect();
    let argc = c_int::try_from(argv.len()).map_err(|_| Error::usage())?;
    argv.push(std::ptr::null_mut());
    let names: Vec<CString> = opts
        .iter()
        .map(|o| CString::new(o.spec.long).expect("option names have no NUL"))
        .collect();
    let mut longopts: Vec<libc::option> = opts
        .iter()
        .zip(&names)
        .zip(FIRST_VAL..)
        .map(|((opt, name), val)| libc::option {
            name: name.as_ptr(),
            has_arg: c_int::from(opt.spec.value.is_some()),
            flag: std::ptr::null_mut(),
            val,
        })
        .collect();
    longopts.push(libc::option {
        name: std::ptr::null(),
        has_arg: 0,
        flag: std::ptr::null_mut(),
        val: 0,
    });
    let _guard = GETOPT.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: the lock makes this the only use of getopt's globals in the
    // program; 0 asks glibc to start afresh (and read POSIXLY_CORRECT).
    unsafe { optind = 0 };
    loop {
        // SAFETY: `argv` is `argc` pointers to NUL-terminated strings that
        // outlive the loop, then NULL; getopt_long only permutes the
        // pointers, in our buffer. `longopts` ends with the zeroed entry
        // and its names live in `names`; the option string is empty; a
        // NULL `longindex` is allowed.
        let c = unsafe {
            libc::getopt_long(
                argc,
                argv.as_ptr(),
                c"".as_ptr(),
                longopts.as_ptr(),
                std::ptr::null_mut(),
            )
        };
        if c == -1 {
            break;
        }
        let Some(opt) = usize::try_from(c - FIRST_VAL)
            .ok()
            .and_then(|i| opts.get(i))
        else {
            return Err(Error::usage());
        };
        // SAFETY: after getopt_long returned an option, `optarg` is NULL
        // or points into one of the strings of `argv`.
        let value = unsafe { c_string_at(optarg) };
        (opt.set)(into, value)?;
    }
    // SAFETY: read under the lock; after the end, `optind` indexes the
    // first operand of the permuted `argv`, at most `argc`.
    let first = usize::try_from(unsafe { optind }).unwrap_or(argv.len());
    let operands = argv[first.min(strings.len())..strings.len()]
        .iter()
        // SAFETY: the permuted pointers are those of `strings`.
        .map(|&p| unsafe { c_string_at(p) })
        .collect();
    Ok(operands)
}

/// `prog` then `args`, as C strings (an argument of the command line
/// cannot hold a NUL byte).
fn c_strings(prog: &str, args: &[OsString]) -> Result<Vec<CString>> {
    std::iter::once(prog.as_bytes())
        .chain(args.iter().map(|a| a.as_bytes()))
        .map(|bytes| {
            CString::new(bytes).map_err(|_| Error::usage_msg("an argument holds a NUL byte"))
        })
        .collect()
}

/// A copy of the C string at `p`; empty for NULL.
///
/// # Safety
///
/// `p` is NULL or points to a NUL-terminated string.
unsafe fn c_string_at(p: *const c_char) -> OsString {
    if p.is_null() {
        return OsString::new();
    }
    // SAFETY: as the caller promises.
    let bytes = unsafe { CStr::from_ptr(p) }.to_bytes();
    OsString::from_vec(bytes.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct T {
        seen: Vec<(&'static str, OsString)>,
    }

    const OPTS: &[Opt<T>] = &[
        Opt::<T>::value("salt", "SALT", "", |t, v| {
            t.seen.push(("salt", v));
            Ok(())
        }),
        Opt::flag("compact", "", |t, v| {
            t.seen.push(("compact", v));
            Ok(())
        }),
        Opt::value("hash-alg", "HASH_ALG", "", |t, v| match v.as_bytes() {
            b"bad" => Err(Error::usage_msg("bad hash")),
            _ => {
                t.seen.push(("hash-alg", v));
                Ok(())
            }
        }),
    ];

    fn run(args: &[&str]) -> (Result<Vec<OsString>>, Vec<(&'static str, OsString)>) {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let mut t = T::default();
        let operands = parse("digest", &args, OPTS, &mut t);
        (operands, t.seen)
    }

    #[test]
    fn abbreviations_permutation_and_verbatim_values() {
        // (POSIXLY_CORRECT is not set under `cargo test`.)
        let (operands, seen) = run(&[
            "a",
            "--hash=sha512",
            "b",
            "--salt",
            "--compact",
            "--comp",
            "--",
            "--salt",
        ]);
        assert_eq!(operands.unwrap(), ["a", "b", "--salt"]);
        let want = [
            ("hash-alg", "sha512"),
            ("salt", "--compact"),
            ("compact", ""),
        ];
        let want: Vec<_> = want.iter().map(|&(n, v)| (n, OsString::from(v))).collect();
        assert_eq!(seen, want);
        // A second parse starts afresh.
        assert_eq!(run(&["x"]).0.unwrap(), ["x"]);
    }

    #[test]
    fn the_first_bad_option_wins() {
        let (result, seen) = run(&["--compact", "--hash-alg=bad", "--foo"]);
        assert_eq!(result.unwrap_err().lines(), [b"bad hash".to_vec()]);
        assert_eq!(seen.len(), 1);
        let (result, _) = run(&["--foo", "--hash-alg=bad"]);
        assert!(result.unwrap_err().lines().is_empty(), "glibc printed it");
    }
}
