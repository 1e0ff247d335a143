//! Digests as people write them down: `sha256:HEX`, as `fsverity digest`
//! and `fsverity measure` print them, or bare hexadecimal, as
//! [`Digest::to_hex`] and most manifests give them.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::hash_algs::{Digest, HashAlgorithm};

/// A trusted file digest to compare verity files with, parsed from either
/// `ALG:HEX` (`sha256:6c1b...`, `sha512:...`) or bare `HEX`.
///
/// A bare digest names no algorithm: it matches a file of either algorithm
/// whose digest has those bytes (the lengths differ, 32 and 64 bytes).
///
/// ```
/// use verityfs::{ExpectedDigest, HashAlgorithm};
///
/// let hex = "fda0e2d973b5c81e4a8ccc43a0bb13cbc9b5da8d83c4ff4416f6860ea20df0d6";
/// let printed: ExpectedDigest = format!("sha256:{hex}").parse()?; // as fsverity prints it
/// let bare: ExpectedDigest = hex.parse()?;
/// let digest = printed.digest();
/// assert!(printed.matches(HashAlgorithm::Sha256, &digest));
/// assert!(bare.matches(HashAlgorithm::Sha256, &digest));
/// assert!(!printed.matches(HashAlgorithm::Sha512, &digest));
/// assert!("sha256:xyz".parse::<ExpectedDigest>().is_err());
/// # Ok::<(), verityfs::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpectedDigest {
    alg: Option<HashAlgorithm>,
    digest: Digest,
}

impl ExpectedDigest {
    /// The algorithm named before the colon, if any.
    pub fn algorithm(&self) -> Option<HashAlgorithm> {
        self.alg
    }

    /// The digest's bytes.
    pub fn digest(&self) -> Digest {
        self.digest
    }

    /// True if a file whose digest is `digest`, computed with `alg`, is the
    /// expected one.
    pub fn matches(&self, alg: HashAlgorithm, digest: &Digest) -> bool {
        self.alg.is_none_or(|a| a == alg) && self.digest == *digest
    }
}

impl FromStr for ExpectedDigest {
    type Err = Error;

    /// Parses `ALG:HEX` or `HEX` (either case); the length must be the
    /// algorithm's (any supported one for bare hex).
    fn from_str(text: &str) -> Result<Self> {
        let bad =
            || Error::InvalidArgument("not a digest (expected sha256:HEX, sha512:HEX or HEX)");
        let (alg, hex) = match text.split_once(':') {
            Some((name, hex)) => (Some(HashAlgorithm::from_name(name).ok_or_else(bad)?), hex),
            None => (None, text),
        };
        let bytes = from_hex(hex).ok_or_else(bad)?;
        let digest = Digest::from_slice(&bytes).ok_or_else(bad)?;
        if alg.is_some_and(|a| a.digest_size() != bytes.len()) {
            return Err(bad());
        }
        Ok(ExpectedDigest { alg, digest })
    }
}

/// The bytes of an even-length hexadecimal string (either case).
fn from_hex(hex: &str) -> Option<Vec<u8>> {
    if hex.len() % 2 != 0 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16);
    hex.as_bytes()
        .chunks(2)
        .map(|pair| Some((digit(pair[0])? * 16 + digit(pair[1])?) as u8))
        .collect()
}

impl fmt::Display for ExpectedDigest {
    /// `ALG:HEX`, or `HEX` when no algorithm was given.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.alg {
            Some(alg) => write!(f, "{alg}:{}", self.digest),
            None => write!(f, "{}", self.digest),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_and_both_algorithms() {
        let d32 = Digest::from_slice(&[0xab; 32]).unwrap();
        let d64 = Digest::from_slice(&[0xcd; 64]).unwrap();
        for (text, alg, digest) in [
            (format!("sha256:{d32}"), HashAlgorithm::Sha256, d32),
            (d32.to_hex().to_uppercase(), HashAlgorithm::Sha256, d32),
            (format!("sha512:{d64}"), HashAlgorithm::Sha512, d64),
            (d64.to_hex(), HashAlgorithm::Sha512, d64),
        ] {
            let expected: ExpectedDigest = text.parse().unwrap();
            assert!(expected.matches(alg, &digest), "{text}");
            assert_eq!(expected.to_string().to_lowercase(), text.to_lowercase());
        }
    }

    #[test]
    fn malformed_digests_are_refused() {
        let d32 = Digest::from_slice(&[1; 32]).unwrap().to_hex();
        for text in [
            String::new(),
            "sha256:".into(),
            format!("sha512:{d32}"),
            format!("md5:{d32}"),
            format!("{d32}0"),
            d32[..62].to_string(),
            format!(" sha256:{d32}"),
        ] {
            let err = text.parse::<ExpectedDigest>().unwrap_err();
            assert_eq!(err.errno(), libc::EINVAL, "{text:?}");
        }
    }

    #[test]
    fn the_algorithm_must_match_when_given() {
        let d = Digest::from_slice(&[7; 32]).unwrap();
        let e: ExpectedDigest = format!("sha256:{d}").parse().unwrap();
        assert!(!e.matches(HashAlgorithm::Sha512, &d));
        assert!(!e.matches(
            HashAlgorithm::Sha256,
            &Digest::from_slice(&[8; 32]).unwrap()
        ));
    }
}
