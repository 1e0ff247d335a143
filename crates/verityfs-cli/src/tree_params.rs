//! The Merkle tree options shared by `digest`, `enable` and `sign`
//! (`--hash-alg`, `--block-size`, `--salt`), parsed and checked exactly as
//! fsverity-utils does: each option once, numbers with C's `strtoul`, and the
//! library checks (`libfsverity_compute_digest()`) in libfsverity's order.

use std::ffi::{OsStr, OsString};

use verityfs::{Error as LibError, HashAlgorithm, MerkleTreeParams, Salt};

use crate::commands::{hash_alg_names, hash_algs_line};
use crate::error::{Error, Result};
use crate::opts::{Hint, Opt};
use crate::output::quote;

/// The arguments of a command that takes the tree options.
pub trait HasTree {
    /// Where the tree options go.
    fn tree(&mut self) -> &mut TreeArgs;
}

/// `--hash-alg`, which starts a line of the usage texts.
pub const fn hash_alg<A: HasTree>() -> Opt<A> {
    Opt::<A>::value(
        "hash-alg",
        "HASH_ALG",
        "Hash algorithm of the Merkle tree: sha256 (default) or sha512",
        |a, v| a.tree().set_hash_alg(&v),
    )
    .hint(Hint::Values(hash_alg_names))
    .doc("A number (the kernel's FS_VERITY_HASH_ALG_*) is taken as it is.")
    .new_line()
}

/// `--block-size`.
pub const fn block_size<A: HasTree>() -> Opt<A> {
    Opt::<A>::value(
        "block-size",
        "BLOCK_SIZE",
        "Merkle tree block size in bytes, a power of 2 (default 4096)",
        |a, v| a.tree().set_block_size(&v),
    )
}

/// `--salt`.
pub const fn salt<A: HasTree>() -> Opt<A> {
    Opt::<A>::value(
        "salt",
        "SALT",
        "Salt prepended to every hashed block, as a hex string (default: none)",
        |a, v| a.tree().set_salt(&v),
    )
}

/// The tree options as given on the command line; unchecked against each
/// other until [`TreeArgs::params`].
#[derive(Default)]
pub struct TreeArgs {
    /// Hash algorithm number, if given (any positive number below 2^31).
    pub hash_alg: Option<u32>,
    /// Block size, if given (a power of two below 2^31).
    pub block_size: Option<u32>,
    /// Salt bytes, if given (possibly empty, of any length).
    pub salt: Option<Vec<u8>>,
}

impl TreeArgs {
    fn set_hash_alg(&mut self, arg: &OsStr) -> Result<()> {
        once(&self.hash_alg, "--hash-alg")?;
        let text = arg.to_str().unwrap_or_default();
        let id = match strtoul(text) {
            (n, true) if n > 0 && n < i32::MAX as u64 => n as u32,
            _ => match arg.to_str().and_then(HashAlgorithm::from_name) {
                Some(alg) => alg.id().into(),
                None => {
                    let mut msg = quote("unknown hash algorithm: '", arg, "'\n");
                    msg.extend_from_slice(hash_algs_line().as_bytes());
                    return Err(Error::usage_msg(msg));
                }
            },
        };
        self.hash_alg = Some(id);
        Ok(())
    }

    fn set_block_size(&mut self, arg: &OsStr) -> Result<()> {
        once(&self.block_size, "--block-size")?;
        // Not UTF-8: not a number either ("x" stands for any non-digit).
        match strtoul(arg.to_str().unwrap_or("x")) {
            (n, true) if n > 0 && n < i32::MAX as u64 && n.is_power_of_two() => {
                self.block_size = Some(n as u32);
                Ok(())
            }
            _ => Err(Error::usage_msg(quote(
                "Invalid block size: ",
                arg,
                ".  Must be power of 2",
            ))),
        }
    }

    fn set_salt(&mut self, arg: &OsStr) -> Result<()> {
        once(&self.salt, "--salt")?;
        let salt = hex_decode(arg.as_encoded_bytes())
            .ok_or_else(|| Error::usage_msg("salt is not a valid hex string"))?;
        self.salt = Some(salt);
        Ok(())
    }

    /// The parameters, checked in libfsverity's order (salt size, hash
    /// algorithm, block size against the digest size).
    pub fn params(&self) -> Result<MerkleTreeParams, LibError> {
        let salt = self.salt.as_deref().unwrap_or_default();
        Salt::new(salt)?;
        let alg = HashAlgorithm::from_id(self.hash_alg.unwrap_or(1))?;
        let block_size = self
            .block_size
            .unwrap_or(verityfs::params::DEFAULT_BLOCK_SIZE);
        MerkleTreeParams::new(alg, block_size.into(), salt)
    }
}

/// A usage error if `slot` is already set: fsverity takes each option once.
pub fn once<T>(slot: &Option<T>, name: &str) -> Result<()> {
    match slot {
        Some(_) => Err(Error::usage_msg(format!(
            "{name} can only be specified once"
        ))),
        None => Ok(()),
    }
}

/// The value of an option taking any number, as fsverity parses it; a
/// usage error `invalid value for <name>` if it is not one.
pub fn number(value: &OsString, name: &str) -> Result<u64> {
    // Not UTF-8: not a number either.
    value
        .to_str()
        .and_then(parse_u64)
        .ok_or_else(|| Error::usage_msg(format!("invalid value for {name}")))
}

/// Decodes an even-length hexadecimal string (either case).
pub fn hex_decode(hex: &[u8]) -> Option<Vec<u8>> {
    if hex.len() % 2 != 0 {
        return None;
    }
    let nibble = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    hex.chunks_exact(2)
        .map(|p| Some(nibble(p[0])? << 4 | nibble(p[1])?))
        .collect()
}

/// C's `strtoull(s, &end, 10)` checked as fsverity does for numbers that
/// may be anything (`errno == 0 && *end == '\0'`): leading white space and
/// a sign are accepted, a minus sign negates modulo 2^64, the empty string
/// is 0; overflow and trailing characters are `None`.
pub fn parse_u64(s: &str) -> Option<u64> {
    match strtoul_checked(s) {
        (Some(value), true) => Some(value),
        _ => None,
    }
}

/// C's `strtoul(s, &end, 10)` on LP64: the value, and whether the whole
/// string was consumed (`*end == '\0'`). Overflow gives `u64::MAX`, as C
/// does (with `errno` set to `ERANGE`).
fn strtoul(s: &str) -> (u64, bool) {
    let (value, all) = strtoul_checked(s);
    (value.unwrap_or(u64::MAX), all)
}

/// [`strtoul`] with overflow as `None`.
fn strtoul_checked(s: &str) -> (Option<u64>, bool) {
    let t = s.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let (negative, t) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return (Some(0), s.is_empty());
    }
    let value = t[..digits]
        .bytes()
        .try_fold(0u64, |n, d| {
            n.checked_mul(10)?.checked_add((d - b'0').into())
        })
        .map(|n| if negative { n.wrapping_neg() } else { n });
    (value, digits == t.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strtoul_matches_c() {
        assert_eq!(strtoul("4096"), (4096, true));
        assert_eq!(strtoul(" +2"), (2, true));
        assert_eq!(strtoul("-1"), (u64::MAX, true));
        assert_eq!(strtoul("12x"), (12, false));
        assert_eq!(strtoul("x"), (0, false));
        assert_eq!(strtoul(""), (0, true));
        assert_eq!(strtoul("99999999999999999999999"), (u64::MAX, true));
    }

    #[test]
    fn parse_u64_matches_fsverity_checks() {
        assert_eq!(parse_u64("18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_u64("-1"), Some(u64::MAX));
        assert_eq!(parse_u64(" +7"), Some(7));
        assert_eq!(parse_u64(""), Some(0));
        assert_eq!(parse_u64("18446744073709551616"), None);
        assert_eq!(parse_u64("-18446744073709551616"), None);
        for bad in ["0x10", "1e3", " ", "-", "5 "] {
            assert_eq!(parse_u64(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn hex() {
        assert_eq!(hex_decode(b"aBcD"), Some(vec![0xab, 0xcd]));
        assert_eq!(hex_decode(b""), Some(vec![]));
        assert_eq!(hex_decode(b"abc"), None);
        assert_eq!(hex_decode(b"zz"), None);
        assert_eq!(hex_decode(b"+1"), None);
    }
}
